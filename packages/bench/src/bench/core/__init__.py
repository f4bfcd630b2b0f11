"""The plumbing that three or more of bench's commands share; it imports no other wing of bench
(`docs/design/bench.md`)."""

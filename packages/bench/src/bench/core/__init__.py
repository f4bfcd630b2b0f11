"""The plumbing every `bench` tool and the trainer are built from; it imports neither
(`bench.tools`, `bench.train`)."""

"""One module per `bench-*` tool, each a `main` (its command) and a plain `run_*` function."""

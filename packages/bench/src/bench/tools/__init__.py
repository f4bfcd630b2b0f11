"""One module per measuring `bench-*` tool: a plain `run_*` function and the `TOOL` its command
(`bench.commands.<name>`) runs once the options have parsed; a tool never imports the trainer
(`bench.train`)."""

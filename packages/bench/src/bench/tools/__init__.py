"""One module per measuring `bench-*` tool, each a `main` (its command) and a plain `run_*`
function; a tool never imports the trainer (`bench.train`)."""

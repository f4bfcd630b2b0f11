"""The plumbing every `bench` tool is built from; it never imports a tool (`bench.tools`)."""

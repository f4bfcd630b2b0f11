"""One module per `bench-*` command, the tool's spec: its help (with examples), its configuration
(a dataclass whose fields are the options, `bench.core.options`) and the vocabularies they offer,
and the implementation it runs once they parse (named, imported only then).

A command module imports only the standard library and light plumbing (`bench.core.cli`, ...),
never torch, so that `--help` and usage errors come at once; `bench/core/cli.py` shows the
pattern and `tests/test_commands.py` checks every command in a fresh interpreter. Each is a
console script of `[project.scripts]` (`bench-attn = "bench.commands.attn:main"`) and runs as
`python -m bench attn` too.
"""

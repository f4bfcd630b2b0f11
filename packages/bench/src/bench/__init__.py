"""Profiling and benchmarking harness for the cs336sys packages.

Six wings (`docs/design/bench.md` draws them): `bench.core`, plumbing three or more consumers
share (the command line, results, plots, timing, launching ranks, the one vocabulary of layouts
and precisions, the one wrapping of a model, the training step); `bench.plan`, bench-plan's
memory and communication model; `bench.train`, the trainer (`bench-train`, `bench-generate`,
`bench-train-results`); `bench.commands`, one module per command, the tool's spec (its help,
its configuration, whose fields are the options, and the names they offer; no torch, so
`--help` comes at once); `bench.tools`, one module per measuring tool (`bench-attn`,
`bench-ddp`, ...), what its command runs once the options have parsed; `bench.report`,
`bench-report`. Each imports only the wings before it here; only the report imports the report,
and a command names its implementation instead of importing it.

Commands: every command is a console script in `[project.scripts]` of bench's `pyproject.toml`
(`bench-thing = "bench.commands.thing:main"`), and `python -m bench thing` (or `python -m bench
bench-thing`) runs the same `main` through `bench/__main__.py`, which reads that table.
"""

__version__ = "0.1.0"

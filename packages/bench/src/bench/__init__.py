"""Profiling and benchmarking harness for the cs336sys packages.

Four layers: `bench.commands` holds one module per command (its help, its options, the names
they offer; no torch, so `--help` comes at once); `bench.core` the plumbing (timing, memory,
results, plots, the command line, launching ranks, the shared training step, ...);
`bench.tools` one module per measuring tool (`bench-attn`, `bench-ddp`, ...), what its command
runs once the options have parsed; `bench.train` the trainer (`bench-train`, `bench-generate`,
`bench-train-results`). Plumbing imports none of the others; tools and the trainer never import
each other (the report may read both); a command names its implementation instead of importing it.

Commands: every command is a console script in `[project.scripts]` of bench's `pyproject.toml`
(`bench-thing = "bench.commands.thing:main"`), and `python -m bench thing` (or `python -m bench
bench-thing`) runs the same `main` through `bench/__main__.py`, which reads that table.
"""

__version__ = "0.1.0"

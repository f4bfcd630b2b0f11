"""Profiling and benchmarking harness for the cs336sys packages.

Three layers: `bench.core` holds the plumbing (timing, memory, results, plots, the command line,
launching ranks, the shared training step, ...); `bench.tools` one module per measuring tool
(`bench-attn`, `bench-ddp`, ...); `bench.train` the trainer (`bench-train`, `bench-generate`,
`bench-train-results`). Plumbing imports neither of the others; tools and the trainer never
import each other (the report may read both).

Commands: every tool is a console script in `[project.scripts]` of bench's `pyproject.toml`
(`bench-thing = "bench.tools.thing:main"`), and `python -m bench thing` (or `python -m bench
bench-thing`) runs the same `main` through `bench/__main__.py`, which reads that table. Adding
a tool is that one line; there is no runner module to write.
"""

__version__ = "0.1.0"

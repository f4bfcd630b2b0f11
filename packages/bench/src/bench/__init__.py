"""Profiling and benchmarking harness for the cs336sys packages.

Two layers: `bench.core` holds the plumbing (timing, memory, results, plots, the command line,
launching ranks, the shared training step, ...) and `bench.tools` one module per `bench-*` tool,
built on it. Plumbing never imports a tool. Each tool also runs as `python -m bench.<tool>`
through a two-line runner module beside this file.
"""

__version__ = "0.1.0"

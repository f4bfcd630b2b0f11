"""bench-report: the 2026 CS336 handout answered, one section per problem, from a results folder.

Every `*.json` a `bench-*` tool wrote (`--json`) in the folder (default `docs/results/`), the
profile runs one level down (`bench-model --profile DIR` writes `DIR/<DIR>.json`) and the
hand-written records that carry an `env` are read back. The report follows the 2026 handout's
order: every problem gets a section with its deliverable, answered in prose computed from the
measured rows (each number followed by the file it comes from and the code revision it
measured), then the result files it rests on in full, with their plots. A problem without
results says what it needs (hardware, the command) and that it was not run; the §8 analytic
problems are answered by bench-plan's formulas (`bench.report.analysis`).

Images are found by the result's own name: `<result>.png` and `<result>_*.png` beside
`<result>.json` (plus the plot paths the run recorded, where they still exist).

Formats: Markdown (default), or `--format latex` / `--format typst` for a write-up typeset in
LaTeX or Typst (the same sections, tables and images). Examples::

    bench-report docs/results -o docs/results/REPORT.md
    bench-report docs/results --format latex -o report/report.tex
    bench-report docs/results --format typst -o report/report.typ
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.core.cli import Command

__all__ = ["COMMAND", "FORMATS", "add_options", "main"]

# What the report renders to (`bench.report.document.render`).
FORMATS = ("markdown", "latex", "typst")


def add_options(parser: argparse.ArgumentParser) -> None:
    """bench-report's options: the results folder, the output file, its title and format."""
    parser.add_argument("folder", nargs="?", default="docs/results", help="results folder")
    parser.add_argument("-o", "--output", type=Path, help="write the report here (else print)")
    parser.add_argument("--title", help="top heading")
    parser.add_argument("--format", choices=FORMATS, default="markdown", help="output format")


COMMAND = Command(
    "bench-report",
    __doc__,
    add_options=add_options,
    run="bench.report.tool:run_parsed",
    common=False,
)
main = COMMAND.main

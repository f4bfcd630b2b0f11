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

Formats: Markdown (default), the full report; or the write-up one hands in, the same answers
with the plots of the results they rest on (each result named in one line, not tabled in full):
`--format typst` (tables fitted to the page by Typst itself: smaller type, then split), `--format
pdf` (that Typst document compiled, with bench's `pdf` extra, the `typst` package), or `--format
latex` (plain ASCII, for pdflatex). Examples::

    bench-report docs/results -o docs/results/REPORT.md
    bench-report docs/results --format pdf -o report/writeup.pdf
    bench-report docs/results --format typst -o report/writeup.typ
    bench-report docs/results --format latex -o report/writeup.tex
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.core.cli import Command

__all__ = ["COMMAND", "FORMATS", "add_options", "main"]

# What the report renders to (`bench.report.document.render`).
FORMATS = ("markdown", "latex", "typst", "pdf")


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

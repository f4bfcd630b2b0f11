"""bench-report: the 2026 CS336 handout answered, one section per problem, from a results folder.

Every `*.json` a `bench-*` tool wrote (`--json`) in the folder (default `docs/results/`), the
profile runs one level down (`bench-model --profile DIR` writes `DIR/<DIR>.json`) and the
hand-written records that carry an `env` are read back. The report follows the 2026 handout's
order: every problem gets a section with its deliverable, answered in prose computed from the
measured rows (each number followed by the file it comes from and the code revision it
measured), then the result files it rests on in full, with their plots. A problem without
results says what it needs (hardware, the command) and that it was not run; the §8 analytic
problems are answered by bench-plan's formulas (`bench.handout.analysis`).

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
import os
import re
from collections.abc import Sequence
from pathlib import Path

from bench.core.document import FORMATS, render
from bench.handout import PROBLEMS, Results, build_document

__all__ = ["PROBLEMS", "build_report", "main", "report_links"]

_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def report_links(text: str) -> list[str]:
    """Every link and image target in Markdown `text`, in order (web addresses included)."""
    return _LINK.findall(text)


def build_report(
    folder: str | os.PathLike[str] = "docs/results",
    *,
    output: str | os.PathLike[str] | None = None,
    title: str = "CS336 assignment 2 (spring 2026), answered from measured results",
    fmt: str = "markdown",
) -> str:
    """The report of every result in `folder`, as text in `fmt` (written to `output` when given).

    Args:
        folder: where the `--json` results are.
        output: the file to write; image links are made relative to its folder (to `folder`
            when None).
        title: the report's top heading.
        fmt: `markdown`, `latex` or `typst`.

    Raises:
        FileNotFoundError: `folder` does not exist.
        ValueError: an unknown format.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    res = Results.collect(folder)
    report_dir = Path(output).parent if output is not None else Path(folder)
    text = render(build_document(res, report_dir=report_dir, title=title), fmt)
    if output is not None:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(text)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `bench-report` (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="bench-report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("folder", nargs="?", default="docs/results", help="results folder")
    parser.add_argument("-o", "--output", type=Path, help="write the report here (else print)")
    parser.add_argument("--title", help="top heading")
    parser.add_argument("--format", choices=FORMATS, default="markdown", help="output format")
    args = parser.parse_args(argv)
    options = {"title": args.title} if args.title else {}
    try:
        text = build_report(args.folder, output=args.output, fmt=args.format, **options)
    except FileNotFoundError as exc:
        parser.error(str(exc))
    if args.output is None:
        print(text, end="")
    else:
        print(f"wrote {args.output}")
    return 0

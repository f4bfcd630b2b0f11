"""bench-report's implementation: the 2026 CS336 handout answered, one section per problem, from a
results folder, as `build_report(folder)`, and `run_parsed`, what its command runs.

What the report holds and the command line: `bench.commands.report` (`bench-report --help`).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Sequence
from pathlib import Path

from bench.report.document import FORMATS, render
from bench.report.problems import PROBLEMS, Results, build_document

__all__ = ["PROBLEMS", "build_report", "report_links", "run_parsed"]

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


def run_parsed(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    argv: Sequence[str] | None = None,
) -> int:
    """What `bench-report` runs once its options have parsed: build the report, print or write
    it; the exit status (0). A missing results folder is a usage error of `parser`."""
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

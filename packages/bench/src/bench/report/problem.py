"""A handout problem as a report section, and a result file as report blocks.

A `Problem` names the handout's problem (`benchmarking_script`), where it stands (§2.1.3), what it
asks for, the function that answers it from the results (paragraphs whose numbers cite their
files and revisions, tables, images), which result files it shows in full (`claims`), and, for
problems that need hardware or tools this project's runs did not have, what they need. A problem
without an answer says so in one sentence: what it needs, and that it was not run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.core.results import code_line
from bench.report.document import Block, Heading, Image, Paragraph, Table
from bench.report.results import DIM_KEYS, Record, Results, name_with_dims, size_label

__all__ = ["Problem", "earlier_blocks", "image_link", "record_blocks"]

Answer = Callable[[Results], list[Block]]


@dataclass(frozen=True)
class Problem:
    """One problem of the handout.

    Attributes:
        key: the handout's name for it (`nsys_profile`).
        title: its title (`Nsight Systems Profiling`).
        where: its section in the 2026 handout (`2.1.4`).
        asks: the deliverable, in a sentence.
        answer: builds the answer from the results; an empty list when nothing is measured.
        claims: decides which result files this problem shows in full (the first problem in
            order that claims a file shows it).
        needs: what it takes to answer when nothing is measured (hardware, a command).
        handout: the handout that asks it: `2026`, or `2025` for the problems the 2026
            handout dropped (an appendix).
    """

    key: str
    title: str
    where: str
    asks: str
    answer: Answer
    claims: Callable[[Record], bool] = lambda record: False
    needs: str = ""
    handout: str = "2026"


def _images(record: Record, stems: set[str]) -> list[Path]:
    """The result's images: `<stem>.png` and `<stem>_*.png` beside it (not those of a result
    whose name extends this one's), then the recorded plots that still exist."""
    path, stem = record.path, record.path.stem
    longer = [s for s in stems if s != stem and s.startswith(f"{stem}_")]
    found = [
        p
        for p in sorted(path.parent.glob(f"{stem}*.png"))
        if (p.stem == stem or p.stem.startswith(f"{stem}_"))
        and not any(p.stem == s or p.stem.startswith(f"{s}_") for s in longer)
    ]
    recorded = [path.parent / plot for plot in record.run.plots]
    return found + [p for p in recorded if p.is_file() and p not in found]


def image_link(image: Path, report_dir: Path) -> str:
    """`image`'s path relative to the report's folder, as a link."""
    return Path(os.path.relpath(image.resolve(), report_dir.resolve())).as_posix()


def _title(record: Record) -> str:
    """The result's title, the size it names shown with its dimensions."""
    return name_with_dims(
        record.run.title or record.path.stem,
        record.run.config.get("shape"),
        date=str(record.run.date),
    )


def _source(record: Record) -> Paragraph:
    run, env = record.run, record.run.env
    triton = f", triton {env['triton']}" if env.get("triton") else ""
    command = f"`{run.command}`" if run.command.strip() else "not recorded"
    return Paragraph(
        f"Source: `{record.path.name}`. Device: {env.get('device_name')}; torch "
        f"{env.get('torch')}{triton}; {run.date}. Command: {command}. {code_line(env)}"
    )


def earlier_blocks(record: Record, newer: Sequence[Record]) -> list[Block]:
    """An earlier run in brief: title, source and what replaces it; its numbers not repeated."""
    names = ", ".join(f"`{r.path.name}`" for r in newer)
    return [
        Heading(4, f"Earlier run: {_title(record)}"),
        _source(record),
        Paragraph(f"Replaced by {names}: its numbers are not quoted, its tables not repeated."),
    ]


def record_blocks(record: Record, report_dir: Path, stems: set[str]) -> list[Block]:
    """A result file in full: title, where and how it was measured, notes, tables, images."""
    run = record.run
    blocks: list[Block] = [Heading(4, _title(record)), _source(record)]
    if run.tool == "profile" and any("phase" not in r for r in run.rows):
        return [
            *blocks,
            Paragraph(
                "Its kernel table ranked `record_function` ranges beside kernels (`forward` as "
                'the top "kernel"), the error these tables no longer make; not reproduced '
                "here."
            ),
        ]
    blocks += [Paragraph(f"- {note}") for note in run.notes]
    if (run.rows and run.columns is not None) or (run.rows and run.group_by is None):
        blocks += _tables(record)
    for image in _images(record, stems):
        blocks.append(Image(image_link(image, report_dir), image.stem))
    return blocks


def _labelled(row: dict) -> dict:
    """The row with its `size` shown with the dimensions it records."""
    if "size" in row and all(row.get(k) is not None for k in DIM_KEYS):
        return {**row, "size": size_label(row)}
    return row


def _tables(record: Record) -> Sequence[Block]:
    return [
        Table([_labelled(r) for r in rows], columns, caption="" if value is None else str(value))
        for value, rows, columns in record.run.groups()
    ]

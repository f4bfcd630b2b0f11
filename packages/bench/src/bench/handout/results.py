"""The results a report is built from, and the small helpers its answers share.

`Results.collect(folder)` reads every bench result in a folder and one level down (profile
runs live in `<profile>/<profile>.json`), plus the hand-written records that carry an `env`
with a revision (GPU test records). Each row handed to an answer carries where it came from, so
that every number the answers quote is cited with its file and the code revision it measured
(`Results.cite`).
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.core.oom import OK, OOM
from bench.core.results import Run, load_json
from lmcore import MODEL_SIZES

__all__ = [
    "OK",
    "OOM",
    "Record",
    "Results",
    "Rows",
    "fmt",
    "grouped",
    "num",
    "ok",
    "pairs",
    "size_label",
    "span",
]

Rows = list[dict[str, Any]]

# The key every tagged row carries: the index of the result it came from.
SOURCE = "_source"


@dataclass(frozen=True)
class Record:
    """A result file: its path and the run in it (a hand-written record as a run too)."""

    path: Path
    run: Run

    @property
    def revision(self) -> str:
        """The short revision the result measured, or `revision not recorded`."""
        rev = self.run.env.get("git_revision")
        return f"`{rev[:12]}`" if rev else "revision not recorded"

    @property
    def citation(self) -> str:
        return f"`{self.path.name}` at {self.revision}"


@dataclass
class Results:
    """Every result of a folder, oldest first, and the files that are not results."""

    folder: Path
    records: list[Record] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @classmethod
    def collect(cls, folder: str | os.PathLike[str]) -> Results:
        """Read `folder/*.json` and `folder/*/*.json` (Chrome traces passed over).

        Raises:
            FileNotFoundError: `folder` does not exist.
        """
        folder = Path(folder)
        if not folder.is_dir():
            raise FileNotFoundError(f"no results folder {folder}; write results there with --json")
        out = cls(folder)
        for path in sorted([*folder.glob("*.json"), *folder.glob("*/*.json")]):
            if path.name.endswith(".trace.json"):
                continue
            try:
                out.records.append(Record(path, load_json(path)))
            except (ValueError, TypeError, KeyError) as exc:
                record = _hand_written(path)
                if record is None:
                    out.skipped.append(f"{path.relative_to(folder).as_posix()}: {exc}")
                else:
                    out.records.append(record)
        out.records.sort(key=lambda r: r.run.date)
        return out

    def runs(self, tool: str, *, stem: str | None = None) -> list[Record]:
        """The records of `tool` (whose file name starts with `stem`, when given)."""
        return [
            r
            for r in self.records
            if r.run.tool == tool and (stem is None or r.path.stem.startswith(stem))
        ]

    def rows(self, tool: str, *, stem: str | None = None, latest: bool = False) -> Rows:
        """The rows of `tool`'s results, each tagged with its source (see `cite`); those
        measured on a GPU only, where there are any.

        Args:
            tool: the tool that wrote them.
            stem: only files whose name starts with this.
            latest: only the newest such file's rows.
        """
        records = self.runs(tool, stem=stem)
        on_gpu = [r for r in records if r.run.env.get("device_type") == "cuda"]
        records = on_gpu or records  # a CPU stand-in answers only where no GPU result does
        if latest and records:
            records = records[-1:]
        index = {id(r): i for i, r in enumerate(self.records)}
        return [{**row, SOURCE: index[id(rec)]} for rec in records for row in rec.run.rows]

    def cite(self, rows: Iterable[dict[str, Any]]) -> str:
        """`(source: `a.json` at `1a2b3c4d5e6f`; ...)` for the files the rows came from."""
        seen = dict.fromkeys(r[SOURCE] for r in rows if SOURCE in r)
        if not seen:
            return ""
        return "(source: " + "; ".join(self.records[i].citation for i in seen) + ")"

    def record_of(self, row: dict[str, Any]) -> Record:
        return self.records[row[SOURCE]]


def _hand_written(path: Path) -> Record | None:
    """A hand-written record (`{"meta": ..., "rows": [...], "env": {...}}`) as a run."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("env"), dict):
        return None
    meta = data.get("meta") or {}
    tool = path.stem.split("_h100")[0].split("_cpu")[0]
    run = Run(
        tool=tool,
        rows=[r for r in data.get("rows", []) if isinstance(r, dict)],
        config={},
        env=data["env"],
        command=str(meta.get("command", data.get("command", ""))),
        date=str(data["env"].get("date", meta.get("date", data.get("date", "")))),
        title=str(meta.get("title", path.stem)),
    )
    return Record(path, run)


def ok(rows: Iterable[dict[str, Any]]) -> Rows:
    """The rows whose measurement completed."""
    return [r for r in rows if r.get("status", OK) == OK]


def num(row: dict[str, Any], key: str) -> float | None:
    """`row[key]` as a float, or None when missing or not a number."""
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def fmt(value: float) -> str:
    """A number for prose: no decimals from 100 up, else three significant digits."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def span(values: Sequence[float], unit: str = "×") -> str:
    """`median (min–max over n)` of `values`, e.g. `2.1× (median; 1.9–2.4× over 5)`."""
    med = statistics.median(values)
    if len(values) == 1:
        return f"{fmt(med)}{unit}"
    return (
        f"{fmt(med)}{unit} (median; {fmt(min(values))}–{fmt(max(values))}{unit} over {len(values)})"
    )


def grouped(rows: Rows, *keys: str) -> dict[tuple, Rows]:
    """`rows` grouped by their values of `keys`, groups and rows in first-seen order."""
    groups: dict[tuple, Rows] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k) for k in keys), []).append(r)
    return groups


def pairs(
    rows: Rows, *, vary: str, a: Any, b: Any, match: Sequence[str], same_file: bool = True
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Rows that differ only in `vary` (value `a` against `b`), matched on the keys `match`
    and, with `same_file`, measured in the same run (a comparison within one run)."""
    keys = (*match, SOURCE) if same_file else tuple(match)
    left = {tuple(r.get(k) for k in keys): r for r in rows if r.get(vary) == a}
    return [
        (left[key], r)
        for r in rows
        if r.get(vary) == b and (key := tuple(r.get(k) for k in keys)) in left
    ]


def size_label(row: dict[str, Any]) -> str:
    """A size with its dimensions, `xl (2560/10240/32L/32H)`: names changed between handouts
    (2025's xl was 1600 wide), so a table never shows the name alone when the row has them."""
    name = str(row.get("size", "?"))
    dims = [row.get(k) for k in ("d_model", "d_ff", "num_layers", "num_heads")]
    if any(d is None for d in dims):
        size = MODEL_SIZES.get(name)
        if size is None or row.get("d_model") is not None:
            return name
        dims = [size.d_model, size.d_ff, size.num_layers, size.num_heads]
    d_model, d_ff, layers, heads = dims
    return f"{name} ({d_model}/{d_ff}/{layers}L/{heads}H)"

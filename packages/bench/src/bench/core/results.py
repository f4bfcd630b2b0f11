"""Result records: tidy rows plus the metadata that makes them a result, as Markdown, JSON and
CSV.

A `Run` is what every tool returns: a list of flat dicts (one per measurement; rows of one kind
share their keys), the configuration that produced them, the environment
(`bench.core.env.collect_env`), the command line and date, free-form notes, and the plots drawn
from the rows. `save_json` writes it in a stable schema that `bench-report` reads back with
`load_json`; `save_csv` writes the rows alone as a spreadsheet or a data frame reads them (one
line per row, a column per key, each row carrying the device, date and code revision).

JSON schema `cs336sys-bench/2`::

    {"schema": "cs336sys-bench/2", "tool": "attn", "title": "...", "date": "<UTC ISO>",
     "command": "bench-attn --json out.json", "env": {...}, "config": {...},
     "columns": ["impl", "d", ...] | null, "group_by": "case" | null,
     "notes": ["..."], "plots": ["attn.png"],
     "rows": [{"impl": "sdpa", "d": 16, ..., "status": "ok"}, ...]}

`brief` (optional): the printed table's columns, key → header there, most telling first. It
keeps to `TABLE_WIDTH` characters: long text cells become numbered notes under it, the least
telling columns are left out (and named) while it is too wide, the rest keep `columns`' order;
`--wide`, `--markdown` and `--json` keep every column. A row's `noisy` lists the columns whose
value its own spread exceeds: printed as `noisy`, not as a number.

`plots` hold paths relative to the JSON file's folder. Non-finite floats (a bucket size of
`inf`, say) are written as `Infinity`, `-Infinity` and `NaN`, the JSON extension that Python's
`json` module reads back as the same floats, so a run survives the round trip exactly.

Schema 2 names layouts and precisions in the harness's one vocabulary (`bench.core.layouts`);
`load_json` reads a result of schema 1 with its rows' old names (bench-zero's `ddp` and
`sharded`, bench-model's `bf16`, ...) in the new ones (`bench.core.layouts.renamed_row`).

Example::

    run = Run.create("attn", rows, device="cuda", config={"batch": 8})
    print(run.to_markdown())
    save_json(run, "docs/results/attn.json")
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import textwrap
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tabulate import tabulate

from bench.core.env import collect_env
from bench.core.layouts import renamed_row
from bench.core.oom import OK, OOM

if TYPE_CHECKING:
    import torch

__all__ = [
    "NOISY",
    "SCHEMA",
    "TABLE_WIDTH",
    "Keys",
    "Run",
    "format_value",
    "load_json",
    "result_stem",
    "save_csv",
    "save_json",
    "to_markdown",
]

SCHEMA = "cs336sys-bench/2"
# The schema before the one vocabulary of layouts and precisions: read, its names renamed.
_OLD_NAMES_SCHEMA = "cs336sys-bench/1"

_EMPTY = "—"  # no value: not measured here (memory on the CPU, a ratio without baseline)
TABLE_WIDTH = 120  # the printed table's: a terminal of 120 columns shows it unwrapped
NOISY = "noisy"  # a row's key: the columns whose value is within its own noise
_LONGEST_CELL = 24  # longer text (a sentence of a status) is a note under the printed table


def format_value(value: Any) -> str:
    """One table cell: 4 significant digits, thousands separators from 1000 up, `—` for missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return _EMPTY
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, list | tuple):
        return ", ".join(map(str, value)) if value else _EMPTY
    return str(value)


class Keys:
    """The row keys a tool writes, each an attribute named after itself (`KEYS.fwd_ms == "fwd_ms"`).

    A tool declares its keys once and readers (bench-report) import them from it instead of
    typing the strings again, so a key renamed in the tool fails loudly in the reader (an
    `AttributeError`) rather than silently reading nothing.

    Example::

        KEYS = Keys("impl", "fwd_ms")
        row[KEYS.fwd_ms]
    """

    __slots__ = ("_names",)

    def __init__(self, *names: str) -> None:
        bad = [n for n in names if not n.isidentifier()]
        if bad:
            raise ValueError(f"row keys must be identifiers, got {bad}")
        object.__setattr__(self, "_names", tuple(dict.fromkeys(names)))

    def __getattr__(self, name: str) -> str:
        if name in self._names:
            return name
        raise AttributeError(f"no row key {name!r}; the tool writes {', '.join(self._names)}")

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Keys are read-only")

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)


def _columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(row))
    return list(seen)


def to_markdown(rows: Sequence[Mapping[str, Any]], *, columns: Sequence[str] | None = None) -> str:
    """A GitHub Markdown table of `rows`.

    Args:
        rows: flat dicts; a key missing from a row is an empty cell.
        columns: which keys to show, in order; every key seen, in first-seen order, when None.

    A row whose `status` is `OOM` shows `OOM` in each cell it has no value for, so the
    out-of-memory region of a sweep reads at a glance; other missing cells show `—`.
    """
    if not rows:
        return "(no rows)"
    columns = list(columns) if columns is not None else _columns(rows)
    cells = []
    for row in rows:
        fill = OOM if row.get("status") == OOM else _EMPTY
        cells.append([fill if row.get(c) is None else format_value(row.get(c)) for c in columns])
    return tabulate(cells, headers=columns, tablefmt="pipe", disable_numparse=True)


def brief_table(
    rows: Sequence[Mapping[str, Any]], *, columns: Mapping[str, str], priority: Sequence[str]
) -> str:
    """The rows as a Markdown table of `columns` (key → header, in order) that fits
    `TABLE_WIDTH`: long text cells as numbered notes under it, `NOISY` cells as `noisy`, and
    the last columns of `priority` left out (and named) while it is wider."""
    notes: dict[str, int] = {}

    def cell(row: Mapping[str, Any], key: str) -> str:
        value, fill = row.get(key), OOM if row.get("status") == OOM else _EMPTY
        text = fill if value is None else "noisy" if key in row.get(NOISY, ()) else None
        text = text or format_value(value)
        long = isinstance(value, str) and len(text) > _LONGEST_CELL
        return f"[{notes.setdefault(text, len(notes) + 1)}]" if long else text

    ranked = [k for k in priority if k in columns]
    while True:
        keys = [k for k in columns if k in ranked]
        cells = [[columns[k] for k in keys], *([cell(r, k) for k in keys] for r in rows)]
        widths = [max(len(row[i]) for row in cells) for i in range(len(keys))]
        cells.insert(1, ["-" * w for w in widths])
        lines = ["| " + " | ".join(map(str.ljust, row, widths)) + " |" for row in cells]
        if len(lines[0]) <= TABLE_WIDTH or len(ranked) == 1:
            break
        ranked.pop()
        notes.clear()
    lines += [_wrapped(f"[{n}] {text}") for text, n in notes.items()]
    left_out = [k for k in priority if k in columns and k not in ranked]
    if left_out:
        lines.append(_wrapped(f"Not shown: {', '.join(left_out)} (--wide shows them)."))
    return "\n".join(lines)


def _wrapped(text: str, indent: str = "") -> str:
    """`text` in lines of `TABLE_WIDTH` (a Markdown paragraph or list item reads the same)."""
    return textwrap.fill(text, TABLE_WIDTH, subsequent_indent=indent, break_long_words=False)


@dataclass
class Run:
    """One tool invocation's rows and everything needed to trust and reproduce them.

    Attributes:
        tool: short tool name (`"attn"`, `"model"`, ...); `bench-report` files the run by it.
        rows: flat dicts, one per measurement; each has a `status` (`"ok"`, `"OOM"`, or
            `"skipped: <reason>"`) when measurements can fail.
        config: the tool's options as given (JSON-ready).
        env: `collect_env(...)` of the device measured.
        command: the exact command line.
        date: UTC ISO time the run was made.
        title: one line saying what was measured.
        columns: the columns a table shows, in order (None: every key).
        group_by: a key whose values split the rows into separate tables (for a tool whose rows
            are of several kinds); each table shows only the columns its rows fill.
        notes: sentences that must travel with the numbers (CPU default, assumed peaks, ...).
        plots: image files drawn from the rows, relative to the JSON file once saved.
        brief: the printed table's columns (see the module docstring); None: every column.
        schema: the JSON schema version.
    """

    tool: str
    rows: list[dict[str, Any]]
    config: dict[str, Any]
    env: dict[str, Any]
    command: str
    date: str
    title: str = ""
    columns: list[str] | None = None
    group_by: str | None = None
    notes: list[str] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    brief: dict[str, str] | None = None
    schema: str = SCHEMA

    @classmethod
    def create(
        cls,
        tool: str,
        rows: Iterable[Mapping[str, Any]],
        *,
        device: torch.device | str,
        config: Mapping[str, Any],
        command: str | None = None,
        title: str = "",
        columns: Sequence[str] | None = None,
        group_by: str | None = None,
        notes: Iterable[str] = (),
        env: Mapping[str, Any] | None = None,
        brief: Mapping[str, str] | None = None,
    ) -> Run:
        """Build a run, collecting the environment of `device` now (or taking `env`).

        Args:
            tool: short tool name.
            rows: the measurements.
            device: the device measured.
            config: the options that produced the rows.
            command: the command line; the process's own when None.
            title: one line saying what was measured.
            columns: table columns in order (None: every key).
            group_by: split the table by this key's values.
            notes: sentences that must travel with the numbers.
            env: the `collect_env` record of a measurement made elsewhere (e.g. read back from
                its files), used instead of this machine's; `command` still replaces its command.
            brief: the printed table's columns, key → header (see the module docstring).
        """
        if env is None:
            env = collect_env(device, command=command)
        else:
            env = {**env, "command": command if command is not None else env["command"]}
        return cls(
            tool=tool,
            rows=[dict(r) for r in rows],
            config=_jsonable(dict(config)),
            env=env,
            command=env["command"],
            date=env["date"],
            title=title,
            columns=list(columns) if columns is not None else None,
            group_by=group_by,
            notes=list(notes),
            brief=dict(brief) if brief is not None else None,
        )

    @property
    def ok_rows(self) -> list[dict[str, Any]]:
        """The rows whose measurement completed (`status` missing or `"ok"`)."""
        return [r for r in self.rows if r.get("status", OK) == OK]

    def table(self, *, wide: bool = True) -> str:
        """The rows as a Markdown table in `columns` order (one table per `group_by` value);
        unless `wide`, of `brief`'s columns (`brief_table`), a group without one left out."""
        brief = None if wide or self.brief is None else self.brief
        parts, hidden = [], 0
        for value, rows, columns in self.groups():
            if brief is None:
                table = to_markdown(rows, columns=columns)
            elif any(c in brief for c in columns):
                shown = {c: brief[c] for c in columns if c in brief}
                table = brief_table(rows, columns=shown, priority=list(brief))
            else:
                hidden += 1
                continue
            parts.append(table if value is None else f"**{value}**\n\n{table}")
        if hidden:
            parts.append(f"{hidden} more table(s): --wide prints them, --markdown writes them.")
        return "\n\n".join(parts)

    def groups(self) -> list[tuple[Any, list[dict[str, Any]], list[str]]]:
        """The table's parts: `(group_by value, rows, columns they fill)`; one part, value
        None and all `columns`, when the run is not grouped."""
        columns = self.columns if self.columns is not None else _columns(self.rows)
        if self.group_by is None:
            return [(None, self.rows, list(columns))]
        groups: dict[Any, list[dict[str, Any]]] = {}
        for row in self.rows:
            groups.setdefault(row.get(self.group_by), []).append(row)
        return [
            (
                value,
                rows,
                [
                    c
                    for c in columns
                    if c != self.group_by and any(r.get(c) is not None for r in rows)
                ],
            )
            for value, rows in groups.items()
        ]

    @property
    def plot_title(self) -> str:
        """The title with the device it ran on, for a figure that leaves the table behind."""
        device = str(self.env.get("device_name") or self.env.get("device") or "")
        return self.title if not device or device in self.title else f"{self.title}, {device}"

    def header(self, *, separator: str = " ") -> str:
        """One Markdown paragraph naming device, versions, date and command: three sentences
        joined by `separator` (a newline keeps each on a line of its own in a terminal)."""
        e = self.env
        triton = f", triton {e['triton']}" if e.get("triton") else ""
        return separator.join(
            [
                f"Device: {e.get('device_name')} ({e.get('device')}); torch {e.get('torch')}"
                f"{triton}, python {e.get('python')}; {self.date}.",
                f"Command: `{self.command}`.",
                code_line(e),
            ]
        )

    def to_markdown(self, *, wide: bool = True) -> str:
        """Title, metadata, notes and table, ready to print or paste; unless `wide`, the
        printed form: the brief table, the prose wrapped to `TABLE_WIDTH` characters."""
        notes = [f"- {n}" if wide else _wrapped(f"- {n}", "  ") for n in self.notes]
        parts = [f"### {self.title}"] if self.title else []
        parts.append(self.header(separator=" " if wide else "\n"))
        return "\n\n".join([*parts, *notes, self.table(wide=wide)])


def code_line(env: Mapping[str, Any]) -> str:
    """The code a result measured, in one sentence: revision (and how it is known), whether the
    tree was dirty, and the package versions (`Code: 1a2b3c4d5e6f (dirty); fa2 0.1.0, ...`)."""
    revision = env.get("git_revision")
    if not revision:
        return "Code: revision not recorded."
    dirty = {True: " (uncommitted changes)", False: "", None: ""}[env.get("git_dirty")]
    source = env.get("git_revision_source")
    how = f" ({source})" if source else ""
    packages = env.get("packages") or {}
    versions = ", ".join(f"{name.removeprefix('cs336sys-')} {v}" for name, v in packages.items())
    return f"Code: `{revision[:12]}`{how}{dirty}" + (f"; {versions}." if versions else ".")


def _jsonable(value: Any) -> Any:
    """Values made JSON-ready: paths, dtypes and devices as str, tuples as lists, numbers kept."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def save_json(run: Run, path: str | os.PathLike[str]) -> Path:
    """Write `run` as JSON (schema `SCHEMA`) to `path`, creating folders; return the path.

    Non-finite floats are written as `Infinity`, `-Infinity` or `NaN`, which `load_json` reads
    back unchanged.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = asdict(run)
    data["rows"] = _jsonable(data["rows"])
    data["env"] = _jsonable(data["env"])
    path.write_text(json.dumps(data, indent=1, allow_nan=True) + "\n")
    return path


# The columns every CSV row ends with: where and when the run was made, on which code.
CSV_PROVENANCE = ("tool", "device_name", "date", "git_revision")


def save_csv(run: Run, path: str | os.PathLike[str]) -> Path:
    """Write `run`'s rows as CSV to `path`, creating folders; return the path.

    The columns are `run.columns` (or every key, in first-seen order), then any other key a row
    holds, then `CSV_PROVENANCE`. An empty cell is a value the row does not have; booleans are
    `true`/`false`, floats keep every digit (`repr`), non-finite ones read `inf`, `-inf`, `nan`
    as pandas and spreadsheets parse them.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = [*(run.columns or ()), *_columns(run.rows)]
    keys = [k for k in dict.fromkeys(keys) if k not in CSV_PROVENANCE]
    provenance = {
        "tool": run.tool,
        "device_name": run.env.get("device_name") or run.env.get("device"),
        "date": run.date,
        "git_revision": run.env.get("git_revision"),
    }
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*keys, *CSV_PROVENANCE])
        for row in run.rows:
            cells = [row.get(k) for k in keys] + [provenance[k] for k in CSV_PROVENANCE]
            writer.writerow([_csv_cell(v) for v in cells])
    return path


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # inf, -inf, nan as Python and pandas spell them
    if isinstance(value, list | tuple | dict):
        return json.dumps(_jsonable(value))
    return str(value)


def load_json(path: str | os.PathLike[str]) -> Run:
    """Read a run written by `save_json`.

    Raises:
        ValueError: if the file is not a bench result (no or another `schema`).
    """
    data = json.loads(Path(path).read_text())
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema not in (SCHEMA, _OLD_NAMES_SCHEMA):
        raise ValueError(f"{path} is not a bench result file (expected schema {SCHEMA!r})")
    fields = Run.__dataclass_fields__
    run = Run(**{k: v for k, v in data.items() if k in fields})
    if schema == _OLD_NAMES_SCHEMA:
        run.rows = [renamed_row(run.tool, row) for row in run.rows]
        run.schema = SCHEMA  # its names are the new ones now
    return run


def result_stem(topic: str, env: Mapping[str, Any], *, num_devices: int = 1) -> str:
    """The conventional file stem `<topic>_<device>_<date>` for `docs/results/`.

    The device part is the chip's model number where the name has one (`"NVIDIA H100 80GB
    HBM3"` → `h100`, as the committed results are named), else the name lower-cased with runs
    of non-alphanumerics as `-`; `cpu` on a CPU. A measurement over `num_devices` GPUs names
    the count (`2xh100`). The date is the run's day.
    """
    name = str(env.get("device_name", env.get("device", "device"))).lower()
    chip = re.search(r"\b[abhl]\d{2,3}\b", name)
    slug = chip.group(0) if chip else "-".join(re.sub(r"[^a-z0-9]+", " ", name).split())
    if env.get("device_type") == "cpu":
        slug = "cpu"
    elif num_devices > 1:
        slug = f"{num_devices}x{slug}"
    return f"{topic}_{slug}_{str(env.get('date', ''))[:10]}"

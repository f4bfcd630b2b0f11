"""The results a report is built from, and the small helpers its answers share.

`Results.collect(folder)` reads every bench result in a folder and one level down (profile
runs live in `<profile>/<profile>.json`), plus the hand-written records that carry an `env`
with a revision (GPU test records) and bench-train's `train_text_*` records. Each row handed to
an answer carries where it came from, so that every number the answers quote is cited with its
file and the code revision it measured (`Results.cite`).

A result that a newer one of the same kind replaces is an earlier run (`Results.earlier`): the
same tool on the same device, and either the same topic (the file name less `_<device>_<date>`,
`model_h100_2026-11-22` → `model`) or cells that newer runs all measured again (an attention
grid whose every (implementation, d, seq) a later grid holds). Answers quote current results
only; the report lists earlier runs apart, without their numbers.
"""

from __future__ import annotations

import json
import os
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.core.oom import OK, OOM
from bench.core.results import Run, load_json
from bench.plan.check import dims_on, recorded_size_label
from bench.tools import allreduce, attn, flash
from bench.train.results import text_title
from bench.train.summary import run_env
from lmcore import MODEL_SIZES

__all__ = [
    "DIM_KEYS",
    "OK",
    "OOM",
    "Record",
    "Results",
    "Rows",
    "fmt",
    "grouped",
    "name_with_dims",
    "num",
    "ok",
    "pairs",
    "size_label",
    "span",
    "topic",
]

Rows = list[dict[str, Any]]

# The key every tagged row carries: the index of the result it came from.
SOURCE = "_source"

# `<topic>_<device>_<date>[_suffix]` (`bench.core.results.result_stem`): the date and what
# follows it, then the device (a chip's model number, `2xh200` for two, or `cpu`).
_DATED = re.compile(r"_\d{4}-\d{2}-\d{2}.*$")
_DEVICE = re.compile(r"_(?:\d+x)?(?:[abhl]\d{2,3}|cpu)$")
# The GPU count a result's name gives its device (`_2xh200_`); one where it gives none.
_GPUS = re.compile(r"_(\d+)x[abhl]\d{2,3}_")

# The keys that say what a row measured (not what it found), for the tools whose results are
# grids that later runs may measure again in other files: a result all of whose cells newer
# results of the same tool hold is an earlier run.
_A, _R, _F = attn.KEYS, allreduce.KEYS, flash.KEYS
_CELLS: dict[str, tuple[str, ...]] = {
    "attn": (_A.impl, _A.batch, _A.d, _A.seq, _A.dtype, _A.causal),
    "allreduce": (_R.backend, _R.world_size, _R.size_mb),
    "flash": (_F.impl, _F.batch, _F.seq, _F.seq_k, _F.d, _F.dtype, _F.causal, _F.grad),
}

# Tools whose cells name what they measured on any machine: an all-reduce's cell is its backend,
# process count and size (gloo's on a CPU alone), and §13's table holds one time a cell.
_ANY_DEVICE = frozenset({"allreduce"})

# A result file named in prose: `docs/results/allreduce_2xh200_2026-11-22.json`.
_MENTIONED = re.compile(r"([\w.-]+\.json)\b")

# The keys a row records a model's dimensions under, in `size_label`'s order.
DIM_KEYS = ("d_model", "d_ff", "num_layers", "num_heads")

# Sizes whose name meant other dimensions in the 2025 handout: a row that records no
# dimensions cannot say which it measured.
_RENAMED = frozenset({"xl"})


def topic(path: str | os.PathLike[str]) -> str:
    """The kind of result a file holds: its name less `_<device>_<date>` and what follows
    (`memory_fp32_h100_2026-11-25.json` → `memory_fp32`, `plan_check_2026-11-25` →
    `plan_check`)."""
    return _DEVICE.sub("", _DATED.sub("", Path(path).stem))


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
    earlier: dict[Path, list[Record]] = field(default_factory=dict)

    @classmethod
    def collect(cls, folder: str | os.PathLike[str], *, newest_gpu: bool = False) -> Results:
        """Read `folder/*.json` and `folder/*/*.json` (Chrome traces passed over).

        With `newest_gpu`, a newer GPU result of a topic also replaces an older one measured on
        another GPU (the write-up answers each problem from one run; the full report keeps
        every GPU's).

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
                out.records.append(Record(path, _with_study(load_json(path))))
            except (ValueError, TypeError, KeyError) as exc:
                record = _hand_written(path) or _train_text(path)
                if record is None:
                    out.skipped.append(f"{path.relative_to(folder).as_posix()}: {exc}")
                else:
                    out.records.append(record)
        out.records.sort(key=lambda r: r.run.date)
        out.earlier = _superseded(out.records, any_gpu=newest_gpu)
        return out

    def current(self, record: Record) -> bool:
        """Whether no newer result of the same kind replaces `record` (see the module)."""
        return record.path not in self.earlier

    def runs(self, tool: str, *, stem: str | None = None) -> list[Record]:
        """The records of `tool` (whose file name starts with `stem`, when given)."""
        return [
            r
            for r in self.records
            if r.run.tool == tool and (stem is None or r.path.stem.startswith(stem))
        ]

    def rows(
        self, tool: str, *, stem: str | None = None, latest: bool = False, earlier: bool = False
    ) -> Rows:
        """The rows of `tool`'s current results (not those of earlier runs), each tagged with
        its source (see `cite`); those measured on a GPU only, where there are any (except for
        the tools whose cells say what they measured on any machine, `_ANY_DEVICE`).

        Args:
            tool: the tool that wrote them.
            stem: only files whose name starts with this.
            latest: only the newest such file's rows.
            earlier: earlier runs' rows too (for a record made in parts, e.g. a test suite run
                a few files at a time, whose parts replace one another by name).
        """
        records = [r for r in self.runs(tool, stem=stem) if earlier or self.current(r)]
        on_gpu = [r for r in records if r.run.env.get("device_type") == "cuda"]
        if tool not in _ANY_DEVICE:
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

    def cite_records(self, records: Iterable[Record]) -> str:
        """`(source: ...)` for whole result files (a number taken from a file, not a row)."""
        found = [r.citation for r in records]
        return f"(source: {'; '.join(found)})" if found else ""

    def cite_mentioned(self, text: str) -> str:
        """`(source: ...)` for the result files `text` names (`name.json`), with revisions."""
        names = dict.fromkeys(_MENTIONED.findall(text))
        return self.cite_records(r for r in self.records if r.path.name in names)

    def record_of(self, row: dict[str, Any]) -> Record:
        return self.records[row[SOURCE]]


def _device(record: Record) -> tuple[Any, Any]:
    env = record.run.env
    return env.get("device_type"), env.get("device_name")


def _cells(record: Record) -> set[tuple]:
    """The cells a result measured (rows whose status is not a failure or a skip)."""
    keys = _CELLS[record.run.tool]
    return {
        tuple(row.get(k) for k in keys) for row in record.run.rows if row.get("status", OK) == OK
    }


def _superseded(records: Sequence[Record], *, any_gpu: bool = False) -> dict[Path, list[Record]]:
    """Each earlier run (`records` oldest first) and the current results that replace it (on
    the same device; with `any_gpu`, a GPU run replaces one on any GPU)."""
    out: dict[Path, list[Record]] = {}
    for i in range(len(records) - 1, -1, -1):  # newest first: the newer ones are settled
        old = records[i]
        newer = [
            r
            for r in records[i + 1 :]
            if r.path not in out
            and r.run.tool == old.run.tool
            and (
                _device(r) == _device(old)
                or r.run.tool in _ANY_DEVICE
                or (any_gpu and _device(r)[0] == _device(old)[0] == "cuda")
            )
            and str(r.run.date) > str(old.run.date)
        ]
        # Two GPUs' run replaces no one-GPU run of its topic; cells say what they measured
        # (an all-reduce's include its process count), whatever machine measured them.
        same = [
            r
            for r in newer
            if topic(r.path) == topic(old.path) and _gpus(r.path) == _gpus(old.path)
        ]
        if same:
            out[old.path] = same
        elif old.run.tool in _CELLS and newer and old.run.rows:
            cells = _cells(old)
            covering = [r for r in newer if _cells(r) & cells]
            if cells <= set().union(*(_cells(r) for r in covering)):
                out[old.path] = covering
    return out


def _gpus(path: Path) -> int:
    found = _GPUS.search(path.name)
    return int(found[1]) if found else 1


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
    env = _hand_written_env(data)
    run = Run(
        tool=tool,
        rows=[r for r in data.get("rows", []) if isinstance(r, dict)],
        config={},
        env=env,
        command=_hand_written_command(data),
        date=str(env.get("date", meta.get("date", data.get("date", "")))),
        title=str(meta.get("title", path.stem)),
    )
    return Record(path, run)


# A script's device with its GPU count: `NVIDIA H200 x2`.
_DEVICE_COUNT = re.compile(r"^(.+?) x(\d+)$")


def _hand_written_env(data: dict[str, Any]) -> dict[str, Any]:
    """A hand-written record's environment: its `env`, or, where a script kept the machine at
    the top level (`device`, `torch`, `git_revision`, `date`) and `env` holds the environment
    variables it ran under (`scripts/ddp_overlap.py`), that machine, its revision's note
    saying how the revision is known."""
    env = data["env"]
    if env.get("device_name") or not data.get("device"):
        return env
    device = str(data["device"])
    found = _DEVICE_COUNT.match(device)
    machine = {
        "device_type": "cuda" if found or "NVIDIA" in device else None,
        "device_name": found[1] if found else device,
        "gpu_count": int(found[2]) if found else None,
        "torch": data.get("torch"),
        "git_revision": data.get("git_revision"),
        "git_revision_source": data.get("git_revision_note"),
        "git_dirty": data.get("git_dirty"),
        "date": data.get("date"),
    }
    return {k: v for k, v in machine.items() if v is not None}


def _hand_written_command(data: dict[str, Any]) -> str:
    """What a hand-written record says was run: its command, else its rows' commands, else the
    scripts it carries (in `meta.scripts`), else ""."""
    meta = data.get("meta") or {}
    command = meta.get("command") or data.get("command")
    if command:
        return str(command)
    rows = [r for r in data.get("rows", []) if isinstance(r, dict)]
    commands = list(dict.fromkeys(str(r["command"]) for r in rows if r.get("command")))
    if commands:
        return "; ".join(commands)
    scripts = meta.get("scripts")
    if isinstance(scripts, dict) and scripts:
        return "python3 " + "; python3 ".join(scripts) + " (the scripts are in the file's meta)"
    return ""


def _train_text(path: Path) -> Record | None:
    """A bench-train real-text record (`bench.train.results.text_result`: the run's summary
    and metrics) as a run of one row, or None when `path` is not one."""
    try:
        data = json.loads(path.read_text())
        summary, metrics = data["summary"], data["metrics"]
        env = run_env(summary)
    except (OSError, ValueError, TypeError, KeyError):
        return None
    evaluated = [m for m in metrics if m.get("val_loss") is not None]
    best = min(evaluated, key=lambda m: m["val_loss"]) if evaluated else {}
    row = {
        "steps": summary["steps"],
        "final_train_loss": summary["final_train_loss"],
        "final_val_loss": summary.get("final_val_loss"),
        "best_val_loss": best.get("val_loss"),
        "best_val_step": best.get("step"),
        "tokens_per_s": summary["tokens_per_s"],
        "mfu": summary.get("mfu"),
        "first_step_s": summary.get("first_step_s"),
        "parameters": summary["parameters"],
    }
    run = Run(
        tool="train_text",
        rows=[row],
        config=summary["config"],
        env=env,
        command=str(env.get("command", "")),
        date=str(env.get("date", "")),
        title=text_title(summary),
        notes=[str(n) for n in data.get("notes") or []],
    )
    text = path.with_suffix(".md")
    if text.is_file():
        run.notes.append(
            f"`{text.name}` holds the generated sample and, where the run had one, its speed "
            "beside the same command under `--baseline torch`."
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


def size_label(row: dict[str, Any], *, date: str | None = None) -> str:
    """A size with its dimensions, `xl (2560/10240/32L/32H)`: names changed between handouts
    (2025's xl was 1600 wide, and reads `xl-2025 (1600/6400/48L/25H; recorded as xl)`), so a
    table never shows a name alone. A row without dimensions takes its name's from lmcore's
    table, except a renamed size's (`xl`): that one takes the dimensions its name meant on the
    `date` its result was measured (`bench.plan.check.dims_on`), or, without a date, says that
    it did not record them."""
    name = str(row.get("size", "?"))
    dims = [row.get(k) for k in DIM_KEYS]
    if all(d is not None for d in dims):
        return recorded_size_label(name, dims)
    size = MODEL_SIZES.get(name)
    if name in _RENAMED:
        if date:
            return recorded_size_label(name, dims_on(name, str(date)))
        return f"{name} (dimensions not recorded)"
    if size is None or row.get("d_model") is not None:
        return name
    return recorded_size_label(name, [size.d_model, size.d_ff, size.num_layers, size.num_heads])


def name_with_dims(
    text: str, shape: dict[str, Any] | None = None, *, date: str | None = None
) -> str:
    """`text` (a result's title) with the sizes it names first after its colon given their
    dimensions (`Data-parallel training step: xl, ...` → `...: xl-2025 (1600/6400/48L/25H;
    recorded as xl), ...`; `scaling: small, xl, context 256` names both), from the run's
    `shape` (its config's) where it has one, else from what the name meant on the run's `date`
    (see `size_label`). A size already followed by its dimensions is left as it is."""
    head, sep, rest = text.partition(": ")
    if not sep:
        return text
    parts = rest.split(", ")
    for i, part in enumerate(parts):
        word = part.split(" ")[0]
        if word not in MODEL_SIZES:
            break
        if re.match(r" \(\d", part[len(word) :]):  # `small (768/...)`: labelled already
            continue
        mine = shape if shape and shape.get("name", word) == word and i == 0 else {}
        parts[i] = size_label({"size": word, **(mine or {})}, date=date) + part[len(word) :]
    return f"{head}{sep}{', '.join(parts)}"


def _with_study(run: Run) -> Run:
    """`run`, its bench-model rows saying what the run was for (`study`): results recorded
    before the rows said it are read by the options their command gave."""
    if run.tool != "model" or all("study" in row for row in run.rows):
        return run
    study = "timing"
    if "--memory-snapshot" in run.command:
        study = "memory"
    elif "--profile" in run.command:
        study = "profile"
    run.rows = [{**row, "study": study} for row in run.rows]
    return run

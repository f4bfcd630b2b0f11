"""bench-step's `--profile DIR`: where a row's step spends its time, kernel category by kernel
category, per phase and per rank.

After a row's timed steps and its instrumented one (so neither the timing nor the memory split
sees the profiler), every rank runs one more step under `torch.profiler` (CPU and CUDA
activities; no shapes, no stacks: the leaderboard step is long, and each of its events would
carry them into the trace). The step's phases are `record_function` ranges
opened and closed by `PhaseRanges` through the step's phase hooks, the ones the instrumented
step reads memory at (`bench.tools.step.full_step`); each range closes after the device is
synchronised, so it spans its phase's kernels on the device as well as on the host.

From that one step, per rank and phase (`forward`, `backward` with its recomputation,
`optimizer`, and `all`: the whole step):

- **category** rows: bench-model's kernel table (`bench.tools.model.profile.profile_rows`):
  every kernel once, attributed to the phase its launch fell in, split by `kernel_category`
  (matmul, attention, softmax, elementwise, communication, optimizer, other) with its number of
  kernels, time and share of the phase's kernel time (kernels on concurrent streams, NCCL's
  beside compute, add up past the wall time);
- **phase** rows: how the device spent the phase's wall time (`bench.core.profiling
  .device_time`, from the kernels' device-side start and end): the compute kernels' summed time,
  the time some compute kernel ran, the time some NCCL kernel ran, the part of it no compute ran
  beside (exposed communication) and the time no kernel ran at all (idle). On a CPU (gloo) the
  operators are the work, timed on the host: only the wall time is known.

Files in DIR: per row and rank `<row>_rank<r>.pt.trace.json.gz` (Chrome/Perfetto; left out past
`MAX_TRACE_BYTES`) and `<row>_rank<r>_kernels.md` (bench-model's tables: ranges, then each
phase's categories and largest kernels); for the run, `<DIR name>.json` and `.md` (a `Run` of
tool `step-profile`, `STEP_PROFILE_COLUMNS`; the Markdown opens with `phase_summary`: a line
per row, rank and phase with each category's ms beside the device split).

Example::

    ranges = PhaseRanges(device)
    with phase_hooks(step, start=ranges.start, mark=ranges.mark):
        rows = profile_step(step, directory=Path("profile"), row="ours_fsdp", rank=0,
                            device=device)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bench.core.env import collect_env, device_name
from bench.core.memory import MIB
from bench.core.profiling import (
    device_kernels,
    device_time,
    is_range,
    on_cpu,
    profiler_activities,
)
from bench.core.results import Keys, Run, load_json, save_json, to_markdown
from bench.core.timing import synchronize
from bench.tools.model.profile import CATEGORIES, kernel_tables, profile_rows, trace_events
from bench.tools.step.memory import PHASES

__all__ = [
    "MAX_TRACE_BYTES",
    "STEP_PROFILE_COLUMNS",
    "STEP_PROFILE_KEYS",
    "PhaseRanges",
    "breakdown_rows",
    "kernel_parity",
    "phase_summary",
    "profile_step",
    "rebuild_step_profile",
    "save_step_profile",
]

# A trace larger than this (gzipped) is left out, its kernel table kept: it bounds what each
# row and rank adds to DIR, and keeps every trace one that a browser's Perfetto tab opens.
MAX_TRACE_BYTES = 256 * MIB
# The whole step, beside its phases.
_ALL = "all"
# How bench-step names its torch-native rows (`kernel_parity` pairs ours' rows with them).
NATIVE_ROW = "torch-native"
_TRACE_SUFFIX = ".pt.trace.json.gz"
_DEVICE_COLUMNS = ("wall_ms", "kernel_ms", "busy_ms", "comm_ms", "exposed_comm_ms", "idle_ms")
STEP_PROFILE_COLUMNS = [
    "row", "rank", "phase", "kind", "category", "kernels", "total_ms", "share", *_DEVICE_COLUMNS,
]  # fmt: skip
# Every key of a row, for readers.
STEP_PROFILE_KEYS = Keys(*STEP_PROFILE_COLUMNS)


class PhaseRanges:
    """`record_function` ranges over a step's phases (`PHASES`), driven by the step's hooks:
    `start` opens `forward`; `mark(phase)` synchronises the device, closes `phase` and opens the
    next. Synchronised at both ends, a range spans its phase's kernels on the device too.

    Args:
        device: the device the step runs on.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._open: tuple[str, Any] | None = None

    def _enter(self, phase: str) -> None:
        scope = torch.profiler.record_function(phase)
        scope.__enter__()
        self._open = (phase, scope)

    def start(self) -> None:
        """Open the first phase, the device idle."""
        synchronize(self.device)
        self._enter(PHASES[0])

    def mark(self, phase: str) -> None:
        """Close `phase` once the device has finished its work; open the next, if any."""
        synchronize(self.device)
        if self._open is None or self._open[0] != phase:
            raise RuntimeError(f"phase {phase!r} ended, but {self._open} was open")
        self._open[1].__exit__(None, None, None)
        self._open = None
        following = PHASES.index(phase) + 1
        if following < len(PHASES):
            self._enter(PHASES[following])


def _windows(events: Sequence[Any]) -> dict[str, tuple[float, float]]:
    """Each phase's range on the host (µs), and `all` from the first phase's start to the last's
    end; the profiled step has one of each (a range of the same name inside it is covered)."""
    found: dict[str, tuple[float, float]] = {}
    for e in events:
        if is_range(e) and on_cpu(e) and e.name in PHASES:
            start, end = found.get(e.name, (e.time_range.start, e.time_range.end))
            found[e.name] = (min(start, e.time_range.start), max(end, e.time_range.end))
    if found:
        found[_ALL] = (min(s for s, _ in found.values()), max(e for _, e in found.values()))
    return found


def _summed(
    kernel_rows: Sequence[Mapping[str, Any]], phases: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """The `phases`' category rows added up per category, shares of their sum: the whole step
    as its window (the first phase's start to the last's end) holds it. `profile_rows`' own
    `all` holds the whole profile: the barrier before the step, NCCL's set-up in it."""
    found: dict[str, dict[str, Any]] = {}
    for r in kernel_rows:
        if r["kind"] == "category" and r["phase"] in phases:
            line = found.setdefault(r["category"], {"calls": 0, "total_ms": 0.0})
            line["calls"] += r["calls"]
            line["total_ms"] += r["total_ms"]
    total = sum(line["total_ms"] for line in found.values())
    return {c: line | {"share": line["total_ms"] / total} for c, line in found.items()}


def breakdown_rows(
    kernel_rows: Sequence[Mapping[str, Any]],
    kernels: Sequence[tuple[str, float, float]],
    windows: Mapping[str, tuple[float, float]],
    *,
    row: str,
    rank: int,
    on_cuda: bool,
) -> list[dict[str, Any]]:
    """One rank's profile of one row as `STEP_PROFILE_COLUMNS` rows; times in ms.

    Args:
        kernel_rows: `profile_rows` of the step (its `category` rows are taken).
        kernels: the device's `(name, start, end)` (µs), `bench.core.profiling.device_kernels`.
        windows: each phase's `(start, end)` on the host (µs), and `all`.
        row: the row's label.
        rank: this rank.
        on_cuda: the kernels are CUDA's (else nothing ran on a device: wall time only).

    Returns:
        Per phase of `windows`, in `PHASES` order then `all`: a `phase` row (wall time, and on
        CUDA `bench.core.profiling.DeviceTime`'s split of it), then a `category` row per
        category that ran (kernels, total_ms, share of the phase's kernel time); `all`'s are
        the phases' added up (the work outside them is not the step's).
    """
    out: list[dict[str, Any]] = []
    base = dict.fromkeys(STEP_PROFILE_COLUMNS) | {"row": row, "rank": rank}
    for phase in [p for p in (*PHASES, _ALL) if p in windows]:
        start, end = windows[phase]
        split = {"wall_ms": (end - start) / 1e3}
        if on_cuda:
            spent = device_time(kernels, window=(start, end))
            split = {c: getattr(spent, c) for c in _DEVICE_COLUMNS}
        out.append({**base, "phase": phase, "kind": "phase", **split})
        categories = (
            _summed(kernel_rows, [p for p in PHASES if p in windows])
            if phase == _ALL
            else {
                r["category"]: r
                for r in kernel_rows
                if r["kind"] == "category" and r["phase"] == phase
            }
        )
        out += [
            {
                **base,
                "phase": phase,
                "kind": "category",
                "category": c,
                "kernels": categories[c]["calls"],
                "total_ms": categories[c]["total_ms"],
                "share": categories[c]["share"],
            }
            for c in CATEGORIES
            if c in categories
        ]
    return out


def phase_summary(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows pivoted: one per (row, rank, phase), the phase row's device split, then each
    category's ms (`<category>_ms`; None where none ran), for reading phases side by side."""
    out: dict[tuple[str, int, str], dict[str, Any]] = {}
    for r in rows:
        key = (r["row"], r["rank"], r["phase"])
        line = out.setdefault(
            key, {"row": r["row"], "rank": r["rank"], "phase": r["phase"]}
            | dict.fromkeys(_DEVICE_COLUMNS) | {f"{c}_ms": None for c in CATEGORIES}
        )  # fmt: skip
        if r["kind"] == "phase":
            line.update({c: r.get(c) for c in _DEVICE_COLUMNS})
        else:
            line[f"{r['category']}_ms"] = r["total_ms"]
    return list(out.values())


def kernel_parity(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """How far kernel parity alone could take each of ours' steps: per rank, over the whole
    step, each compute category's ms in ours' row and in the torch-native row of the same
    checkpointing (`ours / native`), and ours' step with every category at the faster of the
    two and ours' own exposed communication and idle time (`at_parity_ms`), over the
    torch-native step's wall time. A category both rows run at the same speed leaves the step
    as it is; what the faster row does less of (a kernel it never launches) counts too.
    CUDA runs only (a CPU run has no device split); [] without a torch-native row."""
    whole = {(r["row"], r["rank"]): r for r in rows if r["phase"] == _ALL and r["kind"] == "phase"}
    if not any(r.get("busy_ms") is not None for r in whole.values()):
        return []
    spent: dict[tuple[str, int], dict[str, float]] = {}
    for r in rows:
        if r["phase"] == _ALL and r["kind"] == "category" and r["category"] != "communication":
            spent.setdefault((r["row"], r["rank"]), {})[r["category"]] = r["total_ms"]
    natives = [key for key in whole if key[0].startswith(NATIVE_ROW)]
    out = []
    for (row, rank), phase in whole.items():
        if row.startswith(NATIVE_ROW):
            continue
        checkpointing = row.rsplit("_", 1)[-1]  # a row's name ends in its checkpointing
        same = [n for n in natives if n[1] == rank and n[0].rsplit("_", 1)[-1] == checkpointing]
        if not same:
            continue
        native, ours = whole[same[0]], spent.get((row, rank), {})
        theirs = spent.get(same[0], {})
        line: dict[str, Any] = {"row": row, "rank": rank, "native": same[0][0]}
        for c in CATEGORIES:
            if c != "communication" and (c in ours or c in theirs):
                line[c] = f"{ours.get(c, 0.0):,.1f} / {theirs.get(c, 0.0):,.1f}"
        rest = (phase["exposed_comm_ms"] or 0.0) + (phase["idle_ms"] or 0.0)
        at_parity = rest + sum(
            min(ours.get(c, 0.0), theirs.get(c, 0.0)) for c in set(ours) | set(theirs)
        )
        line.update(
            exposed_comm_and_idle_ms=rest, step_ms=phase["wall_ms"],
            native_step_ms=native["wall_ms"], at_parity_ms=at_parity,
            at_parity_vs_native=at_parity / native["wall_ms"],
        )  # fmt: skip
        out.append(line)
    return out


def _export_trace(prof: torch.profiler.profile, path: Path) -> bool:
    """Write the trace gzipped; remove it again past `MAX_TRACE_BYTES`. Whether it stayed."""
    prof.export_chrome_trace(str(path))
    if path.stat().st_size <= MAX_TRACE_BYTES:
        return True
    path.unlink()
    return False


def profile_step(
    step: Callable[[], None],
    *,
    directory: Path,
    row: str,
    rank: int,
    device: torch.device,
) -> list[dict[str, Any]]:
    """Run `step` once under torch.profiler; write its trace and kernel table; its rows.

    `step` must mark its phases with `PhaseRanges` (see the module docstring); every rank of
    the step calls this together, and they start the step after a barrier (outside its phases).

    Args:
        step: one training step, its phase hooks set.
        directory: where the trace and the kernel table go.
        row: the row's label, for the file names and the rows.
        rank: this rank.
        device: the device the step runs on.

    Returns:
        `breakdown_rows` of the step, each with `trace`: the trace's file name, or None when it
        was left out.
    """
    on_cuda = device.type == "cuda"
    activities = profiler_activities(device)
    with torch.profiler.profile(activities=activities, record_shapes=False, with_stack=False) as p:
        if dist.is_initialized():
            # the ranks start the step together: one rank's profiler start-up must not show in
            # another's phases as time spent waiting for its collectives
            dist.barrier()
        step()
    directory.mkdir(parents=True, exist_ok=True)
    trace = directory / f"{row}_rank{rank}{_TRACE_SUFFIX}"
    kept = _export_trace(p, trace)
    rows = _tables(p.events(), directory=directory, row=row, rank=rank, on_cuda=on_cuda)
    return [{**r, "trace": trace.name if kept else None} for r in rows]


def _tables(
    events: Sequence[Any], *, directory: Path, row: str, rank: int, on_cuda: bool
) -> list[dict[str, Any]]:
    """One rank's step from its profiler events: its kernel table written into `directory`,
    its `breakdown_rows` returned."""
    name = f"{row}_rank{rank}"
    found = profile_rows(events, cell=name, on_cuda=on_cuda)
    (directory / f"{name}_kernels.md").write_text(kernel_tables(found, name) + "\n")
    return breakdown_rows(
        found, device_kernels(events), _windows(events), row=row, rank=rank, on_cuda=on_cuda
    )


def rebuild_step_profile(directory: Path) -> Path:
    """Rebuild a CUDA run's tables in `directory` (`<DIR name>.json` and `.md`, each
    `*_kernels.md`) from the traces it holds, on any machine (no GPU): after a change to how
    kernels are categorised or attributed, an earlier GPU run reads as a new one would. The
    run's device, versions, date, command and config are kept; a note says the tables were
    rebuilt, and at which revision of this code.

    Raises:
        FileNotFoundError: no `<DIR name>.json`, or no trace for one of its rows and ranks.
        ValueError: the run is not a CUDA run (a CPU trace keeps no operator's own time).
    """
    run = load_json(directory / f"{directory.name}.json")
    if run.env.get("device_type") != "cuda":
        raise ValueError(f"{directory}: only a CUDA run's tables can be rebuilt from its traces")
    rows: list[dict[str, Any]] = []
    for row, rank in dict.fromkeys((r["row"], r["rank"]) for r in run.rows):
        trace = directory / f"{row}_rank{rank}{_TRACE_SUFFIX}"
        if not trace.exists():
            raise FileNotFoundError(f"{trace}: the trace of row {row}, rank {rank} is missing")
        found = _tables(trace_events(trace), directory=directory, row=row, rank=rank, on_cuda=True)
        rows += [{**r, "trace": trace.name} for r in found]
    revision = collect_env(torch.device("cpu")).get("git_revision")
    return save_step_profile(
        directory, rows, device=torch.device("cuda"), command=run.command, config=run.config,
        env=run.env,
        note=f"The tables were rebuilt from these traces on a CPU (rebuild_step_profile, code "
        f"{revision}); the step ran with the revision above.",
    )  # fmt: skip


def save_step_profile(
    directory: Path,
    rows: Sequence[Mapping[str, Any]],
    *,
    device: torch.device,
    command: str | None,
    config: Mapping[str, Any],
    env: Mapping[str, Any] | None = None,
    note: str | None = None,
) -> Path:
    """`directory/<directory name>.json` and `.md`: the rows as a run of tool `step-profile`
    (`env`: a rebuilt run's own instead of this machine's; `note` after the others)."""
    on_cuda = device.type == "cuda"
    work = "CUDA kernels" if on_cuda else "CPU operators (own time)"
    dropped = sorted({r["row"] for r in rows if r.get("trace") is None}) if on_cuda else []
    notes = [
        "One step per row after its timed steps (the timing never ran under the profiler), on "
        "every rank; phases are record_function ranges closed after a device synchronisation. "
        f"category rows: the phase's {work}, each once, attributed to the phase its launch "
        "fell in (bench-model's profile tables), by category (kernel_category): number, "
        "total_ms, share of the phase's summed kernel time (concurrent streams and NCCL beside "
        "compute add up past wall_ms).",
        "phase rows: wall_ms, the phase's host range (the device synchronised at its end); "
        + (
            "kernel_ms, the compute kernels' summed time (every kernel but NCCL's, copies and "
            "fills); busy_ms, the time some compute kernel ran; comm_ms, the time some NCCL "
            "kernel ran; exposed_comm_ms, the part of comm_ms beside no compute kernel; "
            "idle_ms, the time no kernel ran (from the kernels' device-side intervals, "
            "bench.core.profiling.device_time)."
            if on_cuda
            else "on a CPU the operators run on the host: no device split."
        ),
        f"Traces: <row>_rank<r>.pt.trace.json.gz (Perfetto opens them), left out past "
        f"{MAX_TRACE_BYTES // MIB} MiB gzipped"
        + (f" (left out: {', '.join(dropped)})" if dropped else "")
        + "; kernel tables with the largest kernels per phase: <row>_rank<r>_kernels.md.",
    ]
    if note is not None:
        notes.append(note)
    run = Run.create(
        "step-profile",
        [{c: r.get(c) for c in STEP_PROFILE_COLUMNS} for r in rows],
        device=device,
        config=config,
        command=command,
        title=f"bench-step under torch.profiler: {work} per phase and rank, one step per row, "
        f"{device_name(device) if env is None else env.get('device_name')}",
        columns=STEP_PROFILE_COLUMNS[1:],
        group_by="row",
        notes=notes,
        env=env,
    )
    path = save_json(run, directory / f"{directory.name}.json")
    summary = to_markdown(phase_summary(run.rows))
    header = "Per row, rank and phase: the device split, then each category's kernel time (ms)."
    text = f"{run.to_markdown()}\n\n{header}\n\n{summary}\n"
    parity = kernel_parity(run.rows)
    if parity:
        text += (
            "\nKernel parity (`kernel_parity`): per rank, each compute category's kernel time "
            "over the whole step, ours / torch-native's (ms); at_parity_ms: ours' step with "
            "every category at the faster of the two and ours' own exposed communication and "
            "idle time, at_parity_vs_native: that over the torch-native step's wall time. How "
            "far kernel parity alone could take the step.\n\n"
            f"{to_markdown(parity)}\n"
        )
    path.with_suffix(".md").write_text(text)
    return path

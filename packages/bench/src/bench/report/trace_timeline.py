"""A profiler trace drawn as a timeline of compute beside communication: what the handout's
Nsight Systems screenshots show (§5.3.2 (b), §7 (b)), from the Chrome trace `torch.profiler`
writes (`bench-ddp --trace`, `bench-zero --trace`), where no Nsight Systems is installed.

Two lanes, from one rank's trace:

- on CUDA, **compute** is every GPU kernel that is neither NCCL's nor a copy or fill, and
  **communication** every NCCL kernel (`ncclDevKernel_AllReduce...`), on whatever stream it ran;
- on a CPU (gloo), **communication** is the collectives gloo's own threads run (`gloo:all_reduce`
  ranges on its `pt_gloo_runloop` threads), and **compute** the operators of every other thread
  (the training thread and autograd's), less the calls that only hand work to gloo (`c10d::...`).

`overlap` is the share of the communication lane's time during which the compute lane is busy
too (`bench.core.profiling.overlap_share`): 1 when every collective ran beside compute, 0 when
none did. The figure draws both lanes and states that share in its title.

Example::

    summary = render_trace_timeline("traces/ddp-individual.pt.trace.json", "individual.png")
    summary.overlap, summary.num_collectives
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.core.profiling import (
    COLLECTIVE_OPS,
    COPY_KERNELS,
    NCCL_KERNELS,
    merged_spans,
    overlap_share,
)
from bench.report.document import Image
from bench.report.results import Record, Results

__all__ = ["NO_NSIGHT", "TraceLanes", "render_trace_timeline", "trace_images", "trace_lanes"]

Span = tuple[float, float]

_GLOO = re.compile(r"^gloo:")


@dataclass(frozen=True)
class TraceLanes:
    """One rank's trace as two lanes of busy intervals (µs from the trace's first event).

    Attributes:
        source: `cuda` (GPU kernels) or `cpu` (operators and gloo's threads).
        compute: merged intervals during which compute ran.
        communication: the collectives' intervals, one per collective call.
        names: each collective's name, in the order of `communication`.
        overlap: the share of communication time beside compute (None without collectives).
    """

    source: str
    compute: list[Span]
    communication: list[Span]
    names: list[str]
    overlap: float | None

    @property
    def num_collectives(self) -> int:
        return len(self.communication)

    @property
    def communication_ms(self) -> float:
        """The communication lane's busy time, overlapping calls counted once."""
        return sum(end - start for start, end in merged_spans(self.communication)) / 1e3


def _load(trace: Mapping[str, Any] | str | os.PathLike[str]) -> Mapping[str, Any]:
    if isinstance(trace, Mapping):
        return trace
    return json.loads(Path(trace).read_text())


def _gloo_threads(events: Sequence[Mapping[str, Any]]) -> set[Any]:
    """The threads gloo runs its collectives on (named `pt_gloo_runloop` by the profiler)."""
    return {
        e.get("tid")
        for e in events
        if e.get("ph") == "M"
        and e.get("name") == "thread_name"
        and "gloo" in str(e.get("args", {}).get("name", ""))
    }


def trace_lanes(trace: Mapping[str, Any] | str | os.PathLike[str]) -> TraceLanes:
    """The compute and communication lanes of a Chrome trace (a dict, or the path of one).

    Raises:
        ValueError: the trace holds no complete events (`"ph": "X"`) to draw.
    """
    events = [e for e in _load(trace).get("traceEvents", []) if isinstance(e, Mapping)]
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]
    if not spans:
        raise ValueError("the trace holds no complete events; write it with torch.profiler")
    kernels = [e for e in spans if e.get("cat") == "kernel"]
    compute: list[Span] = []
    comm: list[tuple[Span, str]] = []
    if kernels:
        source = "cuda"
        for e in kernels:
            span = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
            if NCCL_KERNELS.match(e["name"]):
                comm.append((span, e["name"]))
            elif not COPY_KERNELS.match(e["name"]):
                compute.append(span)
    else:
        source = "cpu"
        gloo = _gloo_threads(events)
        for e in spans:
            span = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
            if e.get("tid") in gloo:
                if _GLOO.match(e["name"]):
                    comm.append((span, e["name"]))
            elif e.get("cat") == "cpu_op" and not COLLECTIVE_OPS.match(e["name"]):
                compute.append(span)  # a collective's hand-off to gloo is neither lane's work
    t0 = min(float(e["ts"]) for e in spans)
    comm.sort()
    shifted = [(start - t0, end - t0) for (start, end), _ in comm]
    merged = merged_spans([(start - t0, end - t0) for start, end in compute])
    return TraceLanes(
        source=source,
        compute=merged,
        communication=shifted,
        names=[name for _, name in comm],
        overlap=overlap_share(shifted, merged),
    )


def render_trace_timeline(
    trace: Mapping[str, Any] | str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
) -> TraceLanes:
    """Draw a trace's compute and communication lanes to a PNG (folders are created).

    Args:
        trace: a Chrome trace dict, or the path of a `.pt.trace.json`.
        path: the PNG to write.
        title: the figure's title (the trace's lanes and overlap are added below it).

    Returns:
        The `TraceLanes` drawn.

    Raises:
        ValueError: the trace holds no complete events.
    """
    lanes = trace_lanes(trace)
    from matplotlib.figure import Figure  # imported on first use, as in `bench.core.plots`

    fig = Figure(figsize=(11, 2.6), layout="constrained")
    ax = fig.subplots()
    rows = (
        ("compute", lanes.compute, "tab:blue"),
        ("communication", lanes.communication, "tab:red"),
    )
    for y, (_, spans, color) in enumerate(rows):
        ax.broken_barh(
            [(start / 1e3, max(end - start, 0.0) / 1e3) for start, end in spans],
            (y - 0.35, 0.7),
            color=color,
        )
    ax.set_yticks(range(len(rows)), [label for label, _, _ in rows])
    ax.set_xlabel("time from the trace's first event (ms)")
    ax.grid(True, axis="x", alpha=0.3)
    what = "GPU kernels" if lanes.source == "cuda" else "CPU operators and gloo's threads"
    share = "no collectives" if lanes.overlap is None else f"{lanes.overlap:.0%} beside compute"
    fig.suptitle(
        f"{title or 'profiler trace'}\n{what}: {lanes.num_collectives} collectives, "
        f"{lanes.communication_ms:.3g} ms of communication, {share}",
        fontsize="medium",
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return lanes


# What the handout's screenshots needed and these runs did not have; said where a trace stands in.
NO_NSIGHT = (
    "Nsight Systems was not available on the GPU machines these runs used, so there are no "
    "Nsight screenshots."
)


def _trace_folder(record: Record) -> Path | None:
    """Where a result's traces are: its `trace_dir` as recorded (relative to where the tool
    ran), else that folder's name beside the result or in its `bulk/` folder."""
    given = record.run.config.get("trace_dir")
    if not given:
        return None
    folder = record.path.parent
    name = Path(given).name
    for base in (Path(given), folder / given, folder / name, folder / "bulk" / name):
        if base.is_dir():
            return base
    return None


def trace_images(res: Results, record: Record, *, variants: Sequence[str] = ()) -> list[Image]:
    """The timelines of a result's traced steps (`bench-ddp --trace`, `bench-zero --trace`):
    `timeline_<result>_<trace>.png` beside the result, drawn here from each trace found that has
    no timeline yet or a newer trace. The traces are bulky and stay out of the repository; the
    timelines are committed, so a report built without the traces still shows them.

    The timelines come in the order of `variants` (the rows' variants, `ddp:naive`: a trace is
    named by its variant, a colon written as `-`, then `_` and what else tells it apart), then
    the rest by name."""
    folder, stem = record.path.parent, record.path.stem
    traces = _trace_folder(record)
    for trace in sorted(traces.glob("*.pt.trace.json")) if traces else []:
        name = trace.name.removesuffix(".pt.trace.json")
        png = folder / f"timeline_{stem}_{name}.png"
        if not png.exists() or png.stat().st_mtime < trace.stat().st_mtime:
            render_trace_timeline(trace, png, title=f"{record.path.name}: {name} (rank 0)")
    names = [v.replace(":", "-") for v in variants]

    def rank(png: Path) -> tuple[int, str]:
        trace = png.stem.removeprefix(f"timeline_{stem}_")
        found = [i for i, n in enumerate(names) if trace == n or trace.startswith(f"{n}_")]
        return (found[0] if found else len(names), trace)

    return [
        Image(str(png.resolve()), png.stem)
        for png in sorted(folder.glob(f"timeline_{stem}_*.png"), key=rank)
    ]

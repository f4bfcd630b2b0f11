"""A step's allocated-memory peak in a CUDA memory snapshot, split into requested bytes and the
caching allocator's rounding, with reserved memory and the sites alive at the peak.

`torch.cuda.max_memory_allocated` counts allocator *blocks*; a tensor asks for fewer bytes (its
request). Two runs whose tensors are byte-identical can therefore differ in "allocated" memory
by rounding alone. This script tells the two apart from the pickles that
`bench-zero --memory-snapshot DIR` (or `torch.cuda.memory._dump_snapshot`) writes.

The method is `bench.tools.model.block_replay`'s (its docstring says what a torch 2.11
snapshot holds and which of its sizes are blocks, which requests): the trace's events replayed
in order, each traced block's size rebuilt from its request by the allocator's rules (512-byte
rounding; the small pool's blocks exactly that; a large block not split when <= 1 MiB would
remain), the segments followed through `segment_alloc`/`segment_free`, the blocks alive before
the trace taken from the end state. Blocks count as allocated from `alloc` to `free_requested`,
as `memory_allocated` counts them. The peak is the largest sum of block sizes over the replay
(what `max_memory_allocated` reports for the traced window); at it the script reports the
requested bytes, the difference (rounding), the blocks at least 1 MiB larger than their request,
and the allocating sites. Reserved memory is the end state's sum of segment sizes.

The numbers hold when the replay's checks are 0 (`status` `ok`): `size_mismatches` (traced
blocks the end state holds whose rebuilt size differs from it) and `unplaced` (requests whose
address has no room in the known segments) catch rules that did not hold; `untraced_frees`
(blocks allocated before the trace and freed in it: no record holds their block sizes) and
`expandable` (expandable segments, other rules) say where the method does not apply;
`trace_full` whether the trace reached `--max-entries` (its oldest events were dropped).

Run from the repository root with `PYTHONPATH` set to every package's `src/` (seconds, CPU)::

    python3 packages/bench/scripts/snapshot_peak.py DIR/fsdp_bf16-storage_rank0.pickle ... \\
        --source-result docs/results/<the run that wrote them>.json \\
        --json docs/results/<stem>_snapshot.json --markdown docs/results/<stem>_snapshot.md

`--source-result` takes the device, versions, date and revision from the bench result of the
run that wrote the snapshots (without it, this machine's). Only load pickles you wrote
yourself: unpickling runs code.
"""

from __future__ import annotations

import argparse
import collections
import pickle
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.core.env import command_line
from bench.core.memory import MIB, SNAPSHOT_MAX_ENTRIES
from bench.core.results import Run, load_json, save_json, to_markdown
from bench.tools.model.block_replay import SMALL_SIZE, BlockReplay
from bench.tools.model.timeline import _where

NUM_SITES = 8  # sites listed per snapshot: the largest cover most of the peak
COLUMNS = [
    "snapshot", "events", "trace_full", "peak_allocated_mib", "peak_requested_mib",
    "rounding_mib", "rounded_blocks", "before_trace_allocated_mib", "before_trace_rounding_mib",
    "reserved_end_mib", "size_mismatches", "status",
]  # fmt: skip


def _device_trace(snapshot: Mapping[str, Any]) -> tuple[int, list[dict]]:
    """The index and events of the one device whose trace is non-empty."""
    found = [(d, t) for d, t in enumerate(snapshot["device_traces"]) if t]
    if len(found) != 1:
        raise ValueError(
            f"expected one device with a trace, found {len(found)}: record one device's "
            "history (torch.cuda.memory._record_memory_history on that device)"
        )
    return found[0]


def analyse(
    snapshot: Mapping[str, Any], *, max_entries: int = SNAPSHOT_MAX_ENTRIES
) -> dict[str, Any]:
    """Replay one snapshot to its allocated peak (module docstring: the method).

    Returns a dict of bytes and counts: `events`, `trace_full`, `peak_allocated`,
    `peak_requested`, `rounding`, `rounded_blocks`, `before_trace_allocated`,
    `before_trace_requested`, `reserved_end`, `size_mismatches`, `unplaced`, `untraced_frees`,
    `expandable`, `peak_event` (index into the trace) and `top_sites` (list of
    `{site, blocks, allocated, requested}`, largest first).
    """
    device, trace = _device_trace(snapshot)
    replay = BlockReplay(snapshot, device=device)
    best = (replay.allocated, replay.requested, -1, dict(replay.live))
    for i, e in enumerate(trace):
        replay.apply(e)
        if replay.allocated > best[0]:
            best = (replay.allocated, replay.requested, i, dict(replay.live))
    peak_allocated, peak_requested, peak_event, at_peak = best
    sites: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    for block in at_peak.values():
        site = sites[_where(block.frames)]
        site[0] += 1
        site[1] += block.size
        site[2] += block.requested
    top = sorted(sites.items(), key=lambda kv: -kv[1][1])[:NUM_SITES]
    segments = [s for s in snapshot["segments"] if s.get("device", device) == device]
    return {
        "device": device,
        "events": len(trace),
        "trace_full": len(trace) >= max_entries,
        "peak_allocated": peak_allocated,
        "peak_requested": peak_requested,
        "rounding": peak_allocated - peak_requested,
        "rounded_blocks": sum(1 for b in at_peak.values() if b.size - b.requested >= SMALL_SIZE),
        "before_trace_allocated": replay.before_allocated,
        "before_trace_requested": replay.before_requested,
        "reserved_end": sum(s["total_size"] for s in segments),
        "size_mismatches": replay.size_mismatches,
        "unplaced": replay.unplaced,
        "untraced_frees": replay.untraced_frees,
        "expandable": replay.expandable,
        "peak_event": peak_event,
        "top_sites": [
            {"site": site, "blocks": n, "allocated": size, "requested": request}
            for site, (n, size, request) in top
        ],
    }


def _row(name: str, found: Mapping[str, Any]) -> dict[str, Any]:
    """A result row: MiB for bytes; status `ok` only when the method's conditions held."""
    checks = ("size_mismatches", "unplaced", "untraced_frees", "expandable")
    broken = [k for k in checks if found[k]] + (["trace_full"] if found["trace_full"] else [])
    return {
        "snapshot": name,
        "events": found["events"],
        "trace_full": found["trace_full"],
        "peak_allocated_mib": found["peak_allocated"] / MIB,
        "peak_requested_mib": found["peak_requested"] / MIB,
        "rounding_mib": found["rounding"] / MIB,
        "rounded_blocks": found["rounded_blocks"],
        "before_trace_allocated_mib": found["before_trace_allocated"] / MIB,
        "before_trace_rounding_mib": (
            found["before_trace_allocated"] - found["before_trace_requested"]
        )
        / MIB,
        "reserved_end_mib": found["reserved_end"] / MIB,
        "size_mismatches": found["size_mismatches"],
        "top_sites": [
            {**s, "allocated_mib": s["allocated"] / MIB, "requested_mib": s["requested"] / MIB}
            for s in found["top_sites"]
        ],
        "status": "ok" if not broken else "method does not hold: " + ", ".join(broken),
    }


def _sites_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """One table of the largest sites alive at each snapshot's peak."""
    lines = [
        {"snapshot": r["snapshot"], "site": s["site"], "blocks": s["blocks"],
         "allocated_mib": s["allocated_mib"], "requested_mib": s["requested_mib"]}
        for r in rows
        for s in r["top_sites"]
    ]  # fmt: skip
    return "#### Largest sites alive at each peak\n\n" + to_markdown(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("snapshots", nargs="+", type=Path, help="pickles of _dump_snapshot")
    parser.add_argument(
        "--source-result",
        type=Path,
        default=None,
        help="bench result JSON of the run that wrote the snapshots",
    )
    parser.add_argument(
        "--max-entries",
        type=int,
        default=SNAPSHOT_MAX_ENTRIES,
        help="the max_entries the history was recorded with",
    )
    parser.add_argument("--note", action="append", default=[], help="a sentence for the notes")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args(argv)  # fmt: skip
    rows = []
    for path in args.snapshots:
        with open(path, "rb") as f:
            snapshot = pickle.load(f)
        rows.append(_row(path.stem, analyse(snapshot, max_entries=args.max_entries)))
    command = command_line(["packages/bench/scripts/snapshot_peak.py", *argv], prog="python3")
    source = load_json(args.source_result) if args.source_result is not None else None
    run = Run.create(
        "snapshot-peak", rows, device="cpu", config={"snapshots": [str(p) for p in args.snapshots],
        "source_result": str(args.source_result) if source else None,
        "max_entries": args.max_entries}, command=command,
        env=source.env if source else None, columns=COLUMNS,
        title="Allocated-memory peak of the recorded step, from each CUDA memory snapshot: "
        "requested bytes and the caching allocator's rounding",
        notes=[
            *(
                [f"Source run: `{source.command}` (device, versions, date and revision above "
                 "are that run's; this file is its snapshots replayed offline)."]
                if source else []
            ),
            "Method (snapshot_peak.py's docstring): blocks alive before the trace from the "
            "end-state segments minus the traced allocations still alive; the trace's "
            "requests replayed with block sizes rebuilt by the allocator's rules (512-byte "
            "rounding; a large block not split when <= 1 MiB would remain). `size_mismatches`: "
            "traced blocks alive at the end whose rebuilt size differs from the real one.",
            "peak_allocated: the largest sum of block sizes (what max_memory_allocated counts); "
            "peak_requested: the bytes the tensors asked for at that moment; rounding: their "
            "difference; rounded_blocks: blocks >= 1 MiB larger than their request; "
            "reserved_end: the segments (cudaMalloc'd) at the end of the step.",
            *args.note,
        ],
    )  # fmt: skip
    if args.json is not None:
        save_json(run, args.json)
    markdown = run.to_markdown() + "\n\n" + _sites_markdown(rows) + "\n"
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown)
    print(_sites_markdown(rows), end="\n\n")
    print(run.to_markdown(wide=False))


if __name__ == "__main__":
    main(sys.argv[1:])

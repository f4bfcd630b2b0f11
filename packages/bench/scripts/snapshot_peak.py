"""A step's allocated-memory peak in a CUDA memory snapshot, split into requested bytes and the
caching allocator's rounding, with reserved memory and the sites alive at the peak.

`torch.cuda.max_memory_allocated` counts allocator *blocks*; a tensor asks for fewer bytes (its
request). Two runs whose tensors are byte-identical can therefore differ in "allocated" memory
by rounding alone. This script tells the two apart from the pickles that
`bench-zero --memory-snapshot DIR` (or `torch.cuda.memory._dump_snapshot`) writes.

What a torch 2.11 snapshot holds (`torch.cuda.memory._snapshot`'s docstring; the allocator's
`malloc` records `TraceEntry::ALLOC` with `orig_size`):

- `segments`: the end state. Each segment (one cudaMalloc, `total_size` bytes, pool `small` or
  `large`) lists its `blocks`, each with `address`, `size` (the block) and `requested_size`
  (the request), `state` `active_allocated` or `inactive`.
- `device_traces[d]`: the events since recording began. An `alloc` entry's `size` is the
  **request**, not the block; `free_requested`/`free_completed` repeat the request. No trace
  entry carries a block size.

The method:

1. Blocks alive before the trace = the end state's allocated blocks minus those the trace
   allocated and did not free (matched by address): exact block and requested sizes. (A block
   freed in the trace but allocated before it would have no size; such events are counted as
   `untraced_frees` and must be 0 for the numbers to hold.)
2. Replay the device's `alloc` and `free_completed` events (a block is reusable only once its
   free completes) in order. Each traced block's size is rebuilt from the request by the
   allocator's rules: the request rounded up to a multiple of 512 bytes (`kMinBlockSize`);
   requests of at most 1 MiB (`kSmallSize`) come from the small pool, whose blocks are exactly
   that; a large-pool block takes the start of a free block and splits off the rest only if
   more than 1 MiB would remain, so when the free block (which reaches to the next live block
   or the segment's end: free neighbours are always merged) is at most 1 MiB longer than the
   rounded request, the block is the whole of it. This needs the segments to stay fixed through
   the trace (no `segment_alloc`/`segment_free` events; counted, must be 0) and an unlimited
   `max_split_size` (the snapshot's `allocator_settings`).
3. Check: traced blocks still alive at the end have their real size in `segments`;
   `size_mismatches` counts those the rules rebuilt wrongly (0 means the rules held).
4. The peak is the largest sum of block sizes over the replay (what `max_memory_allocated`
   reports for the traced window); at it the script reports the requested bytes, the
   difference (rounding), the blocks at least 1 MiB larger than their request, and the
   allocating sites. `trace_full` says whether the trace reached `--max-entries` (then its
   oldest events were dropped and step 1 is wrong). Reserved memory is the end state's sum of
   segment sizes.

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
import bisect
import collections
import pickle
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.core.env import command_line
from bench.core.memory import MIB, SNAPSHOT_MAX_ENTRIES
from bench.core.results import Run, load_json, save_json, to_markdown
from bench.tools.model.timeline import _where

MIN_BLOCK = 512  # kMinBlockSize: every block is a multiple of it
SMALL_SIZE = 1 << 20  # kSmallSize: requests up to it use the small pool; a large split's minimum
NUM_SITES = 8  # sites listed per snapshot: the largest cover most of the peak
COLUMNS = [
    "snapshot", "events", "trace_full", "peak_allocated_mib", "peak_requested_mib",
    "rounding_mib", "rounded_blocks", "before_trace_allocated_mib", "before_trace_rounding_mib",
    "reserved_end_mib", "size_mismatches", "status",
]  # fmt: skip


def round_request(size: int) -> int:
    """The allocator's rounding of a request: up to a multiple of 512 bytes, at least 512."""
    return max(MIN_BLOCK, -(-size // MIN_BLOCK) * MIN_BLOCK)


def _device_trace(snapshot: Mapping[str, Any]) -> tuple[int, list[dict]]:
    """The index and events of the one device whose trace is non-empty."""
    found = [(d, t) for d, t in enumerate(snapshot["device_traces"]) if t]
    if len(found) != 1:
        raise ValueError(
            f"expected one device with a trace, found {len(found)}: record one device's "
            "history (torch.cuda.memory._record_memory_history on that device)"
        )
    return found[0]


class _Layout:
    """Fixed segments and the start addresses of the live blocks: where a free block ends."""

    def __init__(self, segments: Sequence[Mapping[str, Any]], starts: Sequence[int]) -> None:
        ordered = sorted(segments, key=lambda s: s["address"])
        self.seg_starts = [s["address"] for s in ordered]
        self.segments = ordered
        self.live = sorted(starts)

    def block_size(self, addr: int, request: int) -> int:
        """The block the allocator hands out at `addr` for `request` bytes (module docstring)."""
        rounded = round_request(request)
        segment = self.segments[bisect.bisect_right(self.seg_starts, addr) - 1]
        if segment["segment_type"] == "small":
            return rounded
        end = segment["address"] + segment["total_size"]
        after = bisect.bisect_right(self.live, addr)
        free = min(end, self.live[after]) - addr if after < len(self.live) else end - addr
        return free if free - rounded <= SMALL_SIZE else rounded

    def add(self, addr: int) -> None:
        bisect.insort(self.live, addr)

    def remove(self, addr: int) -> None:
        self.live.pop(bisect.bisect_left(self.live, addr))


def analyse(
    snapshot: Mapping[str, Any], *, max_entries: int = SNAPSHOT_MAX_ENTRIES
) -> dict[str, Any]:
    """Replay one snapshot to its allocated peak (module docstring: the method).

    Returns a dict of bytes and counts: `events`, `trace_full`, `peak_allocated`,
    `peak_requested`, `rounding`, `rounded_blocks`, `before_trace_allocated`,
    `before_trace_requested`, `reserved_end`, `size_mismatches`, `untraced_frees`,
    `segment_events`, `peak_event` (index into the trace) and `top_sites` (list of
    `{site, blocks, allocated, requested}`, largest first).
    """
    device, trace = _device_trace(snapshot)
    segments = [s for s in snapshot["segments"] if s.get("device", device) == device]
    at_end = {
        b["address"]: b for s in segments for b in s["blocks"] if b["state"] == "active_allocated"
    }
    traced_live: dict[int, dict] = {}
    for e in trace:
        if e["action"] == "alloc":
            traced_live[e["addr"]] = e
        elif e["action"] == "free_completed":
            traced_live.pop(e["addr"], None)
    # (block size, requested size, site) of each live block, by address
    live = {
        addr: (b["size"], b["requested_size"], _where(b.get("frames") or ()))
        for addr, b in at_end.items()
        if addr not in traced_live
    }
    before_allocated = sum(v[0] for v in live.values())
    before_requested = sum(v[1] for v in live.values())
    layout = _Layout(segments, list(live))
    allocated, requested = before_allocated, before_requested
    best = (allocated, requested, -1, dict(live))
    mismatches = untraced = 0
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            size = layout.block_size(e["addr"], e["size"])
            if traced_live.get(e["addr"]) is e and at_end[e["addr"]]["size"] != size:
                mismatches += 1
            live[e["addr"]] = (size, e["size"], _where(e.get("frames") or ()))
            layout.add(e["addr"])
            allocated, requested = allocated + size, requested + e["size"]
            if allocated > best[0]:
                best = (allocated, requested, i, dict(live))
        elif e["action"] == "free_completed":
            if e["addr"] not in live:
                untraced += 1
                continue
            size, request, _ = live.pop(e["addr"])
            layout.remove(e["addr"])
            allocated, requested = allocated - size, requested - request
    peak_allocated, peak_requested, peak_event, at_peak = best
    sites: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    for size, request, site in at_peak.values():
        sites[site][0] += 1
        sites[site][1] += size
        sites[site][2] += request
    top = sorted(sites.items(), key=lambda kv: -kv[1][1])[:NUM_SITES]
    return {
        "device": device,
        "events": len(trace),
        "trace_full": len(trace) >= max_entries,
        "peak_allocated": peak_allocated,
        "peak_requested": peak_requested,
        "rounding": peak_allocated - peak_requested,
        "rounded_blocks": sum(1 for s, r, _ in at_peak.values() if s - r >= SMALL_SIZE),
        "before_trace_allocated": before_allocated,
        "before_trace_requested": before_requested,
        "reserved_end": sum(s["total_size"] for s in segments),
        "size_mismatches": mismatches,
        "untraced_frees": untraced,
        "segment_events": sum(1 for e in trace if e["action"].startswith("segment_")),
        "peak_event": peak_event,
        "top_sites": [
            {"site": site, "blocks": n, "allocated": size, "requested": request}
            for site, (n, size, request) in top
        ],
    }


def _row(name: str, found: Mapping[str, Any]) -> dict[str, Any]:
    """A result row: MiB for bytes; status `ok` only when the method's conditions held."""
    broken = [k for k in ("size_mismatches", "untraced_frees", "segment_events") if found[k]] + (
        ["trace_full"] if found["trace_full"] else []
    )
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

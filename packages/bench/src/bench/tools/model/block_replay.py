"""Replay a CUDA memory snapshot's trace in the caching allocator's block sizes.

`torch.cuda.max_memory_allocated` (bench's peak memory everywhere) counts the allocator's
*blocks*; a tensor asks for fewer bytes (its request). A snapshot (`torch.cuda.memory._snapshot`,
or the pickle of `_dump_snapshot`) carries both kinds, but not in the same places. In the
caching allocator's source (`c10/cuda/CUDACachingAllocator.cpp`; on a GPU, `test_memviz`'s
`test_real_snapshot_matches_the_allocators_counters` checks it against torch's own counters):

- `segments[*].blocks[*]`, the end state: `size` is the block (`Block::size`: the request
  rounded, or the whole free block when the rest was too small to split off) and
  `requested_size` the request (`Block::requested_size`, `malloc`'s `orig_size`). `state` is
  `active_allocated` (a live tensor's), `active_awaiting_free` (freed, waiting for another
  stream's use to finish) or `inactive`.
- `device_traces[d]`, the events since recording began: `alloc` records `orig_size`;
  `free_requested` (the tensor died: `memory_allocated` drops by the block here) and
  `free_completed` (the block is reusable and merges with free neighbours) record
  `block->requested_size`. Every block event carries the **request**; none carries a block
  size. `segment_alloc` and `segment_free` carry a whole segment (`cudaMalloc`'d bytes), at its
  start.

So the end state's `size` minus the trace's `size` mixes the two kinds, off by the rounding of
every block the trace touched. In requested bytes the two records agree exactly. In block
bytes the trace's blocks must be rebuilt, which `BlockReplay` does by the allocator's rules:

1. A request is rounded up to a multiple of 512 bytes (`kMinBlockSize`). A rounded request of at
   most 1 MiB (`kSmallSize`) comes from the small pool, whose blocks are exactly that.
2. A large-pool block takes the start of a free block and splits the rest off only if more than
   1 MiB would remain; otherwise the block is the whole free block. Free neighbours are always
   merged, so the free block reaches to the next block not yet `free_completed`, or to its
   segment's end.
3. The blocks and segments are known at every event. Before the trace: the end state's
   non-inactive blocks at addresses the trace never allocates or frees, and the blocks whose
   first event is a free (allocated, or already freed and awaiting completion, before
   recording began); the end state's segments, less those the trace allocates, plus those it
   frees.

The rules hold for the allocator's defaults. What breaks them is counted, never guessed around
(`problems`): a block allocated before the trace and freed in it (neither record holds its block
size: it counts as its rounded request, a lower bound), expandable segments (other splitting
rules), and blocks whose rebuilt size differs from the end state's or whose address lies in no
known segment (a non-default `max_split_size` or `roundup_power2_divisions` shows up there).
Requested bytes are always exact.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

__all__ = ["MIN_BLOCK", "SMALL_SIZE", "BlockReplay", "LiveBlock", "round_request"]

MIN_BLOCK = 512  # kMinBlockSize: every block is a multiple of it
SMALL_SIZE = 1 << 20  # kSmallSize: requests up to it use the small pool; a large split's minimum
_BLOCK_EVENTS = ("alloc", "free_requested", "free_completed")
_EXPANDABLE_EVENTS = ("segment_map", "segment_unmap")


def round_request(size: int) -> int:
    """The allocator's rounding of a request: up to a multiple of 512 bytes, at least 512."""
    return max(MIN_BLOCK, -(-size // MIN_BLOCK) * MIN_BLOCK)


class LiveBlock(NamedTuple):
    """An allocated block during the replay: its bytes, its request, the frames that made it."""

    size: int
    requested: int
    frames: Sequence[Mapping[str, Any]]


class _Layout:
    """The segments and the start addresses of the blocks not yet reusable: where a free block
    ends."""

    def __init__(self, segments: Mapping[int, int], starts: Sequence[int]) -> None:
        self.seg_end = dict(segments)  # segment start -> end address
        self.seg_starts = sorted(segments)
        self.used = sorted(starts)

    def block_size(self, addr: int, request: int) -> int | None:
        """The block the allocator hands out at `addr` for `request` bytes (module docstring);
        None when `addr` has no room for it in the known segments."""
        rounded = round_request(request)
        if rounded <= SMALL_SIZE:
            return rounded
        index = bisect.bisect_right(self.seg_starts, addr) - 1
        if index < 0:
            return None
        end = self.seg_end[self.seg_starts[index]]
        after = bisect.bisect_right(self.used, addr)
        if after < len(self.used):
            end = min(end, self.used[after])
        free = end - addr
        if free < rounded:
            return None
        return free if free - rounded <= SMALL_SIZE else rounded

    def add(self, addr: int) -> None:
        bisect.insort(self.used, addr)

    def remove(self, addr: int) -> None:
        index = bisect.bisect_left(self.used, addr)
        if index < len(self.used) and self.used[index] == addr:
            self.used.pop(index)

    def add_segment(self, addr: int, size: int) -> None:
        self.seg_end[addr] = addr + size
        bisect.insort(self.seg_starts, addr)

    def remove_segment(self, addr: int) -> None:
        if self.seg_end.pop(addr, None) is not None:
            self.seg_starts.pop(bisect.bisect_left(self.seg_starts, addr))


class BlockReplay:
    """One device's trace replayed event by event, in block bytes and in requested bytes.

    Feed it the trace's entries in order with `apply`; after each, `allocated` is the bytes of
    the allocated blocks (what `torch.cuda.memory_allocated` returned then, where `problems` is
    empty) and `requested` what their tensors asked for (always exact). Both drop at
    `free_requested`, as `memory_allocated` does.

    Args:
        snapshot: a snapshot dict (the module docstring says what it holds).
        device: the device whose trace and segments to replay.

    Attributes:
        trace: the device's trace entries, every action, in order.
        live: the allocated blocks by address.
        allocated, requested: their bytes and their requests, now.
        before_allocated, before_requested: the same before the first event.
        untraced_frees: blocks allocated before the trace and freed in it.
        expandable: expandable segments and their `segment_map`/`segment_unmap` events.
        size_mismatches: traced blocks the end state holds whose rebuilt size differs from it.
        unplaced: large requests whose address has no room for them in the known segments.
    """

    def __init__(self, snapshot: Mapping[str, Any], *, device: int) -> None:
        self.trace: list[dict] = list(snapshot["device_traces"][device])
        segments = [s for s in snapshot["segments"] if s.get("device", device) == device]
        self._at_end = {
            b["address"]: b for s in segments for b in s["blocks"] if b["state"] != "inactive"
        }
        # per address: the first block event, and the last alloc if its block is never reused
        first: dict[int, dict] = {}
        self._survivor: dict[int, dict] = {}
        for e in self.trace:
            if e["action"] in _BLOCK_EVENTS:
                first.setdefault(e["addr"], e)
                if e["action"] == "alloc":
                    self._survivor[e["addr"]] = e
                elif e["action"] == "free_completed":
                    self._survivor.pop(e["addr"], None)
        untouched = {a: b for a, b in self._at_end.items() if a not in first}
        self.live: dict[int, LiveBlock] = {
            a: LiveBlock(b["size"], b["requested_size"], b.get("frames") or ())
            for a, b in untouched.items()
            if b["state"] == "active_allocated"
        }
        freed_first = {a: e for a, e in first.items() if e["action"] != "alloc"}
        for a, e in freed_first.items():
            if e["action"] == "free_requested":
                self.live[a] = LiveBlock(round_request(e["size"]), e["size"], e.get("frames") or ())
        seg_at_start = {s["address"]: s["total_size"] for s in segments}
        for e in reversed(self.trace):
            if e["action"] == "segment_alloc":
                seg_at_start.pop(e["addr"], None)
            elif e["action"] == "segment_free":
                seg_at_start[e["addr"]] = e["size"]
        self._layout = _Layout(
            {a: a + size for a, size in seg_at_start.items()}, [*untouched, *freed_first]
        )
        self.allocated = self.before_allocated = sum(b.size for b in self.live.values())
        self.requested = self.before_requested = sum(b.requested for b in self.live.values())
        self.untraced_frees = sum(
            1 for e in freed_first.values() if e["action"] == "free_requested"
        )
        self.expandable = sum(1 for s in segments if s.get("is_expandable")) + sum(
            1 for e in self.trace if e["action"] in _EXPANDABLE_EVENTS
        )
        self.size_mismatches = self.unplaced = 0

    def apply(self, event: Mapping[str, Any]) -> None:
        """Replay one trace entry (other actions than the block and segment ones change
        nothing)."""
        action, addr = event["action"], event.get("addr")
        if action == "alloc":
            size = self._layout.block_size(addr, event["size"])
            if size is None:
                self.unplaced += 1
                size = round_request(event["size"])
            end = self._at_end.get(addr)
            if self._survivor.get(addr) is event and (end is None or end["size"] != size):
                self.size_mismatches += 1
            self.live[addr] = LiveBlock(size, event["size"], event.get("frames") or ())
            self._layout.add(addr)
            self.allocated += size
            self.requested += event["size"]
        elif action == "free_requested" and addr in self.live:
            block = self.live.pop(addr)
            self.allocated -= block.size
            self.requested -= block.requested
        elif action == "free_completed":
            self._layout.remove(addr)
        elif action == "segment_alloc":
            self._layout.add_segment(addr, event["size"])
        elif action == "segment_free":
            self._layout.remove_segment(addr)

    @property
    def problems(self) -> list[str]:
        """Why block bytes may not be exact, one sentence each; empty when the rules held."""
        found = []
        if self.untraced_frees:
            found.append(
                f"{self.untraced_frees} blocks allocated before recording began were freed in "
                "it (no record holds their block sizes)"
            )
        if self.expandable:
            found.append("expandable segments (their blocks follow other rules)")
        if self.size_mismatches or self.unplaced:
            found.append(
                f"{self.size_mismatches + self.unplaced} blocks rebuilt wrongly (allocator "
                "settings other than the defaults?)"
            )
        return found

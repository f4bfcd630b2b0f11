"""The offline memory-snapshot view, on a hand-made snapshot in PyTorch's format."""

import gc
import itertools
import pickle
import random

import pytest
import torch

from bench.core.memory import MIB
from bench.tools.model.block_replay import round_request
from bench.tools.model.timeline import memory_timeline, render_memory_snapshot

PNG_MAGIC = b"\x89PNG"


def _frames(name, line):
    return [
        {"filename": "/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "forward"},
        {"filename": "/home/u/proj/model.py", "line": line, "name": name},
        {"filename": "??", "line": 0, "name": "c10::alloc"},
    ]


def _event(action, addr, size, t, where=("step", 10)):
    return {
        "action": action,
        "addr": addr,
        "size": size,
        "stream": 0,
        "time_us": t,
        "frames": _frames(*where),
    }


LARGE, SMALL = 0x7F00_0000_0000, 0x7F10_0000_0000  # a large and a small segment's addresses


def _block(addr, size, requested, state="active_allocated"):
    return {"address": addr, "size": size, "requested_size": requested, "state": state,
            "frames": []}  # fmt: skip


def _segment(addr, total, kind, blocks):
    return {"device": 0, "address": addr, "total_size": total, "stream": 0,
            "segment_type": kind, "blocks": blocks}  # fmt: skip


def _snapshot():
    """2 MiB held before recording, then: +4 MiB, +1 MiB (in a segment allocated in the trace),
    -4 MiB, +3 MiB where the 4 MiB were; 2 + 1 + 3 MiB live at the end. Every request a
    multiple of 512 bytes that fills its block: no rounding."""
    trace = [
        _event("segment_alloc", SMALL, 2 * MIB, 0),
        _event("alloc", LARGE + 2 * MIB, 4 * MIB, 10, ("attention", 42)),
        _event("alloc", SMALL, 1 * MIB, 20),
        _event("free_requested", LARGE + 2 * MIB, 4 * MIB, 30),
        _event("free_completed", LARGE + 2 * MIB, 4 * MIB, 31),
        _event("alloc", LARGE + 2 * MIB, 3 * MIB, 40, ("mlp", 7)),
    ]
    large = [
        _block(LARGE, 2 * MIB, 2 * MIB),
        _block(LARGE + 2 * MIB, 3 * MIB, 3 * MIB),
        _block(LARGE + 5 * MIB, 15 * MIB, 0, "inactive"),
    ]
    small = [_block(SMALL, MIB, MIB), _block(SMALL + MIB, MIB, 0, "inactive")]
    segments = [_segment(LARGE, 20 * MIB, "large", large), _segment(SMALL, 2 * MIB, "small", small)]
    return {"segments": segments, "device_traces": [trace]}


def test_timeline_recovers_baseline_and_steps():
    timeline = memory_timeline(_snapshot())
    assert timeline.baseline_allocated == timeline.baseline_requested == 2 * MIB
    assert [a // MIB for a in timeline.allocated] == [6, 7, 3, 6]
    assert timeline.requested == timeline.allocated
    assert timeline.times == [0.0, 0.01, 0.02, 0.03]  # the free counts at its request
    assert timeline.timed and timeline.problems == ()


def _rounded_snapshot():
    """Requests that their blocks round up, as PyTorch records them: the trace's sizes are
    requests, the end state's blocks carry `size` (the block) and `requested_size`.

    Before the trace: a weight of 5 MiB - 100 B (block 5 MiB) and a random small request in
    the small segment. Traced: an activation of 25 MiB + 7 B (its block split off: 25 MiB +
    512 B), a random request of about 9 MiB in the 10 MiB - 512 B left (at most 1 MiB would
    remain: the block is all of it) and a random small request; then the activation is freed.
    """
    before_small = random.randrange(1, MIB)
    late_small = random.randrange(1, MIB)
    large_request = random.randrange(9 * MIB - 1023, 10 * MIB - 511)
    rest = LARGE + 30 * MIB + 512  # where the activation's block ends
    trace = [
        _event("alloc", LARGE + 5 * MIB, 25 * MIB + 7, 100),
        _event("alloc", rest, large_request, 110),
        _event("alloc", SMALL + round_request(before_small), late_small, 120),
        _event("free_requested", LARGE + 5 * MIB, 25 * MIB + 7, 130),
        _event("free_completed", LARGE + 5 * MIB, 25 * MIB + 7, 131),
    ]
    large = [
        _block(LARGE, 5 * MIB, 5 * MIB - 100),
        _block(LARGE + 5 * MIB, 25 * MIB + 512, 0, "inactive"),
        _block(rest, 10 * MIB - 512, large_request),
    ]
    used = round_request(before_small) + round_request(late_small)
    small = [
        _block(SMALL, round_request(before_small), before_small),
        _block(SMALL + round_request(before_small), round_request(late_small), late_small),
        _block(SMALL + used, 2 * MIB - used, 0, "inactive"),
    ]
    segments = [_segment(LARGE, 40 * MIB, "large", large), _segment(SMALL, 2 * MIB, "small", small)]
    snapshot = {"segments": segments, "device_traces": [trace]}
    return snapshot, (before_small, late_small, large_request)


def test_timeline_baseline_and_curve_in_one_kind_of_bytes():
    snapshot, (before_small, late_small, large_request) = _rounded_snapshot()
    timeline = memory_timeline(snapshot)
    # blocks: the end state's untraced blocks; requests: their requests. Never a mix (the end
    # state's blocks minus the trace's requests would be off by the traced blocks' rounding).
    base = 5 * MIB + round_request(before_small)
    assert timeline.problems == ()
    assert timeline.baseline_allocated == base
    steps = [25 * MIB + 512, 10 * MIB - 512, round_request(late_small), -(25 * MIB + 512)]
    assert timeline.allocated == list(itertools.accumulate(steps, initial=base))[1:]
    base_requested = 5 * MIB - 100 + before_small
    assert timeline.baseline_requested == base_requested
    steps = [25 * MIB + 7, large_request, late_small, -(25 * MIB + 7)]
    assert timeline.requested == list(itertools.accumulate(steps, initial=base_requested))[1:]


def _steps(timeline, base):
    """The allocated curve as the change at each event, checked to start from `base`."""
    assert timeline.baseline_allocated == base
    return [b - a for a, b in itertools.pairwise([base, *timeline.allocated])]


def test_segments_followed_through_the_trace():
    """Blocks rebuilt in segments the trace frees (B), allocates (C) or both (D)."""
    a, b, c, d = (LARGE + i * 64 * MIB for i in range(4))
    odd = random.randrange(11 * MIB + 1, 11 * MIB + MIB // 2)  # in a 12 MiB segment: unsplit
    trace = [
        _event("alloc", b, 19 * MIB + 9, 1),  # 1 MiB - 9 B would remain: all 20 MiB
        _event("free_requested", b, 19 * MIB + 9, 2),
        _event("free_completed", b, 19 * MIB + 9, 2),
        _event("segment_free", b, 20 * MIB, 3),
        _event("segment_alloc", c, 12 * MIB, 4),
        _event("alloc", c, odd, 4),
        _event("segment_alloc", d, 20 * MIB, 5),
        _event("alloc", d, 3 * MIB + 1, 5),  # split off: 3 MiB + 512 B
        _event("free_requested", d, 3 * MIB + 1, 6),
        _event("free_completed", d, 3 * MIB + 1, 6),
        _event("segment_free", d, 20 * MIB, 7),
        _event("alloc", a, 19 * MIB + MIB // 2, 8),  # all 20 MiB
    ]
    segments = [
        _segment(a, 20 * MIB, "large", [_block(a, 20 * MIB, 19 * MIB + MIB // 2)]),
        _segment(c, 12 * MIB, "large", [_block(c, 12 * MIB, odd)]),
    ]
    timeline = memory_timeline({"segments": segments, "device_traces": [trace]})
    assert timeline.problems == ()
    assert _steps(timeline, 0) == [
        20 * MIB, -20 * MIB, 12 * MIB, 3 * MIB + 512, -(3 * MIB + 512), 20 * MIB,
    ]  # fmt: skip


def test_a_deferred_free_counts_at_its_request_and_holds_its_block():
    """`memory_allocated` drops at `free_requested`, but the block is reused, and merged with
    its free neighbours, only after `free_completed`: until then it bounds the free block
    before it, which decides whether the next request there is split."""
    a = LARGE
    trace = [
        _event("alloc", a, 4 * MIB, 1),  # 16 MiB remain: split
        _event("alloc", a + 4 * MIB, 8 * MIB, 2),  # 8 MiB remain: split
        _event("alloc", a + 12 * MIB, 7 * MIB + MIB // 2, 3),  # 0.5 MiB remains: all 8 MiB
        _event("free_requested", a + 4 * MIB, 8 * MIB, 4),  # another stream still uses it
        _event("free_requested", a, 4 * MIB, 5),
        _event("free_completed", a, 4 * MIB, 5),
        _event("alloc", a, 3 * MIB + MIB // 2, 6),  # the free block is 4 MiB, not 12: all 4
        _event("free_completed", a + 4 * MIB, 8 * MIB, 7),
    ]
    blocks = [
        _block(a, 4 * MIB, 3 * MIB + MIB // 2),
        _block(a + 4 * MIB, 8 * MIB, 0, "inactive"),
        _block(a + 12 * MIB, 8 * MIB, 7 * MIB + MIB // 2),
    ]
    snapshot = {"segments": [_segment(a, 20 * MIB, "large", blocks)], "device_traces": [trace]}
    timeline = memory_timeline(snapshot)
    assert timeline.problems == ()
    assert _steps(timeline, 0) == [4 * MIB, 8 * MIB, 8 * MIB, -8 * MIB, -4 * MIB, 4 * MIB]
    assert timeline.times == [0.0, 0.001, 0.002, 0.003, 0.004, 0.005]


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ("untraced_free", "allocated before recording began"),
        ("expandable", "expandable segments"),
        ("wrong_end_size", "rebuilt wrongly"),
    ],
)
def test_block_sizes_not_guessed_when_the_rules_do_not_hold(change, problem):
    snapshot, _ = _rounded_snapshot()
    weight = snapshot["segments"][0]["blocks"][0]
    if change == "untraced_free":
        weight["state"] = "inactive"
        snapshot["device_traces"][0].append(_event("free_requested", LARGE, 5 * MIB - 100, 140))
    elif change == "expandable":
        snapshot["segments"][0]["is_expandable"] = True
    else:
        snapshot["segments"][0]["blocks"][2]["size"] = 9 * MIB  # as if the 9 MiB were split
    timeline = memory_timeline(snapshot)
    assert timeline.allocated is None and timeline.baseline_allocated is None
    assert len(timeline.problems) == 1 and problem in timeline.problems[0]
    assert (
        timeline.baseline_requested
        == 5 * MIB - 100 + snapshot["segments"][1]["blocks"][0]["requested_size"]
    )


def test_render_writes_png_and_finds_largest(tmp_path):
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(_snapshot()))
    summary = render_memory_snapshot(path, tmp_path / "out" / "snap.png", num_largest=2)
    assert summary.path.read_bytes()[:4] == PNG_MAGIC
    assert summary.peak_allocated_bytes == summary.peak_requested_bytes == 7 * MIB
    assert summary.baseline_allocated_bytes == 2 * MIB
    assert [a.size for a in summary.largest] == [4 * MIB, 3 * MIB]
    assert summary.largest[0].where == "model.py:42 attention"  # first frame outside torch


def test_render_without_block_sizes_draws_requests(tmp_path):
    snapshot, _ = _rounded_snapshot()
    snapshot["segments"][0]["blocks"][0]["state"] = "inactive"  # the weight, freed in the trace
    trace = snapshot["device_traces"][0]
    trace.append(_event("free_requested", LARGE, 5 * MIB - 100, 140))
    summary = render_memory_snapshot(snapshot, tmp_path / "x.png")
    assert summary.peak_allocated_bytes is None and summary.baseline_allocated_bytes is None
    assert "allocated before recording" in summary.problems[0]
    assert summary.peak_requested_bytes == memory_timeline(snapshot).requested[2]


_UNWIND = {"filename": "??", "line": 0, "name": "torch::unwind::unwind()"}
_ALLOCATOR = {
    "filename": "??",
    "line": 0,
    "name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(...)",
}


@pytest.mark.parametrize(
    ("frames", "where"),
    [
        # forward: Python and C++ frames; the caller's Python frame wins over torch's own
        (
            [_UNWIND, _ALLOCATOR, *_frames("attention", 42)],
            "model.py:42 attention",
        ),
        # only frames inside torch: the innermost Python one
        (
            [_UNWIND, {"filename": "/x/torch/optim/adamw.py", "line": 9, "name": "_single"}],
            "adamw.py:9 _single",
        ),
        # backward on the autograd thread: no Python frame, the node and op from C++ frames
        (
            [
                _UNWIND,
                _ALLOCATOR,
                {"filename": "??", "line": 0, "name": "at::_ops::mm::call(at::Tensor const&)"},
                {
                    "filename": "??",
                    "line": 0,
                    "name": "torch::autograd::generated::MmBackward0::apply(...)",
                },
            ],
            "MmBackward0 (aten::mm)",
        ),
        ([_UNWIND, {"filename": "??", "line": 0, "name": "at::_ops::bmm::call()"}], "aten::bmm"),
        (
            [_UNWIND, _ALLOCATOR, {"filename": "??", "line": 0, "name": "ncclAllReduce"}],
            "ncclAllReduce",
        ),
        ([_UNWIND, _ALLOCATOR], "no Python frame (backward, or C++)"),
        ([], "no Python frame (backward, or C++)"),
    ],
)
def test_largest_allocations_name_the_code_not_the_unwinder(tmp_path, frames, where):
    snap = _snapshot()
    snap["device_traces"][0][1]["frames"] = frames  # the largest allocation (4 MiB)
    summary = render_memory_snapshot(snap, tmp_path / "x.png", num_largest=1)
    assert summary.largest[0].where == where


def test_render_rejects_non_snapshots(tmp_path):
    with pytest.raises(ValueError, match="not a CUDA memory snapshot"):
        render_memory_snapshot({"rows": []}, tmp_path / "x.png")


def test_render_rejects_empty_trace(tmp_path):
    snap = _snapshot()
    snap["device_traces"] = [[]]
    with pytest.raises(ValueError, match="no allocations"):
        render_memory_snapshot(snap, tmp_path / "x.png")


@pytest.mark.gpu
def test_real_snapshot_matches_the_allocators_counters(tmp_path):
    """On a GPU: the trace records requests and the end state blocks and requests, and the
    rebuilt block bytes are `memory_allocated`'s at the end and `max_memory_allocated`'s peak."""
    device = torch.cuda.current_device()
    gc.collect()  # no tensor allocated before recording may be freed during it
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # so that the trace allocates segments too
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=10_000)
    try:
        small = torch.empty(1000, dtype=torch.uint8, device="cuda")  # a 1024-byte block
        odd = torch.empty(11 * MIB + MIB // 2 + 3, dtype=torch.uint8, device="cuda")
        x = torch.randn(1024, 1024, device="cuda")
        y = x @ x
        del x
        snap = torch.cuda.memory._snapshot()
        allocated, peak = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    requests = {
        e["addr"]: e["size"] for e in snap["device_traces"][device] if e["action"] == "alloc"
    }
    blocks = {b["address"]: b for s in snap["segments"] for b in s["blocks"]}
    assert requests[small.data_ptr()] == blocks[small.data_ptr()]["requested_size"] == 1000
    assert blocks[small.data_ptr()]["size"] == 1024
    assert requests[odd.data_ptr()] == odd.numel() < blocks[odd.data_ptr()]["size"]
    timeline = memory_timeline(snap, device=device)
    assert timeline.problems == ()
    assert timeline.allocated[-1] == allocated
    summary = render_memory_snapshot(snap, tmp_path / "real.png", device=device)
    assert summary.peak_allocated_bytes == peak
    assert y.shape == (1024, 1024)

"""The offline memory-snapshot view, on a hand-made snapshot in PyTorch's format."""

import pickle

import pytest
import torch

from bench.core.memory import MIB
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


def _snapshot():
    """2 MiB held before recording, then: +4 MiB, +1 MiB, -4 MiB, +3 MiB; 1 + 3 MiB live at end."""
    trace = [
        _event("segment_alloc", 0x1000, 20 * MIB, 0),
        _event("alloc", 0x1000, 4 * MIB, 10, ("attention", 42)),
        _event("alloc", 0x2000, 1 * MIB, 20),
        _event("free_requested", 0x1000, 4 * MIB, 30),
        _event("free_completed", 0x1000, 4 * MIB, 31),
        _event("alloc", 0x3000, 3 * MIB, 40, ("mlp", 7)),
    ]
    blocks = [
        {"size": 2 * MIB, "requested_size": 2 * MIB, "state": "active_allocated", "frames": []},
        {"size": 1 * MIB, "requested_size": 1 * MIB, "state": "active_allocated", "frames": []},
        {"size": 3 * MIB, "requested_size": 3 * MIB, "state": "active_allocated", "frames": []},
        {"size": 14 * MIB, "requested_size": 0, "state": "inactive", "frames": []},
    ]
    segment = {
        "device": 0,
        "address": 0x1000,
        "total_size": 20 * MIB,
        "stream": 0,
        "segment_type": "large",
        "allocated_size": 6 * MIB,
        "active_size": 6 * MIB,
        "blocks": blocks,
    }
    return {"segments": [segment], "device_traces": [trace]}


def test_timeline_recovers_baseline_and_steps():
    times, allocated, baseline = memory_timeline(_snapshot())
    assert baseline == 2 * MIB
    assert [a // MIB for a in allocated] == [6, 7, 3, 6]
    assert times == [0.0, 0.01, 0.021, 0.03]


def test_render_writes_png_and_finds_largest(tmp_path):
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(_snapshot()))
    summary = render_memory_snapshot(path, tmp_path / "out" / "snap.png", num_largest=2)
    assert summary.path.read_bytes()[:4] == PNG_MAGIC
    assert summary.peak_bytes == 7 * MIB
    assert [a.size for a in summary.largest] == [4 * MIB, 3 * MIB]
    assert summary.largest[0].where == "model.py:42 attention"  # first frame outside torch


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
def test_render_real_cuda_snapshot(tmp_path):
    torch.cuda.memory._record_memory_history(max_entries=10_000)
    try:
        x = torch.randn(1024, 1024, device="cuda")
        y = x @ x
        del x
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    summary = render_memory_snapshot(snap, tmp_path / "real.png")
    assert summary.peak_bytes >= 2 * 4 * MIB
    assert y.shape == (1024, 1024)

"""scripts/step_memory_snapshot.py without GPUs: the replay of an allocator trace to the peak
between its two sentinels, the grouping by allocating frame, and the result it writes."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest
import torch

from bench.core.results import load_json

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "step_memory_snapshot.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("step_memory_snapshot", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def _frames(path: str, line: int) -> list[dict]:
    return [
        {"filename": "/usr/lib/python3/threading.py", "line": 1, "name": "run"},
        {"filename": f"/repo/packages/{path}", "line": line, "name": "f"},
    ]


def test_the_replay_finds_the_peak_inside_the_window_and_who_holds_it(script):
    rng = random.Random()
    sizes = [rng.randrange(1, 1000) * 512 for _ in range(4)]
    mark = script._SENTINEL_BYTES
    trace = [
        # before the window: a persistent weight and a temporary freed before it opens
        {"action": "alloc", "addr": 1, "size": sizes[0], "frames": _frames("w.py", 3)},
        {"action": "alloc", "addr": 2, "size": 10 * sizes[0], "frames": _frames("tmp.py", 4)},
        {"action": "free_requested", "addr": 2, "size": 10 * sizes[0]},
        {"action": "alloc", "addr": 100, "size": mark, "frames": []},  # the window opens
        {"action": "alloc", "addr": 3, "size": sizes[1], "frames": _frames("act.py", 5)},
        {"action": "alloc", "addr": 4, "size": sizes[2], "frames": _frames("act.py", 5)},
        {"action": "free_requested", "addr": 3, "size": sizes[1]},
        {"action": "alloc", "addr": 5, "size": sizes[3], "frames": _frames("grad.py", 6)},
        {"action": "free_requested", "addr": 4, "size": sizes[2]},
        {"action": "free_requested", "addr": 5, "size": sizes[3]},
        {"action": "alloc", "addr": 200, "size": mark, "frames": []},  # and closes
    ]
    peak, groups = script._live_at_peak(trace, (100, 200))
    # the peak is either while 3 and 4 are alive or while 4 and 5 are
    both = max(sizes[1], sizes[3]) + sizes[2]
    assert peak == sizes[0] + mark + both
    holder = "act.py:5 f" if sizes[1] >= sizes[3] else "grad.py:6 f"
    assert groups["w.py:3 f"] == sizes[0] and "tmp.py:4 f" not in groups
    assert groups[holder] == (sizes[1] + sizes[2] if sizes[1] >= sizes[3] else sizes[3])


def test_the_result_it_writes_reads_back_as_a_bench_result(script, tmp_path):
    mib = script._MIB
    groups = {"lmcore/optim.py:1 s": 3 * mib, "?": 2 * mib, "tiny.py:1 x": 10}
    script._save("zero1", False, 9 * mib, 6 * mib, 9 * mib, {"state": 3 * mib}, groups,
                 torch.device("cpu"), str(tmp_path))  # fmt: skip
    (path,) = tmp_path.glob("step_memory_snapshot_cpu_*_zero1.json")
    run = load_json(path)
    assert run.tool == "memory-snapshot" and run.config["compile"] is False
    table = {r["what"]: r["mib"] for r in run.rows}
    assert table["peak (max_memory_allocated), eager blocks"] == 9
    assert table["alive at the peak, allocated at lmcore/optim.py:1 s"] == 3
    assert not any("tiny.py" in w for w in table)  # under a MiB: left out
    assert path.with_suffix(".md").read_text().count("| alive at the peak") == 2

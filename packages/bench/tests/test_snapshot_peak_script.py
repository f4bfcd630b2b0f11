"""scripts/snapshot_peak.py without GPUs: the replay of a hand-made snapshot to its allocated peak,
block sizes rebuilt from requests by the allocator's rules, and the method's self-checks."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from script_module import script_module

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "snapshot_peak.py"
MIB = 1 << 20


@pytest.fixture(scope="module")
def script():
    with script_module(SCRIPT) as module:
        yield module


def _frames(line: int) -> list[dict]:
    return [{"filename": "/repo/packages/model.py", "line": line, "name": "f"}]


def _snapshot():
    """A large segment of 40 MiB and a small one of 2 MiB.

    Before the trace: a 5 MiB weight at L (request 5 MiB - 100 B). Traced: an activation of
    25 MiB + 7 B at L + 5 MiB (10 MiB stay free after it: split), a 9 MiB request at L + 30 MiB
    (10 MiB free there, 1 MiB would remain: not split, the block takes all 10) and 700 B in the
    small segment; the activation is freed; a fresh random request lands at L + 5 MiB and lives.
    """
    big, small = 0x10_0000_0000, 0x20_0000_0000
    late = random.randrange(2 * MIB, 20 * MIB)
    late_block = -(-late // 512) * 512
    trace = [
        {"action": "alloc", "addr": big + 5 * MIB, "size": 25 * MIB + 7, "frames": _frames(1)},
        {"action": "alloc", "addr": big + 30 * MIB, "size": 9 * MIB, "frames": _frames(2)},
        {"action": "alloc", "addr": small, "size": 700, "frames": _frames(3)},
        {"action": "free_requested", "addr": big + 5 * MIB, "size": 25 * MIB + 7},
        {"action": "free_completed", "addr": big + 5 * MIB, "size": 25 * MIB + 7},
        {"action": "free_requested", "addr": small, "size": 700},
        {"action": "free_completed", "addr": small, "size": 700},
        {"action": "alloc", "addr": big + 5 * MIB, "size": late, "frames": _frames(4)},
    ]
    weight = {"address": big, "size": 5 * MIB, "requested_size": 5 * MIB - 100,
              "state": "active_allocated", "frames": _frames(0)}  # fmt: skip
    blocks = [
        weight,
        {"address": big + 5 * MIB, "size": late_block, "requested_size": late,
         "state": "active_allocated", "frames": _frames(4)},
        {"address": big + 5 * MIB + late_block, "size": 25 * MIB - late_block,
         "requested_size": 0, "state": "inactive", "frames": []},
        {"address": big + 30 * MIB, "size": 10 * MIB, "requested_size": 9 * MIB,
         "state": "active_allocated", "frames": _frames(2)},
    ]  # fmt: skip
    segments = [
        {"device": 0, "address": big, "total_size": 40 * MIB, "segment_type": "large",
         "blocks": blocks},
        {"device": 0, "address": small, "total_size": 2 * MIB, "segment_type": "small",
         "blocks": [{"address": small, "size": 2 * MIB, "requested_size": 0,
                     "state": "inactive", "frames": []}]},
    ]  # fmt: skip
    return {"segments": segments, "device_traces": [trace, []]}, late


def test_replay_rebuilds_blocks_and_finds_the_allocated_peak(script):
    snapshot, late = _snapshot()
    found = script.analyse(snapshot, max_entries=100)
    # peak: weight + split activation + unsplit 10 MiB block + 512-byte small block (request 700
    # rounds to 1024), unless the late allocation (with the 10 MiB block) is larger
    early = 5 * MIB + (25 * MIB + 7 + 505) + 10 * MIB + 1024
    late_total = 5 * MIB + -(-late // 512) * 512 + 10 * MIB
    assert found["peak_allocated"] == max(early, late_total) == early
    assert found["peak_requested"] == (5 * MIB - 100) + (25 * MIB + 7) + 9 * MIB + 700
    assert found["rounding"] == found["peak_allocated"] - found["peak_requested"]
    assert found["rounded_blocks"] == 1  # only the unsplit block is >= 1 MiB over its request
    assert found["before_trace_allocated"] == 5 * MIB
    assert found["before_trace_requested"] == 5 * MIB - 100
    assert found["reserved_end"] == 42 * MIB
    checks = ("size_mismatches", "unplaced", "untraced_frees", "expandable")
    assert [found[k] for k in checks] == [0, 0, 0, 0]
    assert not found["trace_full"] and found["device"] == 0
    assert found["top_sites"][0] == {
        "site": "model.py:1 f", "blocks": 1, "allocated": 25 * MIB + 512, "requested": 25 * MIB + 7,
    }  # fmt: skip


def test_self_checks_flag_a_wrong_end_state_and_a_full_trace(script):
    snapshot, _ = _snapshot()
    snapshot["segments"][0]["blocks"][3]["size"] = 9 * MIB + 512  # as if it had been split
    found = script.analyse(snapshot, max_entries=8)
    assert found["size_mismatches"] == 1 and found["trace_full"]
    assert script._row("x", found)["status"].startswith("method does not hold")

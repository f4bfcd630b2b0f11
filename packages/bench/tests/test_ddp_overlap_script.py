"""scripts/ddp_overlap.py's arithmetic, without ranks: the interval sums of a trace summary, the
all-reduce curve, the tail model, the slowest-rank median, and which combinations it picks."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ddp_overlap.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("ddp_overlap", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def _kernel(name: str, start_us: float, dur_us: float, stream: int, grid=(1, 1, 1)) -> dict:
    return {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "ts": start_us,
        "dur": dur_us,
        "args": {"stream": stream, "grid": list(grid)},
    }


def test_union_and_intersection_of_overlapping_intervals(script):
    a = script.union([(3.0, 5.0), (0.0, 2.0), (1.0, 2.5)])
    assert a == [(0.0, 2.5), (3.0, 5.0)]
    b = script.union([(2.0, 4.0), (4.5, 6.0)])
    assert script.total(a) == pytest.approx(4.5)
    # (2, 2.5) + (3, 4) + (4.5, 5)
    assert script.intersection(a, b) == pytest.approx(2.0)


def test_trace_summary_splits_nccl_from_compute_and_finds_the_exposed_part(script):
    events = [
        _kernel("ampere_sgemm_128x64", 0, 4000, stream=7),  # compute 0-4 ms
        _kernel("ampere_sgemm_128x64", 5000, 1000, stream=7),  # compute 5-6 ms
        _kernel("ncclDevKernel_AllReduce_Sum_f32", 3000, 4000, stream=20, grid=(24, 1, 1)),
        {"ph": "X", "cat": "user_annotation", "name": "ddp.all_reduce", "ts": 10, "dur": 30},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "ddp.all_reduce", "ts": 3000, "dur": 9},
    ]
    s = script.summarize_trace(events)
    assert s["window_ms"] == pytest.approx(7.0)
    assert s["compute_ms"] == pytest.approx(5.0)
    assert s["nccl_ms"] == pytest.approx(4.0)
    assert s["overlap_ms"] == pytest.approx(2.0)  # 3-4 and 5-6
    assert s["exposed_ms"] == pytest.approx(2.0)  # 4-5 and 6-7
    assert s["idle_ms"] == pytest.approx(0.0)
    assert s["nccl_ctas"] == 24
    assert s["launch_ms"] == pytest.approx(0.03)  # the host range only
    assert s["streams"]["20"] == {"kind": "nccl", "busy_ms": pytest.approx(4.0), "kernels": 1}
    assert s["streams"]["7"]["kind"] == "compute"


def test_trace_summary_without_kernels_has_no_kernel_numbers(script):
    s = script.summarize_trace([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0}])
    assert s["compute_ms"] is None and s["nccl_ms"] is None


def test_inflation_is_compute_time_beyond_the_single_trace(script):
    traces = [
        {"dtype": "fp32", "role": "single", "rank0": {"compute_ms": 10.0}},
        {"dtype": "fp32", "role": "best", "rank0": {"compute_ms": 12.5}},
    ]
    script.add_inflation(traces)
    assert traces[1]["rank0"]["inflation_ms"] == pytest.approx(2.5)
    assert traces[0]["rank0"]["inflation_ms"] == 0.0


def test_allreduce_curve_interpolates_log_log_and_extrapolates_bandwidth(script):
    curve = [(10**6, 0.1), (10**8, 1.0), (10**9, 4.0)]
    assert script.interpolate_ms(curve, 10**7) == pytest.approx(math.sqrt(0.1 * 1.0))
    assert script.interpolate_ms(curve, 10**5) == 0.1
    # Above the last point: the last segment's 3 ms per 0.9e9 bytes.
    assert script.interpolate_ms(curve, 19 * 10**8) == pytest.approx(4.0 + 3.0)


def test_predicted_tail_is_the_last_bucket_when_the_network_keeps_up(script):
    curve = [(1, 1.0), (1000, 1.0)]  # every bucket takes 1 ms
    # Three equal buckets over a 30 ms backward: ready at 10, 20, 30 ms; the last ends at 31.
    tail = script.predicted_tail_ms([[5], [5], [5]], [100, 100, 100], 30.0, curve)
    assert tail == pytest.approx(1.0)


def test_predicted_tail_adds_the_backlog_of_a_slow_network(script):
    curve = [(1, 15.0), (1000, 15.0)]  # every bucket takes 15 ms: ends at 25, 40, 55
    tail = script.predicted_tail_ms([[5], [5], [5]], [100, 100, 100], 30.0, curve)
    assert tail == pytest.approx(25.0)


def test_slowest_median_takes_the_worst_rank_at_each_step(script):
    median, spread = script.slowest_median([[1.0, 5.0, 3.0], [2.0, 1.0, 4.0]])
    assert median == 4.0  # max per step: 2, 5, 4
    assert spread == pytest.approx(1.5275252)


def test_combinations_take_the_fastest_communication_lever(script):
    def row(step_ms, **levers):
        lv = script.Levers(**levers)
        return {
            "dtype": "fp32",
            "status": "ok",
            "lever_count": len(lv.names()),
            "levers": {"comm": lv.comm, "compute_hi": lv.compute_hi},
            "step_ms": step_ms,
        }

    rows = [row(10.0, comm="ctas8"), row(9.0, compute_hi=True), row(8.0, tail=True)]
    cases = script.combination_cases("fp32", [1000.0], rows)
    labels = [c.label for c in cases]
    assert labels == [
        "bucketed 1000 MB +tail +opt",
        "bucketed 1000 MB +tail +compute-hi",
        "bucketed 1000 MB +opt +compute-hi",
        "bucketed 1000 MB +tail +opt +compute-hi",
    ]


def test_single_levers_on_a_cpu_leave_out_nccl_and_cuda_ones(script):
    cases = script.single_lever_cases("bf16", [4.0], cuda=False)
    assert [c.label for c in cases] == [
        "bucketed 4 MB +tail",
        "bucketed 4 MB +opt",
        "bucketed 4 MB +bf16-wire",
    ]

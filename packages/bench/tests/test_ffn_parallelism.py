"""The collectives' costs and the handout's §8 answers, against simulations and hand arithmetic."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.core.hardware import MEASURED_MATMUL_TFLOPS
from bench.plan import ffn
from bench.plan.collectives import (
    BANDWIDTH_RESULT,
    DEFAULT_BANDWIDTH_GBPS,
    MEASURED_BANDWIDTH_GBPS,
    Collective,
    alternate_ring_all_reduce_bytes,
    alternate_ring_all_reduce_seconds,
    measured_bandwidth_gbps,
    ring_all_gather_bytes,
    ring_all_reduce_bytes,
    ring_reduce_scatter_bytes,
)

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "docs" / "results"


def _ring_all_reduce(values: list[list[float]]) -> tuple[list[list[float]], list[int]]:
    """Simulate the ring all-reduce (reduce-scatter, then all-gather) of §8.1 on N devices whose
    tensors are N chunks each; return the results and the chunks each device sent."""
    n = len(values)
    y = [list(v) for v in values]
    sent = [0] * n
    for t in range(1, n):  # reduce-scatter: device i sends chunk (i - t + 1) mod n
        messages = [(i, (i - t + 1) % n, y[i][(i - t + 1) % n]) for i in range(n)]
        for i, chunk, value in messages:
            y[(i + 1) % n][chunk] += value
            sent[i] += 1
    for t in range(1, n):  # all-gather: device i passes on the finished chunk (i - t + 2) mod n
        messages = [(i, (i - t + 2) % n, y[i][(i - t + 2) % n]) for i in range(n)]
        for i, chunk, value in messages:
            y[(i + 1) % n][chunk] = value
            sent[i] += 1
    return y, sent


def _alternate_all_reduce(values: list[float]) -> tuple[list[float], list[int]]:
    """The handout's alternate algorithm: at step t device i sends x((i − t + 1) mod N) whole."""
    n = len(values)
    y = list(values)
    sent = [0] * n
    for t in range(1, n):
        for i in range(n):
            y[(i + 1) % n] += values[(i - t + 1) % n]
            sent[i] += 1
    return y, sent


@pytest.mark.parametrize("n", [2, 3, 5])
def test_ring_all_reduce_sends_what_the_formula_says(n):
    values = [[float(10 * i + c) for c in range(n)] for i in range(n)]
    result, sent = _ring_all_reduce(values)
    total = [sum(v[c] for v in values) for c in range(n)]
    assert all(r == total for r in result)
    size = 7.0 * n  # S bytes in chunks of 7
    assert all(k * 7.0 == ring_all_reduce_bytes(size, n) for k in sent)
    assert (
        ring_all_gather_bytes(size, n) == ring_reduce_scatter_bytes(size, n) == size * (n - 1) / n
    )


@pytest.mark.parametrize("n", [2, 4, 7])
def test_alternate_all_reduce_sends_whole_tensors(n):
    values = [float(3 * i + 1) for i in range(n)]
    result, sent = _alternate_all_reduce(values)
    assert result == [sum(values)] * n
    assert all(k * 5.0 == alternate_ring_all_reduce_bytes(5.0, n) for k in sent)
    # N/2 times the ring's time
    ring = ring_all_reduce_bytes(5.0, n)
    assert math.isclose(alternate_ring_all_reduce_bytes(5.0, n) / ring, n / 2)
    assert math.isclose(alternate_ring_all_reduce_seconds(5.0, n, 2.0), (n - 1) * 5.0 / 2.0)


def test_collective_counts_and_times():
    c = Collective("all-reduce", "gradients", 8e9, 2, count=3)
    assert c.sent_bytes == 3 * 8e9
    assert math.isclose(c.seconds(100.0), 0.24)
    with pytest.raises(ValueError, match="kind must be"):
        Collective("gossip", "x", 1.0, 2)
    with pytest.raises(ValueError, match="num_devices"):
        Collective("all-gather", "x", 1.0, 0)


def test_measured_bandwidths_are_the_committed_largest_nccl_all_reduce_per_world_size():
    run = json.loads((ROOT / BANDWIDTH_RESULT).read_text())
    nccl = [r for r in run["rows"] if r["backend"] == "nccl" and r["status"] == "ok"]
    largest = {
        n: max((r for r in nccl if r["world_size"] == n), key=lambda r: r["size_mb"])
        for n in {r["world_size"] for r in nccl}
    }
    assert {n: r["size_mb"] for n, r in largest.items()} == {2: 1000.0, 4: 1000.0}
    assert {n: round(r["busbw_gbps"], 1) for n, r in largest.items()} == MEASURED_BANDWIDTH_GBPS
    assert MEASURED_BANDWIDTH_GBPS[2] == DEFAULT_BANDWIDTH_GBPS


@pytest.mark.parametrize(("n", "measured_at"), [(1, 2), (2, 2), (3, 2), (4, 4), (8, 4)])
def test_a_ring_takes_the_bandwidth_measured_at_its_size_or_the_largest_below(n, measured_at):
    assert measured_bandwidth_gbps(n) == MEASURED_BANDWIDTH_GBPS[measured_at]
    c = Collective("all-reduce", "gradients", 8e9, n)
    assert math.isclose(c.seconds(), c.sent_bytes / (MEASURED_BANDWIDTH_GBPS[measured_at] * 1e9))


def test_measured_matmul_rate_is_the_committed_measurement():
    record = json.loads((RESULTS / "matmul_ceiling_h100_2026-11-23.json").read_text())
    best = max(record["bf16_matmul_8192_tflops"])
    assert round(best, 1) == MEASURED_MATMUL_TFLOPS["H100"]["bf16"]


# B = 100 rows, D = 8, F = 200, C = 1500 FLOP/s, W = 45 B/s: B·W/C = 3 and 3·F·W/(2·C) = 9.
SETTING = ffn.FFNSetting(batch=100, d_model=8, d_ff=200, flops_per_s=1500.0, bandwidth=45.0)


def test_data_parallel_by_hand():
    calcs = ffn.data_parallel(SETTING, 4)
    # backward: six (B/N, D)·(D, F) matmuls, 2·25·8·200 = 80,000 FLOPs each
    assert calcs.backward_flops.value == 6 * 80_000
    assert calcs.forward_flops.value == 3 * 80_000
    # all-reduce of 3·D·F·2 = 9,600 B: 2·3/4·9,600 / 45 s
    assert math.isclose(calcs.backward_comm_s.value, 2 * 0.75 * 9600 / 45)
    assert calcs.forward_comm_s.value == 0


def test_data_parallel_bound_is_where_communication_overtakes():
    bound = ffn.data_parallel_max_devices(SETTING)
    assert bound.value == 4  # 1 + B·W/C
    assert not ffn.data_parallel(SETTING, 4).communication_bound("backward")
    assert math.isclose(
        ffn.data_parallel(SETTING, 4).backward_comm_s.value,
        ffn.data_parallel(SETTING, 4).compute_s("backward"),
    )
    assert ffn.data_parallel(SETTING, 5).communication_bound("backward")


def test_fsdp_by_hand():
    calcs = ffn.fsdp(SETTING, 4)
    gather = 0.75 * 9600 / 45  # (N − 1)/N · 6·D·F / W
    assert math.isclose(calcs.forward_comm_s.value, gather)
    assert math.isclose(calcs.backward_comm_s.value, 2 * gather)  # gather + reduce-scatter
    backward, forward = ffn.fsdp_max_devices(SETTING)
    assert backward.value == forward.value == 4
    assert not calcs.communication_bound("forward")
    assert ffn.fsdp(SETTING, 5).communication_bound("forward")


def test_tensor_parallel_by_hand():
    calcs = ffn.tensor_parallel(SETTING, 10)
    # one all-reduce of B·D·2 = 1,600 B each way: 2·9/10·1,600 / 45 s
    assert math.isclose(calcs.forward_comm_s.value, 2 * 0.9 * 1600 / 45)
    assert calcs.forward_comm_s.value == calcs.backward_comm_s.value
    backward, forward = ffn.tensor_parallel_max_devices(SETTING)
    assert backward.value == 19 and forward.value == 10  # 1 + 3·F·W/C, 1 + 3·F·W/(2·C)
    assert not calcs.communication_bound("forward")
    assert ffn.tensor_parallel(SETTING, 11).communication_bound("forward")
    assert not ffn.tensor_parallel(SETTING, 19).communication_bound("backward")
    assert ffn.tensor_parallel(SETTING, 20).communication_bound("backward")
    assert ffn.tensor_parallel_backward_equations()[-1].startswith("dx = all-reduce")


def test_2d_overlapped_bound_is_the_product_of_the_axes():
    bound = ffn.fsdp_tp_max_devices(SETTING, overlap=True)
    assert bound.value == 4 * 10  # (1 + B·W/C)(1 + 3·F·W/(2·C))
    at_bound = ffn.fsdp_tp(SETTING, 4, 10)
    assert math.isclose(at_bound.forward_comm_s.value, at_bound.compute_s("forward"))
    assert ffn.fsdp_tp(SETTING, 5, 10).communication_bound("forward")
    assert ffn.fsdp_tp(SETTING, 4, 11).communication_bound("forward")


def test_2d_shared_network_bound_against_a_search():
    # Maximise N = a·b over real a = N_TP, b = N_FSDP subject to the handout's condition with
    # (N − 1)/N ≈ 1: 6·D·F/(a·W) + 4·B·D/(b·W) ≤ 6·B·D·F/(a·b·C), searched on a fine grid of a
    # (for each a the condition is linear in b).
    s = SETTING
    best = 0.0
    for step in range(1, 200_001):
        a = step * 1e-3
        b = (6 * s.batch * s.d_model * s.d_ff / s.flops_per_s - 4 * s.batch * s.d_model * a
             / s.bandwidth) * s.bandwidth / (6 * s.d_model * s.d_ff)  # fmt: skip
        best = max(best, a * b)
    bound = ffn.fsdp_tp_max_devices(s, overlap=False)
    assert math.isclose(bound.value, best, rel_tol=1e-6)
    assert bound.formula.startswith("N ≤ 3·B·F·W²/(8·C²)")


def test_setting_rejects_nonsense():
    with pytest.raises(ValueError, match="bandwidth must be positive"):
        ffn.FFNSetting(batch=1, d_model=1, d_ff=1, flops_per_s=1.0, bandwidth=0.0)
    with pytest.raises(ValueError, match="num_devices"):
        ffn.data_parallel(SETTING, 0)

"""bench-plan's answers to the 2025 handout's bucket-size equation and XXL accounting, checked
against arithmetic done by hand and against the optimum's definition."""

import math

import pytest

from bench.plan import buckets, xxl


def test_the_bucket_overhead_is_per_call_costs_plus_the_last_transfer():
    # s = 8 GB, w = 320 GB/s, o = 77 µs, 10 buckets: 10·77e-6 + 8e9/(10·320e9) s
    got = buckets.ddp_overhead_seconds(8e9, 320e9, 77e-6, 10).value
    assert got == pytest.approx(10 * 77e-6 + 8e9 / (10 * 320e9))


def test_the_optimal_bucket_minimises_the_overhead():
    s, w, o = 7.99e9, 320.2e9, 77.3e-6
    best = buckets.optimal_bucket_bytes(s, w, o).value
    assert best == pytest.approx(math.sqrt(s * w * o))
    n_best = s / best
    at = {
        n: buckets.ddp_overhead_seconds(s, w, o, n).value for n in (n_best / 2, n_best, 2 * n_best)
    }
    assert at[n_best] < at[n_best / 2] and at[n_best] < at[2 * n_best]
    assert at[n_best] == pytest.approx(2 * math.sqrt(s * o / w))
    with pytest.raises(ValueError, match="bandwidth"):
        buckets.optimal_bucket_bytes(s, 0.0, o)


def test_xxl_memory_by_hand():
    params = 126 * 2 * 16384 * 53248
    assert xxl.XXL.parameters == params == 219_848_638_464
    assert xxl.state_bytes(xxl.XXL).value == 16 * params
    assert xxl.activation_bytes_per_token(xxl.XXL).value == 2 * (16384 + 53248) * 126
    # 16·P / 95 GB = 37.03: 38 devices when activations are left out
    assert xxl.fsdp_devices(xxl.XXL, 95e9).value == 38
    # 4,096 tokens add A/2 = 35.9 GB unsharded: (16P + A/2)/(95 GB − A/2) = 60.2 → 61
    assert xxl.fsdp_devices(xxl.XXL, 95e9, tokens=4096).value == 61
    with pytest.raises(ValueError, match="fewer tokens"):
        xxl.fsdp_devices(xxl.XXL, 95e9, tokens=20_000)


def test_xxl_compute_bound_batch_by_hand():
    # C / (W·M_X·Y) = 4.6e14 / (1.8e11 · 2 · 4) = 319.4 tokens per device
    assert xxl.compute_bound_batch(xxl.XXL, xxl.TPU_V5P).value == pytest.approx(319.44, abs=0.01)
    too_wide = xxl.Mesh(4.6e14, 1.8e11, fsdp=2, tp=32, fsdp_links=2, tp_links=1)
    with pytest.raises(ValueError, match="compute-bound at no batch"):
        xxl.compute_bound_batch(xxl.XXL, too_wide)

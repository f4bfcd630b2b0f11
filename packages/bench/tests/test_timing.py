"""Device-synchronised timers and their summaries."""

import statistics
import time

import numpy as np
import pytest
import torch

from bench.core.timing import Summary, do_bench, elapsed_ms, summarize, time_fn
from bench.tools.attn import time_with_setup

CPU = torch.device("cpu")
SLEEP_S = 0.004  # long enough to dominate timer overhead, short enough for CI


def test_elapsed_ms_returns_result_and_wall_time():
    result, ms = elapsed_ms(lambda: (time.sleep(SLEEP_S), 7)[1], device=CPU)
    assert result == 7
    assert SLEEP_S * 1e3 <= ms < SLEEP_S * 1e3 + 50


def test_time_fn_runs_warmup_untimed_then_repeats():
    calls = []
    samples = time_fn(lambda: calls.append(1), device=CPU, warmup=3, repeats=5)
    assert len(calls) == 8
    assert len(samples) == 5
    assert all(s >= 0 for s in samples)


def test_time_with_setup_times_only_fn():
    order = []

    def setup():
        order.append("setup")
        time.sleep(SLEEP_S * 5)
        return len(order)

    samples = time_with_setup(setup, order.append, device=CPU, warmup=1, repeats=3)
    assert order[:2] == ["setup", 1]
    assert len(order) == 8
    assert max(samples) < SLEEP_S * 5e3  # the setup's sleep is not counted


@pytest.mark.parametrize(("warmup", "repeats"), [(-1, 3), (0, 0)])
def test_time_fn_rejects_bad_counts(warmup, repeats):
    with pytest.raises(ValueError, match="warmup"):
        time_fn(lambda: None, device=CPU, warmup=warmup, repeats=repeats)


def test_summarize_matches_statistics_module():
    samples = torch.rand(17, dtype=torch.float64).add(0.5).tolist()
    s = summarize(samples)
    assert s == Summary(
        n=17,
        mean=pytest.approx(statistics.fmean(samples)),
        std=pytest.approx(statistics.stdev(samples)),
        median=statistics.median(samples),
        min=min(samples),
        max=max(samples),
        iqr=pytest.approx(float(np.subtract(*np.percentile(samples, [75, 25])))),
    )


def test_summarize_of_one_sample_has_zero_std_and_iqr():
    assert summarize([3.5]).std == summarize([3.5]).iqr == 0.0


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")]])
def test_summarize_rejects_empty_or_nonfinite(bad):
    with pytest.raises(ValueError):
        summarize(bad)


def test_summary_as_dict_prefixes_keys():
    d = summarize([1.0, 3.0]).as_dict("fwd_ms_")
    assert d["fwd_ms_mean"] == 2.0
    assert set(d) == {f"fwd_ms_{k}" for k in ("n", "mean", "std", "median", "min", "max", "iqr")}


def test_do_bench_on_cpu_spends_about_its_budget():
    samples = do_bench(lambda: time.sleep(SLEEP_S), device=CPU, warmup_ms=10, rep_ms=40)
    assert 3 <= len(samples) <= 12  # 40 ms of 4 ms calls, with slack for a slow machine
    assert summarize(samples).median >= SLEEP_S * 1e3


def test_do_bench_clears_grads_before_each_call():
    x = torch.randn(5, requires_grad=True)
    seen = []

    def step():
        seen.append(x.grad is None)
        (x * x).sum().backward()

    do_bench(step, device=CPU, warmup_ms=1, rep_ms=2, grad_to_none=[x])
    assert all(seen)


@pytest.mark.gpu
def test_elapsed_ms_on_cuda_times_the_kernel_not_the_launch():
    a = torch.randn(4096, 4096, device="cuda")
    a[:64, :64] @ a[:64, :64], a @ a  # cuBLAS's first calls load its kernels: not timed
    _, small = elapsed_ms(lambda: a[:64, :64] @ a[:64, :64], device="cuda")
    _, big = elapsed_ms(lambda: [a @ a for _ in range(8)], device="cuda")
    assert big > small


@pytest.mark.gpu
def test_do_bench_on_cuda_uses_triton_and_returns_samples():
    a = torch.randn(1024, 1024, device="cuda")
    samples = do_bench(lambda: a @ a, device="cuda", warmup_ms=5, rep_ms=20)
    assert len(samples) > 1
    assert summarize(samples).median > 0

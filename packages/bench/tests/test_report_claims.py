"""Prose that checks itself: each sentence of bench-report that says more than its numbers takes
its words from a rule (`bench.report.claims`) fed the rows it cites, so rows that say the
opposite change the sentence. Each test builds a report from rows one way, then reversed."""

import math

import pytest

from bench.report import claims
from bench.report.tool import build_report

XL = {"d_model": 2560, "d_ff": 10240, "num_layers": 32, "num_heads": 32}
SMALL = {"d_model": 768, "d_ff": 3072, "num_layers": 12, "num_heads": 12}


def _section(text: str, key: str) -> str:
    return text.split(f"`{key}`)\n")[1].split("\n## ")[0]


def _report(tmp_path, key: str) -> str:
    return _section(build_report(tmp_path), key)


# ---------------------------------------------------------------- the rules


def test_relation_counts_a_small_difference_as_level():
    assert claims.relation(106, 100) == "above"
    assert claims.relation(94, 100) == "below"
    assert claims.relation(104, 100) == "level with"
    with pytest.raises(ValueError, match="positive"):
        claims.relation(1, 0)


def test_speed_reads_the_median_ratio():
    assert claims.speed([0.5, 1.3, 1.4]) == "faster"
    assert claims.speed([0.5, 0.8, 3.0]) == "slower"
    assert claims.speed_against(1.01, "flat DDP") == "about as fast as flat DDP"
    assert claims.speed_against(0.9, "flat DDP") == "slower than flat DDP"


def test_growth_names_the_power():
    assert claims.growth(claims.growth_exponent(8192, 2200.0, 16384, 8640.0)) == "with its square"
    assert claims.growth(claims.growth_exponent(1, 3.0, 10, 31.0)) == "linearly"
    assert claims.growth(claims.growth_exponent(1, 3.0, 10, 3.1)) == "barely"
    assert math.isclose(claims.growth_exponent(2, 1.0, 4, 8.0), 3.0)


# ---------------------------------------------------------------- §2.1.3 (b), (c)


def _model_row(mode: str, fwd_ms: float, std: float, **extra) -> dict:
    return {
        "size": "small", **SMALL, "ctx": 512, "batch": 4, "mode": mode, "dtype": "fp32",
        "attention": "naive", "compiled": False, "fwd_ms": fwd_ms, "fwd_std": std,
        "bwd_ms": None if mode == "forward" else 2 * fwd_ms,
        "step_ms": fwd_ms if mode == "forward" else 3 * fwd_ms, "step_std": std,
        "status": "ok", **extra,
    }  # fmt: skip


@pytest.mark.parametrize(("std", "said"), [(0.2, "so the timings are stable"), (3.0, "vary")])
def test_the_spread_sentence_follows_the_standard_deviation(save, tmp_path, std, said):
    rows = [_model_row(m, 20.0, std) for m in ("forward", "train-step")]
    save("model_h100_2026-11-28", "model", rows, date="2026-11-28")
    assert said in _report(tmp_path, "benchmarking_script")


def _warmup_rows(means: dict[int, float]) -> list[dict]:
    return [
        {**_model_row("forward-backward", m / 3, 1.0), "step_ms": m, "warmup": w,
         "first_step_ms": m * (5 if w == 0 else 1)}
        for w, m in means.items()
    ]  # fmt: skip


def test_the_warm_up_sentence_says_where_short_warm_ups_land(save, tmp_path):
    save("warmup_h100_2026-11-28", "warmup", _warmup_rows({0: 160, 1: 54, 2: 61, 5: 59}),
         date="2026-11-28")  # fmt: skip
    text = _report(tmp_path, "benchmarking_script (c)")
    assert "1 warm-up (54 ms) is below it" in text
    assert "2 warm-up (61 ms) is within 5% of it" in text
    assert "keeps their mean and spread above" not in text  # the old, stale sentence


def test_reversed_warm_up_rows_reverse_the_sentence(save, tmp_path):
    save("warmup_h100_2026-11-28", "warmup", _warmup_rows({0: 58, 1: 75, 2: 70, 5: 59}),
         date="2026-11-28")  # fmt: skip
    text = _report(tmp_path, "benchmarking_script (c)")
    assert "1 and 2 warm-up (75 ms, 70 ms) are still above it" in text
    assert "no one-time cost shows" in text and "pay for CUDA context" not in text


@pytest.mark.parametrize(
    ("h100", "h200", "said", "disagree"),
    [
        ({0: 160, 1: 54, 2: 61, 5: 59}, {0: 108, 1: 52, 2: 52, 5: 53},
         "land below it in 1 of 4 (1 warm-up step on the NVIDIA H100", True),
        ({0: 160, 1: 75, 2: 70, 5: 59}, {0: 108, 1: 70, 2: 65, 5: 53},
         "land above it in 4 of 4", False),
    ],
)  # fmt: skip
def test_two_warm_up_studies_are_read_together(save, tmp_path, h100, h200, said, disagree):
    save("warmup_h100_2026-11-23", "warmup", _warmup_rows(h100), date="2026-11-23")
    save("warmup_h200_2026-11-28", "warmup", _warmup_rows(h200), date="2026-11-28",
         device_name="NVIDIA H200")  # fmt: skip
    text = _report(tmp_path, "benchmarking_script (c)")
    assert "fp32 on one NVIDIA H200: 0 warm-up" in text and said in text
    assert ("no cost that warm-up removes" in text) == disagree


# ---------------------------------------------------------------- §2.1.5


def _accumulation(tmp_path, save, fp16_error: float) -> str:
    rows = [
        {"part": "accumulation", "case": case, "printed": "10.0", "abs_error": err}
        for case, err in (("fp32 += fp32", 1e-4), ("fp16 += fp16", fp16_error))
    ]
    save("precision_h100_2026-11-28", "precision", rows, date="2026-11-28")
    return _report(tmp_path, "mixed_precision_accumulation")


def test_the_accumulation_sentence_follows_the_errors(save, tmp_path):
    assert "further off than an fp32 one" in _accumulation(tmp_path, save, 0.047)


def test_reversed_accumulation_errors_do_not_argue_for_fp32(save, tmp_path):
    text = _accumulation(tmp_path, save, 1e-5)
    assert "closer" in text and "further off" not in text


@pytest.mark.parametrize(
    ("small_speedup", "said"),
    [(0.8, "the gain grows with size"), (9.0, "the gain shrinks with size")],
)
def test_the_bf16_trend_follows_the_rows(save, tmp_path, small_speedup, said):
    rows = []
    for size, dims, ms, speedup in (("small", SMALL, 20.0, small_speedup), ("xl", XL, 300.0, 4.0)):
        for dtype, t in (("fp32", ms), ("bf16-autocast", ms / speedup)):
            rows.append({**_model_row("forward", t, 0.1), "size": size, **dims, "dtype": dtype})
    save("model_h100_2026-11-28", "model", rows, date="2026-11-28")
    assert said in _report(tmp_path, "benchmarking_mixed_precision")


# ---------------------------------------------------------------- §2.1.6 (a)


@pytest.mark.parametrize(("bwd_end", "said"), [(60_000.0, "rises"), (30_000.0, "falls")])
def test_the_timeline_sentence_reads_the_phase_memory(save, tmp_path, bwd_end, said):
    row = {
        **_model_row("train-step", 90.0, 0.0), "size": "xl", **XL, "ctx": 128,
        "study": "memory", "peak_mib": 65_000.0, "start_mib": 39_000.0,
        "fwd_end_mib": 44_000.0, "bwd_end_mib": bwd_end, "opt_end_mib": bwd_end,
        "peak_phase": "backward",
    }  # fmt: skip
    stem = "memory_fp32_h100_2026-11-28"
    save(stem, "model", [row], date="2026-11-28", command="bench-model --memory-snapshot m")
    (tmp_path / f"{stem}_snapshot_xl_ctx128_train-step_fp32_naive.png").write_bytes(b"\x89PNG")
    text = _report(tmp_path, "memory_profiling")
    assert "44,000 MiB as the forward ends (it rises through the forward" in text
    assert f"(it {said} through the backward" in text
    assert "the step's peak, 65,000 MiB, falls in the backward" in text


# ---------------------------------------------------------------- §4.1.1, §4.2 (a)


def _attn(impl: str, d: int, seq: int, mem: float, fwd: float) -> dict:
    cell = {"impl": impl, "batch": 8, "d": d, "seq": seq, "dtype": "fp32", "causal": False}
    return {**cell, "fwd_ms": fwd, "bwd_ms": 2 * fwd, "mem_before_bwd_mib": mem, "status": "ok"}


@pytest.mark.parametrize(("mem_at_16k", "said"), [(8640.0, "with its square"), (4300, "linearly")])
def test_the_attention_memory_growth_is_measured_not_assumed(save, tmp_path, mem_at_16k, said):
    rows = [_attn("naive", 64, s, m, 1.0) for s, m in ((256, 72.0), (8192, 2200.0))]
    rows.append(_attn("naive", 64, 16384, mem_at_16k, 4.0))
    save("attn_grid_h100_2026-11-28", "attn", rows, date="2026-11-28")
    text = _report(tmp_path, "pytorch_attention")
    assert f"(8192 and 16384) it grows {said}" in text


@pytest.mark.parametrize(("compiled_ms", "said"), [(0.5, "(faster)"), (2.0, "(slower)")])
def test_compiled_attention_is_called_faster_only_when_it_is(save, tmp_path, compiled_ms, said):
    rows = [_attn(i, 64, 1024, 10.0, t) for i, t in (("naive", 1.0), ("compiled", compiled_ms))]
    save("attn_grid_h100_2026-11-28", "attn", rows, date="2026-11-28")
    assert f"forward {1 / compiled_ms:.3g}× {said}" in _report(tmp_path, "torch_compile")


# ---------------------------------------------------------------- §5.1


def _allreduce(backend: str, world: int, mb: float, ms: float) -> dict:
    busbw = mb / 1e3 / (ms / 1e3) * 2 * (world - 1) / world
    return {"backend": backend, "world_size": world, "size_mb": mb, "ms": ms,
            "busbw_gbps": busbw, "algbw_gbps": busbw, "status": "ok"}  # fmt: skip


def test_the_all_reduce_commentary_reads_latency_and_processes(save, tmp_path):
    rows = [_allreduce("nccl", 2, mb, ms) for mb, ms in ((1, 0.08), (10, 0.12), (1000, 3.1))]
    rows += [_allreduce("gloo", w, 100, ms) for w, ms in ((2, 40.0), (4, 60.0))]
    rows += [_allreduce("gloo", w, 1, 0.4 * w) for w in (2, 4)]
    save("allreduce_2xh200_2026-11-28", "allreduce", rows, date="2026-11-28")
    text = _report(tmp_path, "distributed_communication_single_node")
    assert "from 1 to 10 MB the time grows 1.5× for 10× the data: latency-bound" in text
    assert "going from 2 to 4 processes the time rises (40 to 60 ms)" in text
    assert (
        "nccl at 4 processes (a GPU per process on one node; the machines these runs had "
        "held at most 2)" in text
    )
    assert "--backend nccl --nproc 4 6 --json" in text
    assert "Machines of more than 4 GPUs were not lent" in text
    assert "gloo at 6 processes (not in the run)" in text  # gloo needs no GPU: a run not made
    assert "its empty cells are runs not made, not hardware missing" in text
    assert "--backend gloo --nproc 2 4 6 --sizes-mb 1 10 100 1000 --full" in text


def test_a_reversed_process_count_trend_is_said(save, tmp_path):
    rows = [_allreduce("gloo", w, mb, ms) for w, ms in ((2, 60.0), (4, 40.0)) for mb in (100,)]
    rows += [_allreduce("gloo", w, 1, 0.5) for w in (2, 4)]
    save("allreduce_2xh200_2026-11-28", "allreduce", rows, date="2026-11-28")
    text = _report(tmp_path, "distributed_communication_single_node")
    assert "the time falls (60 to 40 ms)" in text


# ---------------------------------------------------------------- §5.3.1, §5.3.2 (a), §6 (b)


def _ddp(variant: str, step: float, comm: float, wait: float, calls: int) -> dict:
    return {"case": variant.removeprefix("ddp:"), "variant": variant, "step_ms": step,
            "comm_ms": comm, "wait_ms": wait, "overhead_ms": step - 236.5,
            "collectives": calls, "status": "ok"}  # fmt: skip


def _ddp_rows(flat_ms: float, individual_ms: float) -> list[dict]:
    return [
        {"case": "single", "variant": "single", "step_ms": 236.5, "status": "ok"},
        _ddp("ddp:naive", 281.8, 42.3, 43.5, 435),
        _ddp("ddp:flat", flat_ms, 26.0, 26.0, 1),
        _ddp("ddp:individual", individual_ms, 147.7, 13.6, 435),
    ]


def test_ddp_comparisons_follow_the_step_times(save, tmp_path):
    save("ddp_2xh200_2026-11-28", "ddp", _ddp_rows(263.9, 284.4), date="2026-11-28")
    text = build_report(tmp_path)
    flat = _section(text, "minimal_ddp_flat_benchmarking")
    assert "makes the step faster than one all-reduce per gradient" in flat
    assert "once instead of 435 times" in flat
    overlap = _section(text, "ddp_overlap_individual_parameters_benchmarking")
    assert "On 2 ranks, overlapping each gradient's all-reduce" in overlap
    assert "makes the step slower than flat DDP" in overlap
    assert "the backward itself ran 34.3 ms longer" in overlap
    assert "costs more than the 27.4 ms flat DDP adds" in overlap
    assert "overlapping wins" not in overlap


def test_reversed_ddp_rows_reverse_the_comparisons(save, tmp_path):
    save("ddp_2xh200_2026-11-28", "ddp", _ddp_rows(300.0, 240.0), date="2026-11-28")
    text = build_report(tmp_path)
    assert "makes the step slower than one all-reduce per gradient" in _section(
        text, "minimal_ddp_flat_benchmarking"
    )
    overlap = _section(text, "ddp_overlap_individual_parameters_benchmarking")
    assert "makes the step faster than flat DDP" in overlap
    assert "costs less than the 63.5 ms flat DDP adds" in overlap
    assert "overlapping wins" in overlap


def test_each_world_size_is_said_apart_fewest_ranks_first(save, tmp_path):
    """Two bench-ddp runs (2 and 4 ranks) never share a sentence; the 2-rank one leads, and a
    run that recorded no dimensions reads its size by its date (`xl` after 2026-11-26: 2560)."""
    config = {"size": "xl", "context_length": 128, "batch": 4}
    save("ddp_4xh200_2026-11-28", "ddp", _ddp_rows(300.0, 240.0), date="2026-11-28",
         config={**config, "nproc": 4})  # fmt: skip
    save("ddp_2xh200_2026-11-28", "ddp", _ddp_rows(263.9, 284.4), date="2026-11-28",
         config={**config, "nproc": 2})  # fmt: skip
    overlap = _section(build_report(tmp_path), "ddp_overlap_individual_parameters_benchmarking")
    two, four = overlap.index("(a) On 2 ranks"), overlap.index("(a) On 4 ranks")
    assert two < four
    assert "slower than flat DDP" in overlap[two:four] and "faster than flat" in overlap[four:]
    assert "xl (2560/10240/32L/32H), context 128, batch 4, on 2×" in overlap
    naive = _section(build_report(tmp_path), "naive_ddp_benchmarking")
    assert "No run here trained" not in naive and "dimensions not recorded" not in naive


def _fsdp(variant: str, step: float, overlap: float) -> dict:
    return {"variant": variant, "compute_dtype": "fp32", "storage_dtype": "fp32",
            "step_ms": step, "gather_overlap": overlap, "status": "ok"}  # fmt: skip


@pytest.mark.parametrize(
    ("no_prefetch_ms", "said"),
    [(408.0, "faster than the same without prefetching"),
     (300.0, "slower than the same without prefetching")],
)  # fmt: skip
def test_the_fsdp_gather_reading_follows_the_rows(save, tmp_path, no_prefetch_ms, said):
    rows = [_fsdp("fsdp", 352.0, 0.73), _fsdp("fsdp:no-prefetch", no_prefetch_ms, 0.0)]
    save("zero_2xh200_2026-11-28", "zero", rows, date="2026-11-28",
         config={"size": "xl", "nproc": 2, "context_length": 128, "batch": 4})  # fmt: skip
    text = _report(tmp_path, "fsdp_accounting")
    assert (
        "fp32 compute: zero.FSDP takes 352 ms a step, 73% of its all-gather kernel time "
        "beside a compute kernel (hidden), 27% with none (exposed)" in text
    )
    assert said in text and "xl (2560/10240/32L/32H), context 128, batch 4 on 2×" in text


@pytest.mark.parametrize(("time_vs_ddp", "said"), [(1.03, "about DDP's"), (1.3, "slower")])
def test_the_sharding_time_sentence_follows_the_ratio(save, tmp_path, time_vs_ddp, said):
    row = {"variant": "zero1:torch-ddp", "state_mib": 7622.7, "state_vs_ddp": 0.5,
           "param_mib": 7622.7, "grad_mib": 7622.7, "step_ms": 262.9,
           "time_vs_ddp": time_vs_ddp, "status": "ok"}  # fmt: skip
    save("zero_2xh200_2026-11-28", "zero", [row], date="2026-11-28", config={"world_size": 2})
    text = _report(tmp_path, "optimizer_state_sharding_accounting")
    assert f"{time_vs_ddp:.2f}× DDP's: {said}" in text
    assert "0.50× plain DDP's, the 1/2 ZeRO stage 1 keeps" in text


@pytest.mark.parametrize(
    ("forward_speedup", "step_speedup", "said"),
    [
        (2.0, 1.3, "The forward gains most"),
        (1.2, 2.0, "The training step gains more than the forward"),
        (0.4, 0.5, "neither gains here"),
    ],
)
def test_the_whole_model_compile_sentence_follows_the_speed_ups(
    save, tmp_path, forward_speedup, step_speedup, said
):
    rows = []
    for mode, speedup in (("forward", forward_speedup), ("train-step", step_speedup)):
        for compiled, ms in ((False, 30.0), (True, 30.0 / speedup)):
            rows.append({**_model_row(mode, ms, 0.1), "step_ms": ms, "compiled": compiled})
    save("compile_h100_2026-11-28", "model", rows, date="2026-11-28")
    text = _report(tmp_path, "torch_compile")
    assert said in text
    assert ("gains most" in text) == (said == "The forward gains most")

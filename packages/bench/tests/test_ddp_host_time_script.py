"""scripts/ddp_host_time.py's arithmetic, without ranks: the bucket scale, bench-train's settings
it reuses, and the rows it makes of the ranks' samples."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from script_module import script_module

import lmcore

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ddp_host_time.py"


@pytest.fixture(scope="module")
def script():
    with script_module(SCRIPT) as module:
        yield module


def test_buckets_scale_to_25_mb_at_the_real_width(script):
    config = lmcore.MODEL_SIZES["small"].config(context_length=256, vocab_size=script.VOCAB)
    with torch.device("meta"):
        model = lmcore.TransformerLM.from_config(config)
    assert script.scaled_bucket_mb("small", model) == pytest.approx(25.0)


def test_the_step_takes_bench_trains_gpu_settings(script):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert script.trainer_setting("optimizer", cpu) == "torch-fused"  # not the CPU's lmcore
    assert script.trainer_setting("attention", cuda) == "fa2-triton"
    assert script.trainer_setting("attention", cpu) == "sdpa"  # no Triton interpreter
    assert script.trainer_setting("grad_clip", cpu) == 1.0


def _samples(step: float, backward: float, n: int = 3) -> list[dict[str, float]]:
    phases = dict.fromkeys(("forward", "finish", "clip", "optimizer", "zero_grad"), 0.0)
    return [
        {"step": step, "host": step - 1, **phases, "backward": backward, "other": 0.5}
        for _ in range(n)
    ]


def test_rows_take_the_slower_rank_and_compare_with_torch_and_single(script):
    backward = {"single": 10.0, "ddp": 16.0, "ddp:torch": 13.0}
    per_rank = []
    for rank in range(2):
        result = {}
        for case in script.CASES:
            # rank 1 is 2 ms slower in every step of ours
            slow = 2.0 if rank == 1 and case.layout == "ddp" else 0.0
            b = backward[case.layout] + slow
            result[case.name] = {
                "samples": _samples(20.0 + b, b),
                "ops": {"aten::copy_": 4.0, "aten::mm": 6.0},
                "tensors": 100,
                "buckets": 5,
            }
        per_rank.append(result)
    rows = {row["case"]: row for row in script.rows_of("small", per_rank)}
    ours, theirs = rows["ddp"], rows["ddp:torch"]
    assert ours["backward_ms"] == 18.0  # rank 1's
    assert ours["host_vs_torch"] == pytest.approx((38.0 - 1) / (33.0 - 1))
    assert ours["hook_us"] == pytest.approx(1e3 * (18.0 - 10.0) / 100)
    assert theirs["hook_us"] == pytest.approx(1e3 * (13.0 - 10.0) / 100)
    assert rows["single"].get("hook_us") is None
    assert ours["aten_ops"] == 10.0 and ours["copy_"] == 4.0


def test_bucket_sizes_are_bench_trains_at_the_real_width_and_scaled_otherwise(script):
    model = torch.nn.Linear(64, 64, bias=False)  # 16 KiB of float32
    case = script.Case("ddp")
    assert script.bucket_sizes(case, "small", model, real_width=True) == (25.0, None)
    real = lmcore.count_parameters(
        lmcore.MODEL_SIZES["small"].config(context_length=256, vocab_size=script.VOCAB)
    )
    ours, theirs = script.bucket_sizes(case, "small", model, real_width=False)
    assert ours == theirs == pytest.approx(25.0 * 4096 / real)
    one_bucket = script.Case("ddp", scaled_buckets=False)
    ours, theirs = script.bucket_sizes(one_bucket, "small", model, real_width=False)
    assert ours is None and theirs > 16 / 1024

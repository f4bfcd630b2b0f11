"""bench-precision: accumulation against a numpy oracle, dtypes under autocast."""

import numpy as np
import pytest
import torch

from bench.commands.precision import main
from bench.tools.precision import EXACT_SUM, accumulation_rows, autocast_rows, run_precision


def _numpy_sum(acc_dtype, add_dtype):
    total, addend = acc_dtype(0.0), add_dtype(0.01)
    for _ in range(1000):
        total = acc_dtype(total + acc_dtype(addend))
    return float(total)


def test_accumulation_matches_numpy_oracle():
    rows = {r["case"]: r for r in accumulation_rows("cpu")}
    assert rows["fp32 += fp32"]["value"] == _numpy_sum(np.float32, np.float32)
    assert rows["fp16 += fp16"]["value"] == _numpy_sum(np.float16, np.float16)
    assert rows["fp32 += fp16"]["value"] == _numpy_sum(np.float32, np.float16)
    assert rows["fp32 += fp16.to(fp32)"]["value"] == rows["fp32 += fp16"]["value"]
    for row in rows.values():
        assert row["abs_error"] == pytest.approx(abs(row["value"] - EXACT_SUM))


def test_fp16_accumulator_is_worst():
    rows = {r["case"]: r["abs_error"] for r in accumulation_rows("cpu")}
    assert rows["fp16 += fp16"] == max(rows.values())
    assert rows["fp32 += fp32"] == min(rows.values())


def test_cpu_bf16_autocast_dtypes():
    seen = {r["tensor"]: r["dtype"] for r in autocast_rows("cpu", torch.bfloat16)}
    assert seen["parameters"] == "float32"
    assert seen["fc1 output"] == "bfloat16"
    assert seen["logits"] == "bfloat16"
    assert seen["loss"] == "float32"
    assert seen["gradients"] == "float32"
    assert "layer-norm output" in seen


def test_run_splits_parts():
    run = run_precision(device="cpu")
    assert {r["part"] for r in run.rows} == {"accumulation", "autocast"}
    text = run.table()
    assert "**accumulation**" in text and "**autocast**" in text


def test_main_help_exits_zero(help_text):
    assert "bench-precision" in help_text(main)


@pytest.mark.gpu
def test_cuda_autocast_keeps_layer_norm_in_fp32():
    for dtype in (torch.bfloat16, torch.float16):
        seen = {r["tensor"]: r["dtype"] for r in autocast_rows("cuda", dtype)}
        assert seen["fc1 output"] == str(dtype).removeprefix("torch.")
        assert seen["layer-norm output"] == "float32"
        assert seen["gradients"] == "float32"

"""bench-report's section on what the seed projects had: the T4 answer from bench-plan's real
prediction, the matrix's and the precision table's sentences from their rows (and turned when
the rows turn), and what each needs while nothing answers it."""

from __future__ import annotations

import pytest

from bench.core.env import collect_env
from bench.core.results import Run, save_json
from bench.report.tool import build_report
from bench.tools.plan import run_gpu_fit


def _section(text: str, key: str) -> str:
    return text.split(f"`{key}`)\n")[1].split("\n## ")[0]


@pytest.fixture
def save(tmp_path):
    env = {**collect_env("cpu", command="test"), "device_type": "cuda", "device_name": "GPU"}

    def write(stem: str, tool: str, rows: list[dict]) -> None:
        save_json(Run.create(tool, rows, device="cpu", config={}, env=env), tmp_path / stem)

    return write


def test_the_seeds_follow_the_handout_and_say_what_they_need(tmp_path):
    text = build_report(tmp_path)
    seeds = text.split("## What the seed projects had")[1]
    assert "bench-plan --preset t4x2" in _section(text, "t4x2")
    assert "seeds_gpu.sh matrix TEXT" in _section(text, "lm_matrix")
    assert "seeds_gpu.sh fp16 TEXT" in _section(seeds, "fp16")


def test_the_t4_answer_reads_bench_plans_prediction(tmp_path):
    run = run_gpu_fit("T4", devices=2, precision="fp16", command="bench-plan --preset t4x2")
    save_json(run, tmp_path / "plan_t4x2_2026-11-28.json")
    answer = _section(build_report(tmp_path), "t4x2")
    assert "small trains without checkpointing under ddp, zero1, fsdp" in answer
    # the largest sizes fit nowhere: the rows say so, and so does the sentence
    assert "2.7B does not fit 4 sequences of 512 under any layout" in answer
    assert "plan_t4x2_2026-11-28.json" in answer


def _matrix_rows(fsdp_diff: float) -> list[dict]:
    def row(parallel, ranks, tokens, diff):
        return {"size": "small", "attention": "sdpa", "parallel": parallel, "ranks": ranks,
                "tokens_per_s": tokens, "final_train_loss": 3.0 * (1 + diff), "loss_diff": diff,
                "loss_agrees": abs(diff) <= 0.01, "status": "ok"}  # fmt: skip

    return [row("single", 1, 1.0e5, 0.0), row("ddp", 2, 1.8e5, 2e-4), row("fsdp", 2, 1.6e5,
            fsdp_diff)]  # fmt: skip


def test_the_matrix_sentence_follows_its_rows(tmp_path, save):
    save("matrix_2xgpu_2026-11-28.json", "matrix", _matrix_rows(-3e-4))
    answer = _section(build_report(tmp_path), "lm_matrix")
    assert "The most tokens/s: 180,000 (small, sdpa, ddp on 2 rank(s))" in answer
    assert "agrees with its one-rank cell's; the widest gap is -3.00e-04" in answer
    save("matrix_2xgpu_2026-11-28.json", "matrix", _matrix_rows(0.05))  # fsdp disagrees now
    answer = _section(build_report(tmp_path), "lm_matrix")
    assert "1 cell(s) end at a loss beyond the tolerance from their one-rank cell's: sdpa fsdp" in (
        answer
    )


def test_the_fp16_sentence_follows_its_rows(tmp_path, save):
    rows = [
        {"run": "bf16", "precision": "bf16-autocast", "steps": 300, "final_val_loss": 1.50,
         "val_diff": 0.0},
        {"run": "fp16", "precision": "fp16", "steps": 300, "final_val_loss": 1.53,
         "val_diff": 0.03, "skipped_steps": 3},
    ]  # fmt: skip
    save("train_precision_gpu_2026-11-28.json", "train_precision", rows)
    answer = _section(build_report(tmp_path), "fp16")
    assert "fp16 ends at validation loss 1.53, +2.00% from bf16-autocast's 1.5" in answer
    assert "after 300 steps of which 3 were skipped for overflow" in answer

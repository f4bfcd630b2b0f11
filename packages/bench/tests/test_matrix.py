"""bench-matrix: a tiny matrix on the CPU (two attention kernels x one rank and DDP on 2 gloo
ranks), its rows, files and loss agreement; a second invocation reads the finished cells back and
continues a cell killed after its last checkpoint; a disagreeing loss is flagged."""

from __future__ import annotations

import json

import pytest

from bench.commands.matrix import main
from bench.core.oom import OK
from bench.core.results import load_json
from bench.train.matrix import cell_folder, compare_losses
from bench.train.matrix_config import MatrixConfig

# The fewest cells that cover the code: two kernels (the matrix crosses), one rank in this
# process and 2 gloo ranks bench-train starts (the loss agreement across modes).
CELLS = ("--size", "tiny", "--attention", "naive", "sdpa", "--parallel", "single", "ddp")
TRAINING = ("--steps", "4", "--batch-size", "8", "--context-length", "32", "--tokenizer", "bytes")


def _argv(data, out) -> list[str]:
    return ["--data", str(data), "--out", str(out), "--device", "cpu", "--no-progress",
            *CELLS, *TRAINING]  # fmt: skip


def test_a_tiny_matrix_on_two_gloo_ranks_agrees_and_resumes(train_text, tmp_path, capsys):
    out = tmp_path / "matrix"
    assert main([*_argv(train_text, out), "--csv", str(tmp_path / "rows.csv")]) == 0
    run = load_json(out / "matrix.json")
    cells = [(r["attention"], r["parallel"], r["ranks"]) for r in run.rows]
    assert cells == [("naive", "single", 1), ("naive", "ddp", 2), ("sdpa", "single", 1),
                     ("sdpa", "ddp", 2)]  # fmt: skip
    for row in run.rows:
        assert (row["status"], row["run"], row["loss_agrees"]) == (OK, "trained", True)
        assert row["tokens_per_s"] > 0 and row["peak_memory_mib"] is None  # CPU
        assert row["step_ms"] == pytest.approx(8 * 32 / row["tokens_per_s"] * 1e3)
        # 2 ranks add the same gradients in another order: float32 rounding apart
        assert abs(row["loss_diff"]) < 1e-5
    files = {p.name for p in out.iterdir()}
    assert {"matrix.json", "matrix.csv", "matrix.md", "matrix_time.png",
            "matrix_throughput.png"} <= files  # fmt: skip
    assert "matrix_memory.png" not in files  # no memory is measured on a CPU
    assert (tmp_path / "rows.csv").read_text().startswith("size,attention,parallel,ranks,")

    # Killed after its last checkpoint, before its summary: the cell continues from it; the
    # others are read back as they were.
    killed = cell_folder(out, "tiny", "naive", "single")
    (killed / "summary.json").unlink()
    kept = cell_folder(out, "tiny", "sdpa", "ddp") / "summary.json"
    before = kept.stat().st_mtime_ns
    capsys.readouterr()
    assert main(_argv(train_text, out)) == 0
    again = load_json(out / "matrix.json")
    assert [r["run"] for r in again.rows] == ["resumed", "reused", "reused", "reused"]
    assert kept.stat().st_mtime_ns == before
    losses = [r["final_train_loss"] for r in run.rows]
    assert [r["final_train_loss"] for r in again.rows] == losses
    assert json.loads((killed / "summary.json").read_text())["steps"] == 4


def test_other_options_in_a_finished_matrix_are_refused(train_text, tmp_path, capsys):
    out = tmp_path / "matrix"
    one_cell = ["--data", str(train_text), "--out", str(out), "--device", "cpu", "--no-progress",
                "--size", "tiny", "--attention", "sdpa", "--parallel", "single"]  # fmt: skip
    assert main([*one_cell, *TRAINING]) == 0
    with pytest.raises(SystemExit) as exc:  # a usage error, before any cell runs
        main([*one_cell, *TRAINING, "--steps", "5"])
    assert exc.value.code == 2
    assert "holds a finished run of other options (steps)" in capsys.readouterr().err


def test_a_loss_beyond_the_tolerance_is_flagged():
    rows = [
        {"size": "s", "attention": "a", "parallel": "ddp", "final_train_loss": 2.0},
        {"size": "s", "attention": "a", "parallel": "single", "final_train_loss": 2.1},
        {"size": "s", "attention": "a", "parallel": "fsdp", "final_train_loss": 2.1001},
        {"size": "s", "attention": "a", "parallel": "zero1", "final_train_loss": None},  # failed
        {"size": "s", "attention": "b", "parallel": "ddp", "final_train_loss": 3.0},
    ]
    (line,) = compare_losses(rows, tolerance=0.01)
    assert line.startswith("DISAGREES: s a under ddp") and "from single's 2.1000" in line
    assert [r.get("loss_agrees") for r in rows] == [False, True, True, None, True]
    assert rows[0]["loss_diff"] == pytest.approx(-0.1 / 2.1)
    assert rows[4]["loss_diff"] == 0.0  # its own reference: no single cell of kernel b


def test_the_matrix_refuses_what_cannot_run():
    with pytest.raises(ValueError, match="--nproc must be at least 2"):
        MatrixConfig(data="x", nproc=1, parallels=("single", "ddp"))
    with pytest.raises(ValueError, match="--attention takes distinct values"):
        MatrixConfig(data="x", attentions=("sdpa", "sdpa"))
    assert len(MatrixConfig(data="x", sizes=("tiny", "small")).cells) == 2 * 2 * 3

"""bench-ops: rows and ratios of both studies, the CPU default, OOM as a row, the command line."""

import pytest
import torch

import bench.core.tool
import bench.tools.ops
from bench.commands.ops import main
from bench.core.oom import OK, OOM
from bench.core.results import load_json
from bench.core.tool import device_config
from bench.tools.ops import KEYS, OpsConfig, run_ops

# Steps of the tiny model's parameters take seconds under Triton's interpreter: the fused AdamW
# row runs over a few odd-sized tensors instead.
_SMALL_PARAMS = [torch.Size((3, 2049)), torch.Size((7,)), torch.Size((5, 13))]
# Keys every row has, whatever its study.
COMMON = {"study", "shape", "size", "impl", "dtype", "ms", "std", "vs_baseline", "n", "status"}


def test_cpu_default_runs_both_studies_and_says_so(capsys, monkeypatch):
    default = device_config(OpsConfig, "cpu")
    assert default.loss_shapes == default.adamw_sizes == ("tiny",) and default.dtype == "fp32"
    quick = OpsConfig(**{**default.__dict__, "steps": 1, "warmup": 0,
                         "adamw_impls": ("lmcore", "torch-fused")})  # fmt: skip
    monkeypatch.setattr(bench.core.tool, "device_config", lambda cls, device: quick)
    run = run_ops(device="cpu", show_progress=False)
    assert run.tool == "ops" and run.group_by == "study"
    assert [(r["study"], r["impl"], r["status"]) for r in run.rows] == [
        ("loss", "fused", OK),
        ("loss", "eager", OK),
        ("adamw", "lmcore", OK),
        ("adamw", "torch-fused", OK),
    ]
    for row in run.rows:
        assert COMMON.issubset(row) and set(KEYS).issuperset(row)
        assert row["ms"] > 0 and row["size"].startswith("tiny (64/256/2L/4H)")
    adamw = {r["impl"]: r for r in run.rows if r["study"] == "adamw"}
    assert adamw["torch-fused"]["vs_baseline"] == 1.0
    assert adamw["lmcore"]["vs_baseline"] == pytest.approx(
        adamw["torch-fused"]["ms"] / adamw["lmcore"]["ms"]
    )
    loss = run.rows[0]
    assert loss["peak_mib"] is None  # not tracked on a CPU
    assert loss["logits_mib"] == pytest.approx(96 * 10_000 * 4 / 2**20)
    assert "no GPU" in capsys.readouterr().err


def test_fused_adamw_row_runs_under_the_interpreter(monkeypatch):
    monkeypatch.setattr(bench.tools.ops, "_parameter_shapes", lambda size: _SMALL_PARAMS)
    config = OpsConfig(studies=("adamw",), adamw_sizes=("tiny",), steps=1, warmup=0)
    run = run_ops(config, device="cpu", show_progress=False)
    assert {r["impl"]: r["status"] for r in run.rows} == {
        "lmcore": OK,
        "lmcore-fused": OK,
        "torch-fused": OK,
    }
    assert run.rows[0]["params"] == sum(s.numel() for s in _SMALL_PARAMS)


def test_an_out_of_memory_row_does_not_end_the_run(monkeypatch):
    real = bench.tools.ops._measure_loss

    def failing(impl, inputs, config, device):
        if impl == "eager":
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return real(impl, inputs, config, device)

    monkeypatch.setattr(bench.tools.ops, "_measure_loss", failing)
    config = OpsConfig(studies=("loss",), loss_shapes=("tiny",), loss_impls=("eager", "fused"),
                       dtype="fp32", steps=1, warmup=0)  # fmt: skip
    run = run_ops(config, device="cpu", show_progress=False)
    status = {r["impl"]: r["status"] for r in run.rows}
    assert status == {"eager": OOM, "fused": OK}
    assert run.rows[0]["ms"] is None and run.rows[1]["vs_baseline"] is None  # no baseline
    assert "| OOM" in run.table()


@pytest.mark.parametrize(
    "bad",
    [{"studies": ("speed",)}, {"loss_shapes": ("huge",)}, {"adamw_impls": ("sgd",)},
     {"dtype": "fp8"}, {"steps": 0}, {"adamw_sizes": ()}],
)  # fmt: skip
def test_bad_configurations_are_refused(bad):
    with pytest.raises(ValueError):
        OpsConfig(**bad)


def test_command_line_writes_json_and_plot(tmp_path, monkeypatch):
    monkeypatch.setattr(bench.tools.ops, "_parameter_shapes", lambda size: _SMALL_PARAMS)
    json_path, png = tmp_path / "ops.json", tmp_path / "ops.png"
    argv = ["--device", "cpu", "--no-progress", "--study", "adamw", "--adamw-sizes", "tiny",
            "--adamw-impls", "lmcore", "torch-fused", "--steps", "1", "--warmup", "0",
            "--json", str(json_path), "--plot", str(png)]  # fmt: skip
    assert main(argv) == 0
    run = load_json(json_path)
    assert run.tool == "ops" and len(run.rows) == 2 and png.is_file()
    assert run.config["adamw_impls"] == ["lmcore", "torch-fused"]


def test_help_lists_the_studies(help_text):
    text = help_text(main)
    assert text.startswith("usage: bench-ops") and "--loss-shapes" in text
    assert "leaderboard" in text and "torch-fused" in text

"""bench-allreduce on 2 gloo CPU ranks with tiny tensors, and the launcher it runs on."""

from __future__ import annotations

import os

import pytest
import torch

from bench.commands.allreduce import COMMAND, main
from bench.core.launch import is_primary, launch, under_torchrun
from bench.core.results import load_json, save_json
from bench.tools.allreduce import (
    COLUMNS,
    TOOL,
    AllReduceConfig,
    _skip_reason,
    bus_bandwidth_factor,
    plot_allreduce,
    run_allreduce,
)

SIZES_MB = (0.01, 0.25)  # 2,500 and 62,500 floats: milliseconds on gloo
CONFIG = AllReduceConfig(
    backends=("gloo", "nccl"), sizes_mb=SIZES_MB, world_sizes=(2,), warmup=1, steps=3
)
TORCHRUN_ENV = {
    "RANK": "0",
    "WORLD_SIZE": "3",
    "LOCAL_RANK": "0",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
}


@pytest.fixture(scope="module")
def run():
    return run_allreduce(
        CONFIG, device="cpu", command="bench-allreduce --test", show_progress=False
    )


def _gloo_rows(run):
    return [r for r in run.rows if r["backend"] == "gloo"]


def test_one_row_per_backend_world_size_and_size(run):
    cells = [(r["backend"], r["world_size"], r["size_mb"]) for r in run.rows]
    assert cells == [(b, 2, s) for b in ("gloo", "nccl") for s in SIZES_MB]


def test_gloo_rows_complete_with_positive_times(run):
    for row in _gloo_rows(run):
        assert row["status"] == "ok"
        assert 0 < row["ms_min"] <= row["ms"]
        assert row["ms_std"] >= 0


def test_algorithm_bandwidth_is_bytes_over_median_time(run):
    for row in _gloo_rows(run):
        assert row["bytes"] == int(row["size_mb"] * 1e6)
        assert row["algbw_gbps"] == pytest.approx(row["bytes"] / (row["ms"] * 1e-3) / 1e9)


def test_bus_bandwidth_applies_the_ring_factor(run):
    for row in _gloo_rows(run):
        factor = bus_bandwidth_factor(row["world_size"])
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * factor)


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine runs the nccl cells")
def test_nccl_cells_without_gpus_are_skipped_with_the_reason(run):
    for row in run.rows:
        if row["backend"] == "nccl":
            assert row["status"].startswith("skipped: needs 2 GPUs")


def test_table_json_and_plot(run, tmp_path):
    assert run.to_markdown().count("| gloo") == len(SIZES_MB)
    loaded = load_json(save_json(run, tmp_path / "allreduce.json"))
    assert loaded.rows == run.rows and loaded.config["sizes_mb"] == list(SIZES_MB)
    assert loaded.env["torch"] == torch.__version__
    assert plot_allreduce(run, tmp_path / "allreduce.png").stat().st_size > 0


def test_columns_are_the_table_columns(run):
    assert run.columns == list(COLUMNS)


@pytest.mark.parametrize(("n", "factor"), [(2, 1.0), (4, 1.5), (6, 5 / 3), (8, 1.75)])
def test_bus_bandwidth_factor_is_two_n_minus_one_over_n(n, factor):
    assert bus_bandwidth_factor(n) == pytest.approx(factor)


def test_gloo_above_100_mb_is_opt_in():
    assert "--full" in _skip_reason(AllReduceConfig(), "gloo", 2, 1000.0)
    assert _skip_reason(AllReduceConfig(full=True), "gloo", 2, 1000.0) is None


def test_gloo_on_more_ranks_than_cores_is_opt_in():
    too_many = (os.cpu_count() or 1) + 1
    assert "CPU cores" in _skip_reason(AllReduceConfig(), "gloo", too_many, 1.0)
    assert _skip_reason(AllReduceConfig(full=True), "gloo", too_many, 1.0) is None


@pytest.mark.parametrize(
    "bad",
    [{"backends": ("mpi",)}, {"sizes_mb": (0.0,)}, {"world_sizes": (1,)}, {"steps": 0}],
)
def test_invalid_config_raises(bad):
    with pytest.raises(ValueError):
        AllReduceConfig(**bad)


def test_options_override_the_device_default():
    parser = COMMAND.parser()
    args = parser.parse_args(["--sizes-mb", "1", "2", "--world-sizes", "2", "--full"])
    config = TOOL.configure(args, parser, torch.device("cpu"))
    assert config.sizes_mb == (1.0, 2.0) and config.world_sizes == (2,) and config.full
    assert config.backends == ("gloo",)


def test_help_describes_the_tool(help_text):
    assert "bus bandwidth" in help_text(main)


def _never_called(rank: int, world_size: int) -> None:
    raise AssertionError("the launch should have been refused")


def test_launch_refuses_an_unknown_backend():
    with pytest.raises(ValueError, match="backend"):
        launch(_never_called, world_size=2, backend="mpi")


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has the GPUs")
def test_launch_refuses_nccl_without_enough_gpus():
    with pytest.raises(ValueError, match="GPUs"):
        launch(_never_called, world_size=2, backend="nccl")


def test_launch_under_torchrun_refuses_another_world_size(monkeypatch):
    for name, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(name, value)
    assert under_torchrun()
    with pytest.raises(ValueError, match="torchrun started 3"):
        launch(_never_called, world_size=2)


def test_only_rank_zero_of_torchrun_is_primary(monkeypatch):
    assert is_primary()
    for name, value in {**TORCHRUN_ENV, "RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    assert not is_primary()

"""bench-zero on 2 gloo CPU ranks with a tiny model: well-formed rows, JSON, plot, command line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from bench.commands.sharding import COMMAND, main
from bench.core.layouts import LAYOUTS
from bench.core.results import load_json, save_json
from bench.tools.sharding import (
    COLUMNS,
    TOOL,
    ZeroBenchConfig,
    plot_zero,
)

VALID = ZeroBenchConfig(size="tiny")  # a base that the invalid variations change


@pytest.fixture
def run(zero_run):
    """The session's bench-zero run (conftest: ddp:torch, zero1:torch-ddp at caps 0 and 25 MB,
    zero1:torch, and fsdp, fsdp:torch, fsdp:no-prefetch in fp32 and bf16 over fp32 shards and
    in bf16 shards)."""
    return zero_run


_FSDP_DTYPES = [("fp32", "fp32"), ("bf16", "fp32"), ("bf16", "bf16")]  # (compute, storage)


def test_one_row_per_variant_bucket_cap_and_dtypes(run):
    fsdp = [(v, None, *dtypes) for v in ("fsdp", "fsdp:torch", "fsdp:no-prefetch")
            for dtypes in _FSDP_DTYPES]  # fmt: skip
    assert [
        (r["variant"], r["bucket_mb"], r["compute_dtype"], r["storage_dtype"]) for r in run.rows
    ] == [
        ("ddp:torch", None, None, None),
        ("zero1:torch-ddp", 0.0, None, None),
        ("zero1:torch-ddp", 25.0, None, None),
        ("zero1:torch", None, None, None),
        *fsdp,
    ]
    assert all(r["status"] == "ok" for r in run.rows)
    for row in run.rows:
        units = (
            {"fsdp_units": list(LAYOUTS[row["variant"]].units)} if "fsdp" in row["variant"] else {}
        )
        assert row == {**{c: row[c] for c in COLUMNS}, **units}


def test_bf16_storage_keeps_the_shards_and_their_state_in_bf16(run):
    """The model stored in bf16: half of float32 shards' parameter, gradient and AdamW state
    bytes, ours and FSDP2's alike."""
    for variant in ("fsdp", "fsdp:torch"):
        rows = {r["storage_dtype"]: r for r in _rows(run, variant) if r["compute_dtype"] != "fp32"}
        for key in ("param_mib", "grad_mib"):  # the busiest rank's; its padding may differ
            assert rows["bf16"][key] == pytest.approx(rows["fp32"][key] / 2, rel=1e-3), key
        # two moments per element, plus one 4-byte step count per parameter tensor
        assert rows["bf16"]["state_mib"] < rows["fp32"]["state_mib"] / 2 + 0.001


def _rows(run, *variants):
    return [r for r in run.rows if r["variant"] in variants]


def test_every_rank_holds_whole_parameters_and_gradients(run):
    rows = _rows(run, "ddp:torch", "zero1:torch-ddp", "zero1:torch")
    assert len({r["param_mib"] for r in rows}) == 1
    assert all(r["grad_mib"] == r["param_mib"] for r in rows)


def test_fsdp_ranks_hold_about_half_of_parameters_gradients_and_state(run):
    whole = run.rows[0]
    for row in _rows(run, "fsdp", "fsdp:torch", "fsdp:no-prefetch"):
        if row["storage_dtype"] == "bf16":
            continue  # half as many bytes again (above)
        # the largest rank: half of every tensor, plus padding (and ours: whole norm gains)
        for key in ("param_mib", "grad_mib", "state_mib"):
            assert 0.5 <= row[key] / whole[key] <= 0.6, (row["variant"], key)


def test_fsdp_rows_are_compared_with_torch_fsdp_of_the_same_dtypes(run):
    def dtypes(row):
        return row["compute_dtype"], row["storage_dtype"]

    for row in _rows(run, "fsdp"):
        theirs = next(r for r in _rows(run, "fsdp:torch") if dtypes(r) == dtypes(row))
        assert row["time_vs_torch_fsdp"] == pytest.approx(row["step_ms"] / theirs["step_ms"])
        assert row["peak_vs_torch_fsdp"] is None  # no peaks on the CPU
    assert all(r["time_vs_torch_fsdp"] is None for r in _rows(run, "ddp:torch", "fsdp:torch"))
    notes = [note for note in run.notes if note.startswith("fsdp (")]
    assert [note.split(")")[0] for note in notes] == [
        "fsdp (fp32",
        "fsdp (bf16",
        "fsdp (bf16-storage",
    ]
    # bf16 storage's own targets (peak <= 1.00x, time <= 0.80x FSDP2's), one verdict each
    assert "peak_vs_torch_fsdp not measured here" in notes[2]
    assert notes[2].count("time_vs_torch_fsdp") == 1
    assert "time <= torch_fsdp x0.8 (bf16-storage)" in " ".join(run.notes)


def test_prefetching_is_set_against_the_same_dtype_without_it(run):
    notes = [n for n in run.notes if n.startswith("Prefetching")]
    assert len(notes) == 3
    for (compute, storage), note in zip(_FSDP_DTYPES, notes, strict=True):
        (ours,) = [
            r
            for r in _rows(run, "fsdp")
            if (r["compute_dtype"], r["storage_dtype"]) == (compute, storage)
        ]
        (alone,) = [
            r
            for r in _rows(run, "fsdp:no-prefetch")
            if (r["compute_dtype"], r["storage_dtype"]) == (compute, storage)
        ]
        label = "bf16-storage" if storage == "bf16" else compute
        assert f"({label})" in note and f"{ours['step_ms'] / alone['step_ms']:.3f}x" in note


def test_every_fsdp_row_leaves_a_chrome_trace_of_one_step(run):
    folder = Path(run.config["trace_dir"])
    traced = {r["variant"] for r in run.rows if r["variant"] in ("fsdp", "fsdp:torch")}
    traced |= {"fsdp:no-prefetch"}
    expected = {
        f"{v.replace(':', '-')}_{d}.pt.trace.json"
        for v in traced
        for d in ("fp32", "bf16", "bf16-storage")
    }
    assert {p.name for p in folder.iterdir()} == expected
    trace = json.loads((folder / "fsdp_fp32.pt.trace.json").read_text())
    assert any("all_gather" in str(e.get("name", "")) for e in trace["traceEvents"])
    # gloo on the CPU: no kernels, so no overlap to measure
    assert all(r["gather_overlap"] is None for r in run.rows)


def test_unsharded_adamw_state_is_two_moments_per_parameter(run):
    ddp_row = run.rows[0]
    # two fp32 moments per parameter, plus one 4-byte step counter per parameter tensor
    assert ddp_row["state_mib"] == pytest.approx(2 * ddp_row["param_mib"], rel=1e-3)


def test_sharded_state_is_about_half(run):
    for row in _rows(run, "zero1:torch-ddp", "zero1:torch"):
        # the largest rank holds at least half; whole tensors make it a little more
        assert 0.5 <= row["state_vs_ddp"] <= 0.6


def test_cpu_rows_have_times_but_no_peaks(run):
    for row in run.rows:
        assert row["step_ms"] > 0
        assert row["init_mib"] is None and row["after_step_mib"] is None
        assert row["other_mib"] is None
    assert any("CPU" in note for note in run.notes)


def test_json_round_trip_and_plot(run, tmp_path):
    loaded = load_json(save_json(run, tmp_path / "zero.json"))
    assert loaded.rows == run.rows
    assert loaded.config["nproc"] == 2
    assert plot_zero(run, tmp_path / "zero.png").stat().st_size > 0


def test_help(help_text):
    assert "bench-zero" in help_text(main)


def test_options_override_the_cpu_default():
    parser = COMMAND.parser()
    args = parser.parse_args(
        ["--size", "tiny", "--zero-bucket-mb", "0", "none", "--steps", "4", "--fsdp-dtypes", "bf16"]
    )
    config = TOOL.configure(args, parser, torch.device("cpu"))
    assert config.bucket_sizes_mb == (0.0, None)
    assert config.fsdp_dtypes == ("bf16",)
    assert config.steps == 4
    assert config.size == "tiny"
    assert config.trace_dir is None
    args = parser.parse_args(["--trace", "traces"])
    assert TOOL.configure(args, parser, torch.device("cpu")).trace_dir == "traces"


def test_no_options_keep_the_announced_default():
    parser = COMMAND.parser()
    assert TOOL.configure(parser.parse_args([]), parser, torch.device("cpu")) is None


@pytest.mark.parametrize(
    "change",
    [
        {"variants": ("nope",)},
        {"optimizer": "sgd"},
        {"bucket_sizes_mb": (-1.0,)},
        {"bucket_sizes_mb": (float("inf"),)},
        {"bucket_sizes_mb": ()},
        {"nproc": 1},
        {"fsdp_dtypes": ("fp16",)},
        {"fsdp_dtypes": ()},
        {"fsdp_storage": ("fp16",)},
        {"fsdp_storage": ()},
    ],
)
def test_bad_config_raises(change):
    with pytest.raises(ValueError):
        dataclasses.replace(VALID, **change)

"""bench-ddp on 2 gloo CPU ranks with a tiny model: well-formed rows, JSON, plot, command line."""

from __future__ import annotations

import pytest
import torch

import lmcore
from bench.commands.data_parallel import COMMAND, main
from bench.core.results import load_json, save_json
from bench.tools.data_parallel import (
    COLUMNS,
    TOOL,
    VARIANTS,
    DDPBenchConfig,
    plot_ddp,
)

VOCAB = 97
TINY = lmcore.model_config("tiny", context_length=16, vocab_size=VOCAB)
CASES = [
    "single",
    "ddp:naive",
    "ddp:flat",
    "ddp:individual",
    "ddp 0.01 MB",
    "ddp:torch 25 MB (default)",
    f"all-reduce alone ({lmcore.count_parameters(TINY) * 4 / 1e6:.3g} MB)",
]


@pytest.fixture
def run(ddp_run):
    """The session's bench-ddp run (conftest: the tiny model, vocabulary 97, context 16)."""
    return ddp_run


def _by_case(run):
    return {row["case"]: row for row in run.rows}


def _num_params() -> int:
    model = lmcore.TransformerLM.from_size("tiny", context_length=16, vocab_size=VOCAB)
    return len(list(model.parameters()))


def test_one_row_per_variant_and_bucket_size(run):
    assert [row["case"] for row in run.rows] == CASES
    assert [row["variant"] for row in run.rows] == list(VARIANTS)


def test_every_case_completes_with_positive_step_time(run):
    for row in run.rows:
        assert row["status"] == "ok"
        assert row["step_ms"] > 0 and row["step_ms_std"] >= 0


def test_ddp_wrappers_report_their_wait_and_collectives(run):
    rows = _by_case(run)
    assert (
        rows["ddp:naive"]["collectives"] == rows["ddp:individual"]["collectives"] == _num_params()
    )
    assert rows["ddp:flat"]["collectives"] == 1
    assert 1 <= rows["ddp 0.01 MB"]["collectives"] <= _num_params()
    for case in CASES[1:5]:
        assert rows[case]["wait_ms"] > 0


def test_wrappers_without_a_synchronisation_call_report_no_wait(run):
    rows = _by_case(run)
    for case in ("single", "ddp:torch 25 MB (default)"):
        assert rows[case].get("wait_ms") is None and rows[case].get("collectives") is None


def test_gloo_reports_no_all_reduce_time(run):
    assert all(row.get("comm_ms") is None and row.get("hidden") is None for row in run.rows)


def test_ratios_are_against_torch_ddp_and_overheads_against_single(run):
    rows = _by_case(run)
    assert rows["ddp:torch 25 MB (default)"]["vs_torch"] == pytest.approx(1.0)
    assert rows["single"]["overhead_ms"] == pytest.approx(0.0)
    torch_ms = rows["ddp:torch 25 MB (default)"]["step_ms"]
    for row in run.rows[:-1]:
        assert row["vs_torch"] == pytest.approx(row["step_ms"] / torch_ms)
        assert row["overhead_ms"] == pytest.approx(row["step_ms"] - rows["single"]["step_ms"])


def test_end_to_end_hidden_fraction_is_against_the_standalone_all_reduce(run):
    alone = run.rows[-1]
    assert alone["variant"] == "all-reduce" and alone["step_ms"] > 0
    assert alone.get("overhead_ms") is None and alone.get("hidden_e2e") is None
    assert run.rows[0].get("hidden_e2e") is None  # single: nothing to hide
    for row in run.rows[1:-1]:
        assert row["hidden_e2e"] == pytest.approx(1 - row["overhead_ms"] / alone["step_ms"])


def test_notes_judge_the_best_bucket_size_against_the_target(run):
    assert any(note.startswith("Best DDPBucketed: ddp 0.01 MB") for note in run.notes)
    (bucketed,) = [r for r in run.rows if r["variant"] == "ddp"]
    (note,) = [n for n in run.notes if n.startswith("Most hidden end to end")]
    met = "met" if bucketed["hidden_e2e"] >= 0.75 else "NOT met"
    assert f"{bucketed['hidden_e2e']:.0%} of a standalone" in note
    assert f"target >= 75%: {met}" in note


def test_table_json_and_plot(run, tmp_path):
    assert run.columns == list(COLUMNS)
    assert "| ddp:torch 25 MB (default)" in run.to_markdown()
    loaded = load_json(save_json(run, tmp_path / "ddp.json"))
    assert loaded.rows == run.rows and loaded.config["size"] == "tiny"
    assert plot_ddp(run, tmp_path / "ddp.png").stat().st_size > 0


@pytest.mark.parametrize(
    "bad",
    [
        {"variants": ("fsdp",)},
        {"bucket_sizes_mb": (-1.0,)},
        {"torch_bucket_mbs": (0.0,)},
        {"bucket_sizes_mb": (float("inf"),)},
        {"nproc": 1},
        {"warmup": 0},
    ],
)
def test_invalid_config_raises(bad):
    with pytest.raises(ValueError):
        DDPBenchConfig(size="tiny", **bad)


def test_options_override_the_device_default():
    parser = COMMAND.parser()
    argv = ["--size", "small", "--bucket-mb", "5", "none", "--torch-bucket-mb", "default", "50"]
    config = TOOL.configure(parser.parse_args(argv), parser, torch.device("cpu"))
    assert config.size == "small"
    assert config.bucket_sizes_mb == (5.0, None) and config.torch_bucket_mbs == (None, 50.0)


def test_help_describes_the_tool(help_text):
    assert "finish_gradient_synchronization" in help_text(main)

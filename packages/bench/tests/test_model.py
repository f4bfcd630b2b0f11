"""bench-model: records, modes, OOM handling, profiling, NVTX backend, warm-up study, CLI."""

import json

import pytest
import torch

import bench.tools.model
import lmcore
from bench.commands.model import COMMAND, main
from bench.core.oom import OK, OOM
from bench.core.results import load_json
from bench.core.shapes import shape_named
from bench.tools.model import (
    COLUMNS,
    PROFILE_COLUMNS,
    TOOL,
    config_argv,
    run_model,
    run_warmup_study,
)
from bench.tools.model.annotated import annotated_attention
from lmcore import ModelSize, get_attention, naive_attention


def test_rows_per_mode_have_their_regions(tiny_model_config):
    run = run_model(tiny_model_config(), device="cpu", show_progress=False)
    rows = {r["mode"]: r for r in run.rows}
    assert list(rows) == ["forward", "forward-backward", "train-step"]
    for row in run.rows:
        assert set(COLUMNS) <= set(row)
        assert row["status"] == OK and row["n"] == 2
        assert row["peak_mib"] is None and row["mfu"] is None  # CPU: neither is known
    assert rows["forward"]["bwd_ms"] is None
    assert rows["forward-backward"]["bwd_ms"] > 0 and rows["forward-backward"]["opt_ms"] is None
    assert rows["train-step"]["opt_ms"] > 0


def test_step_is_the_sum_of_regions_and_tokens_follow(tiny_model_config):
    run = run_model(tiny_model_config(modes=("train-step",)), device="cpu", show_progress=False)
    (row,) = run.rows
    assert row["step_ms"] == pytest.approx(row["fwd_ms"] + row["bwd_ms"] + row["opt_ms"])
    assert row["tokens_per_s"] == pytest.approx(2 * 16 / (row["step_ms"] * 1e-3))


def test_parameter_count_matches_the_model(tiny_model_config):
    from lmcore import TransformerLM

    (row,) = run_model(
        tiny_model_config(modes=("forward",)), device="cpu", show_progress=False
    ).rows
    model = TransformerLM(97, 16, 32, 1, 2, 64)
    assert row["params_m"] * 1e6 == pytest.approx(sum(p.numel() for p in model.parameters()))


def test_injected_oom_in_the_loss_marks_training_rows(tiny_model_config, monkeypatch):
    def out_of_memory(logits, targets):
        raise torch.OutOfMemoryError("CUDA out of memory (injected)")

    monkeypatch.setattr(bench.tools.model, "cross_entropy", out_of_memory)
    run = run_model(tiny_model_config(), device="cpu", show_progress=False)
    assert [r["status"] for r in run.rows] == [OK, OOM, OOM]
    assert run.rows[1]["step_ms"] is None


def test_bf16_autocast_rows(tiny_model_config):
    run = run_model(
        tiny_model_config(modes=("forward-backward",), dtypes=("fp32", "bf16-autocast")),
        device="cpu",
        show_progress=False,
    )
    assert [(r["dtype"], r["status"]) for r in run.rows] == [("fp32", OK), ("bf16-autocast", OK)]


def test_profile_writes_traces_kernel_tables_and_a_profile_run(tiny_model_config, tmp_path):
    directory = tmp_path / "profile_cpu"
    config = tiny_model_config(modes=("forward", "train-step"), steps=2)
    run_model(
        config,
        device="cpu",
        profile=directory,
        show_progress=False,
    )
    cells = ["tiny_ctx16_forward_fp32_naive", "tiny_ctx16_train-step_fp32_naive"]
    for cell in cells:
        assert json.loads((directory / f"{cell}.pt.trace.json").read_text())["traceEvents"]
        assert "aten::" in (directory / f"{cell}_kernels.md").read_text()
    profile = load_json(directory / "profile_cpu.json")
    assert profile.tool == "profile" and profile.columns == PROFILE_COLUMNS
    ranges = {(r["cell"], r["name"]): r for r in profile.rows if r["kind"] == "range"}
    train = cells[1]
    for name in ("forward", "backward", "optimizer", "attention: softmax", "attention: scores"):
        assert ranges[(train, name)]["total_ms"] > 0
    assert ranges[(train, "forward")]["calls"] == 2  # one per profiled step
    # each layer calls attention once per forward, in each of 2 steps
    assert ranges[(train, "attention: softmax")]["calls"] == 2 * config.shapes[0][1].num_layers
    assert (cells[0], "backward") not in ranges  # forward mode: no backward
    assert ranges[(train, "attention: softmax")]["flops"] > 0
    for phase in ("forward", "backward", "optimizer", "all"):
        operators = [
            r
            for r in profile.rows
            if r["kind"] == "operator" and r["cell"] == train and r["phase"] == phase
        ]
        assert operators and all(r["total_ms"] > 0 for r in operators)
        times = [r["total_ms"] for r in operators]
        assert times == sorted(times, reverse=True)
        assert sum(r["share"] for r in operators) <= 1.0 + 1e-9
        assert not {r["name"] for r in operators} & {name for _, name in ranges}


def test_snapshot_and_nvtx_need_cuda_and_say_so(tiny_model_config, tmp_path):
    run = run_model(
        tiny_model_config(modes=("forward",), nvtx=True),
        device="cpu",
        memory_snapshot=tmp_path / "s.pickle",
        show_progress=False,
    )
    assert run.rows[0]["status"] == OK and run.rows[0]["attention"] == "naive"
    assert any("needs CUDA" in n for n in run.notes)
    assert any("--nvtx" in n for n in run.notes)
    assert not (tmp_path / "s.pickle").exists()


def test_annotated_naive_attention_equals_naive():
    name = annotated_attention("naive")
    q, k, v = (torch.randn(2, 3, 17, 8) for _ in range(3))
    torch.testing.assert_close(
        get_attention(name)(q, k, v, causal=True), naive_attention(q, k, v, causal=True)
    )


def test_annotated_other_backend_wraps_it():
    name = annotated_attention("sdpa")
    q, k, v = (torch.randn(2, 3, 17, 8) for _ in range(3))
    torch.testing.assert_close(
        get_attention(name)(q, k, v, causal=False), get_attention("sdpa")(q, k, v, causal=False)
    )


def test_config_argv_round_trips(tiny_model_config):
    custom = ("mini", ModelSize(d_model=48, d_ff=96, num_layers=2, num_heads=3))
    config = tiny_model_config(
        shapes=(shape_named("small"), custom), compile=(False, True), dtypes=("bf16-autocast",)
    )
    parser = COMMAND.parser()
    args = parser.parse_args(config_argv(config))
    assert TOOL.configure(args, parser, torch.device("cpu")) == config


def test_unknown_size_is_a_clear_error():
    with pytest.raises(ValueError, match="choose one of"):
        shape_named("huge")


def test_warmup_study_runs_fresh_processes(tiny_model_config, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    run = run_warmup_study(
        tiny_model_config(modes=("forward",)), warmups=(0, 1), device="cpu", show_progress=False
    )
    assert run.tool == "warmup"
    assert [(r["warmup"], r["status"]) for r in run.rows] == [(0, OK), (1, OK)]
    assert all(r["first_step_ms"] > 0 for r in run.rows)


def test_main_help_exits_zero(help_text):
    assert "--memory-snapshot" in help_text(main)


def test_main_rejects_partial_dimensions(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--device", "cpu", "--d-model", "64"])
    assert exc.value.code == 2
    assert "--num-layers" in capsys.readouterr().err


@pytest.mark.gpu
def test_cuda_run_reports_memory_mfu_and_snapshot(tiny_model_config, tmp_path):
    run = run_model(
        tiny_model_config(shapes=(shape_named("small"),), context_lengths=(128,)),
        device="cuda",
        memory_snapshot=tmp_path / "snap.pickle",
        show_progress=False,
    )
    for row in run.rows:
        assert row["status"] == OK and row["peak_mib"] > 0
    assert len(list(tmp_path.glob("snap_*.pickle"))) == 3
    assert len(list(tmp_path.glob("snap_*.png"))) == 3


@pytest.mark.gpu
def test_cuda_compiled_bf16_nvtx_step(tiny_model_config):
    run = run_model(
        tiny_model_config(
            modes=("train-step",), dtypes=("bf16-autocast",), compile=(True,), nvtx=True
        ),
        device="cuda",
        show_progress=False,
    )
    assert run.rows[0]["status"] == OK


def test_model_options_reach_the_model(tiny_model_config, monkeypatch):
    """Checkpointing, the fused loss and the optimizer each reach the model of their rows, and
    only the rows of the modes that use them."""
    import lmcore.linear

    seen = {"policies": [], "optimizers": [], "fused_calls": 0}
    apply, build = (
        bench.tools.model.apply_activation_checkpointing,
        bench.tools.model.build_optimizer,
    )
    fused = lmcore.linear.fused_linear_cross_entropy

    def spy_apply(model, *, policy):
        seen["policies"].append(policy)
        return apply(model, policy=policy)

    def spy_build(name, params, **options):
        seen["optimizers"].append(name)
        return build(name, params, **options)

    def spy_fused(*args, **kwargs):
        seen["fused_calls"] += 1
        return fused(*args, **kwargs)

    monkeypatch.setattr(bench.tools.model, "apply_activation_checkpointing", spy_apply)
    monkeypatch.setattr(bench.tools.model, "build_optimizer", spy_build)
    monkeypatch.setattr(lmcore.linear, "fused_linear_cross_entropy", spy_fused)
    config = tiny_model_config(
        modes=("forward", "train-step"),
        activation_checkpointing=("none", "segments:1"),
        loss=("materialized", "fused"),
        optimizer=("lmcore", "torch-fused"),
        warmup=0,
        steps=1,
    )
    run = run_model(config, device="cpu", show_progress=False)
    forward, *training = run.rows
    assert (forward["activation_checkpointing"], forward["loss"], forward["optimizer"]) == (
        None,
        None,
        None,
    )
    combos = {(r["activation_checkpointing"], r["loss"], r["optimizer"]) for r in training}
    assert len(training) == len(combos) == 8 and all(r["status"] == OK for r in run.rows)
    assert seen["policies"] == [r["activation_checkpointing"] for r in training]
    assert seen["optimizers"] == [r["optimizer"] for r in training]
    assert seen["fused_calls"] == sum(r["loss"] == "fused" for r in training)  # one step each


def test_depth_and_grouped_query_attention_reach_the_model(tiny_model_config):
    config = tiny_model_config(
        shapes=(shape_named("tiny"),), modes=("forward",), num_layers=1, num_kv_heads=2
    )
    (row,) = run_model(config, device="cpu", show_progress=False).rows
    tiny = lmcore.MODEL_SIZES["tiny"]
    expected = lmcore.TransformerLM(
        97, 16, tiny.d_model, 1, tiny.num_heads, tiny.d_ff, num_kv_heads=2
    )
    assert (row["num_layers"], row["num_kv_heads"]) == (1, 2)
    assert row["params_m"] * 1e6 == sum(p.numel() for p in expected.parameters())


def test_num_layers_alone_overrides_the_sizes_depth():
    parser = COMMAND.parser()
    args = parser.parse_args(["--size", "leaderboard-8b", "--num-layers", "2"])
    config = TOOL.configure(args, parser, torch.device("cpu"))
    (cell,) = {c.shape for c in bench.tools.model._cells(config)}
    name, size = cell
    assert name == "leaderboard-8b" and size.num_layers == 2 and size.vocab_size == 151_936
    assert config.vocab_size is None  # the size's own vocabulary


def test_bad_model_options_are_usage_errors(capsys):
    for argv in (["--activation-checkpointing", "segments:0"], ["--loss", "chunked"]):
        with pytest.raises(SystemExit) as exc:
            main(["--device", "cpu", *argv])
        assert exc.value.code == 2
    assert "K must be a positive integer" in capsys.readouterr().err

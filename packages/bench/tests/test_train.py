"""bench-train on the CPU: it learns generated text, writes its outputs, resumes exactly, gives
2 gloo ranks the losses of one process, and refuses bad input before training."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
from generated_text import generated_text

import lmcore
from bench.core.training import train_step
from bench.tools import train as bench_train
from bench.tools.train import TrainConfig, main, plot_speed, speed_comparison

# A model of one narrow layer: a step takes milliseconds on one CPU thread.
TINY = [
    "--size",
    "tiny",
    "--d-model",
    "32",
    "--num-layers",
    "1",
    "--num-heads",
    "2",
    "--d-ff",
    "64",
]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text(generated_text(1500, seed=3), encoding="utf-8")
    return path


def _args(text_file, out, *extra: str, cache=None) -> list[str]:
    return [
        "--data",
        str(text_file),
        "--out",
        str(out),
        "--cache-dir",
        str(cache or out.parent / "cache"),
        "--device",
        "cpu",
        "--tokenizer",
        "bytes",
        "--context-length",
        "32",
        "--batch-size",
        "8",
        "--no-progress",
        *TINY,
        *extra,
    ]


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _losses(out):
    return {r["step"]: r["loss"] for r in _metrics(out)}


def test_learns_generated_text_and_writes_its_outputs(text_file, tmp_path):
    out = tmp_path / "run"
    common = ["--steps", "40", "--lr", "1e-2", "--log-every", "5", "--eval-every", "20"]
    assert main(_args(text_file, out, *common, "--generate", "40", "--prompt", "the")) == 0
    summary = json.loads((out / "summary.json").read_text())
    uniform = math.log(256)  # the loss of a model that knows nothing of the bytes
    assert summary["final_train_loss"] < 0.6 * uniform
    assert summary["final_val_loss"] < 0.6 * uniform
    assert summary["steps"] == 40 and summary["tokens_per_s"] > 0 and summary["mfu"] is None
    assert summary["config"]["size"] == "tiny" and summary["versions"]["torch"] == torch.__version__
    assert {"git_revision", "git_dirty"} <= summary.keys()
    records = _metrics(out)
    assert [r["step"] for r in records] == list(range(5, 41, 5))
    assert [r["step"] for r in records if "val_loss" in r] == [20, 40]
    assert records[-1]["loss"] == summary["final_train_loss"]
    assert records[0]["loss"] > records[-1]["loss"]
    assert all({"lr", "tokens_per_s", "mfu"} <= r.keys() for r in records)
    assert (out / "loss.png").stat().st_size > 0 and (out / "checkpoint.pt").is_file()
    assert (out / "sample.txt").read_text().startswith("the")


def test_stopped_and_resumed_run_reproduces_the_uninterrupted_one(text_file, tmp_path):
    # BPE and two micro-batches per step, so the tokenizer and accumulation resume too.
    common = ["--steps", "6", "--log-every", "1", "--eval-every", "3", "--generate", "0"]
    common += ["--tokenizer", "bpe", "--vocab-size", "300", "--grad-accum", "2"]
    assert main(_args(text_file, tmp_path / "whole", *common)) == 0
    assert main(_args(text_file, tmp_path / "parts", *common, "--stop-after", "2")) == 0
    summary = json.loads((tmp_path / "parts" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["stopped_early"]
    assert main(_args(text_file, tmp_path / "parts", *common, "--resume")) == 0
    whole, parts = _metrics(tmp_path / "whole"), _metrics(tmp_path / "parts")
    assert [r["step"] for r in parts] == [r["step"] for r in whole] == list(range(1, 7))
    for a, b in zip(whole, parts, strict=True):
        assert abs(a["loss"] - b["loss"]) <= 1e-5
        if a["step"] in (3, 6):
            assert abs(a["val_loss"] - b["val_loss"]) <= 1e-5


# 4 steps, a loss each; a clipping norm below the tiny model's gradient norm, so the clipping
# (over shards, with FSDP) is part of what the ranks must get right.
RUN_4 = ["--steps", "4", "--log-every", "1", "--grad-clip", "0.1"]


@pytest.fixture(scope="module")
def one_process(text_file, tmp_path_factory):
    """The losses of 4 steps in one process: what every 2-rank run must reproduce."""
    out = tmp_path_factory.mktemp("one") / "run"
    main(_args(text_file, out, *RUN_4, "--generate", "0"))
    return _losses(out)


# The ranks average means of equal halves of each batch, and their gradients: the same sums in
# another order, so float32 rounding (not the method) separates them from one process.
RANKS_ATOL = 1e-5


def _assert_matches(out, one_process):
    losses = _losses(out)
    assert losses.keys() == one_process.keys()
    for step, loss in one_process.items():
        assert abs(losses[step] - loss) <= RANKS_ATOL, step


def test_two_ranks_bucketed_then_zero_match_one_process(text_file, tmp_path, one_process):
    # Steps 1-2 under DDPBucketed, then a resume under ZeRO-1 (how to run may change on a
    # resume): the sharded optimizer loads the saved state and saves its consolidated one.
    out = tmp_path / "run"
    extra = [*RUN_4, "--generate", "0", "--nproc", "2"]
    assert main(_args(text_file, out, *extra, "--parallel", "bucketed", "--stop-after", "2")) == 0
    assert main(_args(text_file, out, *extra, "--parallel", "zero", "--resume")) == 0
    _assert_matches(out, one_process)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["config"]["parallel"] == "zero"
    saved = torch.load(out / "checkpoint.pt", weights_only=True)
    assert saved["iteration"] == 4 and len(saved["optimizer"]["state"]) == len(
        saved["model"]
    )  # every parameter's moments, consolidated from both ranks


def test_torch_native_baseline_step_equals_ours(text_file):
    torch.manual_seed(0)
    model = lmcore.TransformerLM(64, 16, 32, 1, 2, 64, attention="sdpa")
    twin = copy.deepcopy(model)
    tokens = [torch.randint(0, 64, (4, 17)) for _ in range(2)]
    ours = train_step(model, torch.optim.AdamW(model.parameters()), tokens, max_grad_norm=0.5)
    theirs = bench_train._torch_native_step(
        twin, torch.optim.AdamW(twin.parameters()), tokens, max_grad_norm=0.5
    )
    torch.testing.assert_close(ours, theirs)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_baseline_torch_is_sdpa_fused_adamw_compiled():
    config = TrainConfig.create(data="x", out="y", device="cpu", baseline="torch")
    assert (config.attention, config.optimizer, config.compile) == ("sdpa", "torch", True)
    with pytest.raises(ValueError, match="--baseline torch runs attention sdpa"):
        TrainConfig.create(data="x", out="y", device="cpu", baseline="torch", attention="naive")


def test_baseline_torch_from_the_command_line():
    """The parser's defaults must not read as choices that contradict --baseline torch."""
    parser = bench_train.build_parser()
    args = parser.parse_args(
        ["--data", "x", "--out", "y", "--device", "cpu", "--baseline", "torch"]
    )
    config = bench_train.config_from_args(args)
    assert (config.attention, config.optimizer, config.compile) == ("sdpa", "torch", True)
    config = bench_train.config_from_args(parser.parse_args(["--data", "x", "--device", "cpu"]))
    assert (config.optimizer, config.compile) == ("lmcore", False)


def test_speed_leaves_out_the_first_and_the_profiled_interval(tmp_path):
    config = TrainConfig.create(
        data="x", out=str(tmp_path), device="cpu", steps=40, batch_size=2, context_length=8
    )
    recorder = bench_train._Recorder(config, start=0, primary=True, mfu=None)
    for step, seconds in ((10, 100.0), (20, 1.0), (30, 3.0), (40, 50.0)):
        if step == 40:
            recorder.exclude_interval()
        recorder.log(step, 1.0, 1e-3, None, seconds)
    recorder.close()
    tokens_per_s, _ = recorder.speed()
    assert tokens_per_s == 20 * 2 * 8 / 4.0  # steps 11-30 only
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["tokens_per_s"] for r in logged] == [10 * 16 / s for s in (100.0, 1.0, 3.0, 50.0)]


def test_bucket_size_speaks_ddps_vocabulary():
    parser = bench_train.build_parser()
    base = ["--data", "x", "--out", "y", "--device", "cpu"]
    for extra, size in (([], 25.0), (["--bucket-mb", "none"], None), (["--bucket-mb", "4"], 4.0)):
        args = parser.parse_args([*base, *extra])
        assert bench_train.config_from_args(args).bucket_size_mb == size
    with pytest.raises(ValueError, match="bucket_size_mb"):
        TrainConfig.create(data="x", out="y", device="cpu", bucket_size_mb=math.inf)


def _usage_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda p: p / "missing.txt", "no such file"),
        (lambda p: p / "empty.txt", "is empty"),
        (lambda p: p / "short.txt", "fewer than one sequence"),
        (lambda p: p / "big.bin", "token id 999, outside the vocabulary of 256"),
    ],
)
def test_bad_data_is_refused_before_training(tmp_path, capsys, make, match):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "short.txt").write_text("too short for a sequence\n")
    np.arange(1000, dtype=np.uint16).tofile(tmp_path / "big.bin")
    err = _usage_error(capsys, _args(make(tmp_path), tmp_path / "out", "--steps", "2"))
    assert match in err
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_unknown_size_is_refused(text_file, tmp_path, capsys):
    err = _usage_error(capsys, [*_args(text_file, tmp_path / "o"), "--size", "huge"])
    assert "invalid choice: 'huge'" in err


def test_more_ranks_than_gpus_is_refused(text_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    argv = [*_args(text_file, tmp_path / "o"), "--device", "cuda", "--nproc", "2"]
    assert "--nproc 2 needs 2 GPUs, found 1" in _usage_error(capsys, argv)


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--batch-size", "6", "--nproc", "4", "--parallel", "zero"], "multiple of --grad-accum"),
        (["--nproc", "2", "--parallel", "none"], "needs a --parallel mode"),
        (["--warmup-steps", "5", "--steps", "5"], "--warmup-steps must be in"),
        (["--stop-after", "9", "--steps", "5"], "--stop-after must be in"),
        (["--d-model", "33"], "divisible by num_heads"),
    ],
)
def test_inconsistent_options_are_refused(text_file, tmp_path, capsys, extra, match):
    assert match in _usage_error(capsys, [*_args(text_file, tmp_path / "o"), *extra])


def test_resume_checks_the_checkpoint(text_file, tmp_path, capsys):
    out = tmp_path / "run"
    argv = _args(text_file, out, "--steps", "3", "--stop-after", "1", "--generate", "0")
    assert _usage_error(capsys, [*argv, "--resume"]).count("no checkpoint.pt") == 1
    assert main(argv) == 0
    assert "pass --resume" in _usage_error(capsys, argv)
    err = _usage_error(capsys, [*argv, "--resume", "--lr", "1e-2", "--seed", "4"])
    assert "--lr 0.0006 → 0.01" in err and "--seed 0 → 4" in err
    # How to run may change: the log interval, here.
    assert main([*argv, "--resume", "--stop-after", "2", "--log-every", "2"]) == 0


@pytest.mark.gpu
def test_trains_on_cuda_in_bf16_with_fa2(text_file, tmp_path):
    out = tmp_path / "run"
    argv = _args(text_file, out, "--steps", "20", "--log-every", "5", "--generate", "20")
    argv += ["--device", "cuda", "--precision", "bf16", "--attention", "fa2-triton"]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_train_loss"] < math.log(256)
    assert summary["mfu"] is None or 0 < summary["mfu"] < 1


def test_two_fsdp_ranks_match_one_process_across_a_resume(text_file, tmp_path, one_process):
    # Weights, gradients and optimizer state sharded; the clipping norm spans the shards; an
    # evaluation (forward passes without backward) between training steps.
    out = tmp_path / "run"
    extra = [*RUN_4, "--nproc", "2", "--parallel", "fsdp", "--eval-every", "1"]
    extra += ["--eval-batches", "2"]
    assert main(_args(text_file, out, *extra, "--stop-after", "2", "--generate", "0")) == 0
    assert (out / "checkpoint-rank1.pt").is_file()
    assert main(_args(text_file, out, *extra, "--resume", "--generate", "8")) == 0
    _assert_matches(out, one_process)
    assert (out / "sample.txt").read_text()


def test_speed_comparison_table_and_plot(text_file, tmp_path):
    runs = {}
    for label, extra in (("ours", []), ("torch-optimizer", ["--optimizer", "torch"])):
        runs[label] = tmp_path / label
        argv = _args(text_file, runs[label], "--steps", "4", "--log-every", "2", *extra)
        assert main([*argv, "--generate", "0", "--eval-batches", "1"]) == 0
    run = speed_comparison(list(runs.items()), baseline="torch-optimizer")
    rows = {r["run"]: r for r in run.rows}
    assert rows["torch-optimizer"]["vs_baseline"] == 1.0
    ours = json.loads((runs["ours"] / "summary.json").read_text())
    assert rows["ours"]["tokens_per_s"] == ours["tokens_per_s"]
    assert rows["ours"]["optimizer"] == "lmcore" and rows["ours"]["step"] == "bench.core.training"
    assert plot_speed(run, tmp_path / "speed.png").stat().st_size > 0
    with pytest.raises(ValueError, match="baseline"):
        speed_comparison(list(runs.items()), baseline="missing")
    assert run.env["git_revision"] == ours["env"]["git_revision"]  # the runs' machine, not ours


def test_result_files_from_run_folders(text_file, tmp_path):
    """bench-train-results: train_text_* and train_speed_* from finished runs, on any machine."""
    from bench.tools import train_results

    run = tmp_path / "run"
    argv = _args(text_file, run, "--steps", "6", "--log-every", "2", "--eval-every", "2")
    assert main([*argv, "--generate", "8", "--eval-batches", "1", "--profile-step", "5"]) == 0
    results = tmp_path / "results"
    speed = [f"a={run}", f"b={run}"]
    args = ["--out", str(results), "--text", str(run), "--speed", *speed, "--baseline", "b"]
    assert train_results.main([*args, "--note", "same run twice"]) == 0
    text = next(results.glob("train_text_cpu_*.md")).read_text()
    best = min(r["val_loss"] for r in _metrics(run) if "val_loss" in r)
    assert f"lowest validation loss {best:.4f}" in text and (run / "sample.txt").read_text() in text
    speed_md = next(results.glob("train_speed_cpu_*.md")).read_text()
    assert "same run twice" in speed_md and "One step of `a` under torch.profiler" in speed_md
    saved = json.loads(next(results.glob("train_speed_cpu_*.json")).read_text())
    assert [row["vs_baseline"] for row in saved["rows"]] == [1.0, 1.0]
    assert {p.suffix for p in results.iterdir()} == {".md", ".json", ".png"}
    with pytest.raises(SystemExit):
        train_results.main(["--out", str(results), "--speed", *speed])  # no --baseline

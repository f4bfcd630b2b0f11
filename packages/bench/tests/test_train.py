"""bench-train in one process on the CPU: it learns generated text, writes its outputs, resumes
exactly, stops on a time budget, samples again from a saved run, and refuses bad input before
training. (Several ranks: test_train_ranks.py; options and config files: test_train_config.py.)"""

from __future__ import annotations

import copy
import json
import math
import shutil

import numpy as np
import pytest
import torch

import lmcore
from bench.commands.generate import main as bench_generate
from bench.commands.train import COMMAND, main
from bench.commands.train_results import main as train_results
from bench.core.step import train_step
from bench.core.torch_native import TorchNativeLM
from bench.train.baseline import torch_native_step
from bench.train.config import TrainConfig
from bench.train.config_files import read_config_file
from bench.train.loop import Trainer
from bench.train.record import Recorder, read_metrics
from bench.train.run import config_from_args, prepare
from bench.train.scaling import scaling_comparison
from bench.train.summary import plot_speed, speed_comparison


@pytest.fixture(scope="module")
def trained(train_argv, train_in_one_thread, tmp_path_factory):
    """40 steps on generated text, an evaluation every 20, a sample, step 35 profiled."""
    out = tmp_path_factory.mktemp("trained") / "run"
    extra = ["--steps", "40", "--lr", "1e-2", "--log-every", "5", "--eval-every", "20"]
    extra += ["--generate", "40", "--prompt", "the", "--profile-step", "35"]
    train_in_one_thread(train_argv(out, *extra))
    return out


def test_learns_generated_text_and_writes_its_outputs(trained):
    summary = json.loads((trained / "summary.json").read_text())
    uniform = math.log(256)  # the loss of a model that knows nothing of the bytes
    assert summary["final_train_loss"] < 0.6 * uniform
    assert summary["final_val_loss"] < 0.6 * uniform
    assert summary["steps"] == 40 and summary["tokens_per_s"] > 0 and summary["mfu"] is None
    assert summary["stopped_by"] is None and summary["first_step_s"] > 0
    assert summary["config"]["size"] == "tiny" and summary["env"]["torch"] == torch.__version__
    assert {"git_revision", "git_dirty", "command", "device_name"} <= summary["env"].keys()
    assert not {"versions", "git_revision", "device_name", "command"} & summary.keys()  # once
    records = read_metrics(trained)
    assert [r["step"] for r in records] == list(range(5, 41, 5))
    assert [r["step"] for r in records if "val_loss" in r] == [20, 40]
    assert records[-1]["loss"] == summary["final_train_loss"]
    assert records[0]["loss"] > records[-1]["loss"]
    assert all({"lr", "tokens_per_s", "mfu"} <= r.keys() for r in records)
    assert (trained / "loss.png").stat().st_size > 0 and (trained / "checkpoint.pt").is_file()
    assert (trained / "sample.txt").read_text().startswith("the")
    assert (trained / "config.toml").is_file() and (trained / "profile.txt").is_file()
    assert json.loads((trained / "profile.pt.trace.json").read_text())["traceEvents"]


def test_stopped_and_resumed_run_reproduces_the_uninterrupted_one(train_argv, tmp_path):
    # BPE and two micro-batches per step, so the tokenizer and accumulation resume too.
    common = ["--steps", "6", "--log-every", "1", "--eval-every", "3", "--generate", "0"]
    common += ["--tokenizer", "bpe", "--vocab-size", "300", "--grad-accum", "2"]
    assert main(train_argv(tmp_path / "whole", *common)) == 0
    assert main(train_argv(tmp_path / "parts", *common, "--stop-after", "2")) == 0
    summary = json.loads((tmp_path / "parts" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["stopped_by"] == "stop-after"
    assert main(train_argv(tmp_path / "parts", *common, "--resume")) == 0
    whole, parts = read_metrics(tmp_path / "whole"), read_metrics(tmp_path / "parts")
    assert [r["step"] for r in parts] == [r["step"] for r in whole] == list(range(1, 7))
    for a, b in zip(whole, parts, strict=True):
        assert abs(a["loss"] - b["loss"]) <= 1e-5
        if a["step"] in (3, 6):
            assert abs(a["val_loss"] - b["val_loss"]) <= 1e-5


def test_the_progress_bar_registers_no_semaphore_a_rank_could_leak(
    train_argv, tmp_path, monkeypatch
):
    # A rank's start method is its launcher's (forkserver), where a multiprocessing lock is a
    # named semaphore told to the launcher's resource tracker; a rank ends with os._exit, so
    # the launcher warned at exit of "leaked semaphore objects". tqdm made one by default.
    import multiprocessing
    import threading
    from multiprocessing import resource_tracker

    from tqdm import tqdm
    from tqdm.std import TqdmDefaultWriteLock

    registered = []

    def register(name: str, kind: str) -> None:
        # The run's own thread only: a compile worker pool another test started may create its
        # queues' semaphores from a thread of its own while this one runs.
        if threading.current_thread() is threading.main_thread():
            registered.append(kind)

    monkeypatch.setattr(resource_tracker, "register", register)
    # A fresh rank has no monitor thread. One an earlier test's bar started wakes every 10 s
    # and takes tqdm.get_lock(), which would build the default lock while ours is deleted.
    if tqdm.monitor is not None:
        tqdm.monitor.exit()
    monkeypatch.setattr(tqdm, "monitor", None)
    monkeypatch.setattr(tqdm, "monitor_interval", 0)
    monkeypatch.delattr(tqdm, "_lock", raising=False)  # as in a fresh rank
    monkeypatch.delattr(TqdmDefaultWriteLock, "mp_lock", raising=False)
    before = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("forkserver", force=True)
    try:
        assert main(train_argv(tmp_path / "run", "--steps", "1", "--generate", "0")) == 0
    finally:
        multiprocessing.set_start_method(before, force=True)
    assert "semaphore" not in registered
    assert getattr(TqdmDefaultWriteLock, "mp_lock", None) is None  # tqdm made none either


def test_time_budget_ends_with_an_evaluation_a_checkpoint_and_a_sample(train_argv, tmp_path):
    out = tmp_path / "run"
    extra = ["--steps", "100000", "--time-budget", "1s", "--log-every", "1000"]
    assert main(train_argv(out, *extra, "--eval-every", "0", "--generate", "8")) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_by"] == "time-budget" and summary["stopped_early"]
    last = read_metrics(out)[-1]
    assert last["step"] == summary["steps"] < 100000 and "val_loss" in last
    saved = torch.load(out / "checkpoint.pt", weights_only=True)
    assert saved["iteration"] == summary["steps"]
    assert (out / "sample.txt").read_text()


def test_generate_from_a_saved_run_repeats_its_sample(trained, capsys):
    assert bench_generate(["--run", str(trained), "--device", "cpu"]) == 0
    assert capsys.readouterr().out == (trained / "sample.txt").read_text() + "\n"
    argv = ["--run", str(trained), "--prompt", "a dog", "--generate", "12", "--temperature", "0"]
    assert bench_generate(argv) == 0
    greedy, said = capsys.readouterr()
    assert "tokens/s with the KV cache on cpu" in said
    assert greedy.startswith("a dog") and len(greedy.encode()) == len(b"a dog") + 12 + 1
    assert bench_generate(argv) == 0 and capsys.readouterr().out == greedy  # greedy: repeatable
    assert bench_generate([*argv, "--no-cache"]) == 0
    uncached = capsys.readouterr()
    assert uncached.out == greedy  # float32: the window's tokens are the cache's
    assert "12 tokens in" in uncached.err and "tokens/s without a KV cache" in uncached.err


def test_generate_needs_a_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        bench_generate(["--run", str(tmp_path)])
    assert exc.value.code == 2 and "no checkpoint.pt" in capsys.readouterr().err


def test_torch_native_baseline_step_equals_ours():
    torch.manual_seed(0)
    model = lmcore.TransformerLM(64, 16, 32, 1, 2, 64, attention="sdpa")
    twin = copy.deepcopy(model)
    tokens = [torch.randint(0, 64, (4, 17)) for _ in range(2)]
    ours = train_step(model, torch.optim.AdamW(model.parameters()), tokens, max_grad_norm=0.5)
    native = TorchNativeLM(twin, compile=False)  # bench-step's torch-native model
    theirs = torch_native_step(
        native, torch.optim.AdamW(native.parameters()), tokens, max_grad_norm=0.5
    )
    torch.testing.assert_close(ours, theirs)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_baseline_torch_is_sdpa_fused_adamw_compiled():
    config = TrainConfig.create(data="x", out="y", device="cpu", baseline="torch")
    assert (config.attention, config.optimizer, config.compile) == ("sdpa", "torch-fused", True)
    with pytest.raises(ValueError, match="--baseline torch runs --attention sdpa"):
        TrainConfig.create(data="x", out="y", device="cpu", baseline="torch", attention="naive")
    with pytest.raises(ValueError, match="runs torch's own loss"):
        TrainConfig.create(data="x", out="y", device="cpu", baseline="torch", loss="fused")


def test_baseline_torch_from_the_command_line():
    """No default is written into the parser, so none reads as a choice that contradicts
    --baseline torch; without it, a CPU run is eager with lmcore's AdamW."""
    parser = COMMAND.parser()
    args = parser.parse_args(["--data", "x", "--device", "cpu", "--baseline", "torch"])
    config = config_from_args(args)
    assert (config.attention, config.optimizer, config.compile) == ("sdpa", "torch-fused", True)
    config = config_from_args(parser.parse_args(["--data", "x", "--device", "cpu"]))
    assert (config.optimizer, config.compile) == ("lmcore", False)


def test_speed_leaves_out_the_first_and_the_profiled_interval(tmp_path):
    config = TrainConfig.create(
        data="x", out=str(tmp_path), device="cpu", steps=40, batch_size=2, context_length=8
    )
    recorder = Recorder(config, start=0, primary=True, mfu=None)
    for step, seconds in ((10, 100.0), (20, 1.0), (30, 3.0), (40, 50.0)):
        if step == 40:
            recorder.exclude_interval()
        recorder.log(step, 1.0, 1e-3, None, seconds)
    recorder.close()
    tokens_per_s, _ = recorder.speed()
    assert tokens_per_s == 20 * 2 * 8 / 4.0  # steps 11-30 only
    logged = read_metrics(tmp_path)
    assert [r["tokens_per_s"] for r in logged] == [10 * 16 / s for s in (100.0, 1.0, 3.0, 50.0)]


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda p: p / "missing.txt", "no such file"),
        (lambda p: p / "empty.txt", "is empty"),
        (lambda p: p / "short.txt", "fewer than one sequence"),
        (lambda p: p / "big.bin", "token id 999, outside the vocabulary of 256"),
    ],
)
def test_bad_data_is_refused_before_training(train_argv, tmp_path, usage_error, make, match):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "short.txt").write_text("too short for a sequence\n")
    np.arange(1000, dtype=np.uint16).tofile(tmp_path / "big.bin")
    argv = train_argv(tmp_path / "out", "--steps", "2", data=make(tmp_path))
    assert match in usage_error(argv)
    out = tmp_path / "out"
    assert not out.exists() or not any(out.iterdir())  # not even config.toml


def test_unknown_size_is_refused(train_argv, tmp_path, usage_error):
    err = usage_error([*train_argv(tmp_path / "o"), "--size", "huge"])
    assert "invalid choice: 'huge'" in err


def test_more_ranks_than_gpus_is_refused(train_argv, tmp_path, usage_error, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    argv = [*train_argv(tmp_path / "o"), "--device", "cuda", "--nproc", "2"]
    assert "--nproc 2 needs 2 GPUs, found 1" in usage_error(argv)


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--batch-size", "6", "--nproc", "4", "--parallel", "zero1"], "multiple of --grad-accum"),
        (["--nproc", "2", "--parallel", "single"], "needs a --parallel mode"),
        (["--warmup-steps", "5", "--steps", "5"], "--warmup-steps must be in"),
        (["--stop-after", "9", "--steps", "5"], "--stop-after must be in"),
        (["--d-model", "33"], "divisible by num_heads"),
        (["--num-kv-heads", "3"], "num_kv_heads must be a positive integer dividing"),
        (["--top-p", "0"], "--top-p in (0, 1]"),
        (["--top-p", "1.5"], "--top-p in (0, 1]"),
        (["--temperature", "-1"], "--temperature must be >= 0"),
        (["--temperature", "inf"], "--temperature inf: give a finite number"),
        (["--lr", "nan"], "--lr nan: give a finite number"),
        (["--lr", "inf"], "--lr inf: give a finite number"),
        (["--weight-decay", "nan"], "--weight-decay nan: give a finite number"),
        (["--weight-decay", "inf"], "--weight-decay inf: give a finite number"),
        (["--grad-clip", "nan"], "--grad-clip nan: give a finite number"),
        (["--min-lr=-inf"], "--min-lr -inf: give a finite number"),
        (["--time-budget", "soon"], "not a duration"),
        (["--timeout", "0"], "--timeout must be a positive number of seconds"),
        (["--no-checkpoint", "--save-every", "2"], "--save-every need checkpoints"),
        (["--no-checkpoint", "--stop-after", "1"], "--stop-after need checkpoints"),
    ],
)
def test_inconsistent_options_are_refused(train_argv, tmp_path, usage_error, extra, match):
    assert match in usage_error([*train_argv(tmp_path / "o"), *extra])


def test_an_out_that_is_a_file_is_refused(train_argv, tmp_path, usage_error):
    (tmp_path / "taken").write_text("not a folder")
    err = usage_error(train_argv(tmp_path / "taken"))
    assert "--out" in err and "is a file; give a folder" in err and "Traceback" not in err


def test_resume_checks_the_checkpoint(train_argv, tmp_path, usage_error):
    argv = train_argv(tmp_path / "run", "--steps", "3", "--stop-after", "1", "--generate", "0")
    assert usage_error([*argv, "--resume"]).count("no checkpoint.pt") == 1
    assert main(argv) == 0
    assert "pass --resume" in usage_error(argv)
    err = usage_error([*argv, "--resume", "--lr", "1e-2", "--seed", "4"])
    assert "--lr 0.0006 → 0.01" in err and "--seed 0 → 4" in err
    err = usage_error([*argv, "--resume", "--nproc", "2", "--parallel", "fsdp"])
    assert "resume with --parallel single --nproc 1" in err
    # How to run may change: the log interval and the optimizer's implementation, here.
    extra = ["--stop-after", "2", "--log-every", "2", "--optimizer", "torch-fused"]
    assert main([*argv, "--resume", *extra]) == 0


def test_a_resumed_optimizer_keeps_the_implementation_it_was_built_with(
    one_process, copy_of, tmp_path
):
    # The checkpoint is lmcore.AdamW's (fused=False in its groups); torch's AdamW took every
    # group option from the state it loaded, and so ran unfused after the resume.
    out = copy_of(one_process.halfway, tmp_path / "run")
    saved = read_config_file(TrainConfig, out / "config.toml")
    resumed = {"out": str(out), "resume": True, "optimizer": "torch-fused"}
    config = TrainConfig.create(**(saved | resumed))
    prepare(config)
    trainer = Trainer(config)
    assert trainer.start == 2 and isinstance(trainer.optimizer, torch.optim.AdamW)
    assert all(group["fused"] and not group["foreach"] for group in trainer.optimizer.param_groups)


def test_speed_comparison_table_and_plot(train_argv, one_process, tmp_path):
    fused = tmp_path / "fused"
    argv = train_argv(fused, "--steps", "4", "--log-every", "2", "--optimizer", "torch-fused")
    assert main([*argv, "--generate", "0", "--eval-batches", "1"]) == 0
    runs = [("ours", one_process.run), ("torch-fused", fused)]
    run = speed_comparison(runs, baseline="torch-fused")
    rows = {r["run"]: r for r in run.rows}
    assert rows["torch-fused"]["vs_baseline"] == 1.0
    ours = json.loads((one_process.run / "summary.json").read_text())
    assert rows["ours"]["tokens_per_s"] == ours["tokens_per_s"]
    assert rows["ours"]["optimizer"] == "lmcore" and rows["ours"]["step"] == "bench.core.step"
    assert rows["ours"]["first_step_s"] == ours["first_step_s"]
    assert plot_speed(run, tmp_path / "speed.png").stat().st_size > 0
    with pytest.raises(ValueError, match="baseline"):
        speed_comparison(runs, baseline="missing")
    assert run.env["git_revision"] == ours["env"]["git_revision"]  # the runs' machine, not ours


def _copied_as(run, out, **changes):
    """A copy of the run folder `run` whose summary says `changes` (config keys under
    `config`), and whose logged losses are each 0.01 higher."""
    shutil.copytree(run, out)
    summary = json.loads((out / "summary.json").read_text())
    summary["config"] |= changes.pop("config", {})
    summary |= changes
    (out / "summary.json").write_text(json.dumps(summary))
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    lines = [{**r, "loss": r["loss"] + 0.01} if "loss" in r else r for r in lines]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return out


def test_scaling_table_sets_each_run_against_the_one_rank_run(one_process, tmp_path):
    one = json.loads((one_process.run / "summary.json").read_text())
    tokens, loss = one["tokens_per_s"], one["final_train_loss"]
    fsdp = _copied_as(
        one_process.run,
        tmp_path / "fsdp",
        world_size=2,
        tokens_per_s=1.5 * tokens,
        final_train_loss=loss + 0.01,
        peak_memory_mib=100.0,
        mfu=0.375,
        config={"parallel": "fsdp", "nproc": 2},
    )
    run = scaling_comparison([("fsdp", fsdp), ("one", one_process.run)])
    two, alone = run.rows
    assert (alone["speedup"], alone["scaling_eff"], alone["loss_diff"]) == (1.0, 1.0, 0.0)
    assert two["speedup"] == pytest.approx(1.5) and two["scaling_eff"] == pytest.approx(0.75)
    assert two["loss_diff"] == pytest.approx(0.01) and two["max_loss_diff"] == pytest.approx(0.01)
    assert (two["parallel"], two["ranks"], two["peak_memory_mib"]) == ("fsdp", 2, 100.0)
    assert two["mfu"] == 0.375 and alone["mfu"] is None  # a CPU run: no peak to divide by
    assert alone["peak_memory_mib"] is None  # a CPU run
    assert run.env["git_revision"] == one["env"]["git_revision"]  # the runs' machine
    other = _copied_as(one_process.run, tmp_path / "other", config={"seed": 7, "lr": 0.1})
    with pytest.raises(ValueError, match=r"other against one: --lr 0.1 vs .*, --seed 7 vs 0"):
        scaling_comparison([("one", one_process.run), ("other", other)])


def test_scaling_title_names_what_all_runs_share_and_the_rest_per_size(one_process, tmp_path):
    # The title gave the first run's batch and steps to every size and only the most ranks
    # ("1 and 4 rank(s)"), though one size trained at another batch and length, on 2 ranks too.
    c = json.loads((one_process.run / "summary.json").read_text())["config"]
    big = {"size": "big", "batch_size": 2 * c["batch_size"], "steps": 3 * c["steps"]}
    four = _copied_as(one_process.run, tmp_path / "t4", world_size=4, config={"nproc": 4})
    runs = [("tiny-x1", one_process.run), ("tiny-x4", four)]
    alike = scaling_comparison(runs).title
    assert alike == (
        f"bench-train scaling: tiny, context {c['context_length']}, global batch "
        f"{c['batch_size']}, {c['precision']}, {c['steps']} steps, 1 and 4 ranks"
    )
    runs.append(("big-x1", _copied_as(one_process.run, tmp_path / "b1", config=big)))
    two = _copied_as(one_process.run, tmp_path / "b2", world_size=2, config=big | {"nproc": 2})
    runs.append(("big-x2", two))
    assert scaling_comparison(runs).title == (
        f"bench-train scaling: tiny, big, context {c['context_length']}, {c['precision']}, "
        f"1, 2 and 4 ranks; tiny: global batch {c['batch_size']}, {c['steps']} steps; "
        f"big: global batch {big['batch_size']}, {big['steps']} steps"
    )


def test_scaling_table_without_a_one_rank_run_has_no_ratios(one_process, tmp_path):
    zero = _copied_as(one_process.run, tmp_path / "zero", world_size=2, config={"nproc": 2})
    (row,) = scaling_comparison([("zero", zero)]).rows
    assert row["speedup"] is None and row["tokens_per_s"] > 0


@pytest.mark.parametrize(
    ("runs", "said"),
    [
        (["--scaling", "one={run}", "two={run}", "one={unfinished}"], "label 'one' names several"),
        (["--speed", "one={run}", "one={run}", "--baseline", "one"], "label 'one' names several"),
        (["--scaling", "one={run}", "two={unfinished}"], "holds no summary.json: not the folder"),
        (["--text", "{unfinished}"], "holds no summary.json: not the folder"),
    ],
    ids=["repeated-scaling-label", "repeated-speed-label", "no-summary", "no-summary-text"],
)
def test_results_refuse_what_would_drop_a_run(runs, said, one_process, tmp_path, capsys):
    # A table built by label kept only the last run of a repeated label; a folder without a
    # summary ended in a traceback.
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    argv = [arg.format(run=one_process.run, unfinished=unfinished) for arg in runs]
    with pytest.raises(SystemExit) as exc:
        train_results(["--out", str(tmp_path / "results"), *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and said in err and "Traceback" not in err


def test_no_checkpoint_leaves_none_and_records_the_peak(train_argv, tmp_path):
    out = tmp_path / "run"
    assert main(train_argv(out, "--steps", "2", "--generate", "0", "--no-checkpoint")) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["peak_memory_mib"] is None  # no peak on a CPU
    assert not list(out.glob("checkpoint*"))


def test_result_files_from_run_folders(trained, tmp_path):
    """bench-train-results: train_text_* and train_speed_* from finished runs, on any machine."""
    results = tmp_path / "results"
    speed = [f"a={trained}", f"b={trained}"]
    args = ["--out", str(results), "--text", str(trained), "--text-baseline", str(trained)]
    args += ["--speed", *speed, "--baseline", "b"]
    assert train_results([*args, "--note", "same run twice"]) == 0
    text = next(results.glob("train_text_cpu_*.md")).read_text()
    best = min(r["val_loss"] for r in read_metrics(trained) if "val_loss" in r)
    assert f"lowest validation loss {best:.4f}" in text
    assert "with `--baseline torch`" in text and "this run is 1.00× that" in text
    assert (trained / "sample.txt").read_text() in text
    speed_md = next(results.glob("train_speed_cpu_*.md")).read_text()
    assert "same run twice" in speed_md and "One step of `a` under torch.profiler" in speed_md
    saved = json.loads(next(results.glob("train_speed_cpu_*.json")).read_text())
    assert [row["vs_baseline"] for row in saved["rows"]] == [1.0, 1.0]
    assert {p.suffix for p in results.iterdir()} == {".md", ".json", ".png", ".csv"}
    speed_csv = next(results.glob("train_speed_cpu_*.csv")).read_text().splitlines()
    assert len(speed_csv) == 1 + len(speed)  # a header, then a row per run
    with pytest.raises(SystemExit):
        train_results(["--out", str(results), "--speed", *speed])  # no --baseline
    assert train_results(["--out", str(results), "--scaling", f"one={trained}"]) == 0
    scaling = json.loads(next(results.glob("train_scaling_cpu_*.json")).read_text())
    assert [row["speedup"] for row in scaling["rows"]] == [1.0]
    assert next(results.glob("train_scaling_cpu_*.png")).stat().st_size > 0


@pytest.mark.gpu
def test_the_fast_default_trains_on_cuda(train_argv, tmp_path, capsys):
    """No option but the tiny model: compiled, bf16, fa2-triton, fused AdamW."""
    out = tmp_path / "run"
    argv = train_argv(out, "--steps", "20", "--log-every", "5", "--generate", "20")
    assert main([*argv, "--device", "cuda"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    c = summary["config"]
    assert (c["precision"], c["attention"], c["compile"], c["optimizer"]) == (
        "bf16-autocast",
        "fa2-triton",
        True,
        "torch-fused",
    )
    assert "first step:" in capsys.readouterr().err
    assert summary["final_train_loss"] < math.log(256)
    assert summary["mfu"] is None or 0 < summary["mfu"] < 1
    assert summary["peak_memory_mib"] > 0
    assert bench_generate(["--run", str(out), "--device", "cuda"]) == 0
    assert capsys.readouterr().out == (out / "sample.txt").read_text() + "\n"


def test_the_torch_baseline_trains_bench_steps_torch_native_model(
    train_text, tmp_path, monkeypatch
):
    """`--baseline torch` steps the same torch-native model as bench-step's rows: the chunked,
    checkpointed cross-entropy, not the full logits (built uncompiled here: importing the
    compiler is what a test should not pay for)."""
    import bench.train.loop
    from bench.train import Trainer

    real = bench.train.loop.torch_native_model
    built = []
    monkeypatch.setattr(
        bench.train.loop,
        "torch_native_model",
        lambda model, *, compile, compile_backend: (
            built.append(compile) or real(model, compile=False)
        ),
    )
    monkeypatch.setattr(
        bench.train.loop, "loss_function", lambda *, compile, backend: lmcore.cross_entropy
    )
    (tmp_path / "run").mkdir()
    config = TrainConfig.create(
        data=str(train_text), out=str(tmp_path / "run"), cache_dir=str(tmp_path / "cache"),
        device="cpu", tokenizer="bytes", size="tiny", context_length=16, batch_size=2,
        baseline="torch", progress=False,
    )  # fmt: skip
    trainer = Trainer(config)
    assert isinstance(trainer.model, TorchNativeLM) and trainer.model.lm is trainer.raw
    assert built == [True]  # --baseline torch compiles its own pieces
    trainer.recorder.close()

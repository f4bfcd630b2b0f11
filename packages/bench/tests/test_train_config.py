"""bench-train's options: written once (the parser holds no default), read from config files
(TOML or JSON, the command line winning), written to the run folder so that a run repeats from
it; the bucket size reaches every wrapper; GQA, TensorBoard and `--help`."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math

import pytest
import torch
import torch.distributed as dist
from spawn_ranks import free_port

import ddp
import lmcore
from bench.commands.train import COMMAND, main
from bench.core import parallel as parallel_module
from bench.core.cli import resolve_device
from bench.core.options import may_change, parse_duration
from bench.train import lm
from bench.train import run as run_module
from bench.train.config import TrainConfig
from bench.train.config_files import read_config_file, write_config_file
from bench.train.lock import LOCK_FILE
from bench.train.loop import Trainer
from bench.train.record import read_metrics
from bench.train.run import config_from_args, prepare


def test_the_parser_holds_no_default_and_the_device_default_agrees():
    parser = COMMAND.parser()
    options = [a for a in parser._actions if a.dest not in ("help", "config")]
    assert options and all(a.default is argparse.SUPPRESS for a in options)
    config = config_from_args(parser.parse_args(["--data", "x"]))
    assert config == TrainConfig.create(data="x")
    assert config.device == str(resolve_device("auto"))
    assert (config.attention, config.size) == (
        ("fa2-triton", "small") if "cuda" in config.device else ("sdpa", "tiny")
    )


def test_help_groups_the_options_and_shows_examples(help_text):
    text = help_text(COMMAND.parser().parse_args)
    for group in ("data:", "model:", "training:", "run:", "output:", "sampling:"):
        assert f"\n{group}\n" in text
    assert "--config runs/small/config.toml" in text and "--time-budget 20m" in text
    assert "(default: small with CUDA, tiny on a CPU)" in text


def test_resume_may_change_how_to_run_but_not_what_is_trained():
    resumable = may_change(TrainConfig)
    assert {"nproc", "parallel", "compile", "attention", "optimizer", "time_budget"} <= resumable
    assert not {"lr", "seed", "size", "num_kv_heads", "precision", "batch_size"} & resumable


def test_logging_and_evaluation_follow_the_run_length():
    """A short run still logs often and draws a validation curve; given intervals win."""
    intervals = [
        (c.log_interval, c.eval_interval)
        for c in (
            TrainConfig.create(data="x", device="cpu", steps=steps) for steps in (4, 100, 1000)
        )
    ]
    assert intervals == [(1, 1), (1, 10), (10, 100)]
    config = TrainConfig.create(data="x", device="cpu", steps=100, log_every=5, eval_every=0)
    assert (config.log_interval, config.eval_interval) == (5, 0)


def test_evaluation_takes_at_most_a_tenth_of_a_run_unless_told():
    """10 batches per evaluation where that is at most a tenth of the work (a forward each,
    against a forward and a backward, two forwards' work, per training micro-batch), fewer in
    a short run, at least one."""
    counts = {
        steps: TrainConfig.create(data="x", device="cpu", steps=steps).eval_batch_count
        for steps in (4, 20, 100, 1000)
    }
    assert counts == {4: 1, 20: 1, 100: 3, 1000: 10}  # 10 evaluations: 0.1 × 3 × steps / 10
    accumulating = TrainConfig.create(data="x", device="cpu", steps=100, grad_accum=4)
    assert accumulating.eval_batch_count == 10  # 4 micro-batches a step: 12 forwards' work
    given = TrainConfig.create(data="x", device="cpu", steps=4, eval_batches=7)
    assert given.eval_batch_count == 7


def test_timeout_bounds_the_ranks_only_when_given(monkeypatch, train_argv, tmp_path):
    """`--timeout S` reaches `launch` as bench-ddp's does; without it there is no bound."""
    seen = []

    def stopped(worker, **options):
        seen.append(options["timeout"])
        raise TimeoutError("stopped")

    monkeypatch.setattr(run_module, "launch", stopped)
    ranks = ["--nproc", "2", "--parallel", "ddp", "--generate", "0"]
    for name, extra in (("bounded", ["--timeout", "90"]), ("unbounded", [])):
        with pytest.raises(TimeoutError):
            main(train_argv(tmp_path / name, *ranks, *extra))
        assert not (tmp_path / name / LOCK_FILE).exists()  # released on the way out
    assert seen == [90.0, None]


def test_parse_duration():
    assert [parse_duration(t) for t in ("20m", "90s", "1.5h", "1h30m", "1200")] == [
        1200.0,
        90.0,
        5400.0,
        5400.0,
        1200.0,
    ]
    assert parse_duration("1h30m15s") == 5415.0 and parse_duration(".5m") == 30.0
    # a unit given twice or out of order is a typo, not a sum (1h1h read as two hours)
    for bad in ("soon", "10x", "0s", "-5", "1h 30m", "inf", "1h1h", "30m1h", "5s5s", "h", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_duration(bad)


def test_a_written_config_reads_back_to_the_same(tmp_path):
    config = TrainConfig.create(
        data="data/x.txt", out="runs/x", device="cpu", lr=1e-5, bucket_size_mb=None,
        time_budget=parse_duration("20m"), prompt='\t"ROMEO:"\n\x7f', num_kv_heads=1,
        d_model=64, num_heads=4, stop_after=3, resume=False, tensorboard=False,
    )  # fmt: skip
    path = write_config_file(config, tmp_path / "config.toml")
    text = path.read_text()
    assert '\nbucket-mb = "none"\n' in text
    assert "\nstop-after =" not in text and "\nresume =" not in text
    options = read_config_file(TrainConfig, path)
    assert TrainConfig.create(**options) == TrainConfig.create(
        **{**config.__dict__, "stop_after": None}
    )
    as_json = tmp_path / "config.json"
    as_json.write_text(json.dumps({"data": "data/x.txt", "bucket-mb": 4, "time-budget": "1h"}))
    assert read_config_file(TrainConfig, as_json) == {
        "data": "data/x.txt",
        "bucket_size_mb": 4.0,
        "time_budget": 3600.0,
    }


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("contxt-length = 64", "unknown option 'contxt-length'; did you mean 'context-length'"),
        ('steps = "many"', "steps = 'many'"),
        ("compile = 1", "compile = 1 is not a bool"),
        ("lr = true", "lr = True is not a float"),
        ("steps = [", "--config"),
    ],
)
def test_a_bad_config_file_is_refused(tmp_path, text, match):
    path = tmp_path / "bad.toml"
    path.write_text(text + "\n")
    with pytest.raises(ValueError, match=match.replace("[", r"\[").replace("(", r"\(")):
        read_config_file(TrainConfig, path)


def test_config_file_repeats_a_run_and_the_command_line_wins(one_process, losses_of, tmp_path):
    saved = one_process.run / "config.toml"
    again = tmp_path / "again"
    assert main(["--config", str(saved), "--out", str(again), "--no-progress"]) == 0
    assert losses_of(again) == one_process.losses  # the same run, to the bit
    mine = read_config_file(TrainConfig, again / "config.toml")
    theirs = read_config_file(TrainConfig, saved)
    assert mine == {**theirs, "out": str(again), "progress": False}
    args = COMMAND.parser().parse_args(["--config", str(saved), "--lr", "0.01"])
    assert config_from_args(args).lr == 0.01


def test_zero_gets_the_bucket_size(train_text, tmp_path, monkeypatch):
    """`--bucket-mb` reaches ShardedOptimizer under --parallel zero1, as it reaches DDPBucketed
    (a one-rank process group here, the trainer's own wiring)."""
    seen = []
    real = parallel_module.zero.ShardedOptimizer

    def spy(*args, **kwargs):
        seen.append(kwargs.get("bucket_size_mb", "left out"))
        return real(*args, **kwargs)

    monkeypatch.setattr(parallel_module.zero, "ShardedOptimizer", spy)
    init = f"tcp://127.0.0.1:{free_port()}"
    dist.init_process_group("gloo", init_method=init, rank=0, world_size=1)
    try:
        for size in (4.0, None):
            out = tmp_path / f"run-{size}"
            out.mkdir()
            config = TrainConfig.create(
                data=str(train_text), out=str(out), cache_dir=str(tmp_path / "cache"),
                device="cpu", tokenizer="bytes", size="tiny", context_length=16, batch_size=2,
                parallel="zero1", bucket_size_mb=size, progress=False,
            )  # fmt: skip
            trainer = Trainer(config)
            assert trainer.model.bucket_size_mb == size  # DDPBucketed's
            trainer.recorder.close()
    finally:
        dist.destroy_process_group()
    assert seen == [4.0, None] and ddp.DEFAULT_BUCKET_SIZE_MB not in seen


def test_bucket_size_speaks_ddps_vocabulary():
    parser = COMMAND.parser()
    base = ["--data", "x", "--out", "y", "--device", "cpu"]
    for extra, size in (([], 25.0), (["--bucket-mb", "none"], None), (["--bucket-mb", "4"], 4.0)):
        assert config_from_args(parser.parse_args([*base, *extra])).bucket_size_mb == size
    with pytest.raises(ValueError, match="--bucket-mb inf: give a finite number"):
        TrainConfig.create(data="x", out="y", device="cpu", bucket_size_mb=math.inf)


def test_grouped_query_attention_reaches_the_model(train_argv, tmp_path):
    out = tmp_path / "run"
    assert main(train_argv(out, "--steps", "2", "--num-kv-heads", "1", "--generate", "0")) == 0
    saved = torch.load(out / "checkpoint.pt", weights_only=True)
    head_dim = 32 // 2  # --d-model 32, --num-heads 2
    assert saved["model"]["layers.0.attn.k_proj.weight"].shape == (head_dim, 32)
    assert saved["extra"]["model_config"]["num_kv_heads"] == 1


def test_tensorboard_without_its_package_says_what_to_do(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "tensorboard" else real(name, *a),
    )
    with pytest.raises(ValueError, match=r"pip install 'cs336sys-bench\[tensorboard\]'"):
        TrainConfig.create(data="x", device="cpu", tensorboard=True)


@pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None, reason="needs the tensorboard extra"
)
def test_tensorboard_logs_the_metrics_of_metrics_jsonl(train_argv, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    extra = ["--steps", "4", "--log-every", "2", "--eval-every", "4", "--generate", "0"]
    assert main(train_argv(out, *extra, "--tensorboard")) == 0
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    records = read_metrics(out)
    for key in ("loss", "lr", "tokens_per_s", "val_loss"):
        logged = [(e.step, e.value) for e in events.Scalars(key)]
        expected = [(r["step"], r[key]) for r in records if key in r]
        assert [s for s, _ in logged] == [s for s, _ in expected], key
        assert [v for _, v in logged] == pytest.approx([v for _, v in expected], rel=1e-6), key


def test_model_options_reach_the_trainers_model(one_process, losses_of, tmp_path):
    """--activation-checkpointing and --loss fused reach the model: the one-process run again,
    to rounding (the fused loss sums the same terms in chunks), with checkpoints in the model."""
    out = tmp_path / "options"
    saved = one_process.run / "config.toml"
    extra = ["--activation-checkpointing", "segments:1", "--loss", "fused", "--no-progress"]
    assert main(["--config", str(saved), "--out", str(out), *extra]) == 0
    theirs = one_process.losses
    assert losses_of(out).keys() == theirs.keys()
    for step, loss in losses_of(out).items():
        assert loss == pytest.approx(theirs[step], rel=1e-5), step
    saved = read_config_file(TrainConfig, out / "config.toml")
    assert (saved["activation_checkpointing"], saved["loss"]) == ("segments:1", "fused")
    config = TrainConfig.create(**{**saved, "out": str(tmp_path / "fresh")})
    prepare(config)  # the output folder, as bench-train makes it before training
    trainer = Trainer(config)
    assert isinstance(trainer.raw.layers, lmcore.CheckpointedBlockStack)
    assert trainer.step_fn.keywords["fused_loss"] is True


def test_the_optimizers_are_the_shared_ones():
    assert TrainConfig.create(data="x", out="y", optimizer="lmcore-fused").optimizer == (
        "lmcore-fused"
    )
    assert lm.optimizer_class("lmcore-fused", lr=0.1) == (
        lmcore.AdamW,
        {"lr": 0.1, "betas": lm.BETAS, "fused": True},
    )


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"activation_checkpointing": "segments:0"}, "--activation-checkpointing"),
        ({"loss": "chunked"}, "--loss 'chunked'"),
        ({"baseline": "torch", "loss": "fused"}, "--baseline torch runs torch.s own loss"),
    ],
)
def test_bad_model_options_are_refused(options, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig.create(data="x", out="y", device="cpu", **options)

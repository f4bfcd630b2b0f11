"""bench-train survives what ends runs: a kill at any moment (a process of its own that kills
itself at a named point, `bench.train.faults`), a second run into the same folder or into a
finished run's, a damaged checkpoint, a refused resume, a checkpoint that cannot be written, a
partial metrics line, a tokenizer left by another run. (Several ranks: test_train_ranks.py;
signals to the process that starts them: test_launch.py.)"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from killed_run import run_killed

import lmcore
from bench.commands.generate import main as bench_generate
from bench.commands.train import main
from bench.train.config import CONFIG_FILE
from bench.train.lock import LOCK_FILE, hold
from bench.train.record import METRICS, read_metrics
from bench.train.tokenizer import TOKENIZER_FILE, BPETokenizer

# Six steps, a checkpoint every two, an evaluation every three, a sample at the end.
SIX_STEPS = ["--steps", "6", "--save-every", "2", "--log-every", "1", "--eval-every", "3"]
SIX_STEPS += ["--eval-batches", "2", "--generate", "16", "--prompt", "the"]


@pytest.fixture(scope="module")
def uninterrupted(train_argv, train_in_one_thread, tmp_path_factory):
    """`SIX_STEPS` run through without a kill: what every resumed run must reproduce."""
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    train_in_one_thread(train_argv(out, *SIX_STEPS))
    return out


def _checkpoint_step(out) -> int:
    return torch.load(out / "checkpoint.pt", weights_only=True)["iteration"]


def _cut_last_line(out) -> None:
    """Leave half of the last metrics line, as a kill while appending it does."""
    text = (out / METRICS).read_text()
    last = text.rstrip("\n").rsplit("\n", 1)[-1]
    (out / METRICS).write_text(text[: len(text) - len(last) // 2 - 1])


@pytest.mark.parametrize(
    ("point", "checkpoint_at"),
    [("step:3", 2), ("checkpoint:4", 2), ("metrics:5", 4), ("outputs", 6)],
    ids=["mid-step", "mid-checkpoint", "mid-metrics-line", "after-the-last-checkpoint"],
)
def test_resume_after_a_kill_reproduces_the_uninterrupted_run(
    point, checkpoint_at, uninterrupted, train_argv, tmp_path
):
    out = tmp_path / "run"
    run_killed(train_argv(out, *SIX_STEPS), point)
    assert _checkpoint_step(out) == checkpoint_at
    assert (out / LOCK_FILE).is_file() and not (out / "summary.json").exists()
    if point.startswith("checkpoint"):
        assert (out / "checkpoint.pt.tmp").is_file()  # written, never committed
    if point.startswith("metrics"):
        _cut_last_line(out)
        with pytest.warns(UserWarning, match="left out its last line, a partial record"):
            assert main(train_argv(out, *SIX_STEPS, "--resume")) == 0
    else:  # the killed run's lock file does not hold the folder: the kill released it
        assert main(train_argv(out, *SIX_STEPS, "--resume")) == 0
    whole, resumed = read_metrics(uninterrupted), read_metrics(out)
    assert [r["step"] for r in resumed] == [r["step"] for r in whole] == list(range(1, 7))
    for a, b in zip(whole, resumed, strict=True):
        assert a.keys() == b.keys()
        for key in ("loss", "lr", "val_loss"):
            assert a.get(key) == pytest.approx(b.get(key), abs=1e-5), (a["step"], key)
    summary = json.loads((out / "summary.json").read_text())
    expected = json.loads((uninterrupted / "summary.json").read_text())
    for key in ("final_train_loss", "final_val_loss"):
        assert summary[key] == pytest.approx(expected[key], abs=1e-5)
    assert summary["steps"] == 6 and summary["tokens_per_s"] > 0
    assert (out / "sample.txt").read_text() == (uninterrupted / "sample.txt").read_text()
    assert (out / "loss.png").stat().st_size > 0
    left = {p.name for p in out.iterdir()} - {p.name for p in uninterrupted.iterdir()}
    assert not left  # no temporary file, no lock


def test_resume_auto_starts_a_run_continues_it_after_a_kill_and_ends_a_finished_one(
    uninterrupted, train_argv, tmp_path, capsys
):
    """One command for every start, as torchrun's --max-restarts and a scheduler's requeue
    repeat it: it starts (no checkpoint), continues after the kill (one), and finds it done."""
    out = tmp_path / "run"
    argv = train_argv(out, *SIX_STEPS, "--resume", "auto")
    run_killed(argv, "step:3")
    assert _checkpoint_step(out) == 2
    assert main(argv) == 0
    whole, resumed = read_metrics(uninterrupted), read_metrics(out)
    assert [r["loss"] for r in resumed] == pytest.approx([r["loss"] for r in whole], abs=1e-5)
    assert (out / "sample.txt").read_text() == (uninterrupted / "sample.txt").read_text()
    capsys.readouterr()
    assert main(argv) == 0
    assert "the checkpoint is at the last step, 6: writing the outputs" in capsys.readouterr().err


def test_a_second_run_into_a_busy_out_is_refused(train_argv, tmp_path, usage_error):
    out = tmp_path / "run"
    argv = train_argv(out, "--steps", "2", "--generate", "0", "--eval-batches", "1")
    with hold(out, command="bench-train --the-first-run"):
        err = usage_error(argv)
        assert f"in use by another bench-train run (pid {os.getpid()}" in err
        assert "--the-first-run" in err
        assert "in use by another" in usage_error([*argv, "--resume"])
        assert {p.name for p in out.iterdir()} == {LOCK_FILE}  # nothing read or written
    assert main(argv) == 0 and not (out / LOCK_FILE).exists()


def test_a_finished_run_is_never_overwritten_without_overwrite(train_argv, tmp_path, usage_error):
    out = tmp_path / "run"
    argv = train_argv(out, "--steps", "1", "--generate", "0", "--eval-batches", "1")
    assert main([*argv, "--no-checkpoint"]) == 0  # nothing to --resume: only its results
    kept = {name: (out / name).read_bytes() for name in ("summary.json", METRICS)}
    err = usage_error([*argv, "--seed", "1"])
    assert f"holds a run's results (summary.json, {METRICS}); choose another --out" in err
    assert "pass --overwrite" in err
    assert {name: (out / name).read_bytes() for name in kept} == kept
    (out / "summary.json").unlink()  # a run that ended before its summary: its metrics count
    assert f"holds a run's results ({METRICS})" in usage_error(argv)
    assert "--overwrite starts a new run" in usage_error([*argv, "--overwrite", "--resume"])
    assert main([*argv, "--seed", "1", "--overwrite"]) == 0
    assert json.loads((out / "summary.json").read_text())["config"]["seed"] == 1
    assert "pass --resume to continue it, --overwrite to replace it" in usage_error(argv)
    # Replaced whole: the new run's checkpoint is gone with it, not left for a --resume.
    assert main([*argv, "--overwrite", "--no-checkpoint"]) == 0
    assert not list(out.glob("checkpoint*"))


def test_a_refused_resume_leaves_the_runs_configuration(one_process, copy_of, train_argv, tmp_path):
    # The checkpoint reads, but its optimizer state is SGD's: refused as it is loaded, after
    # the checks made before any rank starts. config.toml still describes the run.
    out = copy_of(one_process.halfway, tmp_path / "run")
    saved = torch.load(out / "checkpoint.pt", weights_only=True)
    for entry in saved["optimizer"]["state"].values():
        entry["momentum_buffer"] = entry.pop("exp_avg")
    torch.save(saved, out / "checkpoint.pt")
    before = (out / CONFIG_FILE).read_text()
    with pytest.raises(ValueError, match="momentum_buffer"):
        main(train_argv(out, *one_process.args, "--resume", "--log-every", "2"))
    assert (out / CONFIG_FILE).read_text() == before


def test_a_checkpoint_that_cannot_be_written_keeps_the_previous_one(
    one_process, copy_of, train_argv, tmp_path, monkeypatch, capsys
):
    # What torch's writer raises when the disk fills, after part of the file is written.
    def full_disk(model, optimizer, iteration, path, **extra):
        Path(path).write_bytes(b"PK\x03\x04" + bytes(100))
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4608")

    out = copy_of(one_process.halfway, tmp_path / "run")  # its checkpoint: step 2
    argv = train_argv(out, *one_process.args, "--resume")
    monkeypatch.setattr(lmcore, "save_checkpoint", full_disk)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "could not write the checkpoint of step 4 to" in err and "unexpected pos" in err
    assert "It needs at least" in err and "MiB free" in err and "Traceback" not in err
    assert "The previous checkpoint, of step 2, is intact" in err
    assert _checkpoint_step(out) == 2 and not list(out.glob("*.tmp"))
    monkeypatch.undo()
    assert main(argv) == 0 and _checkpoint_step(out) == 4


def _damage(path, how: str) -> None:
    data = path.read_bytes()
    if how == "empty":
        path.write_bytes(b"")
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "garbled":  # inside a tensor's bytes: torch alone would load other weights
        middle = len(data) // 2
        flipped = bytes(b ^ 0xFF for b in data[middle : middle + 64])
        path.write_bytes(data[:middle] + flipped + data[middle + 64 :])
    elif how == "without-record":  # an lmcore checkpoint, not the trainer's
        saved = torch.load(path, weights_only=True)
        torch.save({**saved, "extra": {}}, path)
    else:  # objects a weights-only load refuses
        torch.save({"model": argparse.Namespace(step=2)}, path)


@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("empty", "is damaged (File is not a zip file)"),
        ("truncated", "is damaged"),
        ("garbled", "fails its checksum"),
        ("without-record", "is not a bench-train checkpoint (it lacks the trainer's record"),
        ("foreign", "holds objects other than tensors and plain data"),
    ],
)
def test_a_damaged_checkpoint_is_a_usage_error_naming_it(
    how, said, one_process, copy_of, train_argv, tmp_path, usage_error, capsys
):
    out = copy_of(one_process.halfway, tmp_path / "run")
    _damage(out / "checkpoint.pt", how)
    err = usage_error(train_argv(out, *one_process.args, "--resume"))
    assert f"{out / 'checkpoint.pt'}" in err and said in err
    assert "Traceback" not in err
    with pytest.raises(SystemExit) as exc:
        bench_generate(["--run", str(out), "--device", "cpu"])
    assert exc.value.code == 2 and said in capsys.readouterr().err


def test_a_damaged_metrics_line_before_the_last_is_an_error(tmp_path):
    (tmp_path / METRICS).write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(ValueError, match="line 2 is not a JSON record"):
        read_metrics(tmp_path)


def test_a_new_run_replaces_a_tokenizer_left_by_another(
    train_argv, train_text, tmp_path, usage_error
):
    out = tmp_path / "run"
    out.mkdir()
    BPETokenizer.train(train_text.read_text(), 300).save(out / TOKENIZER_FILE)  # stale
    bpe = ["--tokenizer", "bpe", "--vocab-size", "320", "--steps", "1", "--eval-batches", "1"]
    argv = train_argv(out, *bpe, "--generate", "0")
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["vocab_size"] == summary["config"]["vocab_size"] == 320  # one vocabulary
    assert BPETokenizer.load(out / TOKENIZER_FILE).vocab_size == 320
    # Token ids bring no tokenizer: one in --out decodes their samples, if its ids fit.
    tokens, ids = tmp_path / "tokens.bin", tmp_path / "ids"
    (np.arange(4000) % 280).astype(np.uint16).tofile(tokens)
    ids.mkdir()
    shutil.copyfile(out / TOKENIZER_FILE, ids / TOKENIZER_FILE)
    err = usage_error(train_argv(ids, *bpe, "--vocab-size", "280", data=tokens))
    assert "has a vocabulary of 320, larger than the model's 280" in err


def test_resume_refuses_a_tokenizer_the_checkpoint_was_not_trained_with(
    train_argv, train_text, tmp_path, usage_error
):
    out = tmp_path / "run"
    bpe = ["--tokenizer", "bpe", "--vocab-size", "320", "--steps", "2", "--eval-batches", "1"]
    argv = train_argv(out, *bpe, "--generate", "0")
    assert main([*argv, "--stop-after", "1"]) == 0
    BPETokenizer.train(train_text.read_text()[:2000], 320).save(out / TOKENIZER_FILE)
    err = usage_error([*argv, "--resume"])
    assert "the checkpoint's tokenizer is not the one it was trained with" in err
    (out / TOKENIZER_FILE).unlink()
    assert "the checkpoint's tokenizer is missing" in usage_error([*argv, "--resume"])

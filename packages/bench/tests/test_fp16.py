"""fp16 with dynamic loss scaling: `bench.core.loss_scale.LossScaler` skips a step whose gradients
overflow (the weights untouched), halves its scale and counts the skip, on every rank alike where
gradients are sharded; bench-train's `--precision fp16` logs the scale and the skips, recovers
from a scale far too high instead of training on infinities, resumes the scaler exactly, and
under zero.FSDP on 2 ranks skips the steps one process skips."""

from __future__ import annotations

import json
import math

import pytest
import torch
from spawn_ranks import run_ranks
from torch import nn

from bench.commands.train import main
from bench.commands.train_results import main as bench_train_results
from bench.core.loss_scale import LossScaler
from bench.core.results import load_json
from bench.train.record import read_metrics

CPU = torch.device("cpu")
# A first scale this tiny model's fp16 gradients overflow at (they fit from 2^19 down): the run
# skips its first steps, halving the scale each time, then trains.
TOO_HIGH = str(2**22)
FP16 = ("--precision", "fp16", "--generate", "0", "--log-every", "1")


def _linear_step(scaler: LossScaler, *, overflow: bool) -> tuple[nn.Linear, list[torch.Tensor]]:
    """One scaled SGD step of a linear layer (an inf put into one gradient when `overflow`);
    the layer and its weights before the step."""
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    scaler.scale(model(torch.randn(5, 8)).square().mean()).backward()
    if overflow:
        model.weight.grad[1, 2] = math.inf
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    return model, before


def test_an_overflowing_step_is_skipped_and_the_scale_halved():
    scaler = LossScaler(CPU, init_scale=2.0**10)
    model, before = _linear_step(scaler, overflow=True)
    assert scaler.update() is True
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    assert (scaler.get_scale(), scaler.skipped_steps) == (2.0**9, 1)

    model, before = _linear_step(scaler, overflow=False)
    assert scaler.update() is False
    assert not torch.equal(model.weight, before[0])
    assert (scaler.get_scale(), scaler.skipped_steps) == (2.0**9, 1)
    resumed = LossScaler(CPU)
    resumed.load_state_dict(scaler.state_dict())
    assert (resumed.get_scale(), resumed.skipped_steps) == (2.0**9, 1)


def test_unscaled_gradients_are_the_unscaled_backwards():
    torch.manual_seed(1)
    model, x = nn.Linear(6, 3), torch.randn(4, 6)
    model(x).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    scaler = LossScaler(CPU, init_scale=2.0**12)
    scaler.scale(model(x).sum()).backward()
    scaler.unscale_(torch.optim.SGD(model.parameters(), lr=0.1))
    for param, grad in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(param.grad, grad)  # a power of two scales exactly


def _skip_on_one_rank(rank: int, world_size: int) -> tuple[bool, float, bool]:
    """An overflow in rank 1's gradients only (as in its shard of a sharded gradient)."""
    scaler = LossScaler(CPU, init_scale=8.0)
    torch.manual_seed(rank)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.weight.detach().clone()
    scaler.scale(model(torch.randn(3, 4)).sum()).backward()
    if rank == 1:
        model.weight.grad[0, 0] = math.inf
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    skipped = scaler.update()
    return skipped, scaler.get_scale(), torch.equal(before, model.weight)


def test_every_rank_skips_where_one_overflows():
    assert run_ranks(_skip_on_one_rank) == [(True, 4.0, True)] * 2


def test_a_run_whose_gradients_overflow_skips_steps_and_recovers(train_argv, tmp_path):
    out = tmp_path / "run"
    extra = (*FP16, "--loss-scale", TOO_HIGH, "--steps", "8", "--eval-every", "1")
    assert main(train_argv(out, *extra, "--eval-batches", "2")) == 0
    records = read_metrics(out)
    skipped = [r["skipped_steps"] for r in records]
    first_taken = skipped.index(skipped[-1]) + 1  # the skips end: every later step is taken
    assert 1 <= skipped[-1] == first_taken < len(records) - 2
    scales = [r["loss_scale"] for r in records]  # after each step
    assert scales[:first_taken] == [2.0 ** (21 - i) for i in range(first_taken)]
    assert len(set(scales[first_taken - 1 :])) == 1
    # skipped steps leave the weights as they were, so the validation loss with them
    val = [r["val_loss"] for r in records]
    assert len(set(val[:first_taken])) == 1 and val[-1] < val[0]
    weights = torch.load(out / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.isfinite(w).all() for w in weights.values())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["skipped_steps"] == skipped[-1] and summary["loss_scale"] == scales[-1]


def test_a_resumed_fp16_run_continues_its_loss_scale(train_argv, tmp_path):
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    extra = (*FP16, "--loss-scale", TOO_HIGH, "--steps", "6")
    assert main(train_argv(whole, *extra)) == 0
    assert main(train_argv(halves, *extra, "--stop-after", "2")) == 0
    assert main(train_argv(halves, *extra, "--resume")) == 0
    # without the scaler in the checkpoint, the second half would start at TOO_HIGH again
    whole_run, resumed = (
        [(r["step"], r["loss"], r["loss_scale"], r["skipped_steps"]) for r in read_metrics(out)]
        for out in (whole, halves)
    )
    assert resumed == whole_run and whole_run[1][3] >= 1


def test_sharded_modes_on_two_ranks_skip_the_steps_one_process_skips(train_argv, tmp_path):
    # zero.FSDP's sharded gradients: each rank unscales its shards, the ranks agree on the
    # overflow, and the fp16 gradients are summed over the ranks in float32 (in fp16 the sum
    # overflows at a scale one process's gradients bear, and the two ranks skipped a step more).
    # ZeRO-1 (DDPBucketed's averaged gradients, the optimizer sharded): every rank unscales the
    # whole model's gradients before its shard's step.
    extra = (*FP16, "--loss-scale", TOO_HIGH, "--steps", "6")
    assert main(train_argv(tmp_path / "one", *extra)) == 0
    ones = read_metrics(tmp_path / "one")
    assert ones[-1]["skipped_steps"] >= 1
    for mode in ("fsdp", "zero1"):
        assert main(train_argv(tmp_path / mode, *extra, "--nproc", "2", "--parallel", mode)) == 0
        twos = read_metrics(tmp_path / mode)
        assert [r["skipped_steps"] for r in twos] == [r["skipped_steps"] for r in ones], mode
        # zero.FSDP computes the blocks in fp16 where autocast keeps the residual stream in
        # float32: a few of fp16's roundings (2^-11 relative) apart
        for mine, theirs in zip(twos, ones, strict=True):
            assert mine["loss"] == pytest.approx(theirs["loss"], rel=2e-3), mode


def test_loss_scale_needs_fp16(train_argv, tmp_path, usage_error):
    error = usage_error(train_argv(tmp_path / "run", "--loss-scale", "1024"))
    assert "scales fp16's loss only" in error


def test_the_precision_table_sets_fp16_beside_the_reference(
    train_argv, one_process, tmp_path, capsys
):
    fp16 = tmp_path / "fp16"
    assert main(train_argv(fp16, *one_process.args, "--precision", "fp16")) == 0
    results = tmp_path / "results"
    argv = ["--out", str(results), "--precision", f"fp32={one_process.run}", f"fp16={fp16}"]
    assert bench_train_results(argv) == 0
    (json_file,) = results.glob("train_precision_cpu_*.json")
    run = load_json(json_file)
    reference, scaled = run.rows
    assert (reference["precision"], scaled["precision"]) == ("fp32", "fp16")
    assert reference["loss_diff"] == 0.0 and reference["skipped_steps"] is None
    assert scaled["skipped_steps"] == 0 and scaled["loss_scale"] == 2.0**16
    # fp16 rounds the matmuls' inputs to 11 significant bits: the losses stay close
    assert abs(scaled["loss_diff"]) < 1e-2 and scaled["max_loss_diff"] < 1e-2
    assert any(n.startswith("fp16 (fp16) ends at validation loss") for n in run.notes)
    assert {p.suffix for p in results.iterdir()} == {".json", ".csv", ".md", ".png"}
    other = tmp_path / "other-lr"  # another training: refused, naming what differs
    assert main(train_argv(other, *one_process.args, "--precision", "fp16", "--lr", "1e-3")) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        bench_train_results(["--out", str(results), "--precision", f"a={fp16}", f"b={other}"])
    assert exc.value.code == 2 and "--lr 0.001 vs 0.0006" in capsys.readouterr().err

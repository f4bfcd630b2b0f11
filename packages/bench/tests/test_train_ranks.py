"""bench-train on 2 gloo ranks: the parallel modes reproduce the one-process run's losses (and
weights), across resumes and changes of mode, and under `torchrun` as two nodes; an FSDP run
killed while it commits a checkpoint resumes from the previous one.

Each 2-rank launch costs tens of seconds on two shared cores, so the consolidated modes resume
the one-process run's checkpoint after step 2 (`one_process.halfway`) and run steps 3-4 only."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch
from spawn_ranks import free_port, run_ranks

import lmcore
import zero
from bench.commands.train import main
from bench.train import TrainConfig, Trainer
from bench.train.faults import KILL_AT
from bench.train.scaling import scaling_comparison

# The ranks average means of equal halves of each batch, and their gradients: the same sums in
# another order, so float32 rounding (not the method) separates them from one process.
RANKS_ATOL = 1e-5
RUN_4 = ["--steps", "4", "--log-every", "1", "--grad-clip", "0.1", "--generate", "0"]


def _assert_matches(losses: dict[int, float], expected: dict[int, float]) -> None:
    assert losses.keys() == expected.keys()
    for step, loss in expected.items():
        assert abs(losses[step] - loss) <= RANKS_ATOL, step


def _assert_same_weights_and_consolidated(out, reference) -> None:
    """The final checkpoint holds the one-process run's weights and every parameter's moments."""
    saved = torch.load(out / "checkpoint.pt", weights_only=True)
    expected = torch.load(reference / "checkpoint.pt", weights_only=True)
    assert saved["iteration"] == 4
    assert saved["model"].keys() == expected["model"].keys()
    for name, weight in expected["model"].items():
        torch.testing.assert_close(saved["model"][name], weight, atol=RANKS_ATOL, rtol=0)
    assert len(saved["optimizer"]["state"]) == len(saved["model"])
    model = lmcore.TransformerLM(**saved["extra"]["model_config"])
    decayed = [p for p in model.parameters() if p.dim() >= 2]
    plain = [p for p in model.parameters() if p.dim() < 2]
    optimizer = lmcore.AdamW([{"params": decayed}, {"params": plain}])
    lmcore.load_checkpoint(saved, model, optimizer)  # loads into one process as it is


@pytest.mark.parametrize("mode", ["zero1", "fsdp:torch"])
def test_two_ranks_continue_a_one_process_checkpoint(
    mode, train_argv, one_process, losses_of, copy_of, tmp_path
):
    # Steps 1-2 in one process, 3-4 on 2 ranks: the mode loads the consolidated state (ZeRO-1
    # shards it, FSDP2 shards weights and state), trains, samples from the gathered weights and
    # saves the consolidated state again.
    out = copy_of(one_process.halfway, tmp_path / "run")
    extra = [*RUN_4, "--nproc", "2", "--parallel", mode, "--resume", "--generate", "8"]
    assert main(train_argv(out, *extra)) == 0
    _assert_matches(losses_of(out), one_process.losses)
    _assert_same_weights_and_consolidated(out, one_process.run)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["config"]["parallel"] == mode
    assert (out / "sample.txt").read_text()
    # bench-train-results' scaling table sets the run against the one-process one
    table = scaling_comparison([("one", one_process.run), (mode, out)])
    one, two = table.rows
    assert (one["ranks"], one["speedup"], one["loss_diff"]) == (1, 1.0, 0.0)
    assert two["ranks"] == 2 and two["scaling_eff"] == pytest.approx(two["speedup"] / 2)
    assert two["max_loss_diff"] <= RANKS_ATOL and two["peak_memory_mib"] is None  # CPU


def _torchrun_two_nodes(argv: list[str], *, kill_at: str) -> list[str]:
    """bench-train as two torchrun node processes on this machine, one rank each, meeting at a
    c10d rendezvous on localhost (multi-node as a cluster runs it), killed at `kill_at`
    (`bench.train.faults`); their logs."""
    rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    rendezvous += ["--rdzv-id", "bench-train-test", "--nnodes", "2", "--nproc-per-node", "1"]
    command = [sys.executable, "-m", "torch.distributed.run", *rendezvous, "-m", "bench", "train"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", KILL_AT: kill_at}
    nodes = [
        subprocess.Popen(
            [*command, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for _ in range(2)
    ]
    try:
        logs = [node.communicate(timeout=300)[0] for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    assert all(node.returncode != 0 for node in nodes), "\n".join(logs)
    return logs


def test_fsdp_killed_mid_checkpoint_on_two_torchrun_nodes_resumes_on_two_ranks(
    train_argv, one_process, losses_of, tmp_path, usage_error
):
    # Steps 1-4 on two torchrun nodes, a checkpoint every 2 steps; rank 0 is killed as it
    # commits step 4's (rank 1 has written its file of step 4). Steps 3-4 again, from step 2's
    # checkpoint, on two ranks bench-train starts itself. Weights, gradients and optimizer
    # state sharded, a checkpoint file per rank; the clipping norm spans the shards; an
    # evaluation (forward passes without backward) after every step.
    out = tmp_path / "run"
    extra = [*RUN_4, "--parallel", "fsdp", "--eval-every", "1", "--eval-batches", "2"]
    _torchrun_two_nodes(train_argv(out, *extra, "--save-every", "2"), kill_at="checkpoint:4")
    saved = torch.load(out / "checkpoint.pt", weights_only=True)
    assert saved["iteration"] == 2
    assert saved["extra"]["files"] == {0: "checkpoint.pt", 1: "checkpoint-rank1-step2.pt"}
    assert (out / "checkpoint-rank1-step4.pt").is_file()  # written, never committed
    # A set of files of different steps is refused before any rank starts.
    committed = out / "checkpoint-rank1-step2.pt"
    kept = committed.read_bytes()
    shutil.copyfile(out / "checkpoint-rank1-step4.pt", committed)
    resume = train_argv(out, *extra, "--nproc", "2", "--resume")
    assert "holds step 4, but checkpoint.pt is at step 2" in usage_error(resume)
    committed.write_bytes(kept)
    assert main([*resume, "--generate", "8"]) == 0
    _assert_matches(losses_of(out), one_process.losses)
    assert (out / "sample.txt").read_text()
    assert sorted(p.name for p in out.glob("checkpoint*")) == [
        "checkpoint-rank1-step4.pt",
        "checkpoint.pt",
    ]


def _fsdp_bf16_worker(rank: int, world_size: int, options: dict, outs: list[str]) -> dict:
    """Two steps of bench-train's `--parallel fsdp --precision bf16` on this rank, eager and
    with each unit compiled (aot_eager: the graphs inductor would compile, run without its
    kernels); the losses, and what the compiled run's model and optimizer hold."""
    results = {}
    for out, compiled in zip(outs, (False, True), strict=True):
        config = TrainConfig.create(
            **options, out=out, nproc=world_size, parallel="fsdp", precision="bf16",
            compile=compiled, compile_backend="aot_eager",
        )  # fmt: skip
        trainer = Trainer(config, rank=rank, world_size=world_size)
        records = trainer.train()["records"]
        results[compiled] = [r["loss"] for r in records]
    model, optimizer = trainer.model, trainer.optimizer
    results["fsdp"] = isinstance(model, zero.FSDP)
    results["units_compiled"] = [hasattr(m.forward, "_torchdynamo_orig_callable") for m in
                                 model.unit_modules]  # fmt: skip
    results["dtypes"] = {str(t.dtype) for s in optimizer.state.values() for t in s.values()
                         if t.dim()} | {str(p.dtype) for p in model.parameters()}  # fmt: skip
    return results


def test_fsdp_in_bf16_compiled_per_unit_trains_as_the_eager_one(train_text, tmp_path):
    # bf16 shards, gradients and AdamW moments; each unit's forward compiled with FSDP's hooks
    # outside: the same operations as eager, so the same bits on both ranks
    options = {
        "data": str(train_text), "cache_dir": str(tmp_path / "cache"), "device": "cpu",
        "tokenizer": "bytes", "size": "tiny", "d_model": 32, "num_layers": 1, "num_heads": 2,
        "d_ff": 64, "context_length": 16, "batch_size": 4, "steps": 2, "log_every": 1,
        "eval_every": 0, "generate": 0, "checkpoint": False, "progress": False,
        "optimizer": "lmcore",
    }  # fmt: skip
    outs = [tmp_path / "eager", tmp_path / "compiled"]
    for out in outs:
        out.mkdir()
    ranks = run_ranks(_fsdp_bf16_worker, args=(options, [str(out) for out in outs]))
    first = ranks[0]  # rank 0 records the losses (the mean over the ranks)
    assert first[True] == first[False] and len(first[True]) == 2
    assert all(math.isfinite(loss) for loss in first[True])
    for rank in ranks:
        assert rank["fsdp"] and rank["units_compiled"] == [True, True, True]
        assert rank["dtypes"] == {"torch.bfloat16"}


@pytest.mark.gpu
def test_torch_fsdp_compiles_per_block_on_a_gpu(train_argv, tmp_path):
    """The fast default (compiled, bf16) under FSDP2: `compile` per block, then `fully_shard`."""
    out = tmp_path / "run"
    argv = train_argv(out, "--steps", "10", "--log-every", "5", "--generate", "8")
    assert main([*argv, "--device", "cuda", "--nproc", "1", "--parallel", "fsdp:torch"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["compile"] and summary["config"]["precision"] == "bf16-autocast"
    assert summary["final_train_loss"] < math.log(256) and (out / "sample.txt").read_text()

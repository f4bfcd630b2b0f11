"""zero.ShardedOptimizer(lmcore.AdamW) under each data-parallel wrapper equals one-process training.

Each rank trains a tiny `lmcore.TransformerLM` on its own slice of the global batch; the wrapper
averages the gradients, the sharded optimizer steps each rank's shard and broadcasts it. The
reference is the same model trained with plain `lmcore.AdamW` on the whole batch in one process.
Everything is float64 so that the only difference left is the order of floating-point sums.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from spawn_ranks import run_ranks
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import ddp
import lmcore
from zero import ShardedOptimizer

VOCAB, CONTEXT, D_MODEL, LAYERS, HEADS, D_FF = 37, 8, 16, 2, 2, 24
GLOBAL_BATCH, SEQ = 4, 7  # each of 2 ranks gets 2 sequences
STEPS = 3
OPTIONS = {"lr": 1e-2, "betas": (0.9, 0.95), "weight_decay": 0.1}
# Summing in another order changes fp64 results by ~1e-16 relative; AdamW's m / (sqrt(v) + eps)
# can amplify that where a gradient is near zero by up to lr * |dg| / eps (~1e-10 here). A
# wrong shard, a missed broadcast or a skipped average moves parameters by ~lr = 1e-2.
TOLERANCE = {"rtol": 1e-9, "atol": 1e-9}

WRAPPERS: dict[str, Callable[[nn.Module], nn.Module]] = {
    "NaiveDDP": ddp.NaiveDDP,
    "FlatDDP": ddp.FlatDDP,
    "DDPIndividualParameters": ddp.DDPIndividualParameters,
    "DDPBucketed": lambda m: ddp.DDPBucketed(m, bucket_size_mb=0.005),  # a few buckets
    "torch DDP": DistributedDataParallel,
}


def _model(device: torch.device) -> lmcore.TransformerLM:
    torch.manual_seed(0)
    model = lmcore.TransformerLM(VOCAB, CONTEXT, D_MODEL, LAYERS, HEADS, D_FF)
    return model.to(device=device, dtype=torch.float64)


def _batches(device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        tuple(torch.randint(VOCAB, (GLOBAL_BATCH, SEQ), generator=g).to(device) for _ in range(2))
        for _ in range(STEPS)
    ]


def _reference(device: torch.device) -> list[torch.Tensor]:
    model = _model(device)
    optimizer = lmcore.AdamW(model.parameters(), **OPTIONS)
    for tokens, targets in _batches(device):
        optimizer.zero_grad()
        lmcore.cross_entropy(model(tokens), targets).backward()
        optimizer.step()
    return [p.detach().cpu() for p in model.parameters()]


def _sharded(name: str, rank: int, world_size: int, device: torch.device) -> list[torch.Tensor]:
    model = _model(device)
    wrapped = WRAPPERS[name](model)
    optimizer = ShardedOptimizer(wrapped.parameters(), lmcore.AdamW, **OPTIONS)
    for tokens, targets in _batches(device):
        mine = slice(rank, None, world_size)  # this rank's sequences of the global batch
        if hasattr(wrapped, "on_train_batch_start"):
            wrapped.on_train_batch_start()
        optimizer.zero_grad()
        lmcore.cross_entropy(wrapped(tokens[mine]), targets[mine]).backward()
        if hasattr(wrapped, "finish_gradient_synchronization"):
            wrapped.finish_gradient_synchronization()
        optimizer.step()
    return [p.detach().cpu() for p in model.parameters()]


def _resumed_from_a_fused_state(rank: int, world_size: int, device: torch.device) -> dict:
    """Training stopped after one step and resumed from a state dict whose groups say
    `fused=True` (as a fused run saves them) into ShardedOptimizer(lmcore.AdamW) of the default
    implementation: its parameters at the end, and the implementation each step ran with."""
    model = _model(device)
    wrapped = DistributedDataParallel(model)
    optimizer = ShardedOptimizer(wrapped.parameters(), lmcore.AdamW, **OPTIONS)
    batches = _batches(device)
    mine = slice(rank, None, world_size)
    implementations = []
    for step, (tokens, targets) in enumerate(batches):
        if step == 1:
            saved = optimizer.state_dict()
            for group in saved["param_groups"]:
                group["fused"] = True
            optimizer = ShardedOptimizer(wrapped.parameters(), lmcore.AdamW, **OPTIONS)
            optimizer.load_state_dict(saved)
        optimizer.zero_grad()
        lmcore.cross_entropy(wrapped(tokens[mine]), targets[mine]).backward()
        try:
            optimizer.step()
        except Exception as exc:  # the fault this guards against: the saved option took over
            return {"error": repr(exc)}
        groups = [*optimizer.param_groups, *optimizer.local_optimizer.param_groups]
        implementations.append({group["fused"] for group in groups})
    return {"params": [p.detach().cpu() for p in model.parameters()], "fused": implementations}


def _worker(rank: int, world_size: int, device_type: str) -> dict[str, Any]:
    device = torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")
    return {
        "reference": _reference(device),
        **{name: _sharded(name, rank, world_size, device) for name in WRAPPERS},
        "resumed": _resumed_from_a_fused_state(rank, world_size, device),
    }


@pytest.fixture(scope="module")
def gloo_results() -> list[dict[str, Any]]:
    return run_ranks(_worker, world_size=2, args=("cpu",))


def _assert_matches_reference(results: list[dict[str, Any]], name: str) -> None:
    for out in results:
        for actual, expected in zip(out[name], out["reference"], strict=True):
            torch.testing.assert_close(actual, expected, **TOLERANCE)


@pytest.mark.parametrize("name", WRAPPERS)
def test_sharded_lmcore_adamw_under_wrapper_equals_one_process(gloo_results, name: str):
    _assert_matches_reference(gloo_results, name)


def test_a_resumed_sharded_optimizer_keeps_its_own_implementation(gloo_results):
    # Before: the saved fused=True reached param_groups and was pushed into the inner AdamW at
    # every step, which then ran its fused kernel on float64 CPU parameters.
    for out in gloo_results:
        resumed = out["resumed"]
        assert "error" not in resumed, resumed.get("error")
        assert resumed["fused"] == [{False}] * STEPS
        for actual, expected in zip(resumed["params"], out["reference"], strict=True):
            torch.testing.assert_close(actual, expected, **TOLERANCE)


@pytest.mark.gpu
def test_nccl_sharded_lmcore_adamw_under_wrappers_equals_one_process():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    results = run_ranks(_worker, world_size=2, backend="nccl", args=("cuda",))
    for name in WRAPPERS:
        _assert_matches_reference(results, name)


def test_zero_and_ddp_speak_one_bucket_vocabulary():
    """zero keeps its own copy of the bucket size helpers (it installs without ddp): same default,
    same sizes in bytes, same refusals."""
    import zero.broadcast

    assert zero.DEFAULT_BUCKET_SIZE_MB == ddp.DEFAULT_BUCKET_SIZE_MB
    for size in (None, 0, 0.5, 25, ddp.DEFAULT_BUCKET_SIZE_MB):
        assert zero.broadcast.bucket_bytes(size) == ddp.bucket_bytes(size)
    for bad in (-1, float("inf"), float("nan")):
        with pytest.raises(ValueError):
            zero.broadcast.bucket_bytes(bad)
        with pytest.raises(ValueError):
            ddp.bucket_bytes(bad)

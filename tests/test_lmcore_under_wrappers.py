"""lmcore's checkpointed blocks and fused loss under every data-parallel wrapper: one step on two
gloo ranks gives the gradients of one process.

Each rank runs `model(x, targets=y)` (the fused LM-head loss, called inside the LM head's own
forward so that sharding wrappers gather its weight) on its half of the batch through blocks
checkpointed in segments of two. The reference is one process on the whole batch with the plain
model and the materialised loss. The ddp wrappers run in float64, so only the order of sums
differs; zero.FSDP and torch's FSDP2 keep float32 weights.
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
import zero

VOCAB, CONTEXT, D_MODEL, LAYERS, HEADS, D_FF = 37, 8, 16, 3, 2, 24
BATCH, SEQ = 4, 7  # each of 2 ranks gets 2 sequences
POLICY = "segments:2"

DDP_WRAPPERS: dict[str, Callable[[nn.Module], nn.Module]] = {
    "NaiveDDP": ddp.NaiveDDP,
    "FlatDDP": ddp.FlatDDP,
    "DDPIndividualParameters": ddp.DDPIndividualParameters,
    "DDPBucketed": lambda m: ddp.DDPBucketed(m, bucket_size_mb=0.005),
    "torch DDP": DistributedDataParallel,
}
SHARDED = ("zero.FSDP", "FSDP2")
TOLERANCE = {
    torch.float64: {"rtol": 1e-9, "atol": 1e-12},
    torch.float32: {"rtol": 1e-4, "atol": 1e-6},
}


def _model(dtype: torch.dtype, *, checkpointed: bool) -> lmcore.TransformerLM:
    torch.manual_seed(0)
    model = lmcore.TransformerLM(VOCAB, CONTEXT, D_MODEL, LAYERS, HEADS, D_FF).to(dtype)
    if checkpointed:
        lmcore.apply_activation_checkpointing(model, policy=POLICY)
    return model


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(VOCAB, (BATCH, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def _reference_grads(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    model = _model(dtype, checkpointed=False)
    x, y = _batch()
    lmcore.cross_entropy(model(x), y).backward()
    return {n: p.grad for n, p in model.named_parameters()}


def _ddp_grads(name: str, rank: int, world_size: int) -> dict[str, torch.Tensor]:
    model = _model(torch.float64, checkpointed=True)
    wrapped = DDP_WRAPPERS[name](model)
    x, y = (t.chunk(world_size)[rank] for t in _batch())
    wrapped(x, targets=y).backward()
    if hasattr(wrapped, "finish_gradient_synchronization"):
        wrapped.finish_gradient_synchronization()
    return {n: p.grad for n, p in model.named_parameters()}


def _zero_fsdp_grads(rank: int, world_size: int) -> dict[str, torch.Tensor]:
    """Full gradients read back from one SGD step of rate 1: before − after."""
    model = _model(torch.float32, checkpointed=True)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    fsdp = zero.FSDP(model, units=(lmcore.TransformerBlock,))
    x, y = (t.chunk(world_size)[rank] for t in _batch())
    fsdp(x, targets=y).backward()
    fsdp.finish_gradient_synchronization()
    torch.optim.SGD(fsdp.parameters(), lr=1.0).step()
    after = fsdp.gather_full_params()
    return {n: before[n] - after[n] for n in before}


def _fsdp2_grads(rank: int, world_size: int) -> dict[str, torch.Tensor]:
    from torch.distributed.fsdp import fully_shard

    model = _model(torch.float32, checkpointed=True)
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    x, y = (t.chunk(world_size)[rank] for t in _batch())
    model(x, targets=y).backward()
    return {n: p.grad.full_tensor() for n, p in model.named_parameters()}


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    results: dict[str, Any] = {name: _ddp_grads(name, rank, world_size) for name in DDP_WRAPPERS}
    results["zero.FSDP"] = _zero_fsdp_grads(rank, world_size)
    results["FSDP2"] = _fsdp2_grads(rank, world_size)
    return results


@pytest.fixture(scope="module")
def gloo_results() -> list[dict[str, Any]]:
    return run_ranks(_worker, world_size=2)


@pytest.mark.parametrize("name", [*DDP_WRAPPERS, *SHARDED])
def test_checkpointed_fused_loss_under_wrapper_equals_one_process(gloo_results, name):
    dtype = torch.float32 if name in SHARDED else torch.float64
    expected = _reference_grads(dtype)
    for result in gloo_results:
        got = result[name]
        assert got.keys() == expected.keys()
        for key, want in expected.items():
            torch.testing.assert_close(got[key], want, msg=key, **TOLERANCE[dtype])

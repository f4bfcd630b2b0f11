"""What FSDP holds through a training step, counted tensor by tensor on 2 gloo ranks.

`LiveTensors` (tests/support) counts the live storages op by op; `nccl_lifetimes` keeps an async
collective's tensors alive until its wait, as NCCL does on a GPU. The model is a bf16
`lmcore.TransformerLM` under `zero.apply_fsdp` with a unit per block, the embedding and the LM
head (bench-zero's bf16-storage row), sized so that one block's full weights outweigh every
other tensor of the step but the shards, their state and gradients summed: a storage of a
block's full bytes is then a full-size buffer of FSDP's (gathered weights, an all-gather's
output, a reduce-scatter's packed gradients), and counting them counts what FSDP holds.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from live_tensors import LiveTensors, nccl_lifetimes
from spawn_ranks import run_ranks

from lmcore import Embedding, LMHead, TransformerLM
from lmcore.model import TransformerBlock
from zero import apply_fsdp

# A block's weights (4·d² + 3·d·d_ff = 65,536 elements) are 8x the embedding's and 32x the
# largest activation (batch · seq · d_ff), so only FSDP's full-size buffers reach a block's bytes.
DIM, HIDDEN, LAYERS, HEADS, VOCAB = 64, 256, 3, 4, 128
BATCH, SEQ = 2, 8
BLOCK_BYTES = (4 * DIM * DIM + 3 * DIM * HIDDEN) * torch.bfloat16.itemsize


def _step_worker(rank: int, world_size: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = TransformerLM(VOCAB, SEQ, DIM, LAYERS, HEADS, HIDDEN, attention="naive").bfloat16()
    fsdp = apply_fsdp(model, units=(TransformerBlock, Embedding, LMHead))
    optimizer = torch.optim.AdamW(fsdp.parameters(), lr=1e-3, foreach=True)  # a GPU's default
    g = torch.Generator().manual_seed(rank)
    live = LiveTensors(large=BLOCK_BYTES)
    live.track([*fsdp.parameters(), *fsdp.buffers()])

    def step(phase: str) -> None:
        tokens = torch.randint(VOCAB, (BATCH, SEQ + 1), generator=g)
        live.phase = f"{phase} forward+backward"
        logits = fsdp(tokens[:, :-1])
        F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten()).backward()
        fsdp.finish_gradient_synchronization()
        live.phase = f"{phase} optimizer step"
        optimizer.step()
        optimizer.zero_grad()

    with nccl_lifetimes(), live:
        step("first")  # the optimizer's state is created here
        step("second")
    return {phase: peak.large_alive for phase, peak in live.peaks.items()}


@pytest.fixture(scope="module")
def held() -> dict[str, Any]:
    return run_ranks(_step_worker, world_size=2)[0]


def test_backward_holds_at_most_three_full_size_buffers(held):
    # The unit computing its backward, the next unit's all-gather output (prefetched), and one
    # reduce-scatter in flight; FSDP2 holds as many. Without freeing the unit's weights and the
    # finished reduction before packing, in-place all-gathers and allocating the gathered
    # weights only at copy-out, more were alive at once.
    large = held["second forward+backward"]
    assert len(large) <= 3, [(a.op, a.where, a.shape) for a in large]


@pytest.mark.parametrize("phase", ["first optimizer step", "second optimizer step"])
def test_the_optimizer_step_holds_no_full_size_buffer(held, phase):
    assert held.get(phase, []) == []

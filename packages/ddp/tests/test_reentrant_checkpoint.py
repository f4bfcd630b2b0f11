"""A parameter shared by two reentrant-checkpointed segments: every wrapper matches one process.

Reentrant checkpointing (`use_reentrant=True`) runs each segment's backward as a backward of
its own, so the shared parameter's gradient is accumulated (and its hook fires) once per
segment. One spawned run (gloo, 2 ranks) trains each wrapper a few steps; the tests compare the
gradients of every step with one process on the whole batch, and check that a backward too many
in a later step is still reported.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from spawn_ranks import run_ranks
from torch import nn
from torch.utils.checkpoint import checkpoint

from ddp import DDPBucketed, DDPIndividualParameters, FlatDDP, NaiveDDP

WRAPPERS = {
    "naive": NaiveDDP,
    "flat": FlatDDP,
    "individual": DDPIndividualParameters,
    "bucketed": DDPBucketed,
}
BATCH, DIM, STEPS = 3, 6, 3


class _Shared(nn.Module):
    """`shared` is applied in two checkpointed segments, each with a layer of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(DIM, DIM)
        self.first = nn.Linear(DIM, DIM)
        self.second = nn.Linear(DIM, 1)

    def _segment(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        return layer(torch.tanh(self.shared(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = checkpoint(self._segment, self.first, x, use_reentrant=True)
        return checkpoint(self._segment, self.second, x, use_reentrant=True)


def _net() -> _Shared:
    torch.manual_seed(0)
    return _Shared().double()


def _inputs(step: int, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(10 * step + rank)
    # requires_grad: reentrant checkpointing only back-propagates into a segment whose inputs
    # require gradients.
    return torch.randn(BATCH, DIM, generator=g, dtype=torch.float64).requires_grad_()


def _grads(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in module.named_parameters()}


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, cls in WRAPPERS.items():
        wrapper = cls(_net())
        steps = []
        for step in range(STEPS):
            wrapper.on_train_batch_start()
            wrapper.zero_grad()
            wrapper(_inputs(step, rank)).sum().backward()
            wrapper.finish_gradient_synchronization()
            steps.append(_grads(wrapper.module))
        out[name] = steps
        wrapper.on_train_batch_start()
        loss = wrapper(_inputs(STEPS, rank)).sum()
        loss.backward(retain_graph=True)
        try:
            loss.backward()
            out[name + "-twice"] = None
        except RuntimeError as e:
            out[name + "-twice"] = str(e)
        wrapper.finish_gradient_synchronization()
    return out


def _reference() -> list[dict[str, torch.Tensor]]:
    """One process: each step's gradient of the mean over the ranks' losses (no checkpointing
    needed for the numbers, but used anyway: the same graph)."""
    module, steps = _net(), []
    for step in range(STEPS):
        module.zero_grad()
        losses = [module(_inputs(step, rank)).sum() for rank in range(2)]
        (sum(losses) / 2).backward()
        steps.append(_grads(module))
    return steps


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return run_ranks(_worker, world_size=2)


@pytest.mark.parametrize("name", WRAPPERS)
def test_every_step_equals_one_process(ranks, name):
    reference = _reference()
    for rank in ranks:
        for got, want in zip(rank[name], reference, strict=True):
            for key in want:
                torch.testing.assert_close(got[key], want[key], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["individual", "bucketed"])
def test_a_backward_too_many_is_still_reported(ranks, name):
    for rank in ranks:
        assert "no_sync" in rank[name + "-twice"]

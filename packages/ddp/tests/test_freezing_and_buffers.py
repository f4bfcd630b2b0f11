"""Changes of `requires_grad` after wrapping fail loudly; buffers follow rank 0 on request.

One spawned run (gloo, 2 ranks) plays every scenario for every wrapper; the tests check one
behaviour each. Buffer synchronisation is compared with torch's own DistributedDataParallel.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest
import torch
from spawn_ranks import run_ranks
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp import DDPBucketed, DDPIndividualParameters, FlatDDP, NaiveDDP

WRAPPERS = {
    "naive": NaiveDDP,
    "flat": FlatDDP,
    "individual": DDPIndividualParameters,
    "bucketed": DDPBucketed,
}
BATCH, DIM = 4, 5
STEPS = 3


class _Net(nn.Module):
    """Two layers around a BatchNorm that updates its running statistics in training mode."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(DIM, DIM)
        self.norm = nn.BatchNorm1d(DIM)
        self.fc2 = nn.Linear(DIM, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.norm(self.fc1(x))))


def _net(seed: int) -> _Net:
    torch.manual_seed(seed)
    return _Net().double()


def _inputs(rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(BATCH, DIM, generator=g, dtype=torch.float64) * (rank + 1)


def _step_error(wrapper: nn.Module, rank: int, step: int) -> str | None:
    wrapper.on_train_batch_start()
    wrapper(_inputs(rank, step)).sum().backward()
    try:
        wrapper.finish_gradient_synchronization()
    except RuntimeError as e:
        return str(e)
    return None


def _requires_grad_changes(cls: type[nn.Module], rank: int) -> dict[str, Any]:
    """One good step, then a layer unfrozen; and, on a fresh wrapper, one frozen."""
    out: dict[str, Any] = {}
    module = _net(rank)
    module.fc2.requires_grad_(False)
    wrapper = cls(module)
    out["before_change"] = _step_error(wrapper, rank, 0)
    module.fc2.requires_grad_(True)
    module.zero_grad()
    out["unfrozen"] = _step_error(wrapper, rank, 1)
    module.zero_grad()
    del wrapper  # its hooks go with it
    rewrapped = cls(module)
    out["after_rewrap"] = _step_error(rewrapped, rank, 2)
    out["rewrapped_grad"] = module.fc2.weight.grad.clone()
    module.fc1.requires_grad_(False)
    module.zero_grad(set_to_none=True)
    out["frozen"] = _step_error(rewrapped, rank, 3)
    out["frozen_grad_is_none"] = module.fc1.weight.grad is None
    return out


def _buffers(cls: type[nn.Module], rank: int, broadcast: bool) -> dict[str, Any]:
    """Running statistics after a few training steps, ours and torch DDP's."""
    ours = cls(_net(rank), broadcast_buffers=broadcast)
    theirs = DistributedDataParallel(_net(rank), broadcast_buffers=broadcast)
    for model in (ours, theirs):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(STEPS):
            optimizer.zero_grad()
            model(_inputs(rank, step)).sum().backward()
            if model is ours:
                ours.finish_gradient_synchronization()
            optimizer.step()
    return {
        "ours": {k: v.clone() for k, v in ours.module.state_dict().items()},
        "torch": {k: v.clone() for k, v in theirs.module.state_dict().items()},
    }


def _worker(rank: int, world_size: int) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for name, cls in WRAPPERS.items():
        results[name] = {
            "requires_grad": _requires_grad_changes(cls, rank),
            "buffers_each_forward": _buffers(cls, rank, True),
            "buffers_at_construction": _buffers(cls, rank, False),
        }
    return results


@functools.cache
def _results() -> list[dict[str, dict[str, Any]]]:
    return run_ranks(_worker)


def _per_rank(name: str, scenario: str) -> list[Any]:
    return [copy.deepcopy(r[name][scenario]) for r in _results()]


@pytest.mark.parametrize("name", WRAPPERS)
def test_unfreezing_after_wrapping_raises_on_every_rank(name):
    for out in _per_rank(name, "requires_grad"):
        assert out["before_change"] is None
        message = out["unfrozen"]
        assert message is not None and "'fc2.weight' (unfrozen)" in message
        assert "Wrap the module again" in message


@pytest.mark.parametrize("name", WRAPPERS)
def test_freezing_after_wrapping_raises_and_leaves_no_zero_gradient(name):
    for out in _per_rank(name, "requires_grad"):
        message = out["frozen"]
        assert message is not None and "'fc1.weight' (frozen)" in message
        assert out["frozen_grad_is_none"]


@pytest.mark.parametrize("name", WRAPPERS)
def test_rewrapping_after_a_change_averages_the_new_parameters(name):
    outs = _per_rank(name, "requires_grad")
    assert all(out["after_rewrap"] is None for out in outs)
    torch.testing.assert_close(outs[0]["rewrapped_grad"], outs[1]["rewrapped_grad"])


@pytest.mark.parametrize("name", WRAPPERS)
@pytest.mark.parametrize("scenario", ["buffers_each_forward", "buffers_at_construction"])
def test_buffers_follow_torch_ddp(name, scenario):
    for out in _per_rank(name, scenario):
        assert out["ours"].keys() == out["torch"].keys()
        for key, expected in out["torch"].items():
            torch.testing.assert_close(out["ours"][key], expected, msg=key)

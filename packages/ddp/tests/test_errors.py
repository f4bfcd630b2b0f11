"""Bad input fails at construction with an error that says what to do, never with a hang."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist
from spawn_ranks import run_ranks
from torch import nn

from ddp import DDPBucketed, DDPIndividualParameters, FlatDDP, NaiveDDP

WRAPPERS = [NaiveDDP, FlatDDP, DDPIndividualParameters, DDPBucketed]


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_uninitialised_process_group_raises(wrapper):
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        wrapper(nn.Linear(3, 2))


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_non_module_raises_type_error(wrapper):
    with pytest.raises(TypeError, match=r"nn\.Module"):
        wrapper(torch.zeros(3))


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_non_float_grad_dtype_raises(wrapper):
    with pytest.raises(ValueError, match="grad_dtype"):
        wrapper(nn.Linear(3, 2), grad_dtype=torch.int32)


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_unknown_unused_grads_policy_raises(wrapper):
    with pytest.raises(ValueError, match="unused_grads"):
        wrapper(nn.Linear(3, 2), unused_grads="drop")


@pytest.mark.parametrize("size", [-1, float("nan"), float("inf")])
def test_bad_bucket_size_raises_value_error(size):
    with pytest.raises(ValueError, match="bucket_size_mb"):
        DDPBucketed(nn.Linear(3, 2), size)


def test_non_numeric_bucket_size_raises_type_error():
    with pytest.raises(TypeError, match="bucket_size_mb"):
        DDPBucketed(nn.Linear(3, 2), "25")


class _TwoLayers(nn.Module):
    def __init__(self, hidden: int, extra: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(5, hidden)
        self.fc2 = nn.Linear(hidden, 3)
        if extra:
            self.fc3 = nn.Linear(3, 3)


def _construction_error(wrapper: type[nn.Module], module: nn.Module) -> str | None:
    try:
        wrapper(module)
    except (RuntimeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def _errors_worker(rank: int, world_size: int) -> dict[str, list[str | None]]:
    split_device = _TwoLayers(4)
    split_device.fc2.to("meta")
    return {
        "shape": [_construction_error(w, _TwoLayers(4 + rank)) for w in WRAPPERS],
        "count": [_construction_error(w, _TwoLayers(4, extra=rank == 1)) for w in WRAPPERS],
        "frozen": [
            _construction_error(w, _TwoLayers(4).requires_grad_(rank == 0)) for w in WRAPPERS
        ],
        "devices": [_construction_error(w, split_device) for w in WRAPPERS],
    }


@functools.cache
def _errors() -> list[dict[str, list[str | None]]]:
    return run_ranks(_errors_worker)


def test_mismatched_shapes_raise_on_every_rank_naming_the_parameter():
    for rank_errors in _errors():
        for message in rank_errors["shape"]:
            assert message is not None
            assert message.startswith("RuntimeError")
            assert "rank 1" in message and "'fc1.weight'" in message and "(5, 5)" in message


def test_mismatched_parameter_count_raises_on_every_rank():
    for rank_errors in _errors():
        for message in rank_errors["count"]:
            assert message is not None and "rank 1" in message and "where rank 0 has" in message


def test_mismatched_requires_grad_raises_on_every_rank():
    for rank_errors in _errors():
        for message in rank_errors["frozen"]:
            assert message is not None and "requires_grad=False" in message


def test_module_on_several_devices_raises_value_error():
    for rank_errors in _errors():
        for message in rank_errors["devices"]:
            assert message is not None
            assert message.startswith("ValueError") and "module.to(device)" in message

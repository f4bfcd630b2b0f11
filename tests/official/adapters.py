"""The CS336 assignment 2 test suites' adapters, bound to this project's packages.

The course's tests (github.com/stanford-cs336/assignment2-systems) reach a student's code only
through `tests/adapters.py`: functions that return the student's classes or call into them. This
module is that file for this project, for both the spring-2025 suite (tag `spring2025`, version
1.0.5) and the spring-2026 suite (26.x, the repository's main branch): it defines the union of
both files' functions, so one copy serves either. `tests/official/run.py` copies a checkout's
tests into a scratch folder, puts this file in place of their `adapters.py` and runs them; the
course's tests are never copied into this repository.

| adapter | suite | binds to |
|---|---|---|
| `get_flashattention_autograd_function_pytorch` | 2025, 2026 | `fa2.FlashAttention2PyTorch` |
| `get_flashattention_autograd_function_triton` | 2025, 2026 | `fa2.FlashAttention2Triton` |
| `get_ddp_individual_parameters`, `get_ddp` | 2025, 2026 | `ddp.DDPIndividualParameters` |
| `get_ddp_bucketed` | 2025 | `ddp.DDPBucketed` |
| `*_on_after_backward` | 2025, 2026 | the wrapper's `finish_gradient_synchronization()` |
| `ddp_bucketed_on_train_batch_start` | 2025 | `DDPBucketed.on_train_batch_start()` |
| `get_fsdp`, `fsdp_gather_full_params` | 2026 | `zero.FSDP`, `FSDP.gather_full_params()` |
| `get_sharded_optimizer` | 2025, 2026 | `zero.ShardedOptimizer` |
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

import ddp
import fa2
import zero

# The adapter functions each suite's `tests/adapters.py` declares, in its order.
SUITES: dict[str, tuple[str, ...]] = {
    "spring2025": (
        "get_flashattention_autograd_function_pytorch",
        "get_flashattention_autograd_function_triton",
        "get_ddp_individual_parameters",
        "ddp_individual_parameters_on_after_backward",
        "get_ddp_bucketed",
        "ddp_bucketed_on_after_backward",
        "ddp_bucketed_on_train_batch_start",
        "get_sharded_optimizer",
    ),
    "spring2026": (
        "get_flashattention_autograd_function_pytorch",
        "get_flashattention_autograd_function_triton",
        "get_ddp",
        "ddp_on_after_backward",
        "get_fsdp",
        "fsdp_on_after_backward",
        "fsdp_gather_full_params",
        "get_sharded_optimizer",
    ),
}


def get_flashattention_autograd_function_pytorch() -> type:
    """The tiled FlashAttention-2 in plain PyTorch (an `autograd.Function` class)."""
    return fa2.FlashAttention2PyTorch


def get_flashattention_autograd_function_triton() -> type:
    """FlashAttention-2 with Triton kernels forward and backward (an `autograd.Function`)."""
    return fa2.FlashAttention2Triton


def get_ddp_individual_parameters(module: nn.Module) -> nn.Module:
    """DDP that all-reduces each gradient from its hook as soon as backward produces it."""
    return ddp.DDPIndividualParameters(module)


def ddp_individual_parameters_on_after_backward(
    ddp_model: nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """Wait for the gradients' all-reduces before the optimizer step."""
    ddp_model.finish_gradient_synchronization()


def get_ddp_bucketed(module: nn.Module, bucket_size_mb: float | None) -> nn.Module:
    """DDP that all-reduces buckets of gradients (None: one bucket) as each fills in backward."""
    return ddp.DDPBucketed(module, bucket_size_mb=bucket_size_mb)


def ddp_bucketed_on_after_backward(ddp_model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Wait for the buckets' all-reduces before the optimizer step."""
    ddp_model.finish_gradient_synchronization()


def ddp_bucketed_on_train_batch_start(
    ddp_model: nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """Reset the buckets' readiness at the start of a step."""
    ddp_model.on_train_batch_start()


def get_ddp(module: nn.Module) -> nn.Module:
    """The 2026 suite's DDP: overlapped, one all-reduce per gradient (as in 2025's first)."""
    return get_ddp_individual_parameters(module)


def ddp_on_after_backward(ddp_model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Wait for the gradients' all-reduces before the optimizer step."""
    ddp_model.finish_gradient_synchronization()


def get_fsdp(module: nn.Module, compute_dtype: torch.dtype | None = None) -> nn.Module:
    """Fully sharded data parallelism over every weight of two or more dimensions."""
    return zero.FSDP(module, compute_dtype=compute_dtype)


def fsdp_on_after_backward(fsdp_model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Wait for the reduce-scatters and average the replicated gradients."""
    fsdp_model.finish_gradient_synchronization()


def fsdp_gather_full_params(fsdp_model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter full and fp32 under the wrapped module's own names (a collective)."""
    return fsdp_model.gather_full_params()


def get_sharded_optimizer(
    params: Iterable[Any], optimizer_cls: type[torch.optim.Optimizer], **kwargs: Any
) -> torch.optim.Optimizer:
    """ZeRO-1: `optimizer_cls` over this rank's shard of `params`, results broadcast."""
    return zero.ShardedOptimizer(params, optimizer_cls, **kwargs)

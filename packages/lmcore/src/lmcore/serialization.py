"""Training checkpoints: model weights, optimizer state and the iteration, in one file."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import IO, Any

import torch
from torch import nn

__all__ = ["load_checkpoint", "save_checkpoint"]

Destination = str | os.PathLike[str] | IO[bytes]


def _unwrap(model: nn.Module) -> nn.Module:
    # torch.compile wraps the module and prefixes every state-dict key with "_orig_mod.";
    # checkpoints always hold the plain module's keys so compiled and eager runs share them.
    return getattr(model, "_orig_mod", model)


def save_checkpoint(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    iteration: int,
    path: Destination,
    *,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Write the model's and optimizer's state dicts and the iteration to `path` (`torch.save`).

    Args:
        model: the model (a `torch.compile`d model is saved under its original keys).
        optimizer: its optimizer, or None to save the weights alone.
        iteration: the number of completed training steps.
        path: a file path or a writable binary file object.
        extra: anything else a training loop needs to resume (its configuration, random number
            generator states, data position), stored under the key `"extra"`; it must load with
            `torch.load(..., weights_only=True)`: tensors, numbers, strings, lists and dicts.

    Raises:
        ValueError: `iteration` is not a non-negative integer.
    """
    if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
        raise ValueError(f"iteration must be a non-negative integer, got {iteration!r}")
    torch.save(
        {
            "model": _unwrap(model).state_dict(),
            "optimizer": None if optimizer is None else optimizer.state_dict(),
            "iteration": iteration,
            "extra": dict(extra or {}),
        },
        path,
    )


def load_checkpoint(
    path: Destination | Mapping[str, Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
) -> int:
    """Restore a checkpoint written by `save_checkpoint` into `model` (and `optimizer`).

    Tensors are read onto the CPU and copied into the model's and optimizer's own devices, so a
    checkpoint saved on a GPU loads on a CPU-only machine and vice versa. Training resumed from
    the checkpoint continues exactly as the uninterrupted run would have.

    Args:
        path: a file path or a readable binary file object, or a checkpoint already read with
            `torch.load` (to look at its `"extra"` entry first without reading the file twice).
        model: a model of the same architecture as the saved one.
        optimizer: an optimizer of the same type over the same parameters, or None to restore
            the weights only.

    Returns:
        The saved iteration.

    Raises:
        ValueError: an optimizer is given but the checkpoint has no optimizer state.
        RuntimeError: the weights do not fit the model (from `load_state_dict`).

    Example::

        >>> start = load_checkpoint("ckpt.pt", model, optimizer)
        >>> for it in range(start, num_steps): ...
    """
    if isinstance(path, Mapping):
        checkpoint = path
    else:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    _unwrap(model).load_state_dict(checkpoint["model"])
    if optimizer is not None:
        if checkpoint["optimizer"] is None:
            raise ValueError("the checkpoint holds no optimizer state; pass optimizer=None")
        optimizer.load_state_dict(checkpoint["optimizer"])
    return checkpoint["iteration"]

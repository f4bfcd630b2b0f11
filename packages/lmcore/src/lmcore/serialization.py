"""Training checkpoints: model weights, its configuration, optimizer state and the iteration.

`load_checkpoint` checks everything it can before it changes anything: the model's
configuration against the one saved (so weights of a 2-head model do not load silently into a
4-head model of the same shapes), every weight's name and shape, and the optimizer's parameter
groups. A checkpoint that does not fit raises and leaves the model and optimizer as they were.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import warnings
from collections.abc import Mapping
from typing import IO, Any

import torch
from torch import nn

from lmcore.config import ModelConfig

__all__ = ["load_checkpoint", "save_checkpoint"]

Destination = str | os.PathLike[str] | IO[bytes]

# Configuration fields that do not change the function the weights compute: RoPE tables of
# another length agree on the positions both have, and every attention backend computes the
# same attention. Weights load across them; every other field must match.
_COMPATIBLE_FIELDS = ("context_length", "attention")


def _unwrap(model: nn.Module) -> nn.Module:
    # torch.compile wraps the module and prefixes every state-dict key with "_orig_mod.";
    # checkpoints always hold the plain module's keys so compiled and eager runs share them.
    return getattr(model, "_orig_mod", model)


def _model_config(model: nn.Module) -> ModelConfig | None:
    """The `ModelConfig` of `model`, looking through torch.compile and wrappers' `.module`."""
    seen = set()
    while id(model) not in seen:
        seen.add(id(model))
        config = getattr(model, "config", None)
        if isinstance(config, ModelConfig):
            return config
        # (an explicit None test: an empty nn.Sequential is falsy, and still the model)
        inner = getattr(model, "_orig_mod", None)
        if inner is None:
            inner = getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            return None
        model = inner
    return None


def _check_config(saved: Mapping[str, Any] | None, model: nn.Module, source: str) -> None:
    config = _model_config(model)
    if saved is None or config is None:
        return
    ours = dataclasses.asdict(config)
    differences = [
        f"{name} {saved.get(name)!r} (checkpoint) vs {value!r} (model)"
        for name, value in ours.items()
        if name not in _COMPATIBLE_FIELDS and saved.get(name) != value
    ]
    if differences:
        raise ValueError(
            f"{source} was saved from a model of another configuration: "
            f"{'; '.join(differences)}. Build the model from the saved configuration "
            "(ModelConfig(**checkpoint['model_config'])) to load these weights"
        )


def _check_model_state(model: nn.Module, state: Mapping[str, Any], source: str) -> None:
    """Raise unless `model.load_state_dict(state)` will copy every tensor without an error.

    A module with its own `load_state_dict` (a sharding wrapper such as `zero.FSDP`) checks its
    input before copying any of it and is left to do so; reading its `state_dict()` here would
    gather its weights.
    """
    if type(model).load_state_dict is not nn.Module.load_state_dict:
        return
    own = model.state_dict(keep_vars=True)
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    wrong = [
        f"{k} {tuple(state[k].shape)} (checkpoint) vs {tuple(t.shape)} (model)"
        for k, t in own.items()
        if k in state and isinstance(state[k], torch.Tensor) and state[k].shape != t.shape
    ]
    if missing or unexpected or wrong:
        parts = [
            f"{what}: {', '.join(items[:5])}{' …' if len(items) > 5 else ''}"
            for what, items in (
                ("missing weights", missing),
                ("unexpected weights", unexpected),
                ("shapes differ", wrong),
            )
            if items
        ]
        raise ValueError(
            f"{source} does not fit the model ({'; '.join(parts)}); nothing was loaded"
        )


def _check_optimizer_state(optimizer: torch.optim.Optimizer, state: Any, source: str) -> None:
    """Raise unless `optimizer.load_state_dict(state)` will load without an error: the groups'
    sizes here, and whatever else an optimizer with its own `check_state_dict` checks (e.g.
    `lmcore.AdamW`, which refuses the state of another kind of optimizer)."""
    if state is None:
        raise ValueError(f"{source} holds no optimizer state; pass optimizer=None")
    if not isinstance(state, Mapping) or not {"state", "param_groups"} <= state.keys():
        raise ValueError(f"{source} has no optimizer state dict ('state', 'param_groups')")
    saved = [len(group["params"]) for group in state["param_groups"]]
    ours = [len(group["params"]) for group in optimizer.param_groups]
    if saved != ours:
        raise ValueError(
            f"{source} holds optimizer state for parameter groups of sizes {saved}, the "
            f"optimizer has groups of sizes {ours}; build it over the same parameter groups. "
            "Nothing was loaded"
        )
    check = getattr(optimizer, "check_state_dict", None)
    if check is not None:
        try:
            check(state)
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}. Nothing was loaded") from None


def _read(path: Destination, source: str) -> Any:
    """`torch.load` of `path` with `weights_only=True` (unpickling nothing but tensors,
    numbers, strings and containers), onto the CPU.

    Raises:
        ValueError: the file holds other objects. torch's own message would advise
            `weights_only=False`, which runs whatever code the file carries; this one names the
            object and the safe way to allow it.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        message = str(exc)
        if "Weights only load failed" not in message:
            raise
        found = [
            line.strip().removeprefix("WeightsUnpickler error:").strip()
            for line in message.splitlines()
            if "WeightsUnpickler error" in line
        ]
        raise ValueError(
            f"{source} holds an object that is not a tensor, number, string or container of "
            f"them ({found[0] if found else 'see torch.load'}). lmcore loads checkpoints with "
            "torch.load(weights_only=True), which never runs code a file carries; "
            "save_checkpoint writes such objects only where `extra` held them, so save plain "
            "data there. To load this file, and only if you trust it, allow the object's type "
            "with torch.serialization.add_safe_globals([...]) first"
        ) from None


def save_checkpoint(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    iteration: int,
    path: Destination,
    *,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Write the model's state dict and configuration, the optimizer's state dict and the
    iteration to `path` (`torch.save`).

    The configuration (`model.config`, a `ModelConfig`, found through `torch.compile` and any
    wrapper's `.module`) is stored as a dict under `"model_config"` (None for a model without
    one), so that `load_checkpoint` can refuse weights of another architecture.

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
    config = _model_config(model)
    torch.save(
        {
            "model": _unwrap(model).state_dict(),
            "model_config": None if config is None else dataclasses.asdict(config),
            "optimizer": None if optimizer is None else optimizer.state_dict(),
            "iteration": iteration,
            "extra": {} if extra is None else dict(extra),
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

    Everything is checked before anything is copied, so a checkpoint that does not fit raises
    and leaves the model and optimizer untouched: the saved configuration against the model's
    (every field but `context_length` and `attention`, which do not change what the weights
    compute), every weight's name and shape, and the optimizer's parameter groups. A checkpoint
    written before configurations were saved loads by names and shapes alone, with a warning.

    Args:
        path: a file path or a readable binary file object, or a checkpoint already read with
            `torch.load` (to look at its `"extra"` entry first without reading the file twice).
        model: a model of the same architecture as the saved one.
        optimizer: an optimizer of the same type over the same parameters, or None to restore
            the weights only.

    Returns:
        The saved iteration.

    Raises:
        ValueError: the checkpoint's model configuration differs from the model's (the message
            names each differing field), a weight is missing, unexpected or of another shape,
            an optimizer is given but the checkpoint has no optimizer state, one for other
            parameter groups or one the optimizer's own `check_state_dict` refuses
            (`lmcore.AdamW`: the state of another kind of optimizer), the checkpoint lacks its
            entries, or the file holds objects other than tensors, numbers, strings and
            containers of them (the message names the object and the safe way to allow it).

    Warns:
        UserWarning: the checkpoint carries no model configuration (written by an older
            lmcore); its weights are checked by names and shapes only.

    Example::

        >>> start = load_checkpoint("ckpt.pt", model, optimizer)
        >>> for it in range(start, num_steps): ...
    """
    if isinstance(path, Mapping):
        checkpoint, source = path, "the checkpoint"
    else:
        source = f"checkpoint {path!r}" if isinstance(path, str | os.PathLike) else "checkpoint"
        checkpoint = _read(path, source)
    if not isinstance(checkpoint, Mapping) or not {"model", "iteration"} <= checkpoint.keys():
        raise ValueError(
            f"{source} is not an lmcore checkpoint (no 'model' and 'iteration' entries)"
        )
    if "model_config" in checkpoint:
        _check_config(checkpoint["model_config"], model, source)
    else:
        warnings.warn(
            f"{source} carries no model configuration (written by an older lmcore): its "
            "weights are checked by names and shapes only, not against the model's "
            "configuration",
            UserWarning,
            stacklevel=2,
        )
    target = _unwrap(model)
    _check_model_state(target, checkpoint["model"], source)
    if optimizer is not None:
        _check_optimizer_state(optimizer, checkpoint.get("optimizer"), source)
    target.load_state_dict(checkpoint["model"])
    if optimizer is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
    return checkpoint["iteration"]

"""The training step every training tool runs: bench-train's, bench-ddp's and bench-zero's
steps are this one, so that their numbers measure the same work.

- `train_step` (and its first half, `forward_backward`): one optimizer step of next-token
  training over one or more micro-batches, through any model or data-parallel wrapper, with the
  loss scaled where the precision needs it (fp16: `bench.core.loss_scale.LossScaler`);
  `clip_grad_norm`, its clipping, which also handles gradients sharded over the ranks (FSDP).
- `build_lm`: the model on a device, materialised from the meta device on a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

import lmcore
from bench.core.model_runtime import next_token_loss

if TYPE_CHECKING:
    from bench.core.loss_scale import LossScaler

__all__ = ["build_lm", "clip_grad_norm", "forward_backward", "train_step"]


def build_lm(
    model_config: lmcore.ModelConfig, device: torch.device, *, seed: int
) -> lmcore.TransformerLM:
    """The `lmcore.TransformerLM` of `model_config` on `device`, initialised from `seed`.

    On a GPU the model is built on the meta device and materialised there, which skips the slow
    CPU initialisation of an XL model.
    """
    torch.manual_seed(seed)
    if device.type == "cpu":
        return lmcore.TransformerLM.from_config(model_config)
    with torch.device("meta"):
        model = lmcore.TransformerLM.from_config(model_config)
    model = model.to_empty(device=device)
    model.reset_parameters()
    return model


def forward_backward(
    model: nn.Module,
    micro_batches: Sequence[torch.Tensor],
    *,
    autocast_dtype: torch.dtype | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = lmcore.cross_entropy,
    fused_loss: bool = False,
    loss_scaler: LossScaler | None = None,
    eot_id: int | None = None,
) -> torch.Tensor:
    """Forward and backward of next-token cross-entropy over `micro_batches`; the mean loss.

    Each micro-batch is a token tensor `(batch, seq + 1)`: inputs `[:, :-1]`, targets `[:, 1:]`.
    Each loss is divided by the number of micro-batches, so the accumulated gradients are those
    of their mean. A data-parallel wrapper (ours or torch's) communicates once: every backward
    but the last runs under its `no_sync()`; ours get `on_train_batch_start()` first and
    `finish_gradient_synchronization()` after the last backward (as does any wrapper that has
    them, e.g. `zero.FSDP`).

    Args:
        model: an `lmcore.TransformerLM`, or a wrapper around one.
        micro_batches: one or more token tensors.
        autocast_dtype: run forward and loss under `torch.autocast` in this dtype (e.g.
            `torch.bfloat16`); None runs in the parameters' dtype.
        loss_fn: `(logits, targets) -> mean loss`; `lmcore.cross_entropy` (or a compiled one).
        fused_loss: the model's own fused LM head + loss instead, `model(inputs,
            targets=targets)`, which never holds the logits (`loss_fn` is then not used).
        loss_scaler: backward from each loss times its scale (fp16); the gradients are left
            scaled, for `train_step` to unscale. None: backward from the loss itself.
        eot_id: each row holds documents that start at this end-of-text id, attended apart
            (`next_token_loss`); None: plain rows.

    Returns:
        The mean loss over the micro-batches (unscaled), detached: a 0-d tensor in at least
        fp32, left on the device (no host synchronisation).

    Raises:
        ValueError: no micro-batch.
    """
    if not micro_batches:
        raise ValueError("forward_backward needs at least one micro-batch")
    if hasattr(model, "on_train_batch_start"):
        model.on_train_batch_start()
    no_sync = getattr(model, "no_sync", contextlib.nullcontext)
    device_type = micro_batches[0].device.type
    losses = []
    for index, tokens in enumerate(micro_batches):
        last = index == len(micro_batches) - 1
        with contextlib.nullcontext() if last else no_sync():
            with torch.autocast(
                device_type, dtype=autocast_dtype, enabled=autocast_dtype is not None
            ):
                loss = next_token_loss(
                    model, tokens[:, :-1], tokens[:, 1:], fused=fused_loss, loss_fn=loss_fn,
                    eot_id=eot_id,
                )  # fmt: skip
                loss = loss / len(micro_batches)
            (loss if loss_scaler is None else loss_scaler.scale(loss)).backward()
        losses.append(loss.detach())
    if hasattr(model, "finish_gradient_synchronization"):
        model.finish_gradient_synchronization()
    # (num_micro,) -> (): summed in at least fp32 (a bf16 autocast loss too)
    return torch.stack(losses).sum(dtype=torch.promote_types(losses[0].dtype, torch.float32))


# Added to the norm before dividing, as lmcore.clip_grad_norm and torch do.
_CLIP_EPS = 1e-6


@torch.no_grad()
def clip_grad_norm(
    params: Sequence[torch.Tensor], max_norm: float, *, sharded: Collection[torch.Tensor] = ()
) -> torch.Tensor:
    """Clip the gradients of `params` to a total L2 norm of `max_norm`; return the norm before.

    Without `sharded` this is `lmcore.clip_grad_norm`. The gradients of the `sharded` parameters
    are instead this rank's shards of gradients spread over the ranks of the default process
    group (`zero.FSDP`'s weights of two or more dimensions), and the others are replicated
    (equal on every rank): the squared norm is the shards' squares summed over the ranks (one
    all-reduce, every rank must call) plus the replicated gradients' squares counted once, so
    every rank scales by the norm one process would compute for the whole model.
    """
    if not sharded:
        return lmcore.clip_grad_norm(params, max_norm)
    ids = {id(p) for p in sharded}
    grads = [p.grad for p in params if p.grad is not None]
    shards = [p.grad for p in params if p.grad is not None and id(p) in ids]
    replicated = [p.grad for p in params if p.grad is not None and id(p) not in ids]
    device = grads[0].device
    squares = torch.zeros(2, device=device)  # (shards summed over ranks, replicated)
    for index, group in enumerate((shards, replicated)):
        if group:
            squares[index] = torch.stack(torch._foreach_norm(group)).square().sum()
    shard_squares = squares[:1].clone()
    dist.all_reduce(shard_squares)
    total = (shard_squares[0] + squares[1]).sqrt()
    scale = (max_norm / (total + _CLIP_EPS)).clamp(max=1.0)
    torch._foreach_mul_(grads, scale)
    return total


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[torch.Tensor],
    *,
    autocast_dtype: torch.dtype | None = None,
    max_grad_norm: float | None = None,
    sharded_params: Collection[torch.Tensor] = (),
    set_to_none: bool = True,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = lmcore.cross_entropy,
    fused_loss: bool = False,
    loss_scaler: LossScaler | None = None,
    eot_id: int | None = None,
) -> torch.Tensor:
    """One training step: `forward_backward`, optional clipping, the optimizer step, zero_grad.

    The one step bench-ddp, bench-zero and bench-train run, so that their numbers measure the
    same work.

    Args:
        model: an `lmcore.TransformerLM`, or a wrapper around one.
        optimizer: steps `model`'s parameters (a torch optimizer, `zero.ShardedOptimizer`, ...).
        micro_batches: one or more token tensors `(batch, seq + 1)` (see `forward_backward`).
        autocast_dtype: autocast dtype of forward and loss; None for none.
        max_grad_norm: clip the gradients' total norm to this (`clip_grad_norm`, after
            synchronisation); None: no clipping.
        sharded_params: the parameters whose gradients are shards spread over the ranks
            (`zero.FSDP`'s weights of two or more dimensions), for the clipping norm.
        set_to_none: `optimizer.zero_grad(set_to_none=...)` after the step; False keeps the
            gradient tensors allocated from step to step.
        loss_fn, eot_id: the loss of logits and targets, packed documents (`forward_backward`).
        loss_scaler: scale the loss (fp16): the gradients are unscaled after synchronisation,
            before clipping, and the optimizer step is skipped (on every rank) where one
            overflowed; the scaler then halves its scale or grows it and counts the skip.

    Returns:
        The step's mean loss, detached (see `forward_backward`).
    """
    loss = forward_backward(
        model, micro_batches, autocast_dtype=autocast_dtype, loss_fn=loss_fn,
        fused_loss=fused_loss, loss_scaler=loss_scaler, eot_id=eot_id,
    )  # fmt: skip
    if loss_scaler is not None:
        loss_scaler.unscale_(optimizer)
    if max_grad_norm is not None:
        clip_grad_norm(list(model.parameters()), max_grad_norm, sharded=sharded_params)
    if loss_scaler is None:
        optimizer.step()
    else:
        loss_scaler.step(optimizer)
        loss_scaler.update()
    optimizer.zero_grad(set_to_none=set_to_none)
    return loss

"""`--baseline torch`: the training step written with torch's own pieces only, as a user would.

The model is bench-step's torch-native one (`bench.core.torch_native.torch_native_model`: each
block compiled, `F.cross_entropy` over checkpointed chunks of tokens, so that no chunk's logits
outlive it), with SDPA attention, `torch.nn.utils.clip_grad_norm_` and
`torch.optim.AdamW(fused=True)` (`bench.train.choices.BASELINES` sets those options): the
strongest plain-PyTorch set-up a user could pick, the same bench-step sets beside its rows, to
compare speed with side by side. Deliberately independent of `bench.core.step.train_step`: the
reference the project's step is compared with, not a second training step of the project.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from bench.core.loss_scale import LossScaler

__all__ = ["torch_native_step"]


def torch_native_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[torch.Tensor],
    *,
    autocast_dtype: torch.dtype | None = None,
    max_grad_norm: float | None = None,
    scaler: LossScaler | torch.amp.GradScaler | None = None,
) -> torch.Tensor:
    """One optimizer step over `micro_batches` (token tensors `(batch, seq + 1)`); the mean loss.

    Args:
        model: a model whose `model(inputs, targets)` is the mean next-token loss
            (`bench.core.torch_native.TorchNativeLM`), or torch's DistributedDataParallel around
            one.
        optimizer: its optimizer.
        micro_batches: inputs `[:, :-1]`, next-token targets `[:, 1:]`.
        autocast_dtype: autocast dtype of forward and loss; None for none.
        max_grad_norm: clip the gradients' total norm to this; None: no clipping.
        scaler: scale the loss as torch's AMP recipe does (fp16): scale, backward, `unscale_`,
            clip, `step`, `update`. None: no scaling.

    Returns:
        The mean loss over the micro-batches, detached, on the device.
    """
    no_sync = getattr(model, "no_sync", contextlib.nullcontext)
    total = torch.zeros((), device=micro_batches[0].device)
    for index, tokens in enumerate(micro_batches):
        last = index == len(micro_batches) - 1
        with contextlib.nullcontext() if last else no_sync():
            with torch.autocast(
                tokens.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None
            ):
                loss = model(tokens[:, :-1], tokens[:, 1:]) / len(micro_batches)
            (loss if scaler is None else scaler.scale(loss)).backward()
        total += loss.detach()
    if scaler is not None:
        scaler.unscale_(optimizer)
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm, foreach=True)
    if scaler is None:
        optimizer.step()
    else:
        scaler.step(optimizer)
        scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return total

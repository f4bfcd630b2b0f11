"""What the shared model options (`bench.core.model_options`) select, built at run time: the
optimizer (`--optimizer`: `optimizer_class`, `build_optimizer`) and the next-token loss
(`--loss`: `loss_function`, `next_token_loss`). Imports torch; the options themselves do not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

import lmcore
from bench.core.model_options import DEFAULT_COMPILE_BACKEND, OPTIMIZERS

__all__ = ["LossFn", "build_optimizer", "loss_function", "next_token_loss", "optimizer_class"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def optimizer_class(
    name: str, *, param_dtype: torch.dtype | None = None
) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """The class of the optimizer `name` (of `OPTIMIZERS`) and the options that select its path.

    All three are AdamW and load each other's state dicts, and keep their moments in the
    parameters' dtype: lmcore's fused kernel keeps float32 moments unless told otherwise, so
    for bf16 parameters (`param_dtype`) it is given `moment_dtype=torch.bfloat16`, the
    precision torch's AdamW keeps them in (half the bytes: 31 GB rather than 62 at 8B).

    Raises:
        ValueError: an unknown name.
    """
    if name == "lmcore":
        return lmcore.AdamW, {}
    if name == "lmcore-fused":
        bf16 = param_dtype == torch.bfloat16
        return lmcore.AdamW, {"fused": True, **({"moment_dtype": param_dtype} if bf16 else {})}
    if name == "torch-fused":
        return torch.optim.AdamW, {"fused": True}
    raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")


def build_optimizer(name: str, params: Iterable[Any], **options: Any) -> torch.optim.Optimizer:
    """`name`'s optimizer over `params` (tensors or groups) with `options` (lr, betas, ...),
    its moments in the parameters' dtype (`optimizer_class`).

    Raises:
        ValueError: an unknown name, or parameters its path cannot update (lmcore-fused needs
            CUDA tensors, or Triton's interpreter on a CPU).
    """
    params = list(params)
    first = params[0]["params"][0] if isinstance(params[0], dict) else params[0]
    cls, path = optimizer_class(name, param_dtype=first.dtype)
    return cls(params, **options, **path)


def loss_function(*, compile: bool, backend: str = DEFAULT_COMPILE_BACKEND) -> LossFn:
    """The materialised next-token loss `(logits, targets) -> mean`: `lmcore.cross_entropy`,
    through `torch.compile(backend=backend)` when `compile` (its max, exp, sum and gather fuse
    into few kernels)."""
    if not compile:
        return lmcore.cross_entropy
    return torch.compile(lmcore.cross_entropy, backend=backend)


def next_token_loss(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    fused: bool,
    loss_fn: LossFn = lmcore.cross_entropy,
    eot_id: int | None = None,
) -> torch.Tensor:
    """The mean next-token cross-entropy of `model` on `inputs` `(batch, seq)` against `targets`.

    Args:
        model: an `lmcore.TransformerLM`, or a wrapper that forwards keyword arguments.
        inputs: token ids `(batch, seq)`.
        targets: next-token ids `(batch, seq)`.
        fused: the model's own fused LM head + loss, `model(inputs, targets=targets)`, which
            never holds the logits; else `loss_fn(model(inputs), targets)`.
        loss_fn: the materialised loss of logits and targets.
        eot_id: the rows are documents packed after one another, each starting at this
            end-of-text id: attention stays in each (`lmcore.Documents`); None: plain rows.
    """
    packed = {}
    if eot_id is not None:
        packed["documents"] = lmcore.Documents.from_tokens(inputs, eot_id=eot_id)
    if fused:
        return model(inputs, targets=targets, **packed)
    return loss_fn(model(inputs, **packed), targets)  # logits (batch, seq, vocab)

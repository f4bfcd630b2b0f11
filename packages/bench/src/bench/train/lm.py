"""The model, its loss and its optimizer, as lmcore provides them: the one place where bench-train
turns its model and optimizer options into objects.

A new lmcore option reaches the trainer here and nowhere else: an option of the model's shape goes
into `TrainConfig.model_config`; one applied to a built model (activation checkpointing) into
`build_model`; another optimizer into `optimizer_class`; another loss into
`bench.core.model_runtime` (the fused LM head + loss is the model's own: `--loss fused` makes the
step call `model(inputs, targets=targets)`), which builds it for the tools too. The vocabulary of
these options (`OPTIMIZERS`, `LOSSES`) is the tools' shared one (`bench.core.model_options`, which
`TrainConfig` offers without importing torch), and so is what each name builds
(`bench.core.model_runtime`). Parallelism is applied afterwards (`bench.train.parallel`,
torchtitan's order: the model's own options, then compile, then the wrappers), so the model it
receives is complete.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import lmcore
from bench.core import model_options, model_runtime
from bench.core.step import build_lm

__all__ = [
    "BETAS",
    "build_model",
    "decayed_names",
    "optimizer_class",
    "param_groups",
]

# AdamW's moment decay rates: GPT-3's (Brown et al., 2020), which nanoGPT and the handout use.
BETAS = (0.9, 0.95)


def build_model(
    model_config: lmcore.ModelConfig,
    device: torch.device,
    *,
    seed: int,
    activation_checkpointing: str = model_options.DEFAULT_CHECKPOINTING,
) -> lmcore.TransformerLM:
    """The `lmcore.TransformerLM` of `model_config` on `device`, initialised from `seed`, with
    the options applied to a built model (`--activation-checkpointing`), unwrapped."""
    model = build_lm(model_config, device, seed=seed)
    return lmcore.apply_activation_checkpointing(model, policy=activation_checkpointing)


def decayed_names(model: nn.Module) -> set[str]:
    """The parameters weight decay applies to: the matrices (linear and embedding weights).

    Taken before wrapping: a sharding wrapper replaces them by flat shards under the same names.
    """
    return {name for name, p in model.named_parameters() if p.dim() >= 2}


def param_groups(model: nn.Module, decayed: set[str], weight_decay: float) -> list[dict[str, Any]]:
    """Two groups of `model`'s parameters: the `decayed` ones with `weight_decay`, the rest
    (norm gains) without."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [
        {"params": [p for n, p in named if n in decayed], "weight_decay": weight_decay},
        {"params": [p for n, p in named if n not in decayed], "weight_decay": 0.0},
    ]


def optimizer_class(
    name: str, *, lr: float, param_dtype: torch.dtype | None = None
) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """The optimizer `name` (of `bench.core.model_options.OPTIMIZERS`) and its options (weight
    decay is per group), its moments in `param_dtype`, the parameters' dtype.

    All three load each other's state dicts, so a resumed run may change `--optimizer`.
    """
    cls, path = model_runtime.optimizer_class(name, param_dtype=param_dtype)
    return cls, {"lr": lr, "betas": BETAS, **path}

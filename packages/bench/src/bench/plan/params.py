"""The parameters of an `lmcore.TransformerLM`, read off the model, with their parallel roles.

`model_parameters(config)` builds the model on the meta device (no memory, no initialisation) and
lists every parameter: its name, shape, the block it belongs to (None outside the blocks) and its
role under Megatron-style tensor parallelism:

- `column`: output dimension split across the TP ranks (q, k, v projections; SwiGLU's w1, w3);
- `row`: input dimension split (the attention output projection; SwiGLU's w2);
- `vocab`: the vocabulary dimension split (token embedding, LM head);
- `replicated`: every rank keeps it whole (RMSNorm gains).

Reading the model keeps one source of truth: a parameter added to lmcore appears here, and one
whose role is unknown raises instead of being silently mis-sharded. Counts agree with
`lmcore.count_parameters` (a test checks).

Example::

    >>> params = model_parameters(lmcore.model_config("small", context_length=256))
    >>> sum(p.numel for p in params) == lmcore.count_parameters(...)
    True
    >>> [p.role for p in params if p.block == 0][:3]
    ['replicated', 'column', 'column']
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import lmcore

if TYPE_CHECKING:
    import torch

__all__ = ["ROLES", "ParamSpec", "model_parameters"]

ROLES = ("column", "row", "vocab", "replicated")

# lmcore's layer attribute names -> the tensor-parallel role of their parameters.
_ROLE_OF = {
    "q_proj": "column",
    "k_proj": "column",
    "v_proj": "column",
    "output_proj": "row",
    "w1": "column",
    "w3": "column",
    "w2": "row",
    "token_embeddings": "vocab",
    "lm_head": "vocab",
    "ln1": "replicated",
    "ln2": "replicated",
    "ln_final": "replicated",
}
_BLOCK = re.compile(r"^layers\.(\d+)\.")


@dataclass(frozen=True)
class ParamSpec:
    """One parameter of the model.

    Attributes:
        name: its name in `model.named_parameters()`.
        shape: its full shape.
        block: index of the `TransformerBlock` holding it; None for embedding, final norm, head.
        role: one of `ROLES`.
        kind: the layer holding it: `"linear"` (used in a matmul: what autocast casts and the
            FLOP count's `N_matmul` counts), `"embedding"` (looked up) or `"norm"`.
    """

    name: str
    shape: tuple[int, ...]
    block: int | None
    role: str
    kind: str

    @property
    def numel(self) -> int:
        """Elements of the whole parameter."""
        return math.prod(self.shape)

    def tp_numel(self, tp: int) -> int:
        """Elements on one of `tp` tensor-parallel ranks (the split dimension rounded up)."""
        if self.role == "replicated" or tp == 1:
            return self.numel
        # nn.Linear and nn.Embedding weights are (out, in) / (vocab, d): column and vocab split
        # dimension 0, row splits dimension 1.
        dim = 1 if self.role == "row" else 0
        split = -(-self.shape[dim] // tp)
        return self.numel // self.shape[dim] * split


def _describe(module_name: str, module: torch.nn.Module) -> tuple[str, str]:
    """(role, kind) of the parameters of one lmcore layer."""
    attribute = module_name.rsplit(".", 1)[-1]
    kinds = ((lmcore.Linear, "linear"), (lmcore.Embedding, "embedding"), (lmcore.RMSNorm, "norm"))
    kind = next((k for cls, k in kinds if isinstance(module, cls)), None)
    if attribute not in _ROLE_OF or kind is None:
        raise ValueError(
            f"lmcore layer {module_name!r} ({type(module).__name__}) has no known tensor-parallel "
            "role; lmcore's layers changed: add it to bench.plan.params._ROLE_OF"
        )
    return _ROLE_OF[attribute], kind


def model_parameters(config: lmcore.ModelConfig) -> tuple[ParamSpec, ...]:
    """Every parameter of `TransformerLM.from_config(config)`, in registration order.

    Built on the meta device: no memory is allocated and nothing is initialised, so even the
    leaderboard's 8B model lists in a fraction of a second. Cached per configuration, without
    the context length and the attention backend, which no parameter depends on.

    Raises:
        ValueError: a parameter whose tensor-parallel role is unknown (see the module docstring).
    """
    return _parameters(dataclasses.replace(config, context_length=1, attention="naive"))


@functools.lru_cache(maxsize=64)
def _parameters(config: lmcore.ModelConfig) -> tuple[ParamSpec, ...]:
    import torch  # here: the parameter list needs a model, the rest of this module needs no torch

    with torch.device("meta"):
        model = lmcore.TransformerLM.from_config(config)
    specs = []
    for module_name, module in model.named_modules():
        for attribute, param in module.named_parameters(recurse=False):
            name = f"{module_name}.{attribute}"
            role, kind = _describe(module_name, module)
            match = _BLOCK.match(name)
            block = int(match.group(1)) if match else None
            specs.append(ParamSpec(name, tuple(param.shape), block, role, kind))
    order = {name: i for i, (name, _) in enumerate(model.named_parameters())}
    return tuple(sorted(specs, key=lambda spec: order[spec.name]))

"""Model shapes for the tools: `lmcore`'s named sizes, with the name each goes by in tables.

A shape is `(name, lmcore.ModelSize)`: a size of `lmcore.MODEL_SIZES` under its own name
(`shape_named("xl")`), or explicit dimensions under a name of the caller's choice
(`bench-model --d-model ... --name custom`). `tiny` (two narrow layers) is the CPU default.
"""

from __future__ import annotations

from collections.abc import Sequence

from lmcore import MODEL_SIZES, ModelSize

__all__ = ["CPU_SIZE", "Shape", "shape_named", "size_label"]

Shape = tuple[str, ModelSize]

# The size every tool runs on a machine without a GPU: a training step takes milliseconds.
CPU_SIZE = "tiny"


def shape_named(name: str) -> Shape:
    """The shape of a size of `lmcore.MODEL_SIZES` ("small" … "2.7B", "tiny").

    Raises:
        ValueError: unknown size (the message lists the valid ones).
    """
    if name not in MODEL_SIZES:
        raise ValueError(f"unknown model size {name!r}; choose one of {', '.join(MODEL_SIZES)}")
    return name, MODEL_SIZES[name]


def size_label(name: str | None, dims: Sequence[int]) -> str:
    """A size's name with its dimensions (d_model/d_ff/layers/heads): `small (768/3072/12L/12H)`."""
    d, f, layers, heads = dims
    text = f"{d}/{f}/{layers}L/{heads}H"
    return f"{name} ({text})" if name else text

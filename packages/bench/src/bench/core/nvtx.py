"""NVTX ranges for Nsight Systems, and an attention backend annotated inside.

`nvtx_range(name)` (ddp's, re-exported: one definition for the wrappers and the tools) marks a
region on the Nsight Systems timeline when CUDA is present, and in `torch.profiler` traces on any
device (`enabled=False` makes it a no-op, so code keeps its ranges on any machine).
`annotated_attention(name)` registers,
in lmcore's attention registry, a variant of backend `name` with ranges around its stages: for
`naive`, the scores (q·kᵀ/√d and the mask), the softmax and the output (weights·v); for any
other backend one range around the whole call. The model is then built with the returned name;
lmcore itself knows nothing of NVTX.

Example::

    model = TransformerLM.from_size("small", context_length=512,
                                    attention=annotated_attention("naive"))
    with nvtx_range("step"):
        model(x).sum().backward()
"""

from __future__ import annotations

import torch

from ddp import nvtx_range
from lmcore import attention_scores, get_attention, register_attention

__all__ = ["annotated_attention", "nvtx_range"]


def _annotated_naive(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool
) -> torch.Tensor:
    with nvtx_range("attention: scores"):
        scores = attention_scores(q, k, causal=causal)  # (batch, heads, seq, seq)
    with nvtx_range("attention: softmax"):
        weights = torch.softmax(scores, dim=-1)
    with nvtx_range("attention: output"):
        return weights @ v


def annotated_attention(name: str) -> str:
    """Register an NVTX-annotated variant of attention backend `name`; return its name.

    Idempotent: calling it again re-registers the same function under the same name.

    Raises:
        ValueError: `name` is not a registered backend.
    """
    inner = get_attention(name)
    if name == "naive":
        fn = _annotated_naive
    else:

        def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool) -> torch.Tensor:
            with nvtx_range(f"attention: {name}"):
                return inner(q, k, v, causal=causal)

    annotated = f"{name}+nvtx"
    register_attention(annotated, fn, overwrite=True)
    return annotated

"""An attention backend annotated inside with NVTX ranges, for bench-model's profiles.

`annotated_attention(name)` registers, in lmcore's attention registry, a variant of backend
`name` with ranges (ddp's `nvtx_range`: on the Nsight Systems timeline when CUDA is present, in
`torch.profiler` traces on any device) around its stages: for `naive`, the scores (q·kᵀ/√d and
the mask), the softmax and the output (weights·v); for any other backend one range around the
whole call. The model is then built with the returned name; lmcore itself knows nothing of
NVTX. bench-model's kernel tables (`bench.tools.model.profile`) give these ranges their FLOPs.

Example::

    model = TransformerLM.from_size("small", context_length=512,
                                    attention=annotated_attention("naive"))
"""

from __future__ import annotations

import torch

from ddp import nvtx_range
from lmcore import attention_scores, get_attention, register_attention

__all__ = ["annotated_attention"]


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

"""NVTX ranges for Nsight Systems, and an attention backend annotated inside.

`nvtx_range(name)` marks a region on the Nsight Systems timeline when CUDA is present, and in
`torch.profiler` traces on any device (`enabled=False` makes it a no-op, so code keeps its
ranges on any machine). `annotated_attention(name)` registers,
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

import contextlib
from collections.abc import Iterator

import torch

from lmcore import attention_scores, get_attention, register_attention

__all__ = ["annotated_attention", "nvtx_range"]


@contextlib.contextmanager
def nvtx_range(name: str, *, enabled: bool = True) -> Iterator[None]:
    """A range called `name` around the block, when `enabled`: an NVTX range (for Nsight
    Systems, when CUDA is available) and a `torch.profiler.record_function` range (for
    `torch.profiler` traces, on any device)."""
    if not enabled:
        yield
        return
    with torch.profiler.record_function(name):
        if not torch.cuda.is_available():
            yield
            return
        torch.cuda.nvtx.range_push(name)
        try:
            yield
        finally:
            torch.cuda.nvtx.range_pop()


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

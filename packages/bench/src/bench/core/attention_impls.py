"""The attention implementations `bench-attn` and `bench-flash` put side by side, by name.

Every implementation is a function `fn(q, k, v, causal) -> o` over head-less tensors
`(batch, seq, d)`, the layout of the handout's attention benchmarks. Those that need a head
dimension (lmcore's backends, SDPA) get a view with one head, `(batch, 1, seq, d)`, of the same
data. An implementation that cannot run here raises `bench.core.oom.Unavailable` with the reason,
so its row says `skipped: <reason>` instead of failing the sweep.

| name | what runs |
|---|---|
| `naive` | `lmcore.naive_attention`: the full score matrix in plain PyTorch |
| `compiled` | `torch.compile(naive)`, one static graph per shape |
| `sdpa` | `torch.nn.functional.scaled_dot_product_attention`, torch's own backend choice |
| `sdpa-flash`, `sdpa-cudnn` | SDPA forced to its FlashAttention-2 or cuDNN backend (CUDA only) |
| `fa2-pytorch` | `fa2.flash_attention(implementation="pytorch")`: the tiled PyTorch code |
| `fa2-triton` | `fa2.flash_attention(implementation="triton")`: the Triton kernels (CUDA only) |
| `fa2-triton-compiled` | `torch.compile(fa2.FlashAttention2Triton.apply)`, the leaderboard call |
| `fa2-triton-nondet` | the Triton kernels with `deterministic=False` (fp32: single-pass backward) |
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench.core.attention_names import IMPL_NAMES
from bench.core.oom import Unavailable
from lmcore import naive_attention, sdpa_attention

__all__ = ["IMPL_NAMES", "AttentionFn", "attention_impl", "require_fa2"]

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]

_SDPA_BACKENDS = {
    "sdpa-flash": SDPBackend.FLASH_ATTENTION,
    "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
}


def require_fa2(name: str) -> Any:
    """`fa2.<name>`, or `Unavailable` saying why the optional `fa2` package cannot provide it."""
    try:
        import fa2
    except ImportError as exc:
        raise Unavailable(f"the fa2 package is not importable ({exc})") from exc
    try:
        return getattr(fa2, name)
    except AttributeError:
        raise Unavailable(f"the installed fa2 package has no {name}") from None


def _one_head(backend: Callable[..., torch.Tensor]) -> AttentionFn:
    """Run a `(batch, heads, seq, d)` backend on `(batch, seq, d)` inputs as a single head."""

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        o = backend(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), causal=causal)
        return o.squeeze(1)  # (batch, 1, seq, d) -> (batch, seq, d)

    return attend


def _forced_sdpa(backend: SDPBackend) -> Callable[..., torch.Tensor]:
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool) -> torch.Tensor:
        try:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        except RuntimeError as exc:
            # SDPA raises a RuntimeError listing why no kernel of the forced backend fits (an
            # unsupported dtype or head size): a property of the case, not a bug.
            if "No available kernel" in str(exc):
                raise Unavailable(f"{backend.name} does not support this case") from exc
            raise

    return attend


def _fa2_triton(device: torch.device) -> Any:
    if device.type != "cuda":
        raise Unavailable("Triton kernels need CUDA (the CPU interpreter is too slow to time)")
    return require_fa2("FlashAttention2Triton")


def _fa2_front_door(**options: Any) -> AttentionFn:
    """`fa2.flash_attention` with `options` (keyword arguments) on head-less inputs."""
    flash_attention = require_fa2("flash_attention")

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        return flash_attention(q, k, v, causal=causal, **options)

    return attend


def attention_impl(name: str, *, device: torch.device | str) -> AttentionFn:
    """The implementation called `name` (see the module docstring), ready to run on `device`.

    Compiled implementations start from a fresh compilation cache, so each call of this function
    compiles its own static graph (a sweep never hits dynamo's recompilation limit, past which
    it would silently run eager code).

    Raises:
        ValueError: `name` is not one of `IMPL_NAMES`.
        Unavailable: the implementation cannot run on this device or installation.
    """
    device = torch.device(device)
    if name == "naive":
        return _one_head(naive_attention)
    if name == "compiled":
        torch.compiler.reset()
        return torch.compile(_one_head(naive_attention), dynamic=False)
    if name == "sdpa":
        return _one_head(sdpa_attention)
    if name in _SDPA_BACKENDS:
        if device.type != "cuda":
            raise Unavailable(f"SDPA's {name.removeprefix('sdpa-')} backend needs CUDA")
        return _one_head(_forced_sdpa(_SDPA_BACKENDS[name]))
    if name == "fa2-pytorch":
        return _fa2_front_door(implementation="pytorch")
    if name == "fa2-triton":
        _fa2_triton(device)
        return _fa2_front_door(implementation="triton")
    if name == "fa2-triton-nondet":
        _fa2_triton(device)
        return _fa2_front_door(implementation="triton", deterministic=False)
    if name == "fa2-triton-compiled":
        function = _fa2_triton(device)
        torch.compiler.reset()
        return torch.compile(function.apply)
    raise ValueError(f"unknown attention implementation {name!r}; choose from {IMPL_NAMES}")

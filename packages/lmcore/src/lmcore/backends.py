"""Attention backends: interchangeable implementations of softmax(q kᵀ / √d) v, chosen by name.

Every backend has the signature `attend(q, k, v, *, causal) -> o` with `q` of shape
`(batch, heads, n_queries, head_dim)`, `k` and `v` of shape `(batch, kv_heads, n_keys, head_dim)`
where `heads` is a multiple of `kv_heads` (grouped-query attention: query head h attends with
key/value head h // (heads // kv_heads); kv_heads == heads is plain multi-head attention),
softmax scale `1 / sqrt(head_dim)`, and returns `o` of the shape of `q`. With `causal=True`,
query `i` attends to keys `j <= i` (indices compared from the top-left corner, which for
self-attention, `n_queries == n_keys`, is the usual lower-triangular mask).

Backends are registered by name; `TransformerLM(..., attention=name)` looks its backend up here.
Other code adds a backend without touching this package::

    from lmcore import register_attention

    def my_attention(q, k, v, *, causal):
        ...

    register_attention("mine", my_attention)
    model = TransformerLM(..., attention="mine")

The `fa2-*` backends import the optional `fa2` package (distribution `cs336sys-fa2`) the first
time they run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Protocol

import torch
import torch.nn.functional as F

from lmcore.config import BUILTIN_ATTENTION

__all__ = [
    "ATTENTION_BACKENDS",
    "AttentionBackend",
    "attention_scores",
    "causal_mask",
    "fa2_pytorch_attention",
    "fa2_triton_attention",
    "get_attention",
    "naive_attention",
    "register_attention",
    "repeat_kv_heads",
    "sdpa_attention",
]


class AttentionBackend(Protocol):
    """The call signature every attention backend implements (see the module docstring)."""

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool
    ) -> torch.Tensor: ...


_BACKENDS: dict[str, AttentionBackend] = {}

# A read-only view of the registry: `register_attention` is the one way to change it.
ATTENTION_BACKENDS: Mapping[str, AttentionBackend] = MappingProxyType(_BACKENDS)


def register_attention(name: str, fn: AttentionBackend, *, overwrite: bool = False) -> None:
    """Make `fn` available as `TransformerLM(..., attention=name)`.

    Args:
        name: the backend's name.
        fn: a callable `fn(q, k, v, *, causal) -> o` following the contract in this module's
            docstring.
        overwrite: replace an existing backend of the same name instead of raising.

    Raises:
        TypeError: `name` is not a string or `fn` is not callable.
        ValueError: `name` is empty, or already registered and `overwrite` is false.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"backend name must be a non-empty string, got {name!r}")
    if not callable(fn):
        raise TypeError(f"backend {name!r} must be callable, got {type(fn).__name__}")
    if name in _BACKENDS and not overwrite:
        raise ValueError(
            f"attention backend {name!r} is already registered; pass overwrite=True to replace it"
        )
    _BACKENDS[name] = fn


def get_attention(name: str) -> AttentionBackend:
    """The backend registered as `name`.

    Raises:
        ValueError: no backend has that name (the message lists the registered ones).
    """
    try:
        return _BACKENDS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown attention backend {name!r}; choose one of {', '.join(sorted(_BACKENDS))}"
        ) from None


def causal_mask(n_queries: int, n_keys: int, *, device: torch.device | None = None) -> torch.Tensor:
    """Boolean `(n_queries, n_keys)` mask, true where query `i` may attend to key `j` (`j <= i`)."""
    rows = torch.arange(n_queries, device=device)[:, None]
    cols = torch.arange(n_keys, device=device)[None, :]
    return cols <= rows


def repeat_kv_heads(q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """k or v `(batch, kv_heads, n, d)` with each head repeated for the query heads sharing it,
    to q's head count: grouped-query attention for code that needs one k, v head per q head."""
    group = q.shape[-3] // x.shape[-3]
    return x if group == 1 else x.repeat_interleave(group, dim=-3)


def attention_scores(q: torch.Tensor, k: torch.Tensor, *, causal: bool) -> torch.Tensor:
    """Scaled scores `q kᵀ / √d` of shape `(..., n_queries, n_keys)`, masked to -inf if causal.

    The first stage of `naive_attention`, public so that instrumented variants (e.g. one with
    profiler ranges around scores, softmax and output) reuse it rather than copy it.
    """
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        keep = causal_mask(q.shape[-2], k.shape[-2], device=q.device)
        scores = scores.masked_fill(~keep, float("-inf"))
    return scores


def naive_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool
) -> torch.Tensor:
    """Plain PyTorch attention that materialises the full `(n_queries, n_keys)` score matrix.

    Memory grows with the square of the sequence length; this is the baseline the other
    backends are measured against. Shared key/value heads are repeated (copied) here.
    """
    weights = torch.softmax(attention_scores(q, repeat_kv_heads(q, k), causal=causal), dim=-1)
    return weights @ repeat_kv_heads(q, v)


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool
) -> torch.Tensor:
    """`torch.nn.functional.scaled_dot_product_attention`, which picks a fused kernel if it can."""
    grouped = k.shape[-3] != q.shape[-3]
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=grouped)


def _fa2_function(name: str):
    """`fa2.<name>`, or an ImportError that says how to install the optional `fa2` package."""
    try:
        import fa2
    except ImportError as err:
        raise ImportError(
            "the fa2-* attention backends need the FlashAttention-2 package cs336sys-fa2; "
            "install it with `pip install 'cs336sys-lmcore[fa2]'` (or `pip install ./packages/fa2` "
            "from a source checkout)"
        ) from err
    try:
        return getattr(fa2, name)
    except AttributeError:
        raise ImportError(
            f"the installed fa2 package does not provide {name}; install a release of "
            "cs336sys-fa2 that does (`pip install -U ./packages/fa2` from a source checkout)"
        ) from None


def fa2_pytorch_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool
) -> torch.Tensor:
    """FlashAttention-2 as tiled PyTorch code (fa2's front door, `implementation="pytorch"`):
    the reference."""
    return _fa2_function("flash_attention")(q, k, v, causal=causal, implementation="pytorch")


def fa2_triton_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool
) -> torch.Tensor:
    """FlashAttention-2 Triton kernels (fa2's front door, `implementation="triton"`), forward
    and backward."""
    return _fa2_function("flash_attention")(q, k, v, causal=causal, implementation="triton")


_BUILTINS = (naive_attention, sdpa_attention, fa2_pytorch_attention, fa2_triton_attention)
for _name, _fn in zip(BUILTIN_ATTENTION, _BUILTINS, strict=True):
    register_attention(_name, _fn)

"""A key/value cache for decoding: each layer's keys and values of the tokens seen so far, so
that a new token attends to them instead of the whole context being run again.

    cache = KVCache.for_model(model, max_length=len(prompt) + new_tokens)
    logits = model(prompt[None], kv_cache=cache)  # prefill: fills every layer's cache
    logits = model(next_token.view(1, 1), kv_cache=cache)  # one token against the cache

Attention against the cache runs `fa2.flash_attn_with_kvcache` (the optional fa2 package):
the new keys and values are written into preallocated buffers in place and attended in one call,
with flash-attn's bottom-right causal alignment, so a chunk of several new tokens works as well
as one. It computes the softmax attention every lmcore backend computes, whatever the model's
`attention`; the buffers take the dtype of the first keys written (the model's, or autocast's).
"""

from __future__ import annotations

import torch

from lmcore.backends import _fa2_function

__all__ = ["KVCache", "LayerKVCache"]


class LayerKVCache:
    """One layer's view of a `KVCache`: where its new tokens sit (`offset`) and `attend`."""

    def __init__(self, cache: KVCache, index: int) -> None:
        self.cache = cache
        self.index = index

    @property
    def offset(self) -> int:
        """The position of the first new token: the number of tokens cached before it."""
        return self.cache.length

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Append k, v to this layer's cache and attend q to every cached token, causally.

        Args:
            q: `(batch, heads, seq, head_dim)`, the new tokens' queries (positions rotated).
            k, v: `(batch, kv_heads, seq, head_dim)`, their keys (rotated) and values.

        Returns:
            `(batch, seq, heads, head_dim)`: new query i sees the cached tokens and new tokens
            0 ... i.
        """
        keys, values = self.cache.buffers(self.index, k)
        return _fa2_function("flash_attn_with_kvcache")(
            q.transpose(1, 2), keys, values, k.transpose(1, 2), v.transpose(1, 2),
            cache_seqlens=self.offset, causal=True,
        )  # fmt: skip


class KVCache:
    """Every layer's keys and values for a batch of sequences decoded together, all at the
    same position.

    The buffers are `(batch, max_length, kv_heads, head_dim)` per layer and per keys/values
    (flash-attn's layout), allocated when a layer first writes, in its keys' dtype and device.
    `TransformerLM.forward(..., kv_cache=cache)` reads `length` for the new tokens' positions,
    writes their keys and values, and advances `length` by their number.

    Args:
        num_layers: the model's blocks.
        max_length: the most tokens the cache holds (at most the model's context length).
    """

    def __init__(self, *, num_layers: int, max_length: int) -> None:
        for name, value in (("num_layers", num_layers), ("max_length", max_length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.max_length = max_length
        self.length = 0
        self._keys: list[torch.Tensor | None] = [None] * num_layers
        self._values: list[torch.Tensor | None] = [None] * num_layers

    @classmethod
    def for_model(cls, model: torch.nn.Module, *, max_length: int | None = None) -> KVCache:
        """An empty cache for `model` (a `TransformerLM`) of `max_length` tokens (default and
        at most its context length).

        Raises:
            ValueError: `max_length` exceeds the context length, or is not positive.
        """
        config = model.config
        max_length = config.context_length if max_length is None else max_length
        if isinstance(max_length, int) and max_length > config.context_length:
            raise ValueError(
                f"max_length {max_length} exceeds the model's context length "
                f"{config.context_length}: RoPE has no positions past it"
            )
        return cls(num_layers=config.num_layers, max_length=max_length)

    def layer(self, index: int) -> LayerKVCache:
        """Layer `index`'s view, which its attention calls."""
        return LayerKVCache(self, index)

    def buffers(self, index: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `index`'s key and value buffers, allocated for keys shaped as `like`
        `(batch, kv_heads, seq, head_dim)` on first use."""
        if self._keys[index] is None:
            batch, kv_heads, _, head_dim = like.shape
            shape = (batch, self.max_length, kv_heads, head_dim)
            self._keys[index] = like.new_zeros(shape)
            self._values[index] = like.new_zeros(shape)
        return self._keys[index], self._values[index]

    def check_room(self, num_tokens: int) -> None:
        """Raise ValueError unless `num_tokens` more tokens fit."""
        if self.length + num_tokens > self.max_length:
            raise ValueError(
                f"the KV cache holds {self.length} of at most {self.max_length} tokens; "
                f"{num_tokens} more do not fit (build a longer one with KVCache.for_model)"
            )

    def advance(self, num_tokens: int) -> None:
        """Count `num_tokens` more tokens as cached (every layer has written them)."""
        self.check_room(num_tokens)
        self.length += num_tokens

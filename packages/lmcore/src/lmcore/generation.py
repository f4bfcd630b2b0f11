"""Autoregressive sampling with temperature and nucleus (top-p) truncation, decoding with a
key/value cache."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

import torch
from torch import nn

from lmcore.kv_cache import KVCache
from lmcore.model import TransformerLM

__all__ = ["generate"]


def _sample(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_p: float | None,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Draw one id from `logits` of shape `(vocab,)`; greedy when `temperature == 0`."""
    if temperature == 0:
        return logits.argmax()
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    if top_p is not None and top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        # Keep the smallest prefix whose mass reaches top_p: a token stays if the mass of the
        # tokens ranked above it is still below top_p (so the top token always stays).
        mass_above = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_above >= top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return torch.multinomial(probs, num_samples=1, generator=generator)[0]


def _cached_model(model: nn.Module, use_cache: bool | None) -> TransformerLM | None:
    """The `TransformerLM` to decode with a KV cache (`model`, or the module a torch.compile
    wraps: decoding runs it eagerly), or None to run `model` on the whole window per token."""
    inner = getattr(model, "_orig_mod", model)
    takes_cache = isinstance(inner, TransformerLM)
    if use_cache is None:
        # The cache needs fa2 (lmcore's optional dependency); the tokens are the same without.
        return inner if takes_cache and importlib.util.find_spec("fa2") is not None else None
    if use_cache and not takes_cache:
        raise TypeError(
            f"use_cache=True needs a TransformerLM (or a torch.compile of one), got "
            f"{type(inner).__name__}; pass use_cache=False to run the whole window per token"
        )
    return inner if use_cache else None


@torch.no_grad()
def generate(
    model: nn.Module,
    prompt_ids: torch.Tensor | Sequence[int],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_p: float | None = None,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool | None = None,
) -> torch.Tensor:
    """Continue a prompt one token at a time, for a quick look at what a model has learned.

    Each step takes the final logits, divides them by `temperature`, keeps the most likely
    tokens whose probabilities sum to `top_p`, and samples. With the KV cache (the default for
    a `TransformerLM` where fa2 is installed) the prompt is run once and every new token
    attends to the cached keys and values (`KVCache`, through `fa2.flash_attn_with_kvcache`):
    one token's work per step instead of the whole window's. Without it, each step runs the
    model on the last `context_length` tokens. Both give the same tokens; once the sequence
    is longer than the context, its positions shift with every token, so those steps run the
    whole window either way. The model is put in eval mode for the call and its previous mode
    restored afterwards.

    Args:
        model: the language model: a `TransformerLM` (or a torch.compile of one), or any module
            mapping `(1, seq)` token ids to `(1, seq, vocab)` logits with a `config.context_length`.
        prompt_ids: 1-D token ids (tensor or list), at least one token.
        max_new_tokens: the most tokens to generate.
        temperature: softmax temperature > 0; 0 picks the most likely token (greedy).
        top_p: nucleus mass in (0, 1]; None or 1 samples from the full distribution.
        eos_id: stop after generating this id (it is included in the output).
        generator: torch random generator on the model's device, for reproducible samples.
        use_cache: True: decode with a KV cache (needs a `TransformerLM` and fa2); False: run
            the window for every token; None (default): the cache where both are there.

    Returns:
        The generated ids, a 1-D int64 tensor of at most `max_new_tokens` on the model's
        device; the prompt is not included.

    Raises:
        ValueError: an empty or non-1-D prompt, or an option out of range.
        TypeError: `use_cache=True` for a model that takes no cache.
        ImportError: `use_cache=True` without fa2 installed.

    Example::

        >>> ids = generate(model, tokenizer.encode("Once upon a time"), 64, top_p=0.9,
        ...                eos_id=tokenizer.eos_id)
        >>> print(tokenizer.decode(ids.tolist()))
    """
    device = next(model.parameters()).device
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=device)
    if prompt.dim() != 1 or prompt.numel() == 0:
        raise ValueError(f"prompt_ids must be a non-empty 1-D sequence, got shape {prompt.shape}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0 for greedy), got {temperature}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    lm = _cached_model(model, use_cache)

    context_length = model.config.context_length
    was_training = model.training
    model.eval()
    try:
        ids = prompt
        cache = None
        if lm is not None:
            window = min(prompt.numel(), context_length)
            cache = KVCache.for_model(lm, max_length=min(context_length, window + max_new_tokens))
        for step in range(max_new_tokens):
            if cache is None or (step > 0 and cache.length == cache.max_length):
                logits = model(ids[-context_length:].unsqueeze(0))[0, -1]  # (vocab,)
            elif step == 0:  # the prompt (its last context_length tokens) fills the cache
                logits = lm(ids[-context_length:].unsqueeze(0), kv_cache=cache)[0, -1]
            else:  # the last token against the cache
                logits = lm(ids[-1:].unsqueeze(0), kv_cache=cache)[0, -1]
            next_id = _sample(logits, temperature=temperature, top_p=top_p, generator=generator)
            ids = torch.cat((ids, next_id.view(1)))
            if eos_id is not None and next_id.item() == eos_id:
                break
    finally:
        model.train(was_training)
    return ids[prompt.numel() :]

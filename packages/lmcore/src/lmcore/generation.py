"""Autoregressive sampling with temperature and nucleus (top-p) truncation."""

from __future__ import annotations

from collections.abc import Sequence

import torch

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


@torch.no_grad()
def generate(
    model: TransformerLM,
    prompt_ids: torch.Tensor | Sequence[int],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_p: float | None = None,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Continue a prompt one token at a time, for a quick look at what a model has learned.

    Each step runs the model on the last `context_length` tokens (no KV cache: simple and
    slow, fine for samples), divides the final logits by `temperature`, keeps the most likely
    tokens whose probabilities sum to `top_p`, and samples. The model is put in eval mode for
    the call and its previous mode restored afterwards.

    Args:
        model: the language model.
        prompt_ids: 1-D token ids (tensor or list), at least one token.
        max_new_tokens: the most tokens to generate.
        temperature: softmax temperature > 0; 0 picks the most likely token (greedy).
        top_p: nucleus mass in (0, 1]; None or 1 samples from the full distribution.
        eos_id: stop after generating this id (it is included in the output).
        generator: torch random generator on the model's device, for reproducible samples.

    Returns:
        The generated ids, a 1-D int64 tensor of at most `max_new_tokens` on the model's
        device; the prompt is not included.

    Raises:
        ValueError: an empty or non-1-D prompt, or an option out of range.

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

    context_length = model.config.context_length
    was_training = model.training
    model.eval()
    try:
        ids = prompt
        for _ in range(max_new_tokens):
            window = ids[-context_length:].unsqueeze(0)  # (1, seq)
            logits = model(window)[0, -1]  # (vocab,)
            next_id = _sample(logits, temperature=temperature, top_p=top_p, generator=generator)
            ids = torch.cat((ids, next_id.view(1)))
            if eos_id is not None and next_id.item() == eos_id:
                break
    finally:
        model.train(was_training)
    return ids[prompt.numel() :]

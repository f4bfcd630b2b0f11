"""Random language-modelling batches from a flat array of token ids (e.g. a `np.memmap`)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

__all__ = ["get_batch"]


def get_batch(
    tokens: npt.ArrayLike,
    batch_size: int,
    context_length: int,
    device: torch.device | str,
    *,
    generator: np.random.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample `batch_size` windows of the token stream and their next-token targets.

    Each window starts at a position drawn uniformly from every start that leaves room for the
    target of the last token. Only the sampled windows are read, so `tokens` can be a
    memory-mapped file far larger than RAM.

    Args:
        tokens: 1-D array of token ids, e.g. `np.memmap(path, dtype=np.uint16, mode="r")`.
        batch_size: number of windows.
        context_length: tokens per window; `len(tokens)` must be at least `context_length + 1`.
        device: where to put the result (`"cpu"`, `"cuda:0"`, ...). CUDA copies go through
            pinned memory and do not block.
        generator: numpy random generator to draw the starts from (for reproducible batches);
            a fresh unseeded one if omitted.

    Returns:
        `(inputs, targets)`, both int64 of shape `(batch_size, context_length)`, with
        `targets[b, i] == inputs[b, i + 1]` for `i < context_length - 1`: targets are the
        inputs shifted left by one token.

    Raises:
        ValueError: `tokens` is not 1-D or too short, or a size is not a positive integer.
        TypeError: `tokens` does not hold integers.

    Example::

        >>> data = np.memmap("train.bin", dtype=np.uint16, mode="r")
        >>> x, y = get_batch(data, 32, 256, "cuda")
        >>> loss = cross_entropy(model(x), y)
    """
    tokens = tokens if isinstance(tokens, np.ndarray) else np.asarray(tokens)
    for name, value in (("batch_size", batch_size), ("context_length", context_length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if tokens.ndim != 1:
        raise ValueError(f"tokens must be a 1-D array of token ids, got shape {tokens.shape}")
    if not np.issubdtype(tokens.dtype, np.integer):
        raise TypeError(f"tokens must hold integer token ids, got dtype {tokens.dtype}")
    num_starts = len(tokens) - context_length
    if num_starts < 1:
        raise ValueError(
            f"need at least context_length + 1 = {context_length + 1} tokens, got {len(tokens)}"
        )
    rng = generator if generator is not None else np.random.default_rng()
    starts = rng.integers(0, num_starts, size=batch_size)
    offsets = np.arange(context_length + 1)
    windows = torch.from_numpy(tokens[starts[:, None] + offsets].astype(np.int64))
    # windows: (batch_size, context_length + 1)
    device = torch.device(device)
    if device.type == "cuda":
        windows = windows.pin_memory().to(device, non_blocking=True)
    else:
        windows = windows.to(device)
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()

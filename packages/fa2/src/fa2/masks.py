"""Which keys each query sees: causal masks and sliding windows, and where they are aligned.

Every mask fa2 knows is a band around a diagonal of the score matrix. Query i sees key j (both
counted from 0 within their sequence) iff

    i + offset - left  <=  j  <=  i + offset + right

where a side given as -1 is unbounded, and `offset` places the diagonal:

- aligned to the top-left corner, `offset = 0` (fa2's `flash_attention`, as the CS336 handout
  and SDPA's `is_causal` do): query 0 sees key 0;
- aligned to the bottom-right corner, `offset = n_keys - n_queries` (flash-attn's
  `flash_attn_func` and `flash_attn_varlen_func`): the last query sees the last key, as when
  new queries attend to a cache of earlier keys.

The two agree when n_queries == n_keys. Causal attention is the band with `right = 0`; a
sliding window of the last W keys is `left = W - 1, right = 0`. A query that sees no key (only
possible bottom-right with n_queries > n_keys, or with a window) gets an output of 0 and a
logsumexp of +inf, as in flash-attn, and passes no gradient.

The PyTorch path, the oracle and the Triton kernels' host code all read the band from here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

__all__ = ["NO_WINDOW", "Band", "check_softcap", "make_band", "visible"]

# `window_size` that hides nothing (flash-attn's spelling: -1 is an unbounded side).
NO_WINDOW = (-1, -1)


class Band(NamedTuple):
    """The keys each query sees (see the module docstring); the default sees every key."""

    left: int = -1  # keys more than `left` before the diagonal are hidden; -1: none
    right: int = -1  # keys more than `right` after the diagonal are hidden; -1: none (causal: 0)
    bottom_right: bool = False  # the diagonal ends in the bottom-right corner (else top-left)

    @property
    def masked(self) -> bool:
        """Whether any key is hidden from any query (beyond the sequence lengths)."""
        return self.left >= 0 or self.right >= 0

    def bounds(self, n_queries: int, n_keys: int) -> tuple[int | None, int | None]:
        """(lo, hi): query i sees key j iff i + lo <= j <= i + hi; None for an unbounded side."""
        offset = n_keys - n_queries if self.bottom_right else 0
        lo = offset - self.left if self.left >= 0 else None
        hi = offset + self.right if self.right >= 0 else None
        return lo, hi


def make_band(
    *,
    causal: bool,
    window_size: Sequence[int] = NO_WINDOW,
    bottom_right: bool = False,
    longest: int | None = None,
) -> Band:
    """The band of a call's options, normalised so that equal masks compare equal.

    Args:
        causal: hide keys after the diagonal (`right = 0`, whatever `window_size` says, as
            flash-attn does).
        window_size: `(left, right)`, each an int >= -1 (-1: unbounded).
        bottom_right: align the diagonal to the bottom-right corner instead of the top-left.
        longest: the longest query or key sequence the band will be applied to (packed
            sequences: the most tokens). A side of at least this many keys hides nothing
            (query i < n_q and key j < n_k never lie that far apart, whichever the
            alignment), so it is made unbounded: the band then says what the mask is, and
            the kernels' int32 row arithmetic never meets a side near 2**31. None: sides are
            kept as given.

    Raises:
        TypeError: `window_size` is not a pair of ints.
        ValueError: a side below -1.
    """
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise TypeError(
            f"window_size must be a pair (left, right) of ints, got {window_size!r}"
        ) from None
    for name, side in (("left", left), ("right", right)):
        if isinstance(side, bool) or not isinstance(side, int):
            raise TypeError(f"window_size {name} must be an int, got {side!r}")
        if side < -1:
            raise ValueError(
                f"window_size {name} must be >= 0, or -1 for no limit on that side, got {side}"
            )
    if causal:
        right = 0
    if longest is not None:
        left, right = (-1 if side >= longest else side for side in (left, right))
    if left < 0 and right < 0:
        return Band()  # sees everything: the alignment does not matter
    return Band(left, right, bool(bottom_right))


def check_softcap(softcap: float) -> float:
    """`softcap` as a float: 0 (off) or a positive, finite cap (scores become
    `softcap * tanh(scores / softcap)`, as in Gemma 2). Raises ValueError otherwise."""
    cap = float(softcap)
    if not (cap >= 0 and math.isfinite(cap)):
        raise ValueError(f"softcap must be 0 (off) or a positive finite number, got {softcap!r}")
    return cap


def visible(
    band: Band, rows: torch.Tensor, cols: torch.Tensor, n_queries: int, n_keys: int
) -> torch.Tensor | None:
    """`(len(rows), len(cols))` boolean mask, True where query `rows[r]` sees key `cols[c]`
    under `band` (lengths not checked); None where the band hides nothing."""
    lo, hi = band.bounds(n_queries, n_keys)
    keep = None
    if hi is not None:
        keep = cols[None, :] <= rows[:, None] + hi
    if lo is not None:
        lower = cols[None, :] >= rows[:, None] + lo
        keep = lower if keep is None else keep & lower
    return keep

"""The rules that turn numbers into the words of a claim.

A sentence of the report that says more than its numbers ("faster", "above", "grows with the
square", "stable", "rises through the backward") takes its words from one of these rules, fed
the very rows it cites, so that rows which say otherwise change the sentence instead of leaving
it stale. Each rule is a pure function of numbers, tested on its own and through the report.

Tolerances are part of the claim: two values within `SAME` of each other are "level", not
"above" or "below", because the timings the report quotes vary by a few per cent from step to
step: the standard deviations of `docs/results/model_h100_2026-11-25.json` reach 2.2% of the
mean step, that of the fully warm row of `docs/results/warmup_h100_2026-11-23.json` 4.6%
(2.71 ms of 59.2 ms).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

__all__ = [
    "SAME",
    "STABLE",
    "direction",
    "growth",
    "growth_exponent",
    "ratio_word",
    "relation",
    "speed",
    "speed_against",
    "spread_word",
]

# Relative difference below which two measurements are reported as level (see the module).
SAME = 0.05
# Largest standard deviation, as a share of the mean, still reported as stable timings: the
# handout asks whether the spread is "high" or "small"; a few per cent is timer and clock noise.
STABLE = 0.05


def relation(value: float, reference: float, *, tolerance: float = SAME) -> str:
    """`above`, `below` or `level with`: `value` against `reference`, within `tolerance`
    (relative to `reference`) counted as level.

    Raises:
        ValueError: `reference` is not positive.
    """
    if not reference > 0:
        raise ValueError(f"reference must be positive, got {reference!r}")
    change = value / reference - 1
    if change > tolerance:
        return "above"
    if change < -tolerance:
        return "below"
    return "level with"


def direction(start: float, end: float, *, tolerance: float = SAME) -> str:
    """`rises`, `falls` or `stays level`: how a quantity moves from `start` to `end`."""
    return {"above": "rises", "below": "falls", "level with": "stays level"}[
        relation(end, start, tolerance=tolerance)
    ]


def speed(ratios: Sequence[float], *, tolerance: float = SAME) -> str:
    """`faster`, `slower` or `about as fast`: the median of `ratios` (baseline time / this
    time, above 1 when this is faster), within `tolerance` of 1 counted as level.

    Raises:
        ValueError: no ratios.
    """
    if not ratios:
        raise ValueError("speed needs at least one ratio")
    return {"above": "faster", "below": "slower", "level with": "about as fast"}[
        relation(statistics.median(ratios), 1.0, tolerance=tolerance)
    ]


def speed_against(ratio: float, other: str, *, tolerance: float = SAME) -> str:
    """`faster than other`, `slower than other` or `about as fast as other`, for one ratio
    (`other`'s time / this time)."""
    word = speed([ratio], tolerance=tolerance)
    return f"about as fast as {other}" if word == "about as fast" else f"{word} than {other}"


def ratio_word(ratio: float, *, more: str, less: str, same: str, tolerance: float = SAME) -> str:
    """`more`, `less` or `same` for a ratio above, below or within `tolerance` of 1."""
    return {"above": more, "below": less, "level with": same}[
        relation(ratio, 1.0, tolerance=tolerance)
    ]


def spread_word(spread: float, *, limit: float = STABLE) -> str:
    """`small` or `large`: a standard deviation as a share of the mean, against `limit`."""
    return "small" if spread <= limit else "large"


def growth_exponent(x0: float, y0: float, x1: float, y1: float) -> float:
    """p in y ∝ x^p between two points (the slope on log-log axes).

    Raises:
        ValueError: a value is not positive, or the two x are equal.
    """
    if min(x0, y0, x1, y1) <= 0 or x0 == x1:
        raise ValueError("growth needs positive values at two different x")
    return math.log(y1 / y0) / math.log(x1 / x0)


def growth(exponent: float) -> str:
    """How a quantity grows with a power `exponent` of its argument, in words: `with its square`
    (1.75 to 2.25), `linearly` (0.75 to 1.25), `barely` (below 0.25), else `as its p-th power`."""
    if 1.75 <= exponent <= 2.25:
        return "with its square"
    if 0.75 <= exponent <= 1.25:
        return "linearly"
    if abs(exponent) < 0.25:
        return "barely"
    return f"as its {exponent:.2f}-th power"

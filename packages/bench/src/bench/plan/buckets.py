"""How large DDP's gradient buckets should be: the 2025 handout's bucket-size equation
(`ddp_bucketed_benchmarking` (b)).

The model (symbols the 2025 handout's): the gradients of a model of `s` bytes are all-reduced
in `n_b` equal buckets at algorithm bandwidth `w` (bytes/s: each rank's data over the
all-reduce's time), each call costing `o` seconds on top of its transfer. As the handout asks,
a bucket's gradients take as long to compute as its bytes take to send, `s / (n_b·w)`, so the
transfers alone would keep pace with the backward; the per-call cost `o` is what they cannot
hide. Bucket i is ready at `i·s/(n_b·w)`; each call then runs `o` longer than the next bucket
takes to compute, so the calls fall behind by `o` each, and the last one ends
`n_b·o + s/(n_b·w)` after the backward does:

    overhead(n_b) = n_b·o + s/(n_b·w)

Few buckets leave one large transfer after the backward; many pay the call cost many times.
Setting the derivative to zero: `n_b* = √(s/(w·o))`, buckets of `b* = s/n_b* = √(s·w·o)` bytes,
and an overhead of `2·√(s·o/w)`.

Example::

    >>> optimal_bucket_bytes(8e9, 320e9, 77e-6).value / 1e6  # MB
    444.0...
"""

from __future__ import annotations

import math

from bench.plan.ffn import Derivation

__all__ = ["ddp_overhead_seconds", "optimal_bucket_bytes"]


def _check(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")


def ddp_overhead_seconds(
    model_bytes: float, bandwidth: float, call_overhead_s: float, num_buckets: int
) -> Derivation:
    """DDP's time after the backward with `num_buckets` buckets: `n_b·o + s/(n_b·w)`.

    Raises:
        ValueError: a value that is not positive.
    """
    _check(
        model_bytes=model_bytes,
        bandwidth=bandwidth,
        call_overhead_s=call_overhead_s,
        num_buckets=num_buckets,
    )
    value = num_buckets * call_overhead_s + model_bytes / (num_buckets * bandwidth)
    return Derivation(
        value,
        "n_b·o + s/(n_b·w)",
        "each bucket computes in the time its bytes take to send, so only the per-call costs "
        "pile up behind the backward, plus the last bucket's transfer",
    )


def optimal_bucket_bytes(
    model_bytes: float, bandwidth: float, call_overhead_s: float
) -> Derivation:
    """The bucket size that minimises `ddp_overhead_seconds`: `√(s·w·o)` bytes.

    Raises:
        ValueError: a value that is not positive.
    """
    _check(model_bytes=model_bytes, bandwidth=bandwidth, call_overhead_s=call_overhead_s)
    return Derivation(
        math.sqrt(model_bytes * bandwidth * call_overhead_s),
        "b* = s/n_b* = √(s·w·o), with n_b* = √(s/(w·o)) and overhead 2·√(s·o/w)",
        "d/dn_b (n_b·o + s/(n_b·w)) = o − s/(n_b²·w) = 0",
    )

"""Bucket sizes and bucket assignment: which tensors travel together in one collective.

The one bucket vocabulary of the workspace: a bucket size is `bucket_size_mb` MiB (like torch
DDP's `bucket_cap_mb`), `None` puts everything in one bucket and `0` gives every tensor its own.
`DDPBucketed` (gradient all-reduces) and `zero.ShardedOptimizer` (parameter broadcasts) both
validate their size with `bucket_bytes` and plan with `assign_buckets`, a pure function of sizes
with no tensors and no process group, so the plan can be tested (and printed) on its own.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

__all__ = ["DEFAULT_BUCKET_SIZE_MB", "assign_buckets", "bucket_bytes"]

# Bucket sizes are in MiB, like torch DDP's `bucket_cap_mb`.
_BYTES_PER_MB = 1024 * 1024
# torch DDP's default `bucket_cap_mb`. At NVLink speeds a 25 MB collective takes on the order of
# 100 µs, several times a collective's ~10 µs launch cost, while buckets stay small next to the
# model.
DEFAULT_BUCKET_SIZE_MB = 25.0


def bucket_bytes(bucket_size_mb: float | None, *, name: str = "bucket_size_mb") -> int | None:
    """The capacity in bytes of a bucket of `bucket_size_mb` MiB, for `assign_buckets`.

    `name` is the option's name in the error messages.

    Raises:
        TypeError: `bucket_size_mb` is neither a number nor None.
        ValueError: `bucket_size_mb` is negative, nan or infinite (`None` is the one bucket).

    Example::

        >>> bucket_bytes(25), bucket_bytes(0), bucket_bytes(None)
        (26214400, 0, None)
    """
    if bucket_size_mb is None:
        return None
    if isinstance(bucket_size_mb, bool) or not isinstance(bucket_size_mb, int | float):
        raise TypeError(
            f"{name} must be a number of MiB or None, got {type(bucket_size_mb).__name__}"
        )
    if not (bucket_size_mb >= 0 and math.isfinite(bucket_size_mb)):
        raise ValueError(
            f"{name} must be a finite number >= 0 (0 gives every tensor its own "
            f"bucket) or None (one bucket), got {bucket_size_mb}"
        )
    return int(bucket_size_mb * _BYTES_PER_MB)


def assign_buckets(
    sizes: Sequence[int],
    *,
    max_bytes: int | None,
    keys: Sequence[Hashable] | None = None,
    reverse: bool = True,
    last_max_bytes: int | None = None,
) -> list[list[int]]:
    """Group parameters into buckets of at most `max_bytes`, in reverse registration order.

    Gradients become ready roughly in the reverse of the order the parameters were registered
    (the last layer's first), so walking the parameters backwards fills the first bucket with the
    gradients that backward produces first, and its all-reduce can start while the rest of
    backward still runs. The walk is greedy: a parameter joins the open bucket of its key unless
    that would take the bucket past `max_bytes`, in which case the bucket is closed and a new one
    starts. A parameter larger than `max_bytes` therefore gets a bucket of its own. With
    `reverse=False` the walk goes forwards instead (broadcasts after an optimizer step, which
    have no backward to follow).

    With `last_max_bytes`, buckets shrink towards the end of the walk: a bucket closes before it
    would hold more than the bytes of its key still to come after it, or `last_max_bytes` if
    that is more. From the end the buckets then hold about `last_max_bytes`, `last_max_bytes`,
    twice that, four times that, ... up to `max_bytes`. The last gradients of backward (the first
    blocks and the embedding) are ready last, and what is reduced after them is exposed: with
    shrinking buckets, as long as backward produces gradient bytes no faster than the network
    reduces them, each bucket's all-reduce takes no longer than backward takes to produce the
    bytes after it, so only the last small bucket is left after backward. (torch DDP's
    ``first_bucket_bytes_cap`` is the mirror image: a small first bucket, to start early.)

    Args:
        sizes: bytes each parameter's gradient occupies on the wire, in registration order.
        max_bytes: the bucket capacity in bytes; `None` puts every parameter (of a key) in one
            bucket; `0` gives every parameter its own bucket.
        keys: optional per-parameter keys (e.g. the dtype); parameters with different keys never
            share a bucket, because a bucket is one flat buffer of one dtype.
        reverse: walk the parameters backwards (the default, for gradients) or forwards.
        last_max_bytes: shrink the buckets towards the end of the walk down to this many bytes
            (see above); `None` (default) keeps every bucket at `max_bytes`.

    Returns:
        Buckets in the order their collectives should be launched (by the position of their
        first parameter in the walk); each bucket lists indices into `sizes` in walk order
        (reverse registration order unless `reverse=False`).

    Raises:
        ValueError: a size, `max_bytes` or `last_max_bytes` is negative, or `keys` has a
            different length.

    Example::

        >>> assign_buckets([4, 4, 8, 4], max_bytes=8)
        [[3], [2], [1, 0]]
        >>> assign_buckets([4, 4, 8, 4], max_bytes=None)
        [[3, 2, 1, 0]]
        >>> assign_buckets([4, 4, 8, 4], max_bytes=8, reverse=False)
        [[0, 1], [2], [3]]
        >>> assign_buckets([1] * 8, max_bytes=None, last_max_bytes=1)
        [[7, 6, 5, 4], [3, 2], [1], [0]]
    """
    if max_bytes is not None and max_bytes < 0:
        raise ValueError(f"max_bytes must be >= 0 or None, got {max_bytes}")
    if last_max_bytes is not None and last_max_bytes < 0:
        raise ValueError(f"last_max_bytes must be >= 0 or None, got {last_max_bytes}")
    if any(size < 0 for size in sizes):
        raise ValueError(f"sizes must be non-negative, got {list(sizes)}")
    if keys is None:
        keys = [None] * len(sizes)
    elif len(keys) != len(sizes):
        raise ValueError(f"keys has {len(keys)} entries but sizes has {len(sizes)}")

    closed: list[list[int]] = []
    open_buckets: dict[Hashable, list[int]] = {}
    open_bytes: dict[Hashable, int] = {}
    still_to_come: dict[Hashable, int] = {}  # bytes of each key after the current parameter
    for key, size in zip(keys, sizes, strict=True):
        still_to_come[key] = still_to_come.get(key, 0) + size
    order = reversed(range(len(sizes))) if reverse else range(len(sizes))
    for index in order:
        key, size = keys[index], sizes[index]
        still_to_come[key] -= size
        limit = max_bytes
        if last_max_bytes is not None:
            shrunk = max(last_max_bytes, still_to_come[key])
            limit = shrunk if limit is None else min(limit, shrunk)
        bucket = open_buckets.get(key)
        if bucket and limit is not None and open_bytes[key] + size > limit:
            closed.append(bucket)
            bucket = None
        if bucket is None:
            bucket = open_buckets[key] = []
            open_bytes[key] = 0
        bucket.append(index)
        open_bytes[key] += size
    buckets = closed + [bucket for bucket in open_buckets.values() if bucket]
    # Launch order: the bucket whose first parameter comes earliest in the walk first.
    return sorted(buckets, key=lambda bucket: -bucket[0] if reverse else bucket[0])

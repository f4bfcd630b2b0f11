"""Bucket assignment: which parameters' gradients travel together in one all-reduce.

A pure function of sizes, with no tensors and no process group, so the plan can be tested (and
printed) on its own.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

__all__ = ["assign_buckets"]


def assign_buckets(
    sizes: Sequence[int],
    *,
    max_bytes: int | None,
    keys: Sequence[Hashable] | None = None,
) -> list[list[int]]:
    """Group parameters into buckets of at most `max_bytes`, in reverse registration order.

    Gradients become ready roughly in the reverse of the order the parameters were registered
    (the last layer's first), so walking the parameters backwards fills the first bucket with the
    gradients that backward produces first, and its all-reduce can start while the rest of
    backward still runs. The walk is greedy: a parameter joins the open bucket of its key unless
    that would take the bucket past `max_bytes`, in which case the bucket is closed and a new one
    starts. A parameter larger than `max_bytes` therefore gets a bucket of its own.

    Args:
        sizes: bytes each parameter's gradient occupies on the wire, in registration order.
        max_bytes: the bucket capacity in bytes; `None` puts every parameter (of a key) in one
            bucket; `0` gives every parameter its own bucket.
        keys: optional per-parameter keys (e.g. the dtype); parameters with different keys never
            share a bucket, because a bucket is one flat buffer of one dtype.

    Returns:
        Buckets in the order their all-reduces should be launched (by the position of their first
        parameter in the backwards walk); each bucket lists indices into `sizes`, in reverse
        registration order.

    Raises:
        ValueError: a size or `max_bytes` is negative, or `keys` has a different length.

    Example::

        >>> assign_buckets([4, 4, 8, 4], max_bytes=8)
        [[3], [2], [1, 0]]
        >>> assign_buckets([4, 4, 8, 4], max_bytes=None)
        [[3, 2, 1, 0]]
    """
    if max_bytes is not None and max_bytes < 0:
        raise ValueError(f"max_bytes must be >= 0 or None, got {max_bytes}")
    if any(size < 0 for size in sizes):
        raise ValueError(f"sizes must be non-negative, got {list(sizes)}")
    if keys is None:
        keys = [None] * len(sizes)
    elif len(keys) != len(sizes):
        raise ValueError(f"keys has {len(keys)} entries but sizes has {len(sizes)}")

    closed: list[list[int]] = []
    open_buckets: dict[Hashable, list[int]] = {}
    open_bytes: dict[Hashable, int] = {}
    for index in reversed(range(len(sizes))):
        key, size = keys[index], sizes[index]
        bucket = open_buckets.get(key)
        if bucket and max_bytes is not None and open_bytes[key] + size > max_bytes:
            closed.append(bucket)
            bucket = None
        if bucket is None:
            bucket = open_buckets[key] = []
            open_bytes[key] = 0
        bucket.append(index)
        open_bytes[key] += size
    buckets = closed + [bucket for bucket in open_buckets.values() if bucket]
    # Launch order: the bucket whose first gradient comes earliest in the backwards walk first.
    return sorted(buckets, key=lambda bucket: -bucket[0])

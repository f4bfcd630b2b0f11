"""Which rank owns which parameter: a pure function, the same on every rank.

Every rank runs this on the same list of sizes and must reach the same answer without talking to
the others, so the algorithm is deterministic: integer arithmetic, stable sorting, ties broken by
the lowest index and the lowest rank.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["partition_by_numel"]


def partition_by_numel(
    numels: Sequence[int],
    num_ranks: int,
    *,
    loads: Sequence[int] | None = None,
) -> list[int]:
    """Assign each item to a rank so that the ranks' total sizes are as even as possible.

    Greedy longest-processing-time (LPT) scheduling: items are taken largest first and each goes
    to the rank with the smallest total so far. The largest total is at most 4/3 of the best
    possible one (Graham, 1969), and never more than the mean plus the largest item, so a model
    whose biggest tensor is small next to the whole splits almost exactly evenly.

    Args:
        numels: the size of each item (for parameters, ``p.numel()``), in registration order.
        num_ranks: how many ranks share the items; at least 1.
        loads: optional size each rank already holds (length ``num_ranks``), so that items added
            later (a new parameter group) fill the lighter ranks first. Defaults to all zero.

    Returns:
        The owner rank of each item, a list as long as ``numels``.

    Raises:
        ValueError: if ``num_ranks`` is below 1, a size is negative, or ``loads`` has the wrong
            length.

    Example::

        >>> partition_by_numel([10, 3, 7, 4], 2)
        [0, 0, 1, 1]
        >>> partition_by_numel([5], 2, loads=[8, 2])
        [1]
    """
    if num_ranks < 1:
        raise ValueError(f"num_ranks must be at least 1, got {num_ranks}")
    if any(n < 0 for n in numels):
        raise ValueError(f"sizes must be non-negative, got {list(numels)}")
    totals = [0] * num_ranks if loads is None else list(loads)
    if len(totals) != num_ranks:
        raise ValueError(f"loads has {len(totals)} entries; pass one per rank ({num_ranks})")

    owners = [0] * len(numels)
    # sorted() is stable: equal sizes keep their registration order
    for index in sorted(range(len(numels)), key=lambda i: -numels[i]):
        rank = min(range(num_ranks), key=lambda r: totals[r])  # first of the lightest ranks
        owners[index] = rank
        totals[rank] += numels[index]
    return owners

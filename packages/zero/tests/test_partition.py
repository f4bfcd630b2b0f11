"""partition_by_numel: balanced, deterministic assignment of parameters to ranks."""

import itertools
import random

import pytest

from zero import partition_by_numel


def _totals(numels: list[int], owners: list[int], num_ranks: int) -> list[int]:
    totals = [0] * num_ranks
    for n, owner in zip(numels, owners, strict=True):
        totals[owner] += n
    return totals


def _optimal_makespan(numels: list[int], num_ranks: int) -> int:
    """The best possible largest total, by trying every assignment (small inputs only)."""
    return min(
        max(_totals(numels, list(owners), num_ranks))
        for owners in itertools.product(range(num_ranks), repeat=len(numels))
    )


def test_docstring_examples():
    assert partition_by_numel([10, 3, 7, 4], 2) == [0, 0, 1, 1]
    assert partition_by_numel([5], 2, loads=[8, 2]) == [1]


def test_every_item_gets_a_valid_rank():
    rng = random.Random(0)
    numels = [rng.randrange(1, 1000) for _ in range(37)]
    owners = partition_by_numel(numels, 5)
    assert len(owners) == len(numels)
    assert set(owners) == set(range(5))


@pytest.mark.parametrize("seed", range(6))
def test_within_four_thirds_of_optimal(seed: int):
    rng = random.Random(seed)
    numels = [rng.randrange(1, 100) for _ in range(rng.randrange(4, 9))]
    num_ranks = rng.randrange(2, 4)
    largest = max(_totals(numels, partition_by_numel(numels, num_ranks), num_ranks))
    assert largest <= 4 / 3 * _optimal_makespan(numels, num_ranks)


@pytest.mark.parametrize("num_ranks", [2, 3, 7])
def test_largest_total_at_most_mean_plus_largest_item(num_ranks: int):
    rng = random.Random(num_ranks)
    numels = [rng.randrange(1, 10_000) for _ in range(101)]
    totals = _totals(numels, partition_by_numel(numels, num_ranks), num_ranks)
    assert max(totals) <= sum(numels) / num_ranks + max(numels)


def test_same_input_same_answer():
    rng = random.Random(3)
    numels = [rng.randrange(1, 50) for _ in range(40)]
    assert partition_by_numel(numels, 3) == partition_by_numel(list(numels), 3)


def test_ties_go_to_the_lowest_index_and_rank():
    assert partition_by_numel([4, 4, 4, 4], 2) == [0, 1, 0, 1]


def test_loads_send_new_items_to_lighter_ranks():
    assert partition_by_numel([3, 2], 3, loads=[10, 0, 4]) == [1, 1]


def test_more_ranks_than_items_leaves_ranks_empty():
    assert partition_by_numel([9, 1], 4) == [0, 1]
    assert partition_by_numel([], 3) == []


@pytest.mark.parametrize(
    ("numels", "num_ranks", "loads", "match"),
    [
        ([1, 2], 0, None, "num_ranks"),
        ([1, -2], 2, None, "non-negative"),
        ([1, 2], 2, [0, 0, 0], "one per rank"),
    ],
)
def test_bad_arguments_raise(numels, num_ranks, loads, match):
    with pytest.raises(ValueError, match=match):
        partition_by_numel(numels, num_ranks, loads=loads)

"""Bucket sizes and bucket assignment, without any process group."""

import math

import pytest

from ddp import DEFAULT_BUCKET_SIZE_MB, assign_buckets, bucket_bytes


def test_none_puts_everything_in_one_bucket_in_reverse_order():
    assert assign_buckets([12, 40, 4, 8], max_bytes=None) == [[3, 2, 1, 0]]


def test_zero_gives_every_parameter_its_own_bucket():
    assert assign_buckets([12, 40, 4, 8], max_bytes=0) == [[3], [2], [1], [0]]


def test_limit_smaller_than_every_parameter_gives_one_bucket_each():
    assert assign_buckets([12, 40, 4, 8], max_bytes=3) == [[3], [2], [1], [0]]


def test_buckets_fill_greedily_backwards_up_to_the_limit():
    # Walking backwards: 7 + 5 = 12 fits, + 9 does not; 9 + 3 = 12 fits, + 2 does not.
    assert assign_buckets([2, 3, 9, 5, 7], max_bytes=12) == [[4, 3], [2, 1], [0]]


def test_limit_is_inclusive():
    assert assign_buckets([6, 6], max_bytes=12) == [[1, 0]]


def test_parameter_larger_than_the_limit_gets_its_own_bucket():
    assert assign_buckets([4, 100, 4, 4], max_bytes=10) == [[3, 2], [1], [0]]


def test_every_index_lands_in_exactly_one_bucket():
    sizes = [(7 * i) % 23 + 1 for i in range(41)]
    buckets = assign_buckets(sizes, max_bytes=30)
    assert sorted(i for bucket in buckets for i in bucket) == list(range(41))
    for bucket in buckets:
        assert len(bucket) == 1 or sum(sizes[i] for i in bucket) <= 30


def test_keys_never_share_a_bucket():
    keys = ["f32", "bf16", "f32", "bf16", "f32"]
    buckets = assign_buckets([4, 4, 4, 4, 4], max_bytes=None, keys=keys)
    assert buckets == [[4, 2, 0], [3, 1]]


def test_keys_fill_their_own_buckets_independently():
    keys = ["a", "b", "a", "b", "a"]
    buckets = assign_buckets([4, 4, 4, 4, 4], max_bytes=8, keys=keys)
    assert buckets == [[4, 2], [3, 1], [0]]


def test_no_parameters_gives_no_buckets():
    assert assign_buckets([], max_bytes=10) == []


def test_negative_limit_is_rejected():
    with pytest.raises(ValueError, match="max_bytes"):
        assign_buckets([4], max_bytes=-1)


def test_negative_size_is_rejected():
    with pytest.raises(ValueError, match="non-negative"):
        assign_buckets([4, -4], max_bytes=8)


def test_keys_of_the_wrong_length_are_rejected():
    with pytest.raises(ValueError, match="keys has 1"):
        assign_buckets([4, 4], max_bytes=8, keys=["a"])


def test_forward_walk_fills_greedily_in_registration_order():
    # 2+3 fit under 12, 9 does not join them; 9 alone, then 5+7 = 12.
    assert assign_buckets([2, 3, 9, 5, 7], max_bytes=12, reverse=False) == [[0, 1], [2], [3, 4]]


def test_forward_walk_orders_buckets_by_their_first_parameter():
    keys = ["a", "b", "a", "b", "a"]
    buckets = assign_buckets([4, 4, 4, 4, 4], max_bytes=8, keys=keys, reverse=False)
    assert buckets == [[0, 2], [1, 3], [4]]
    assert assign_buckets([4, 4, 4], max_bytes=None, reverse=False) == [[0, 1, 2]]


def test_last_max_bytes_halves_the_buckets_towards_the_end():
    # From the end: 1, 1, 2, 4 bytes; no bucket holds more than the buckets after it.
    assert assign_buckets([1] * 8, max_bytes=None, last_max_bytes=1) == [
        [7, 6, 5, 4],
        [3, 2],
        [1],
        [0],
    ]


def test_last_max_bytes_shrinks_only_the_tail_of_capped_buckets():
    buckets = assign_buckets([1] * 16, max_bytes=4, last_max_bytes=1)
    assert [len(b) for b in buckets] == [4, 4, 4, 2, 1, 1]


def test_last_max_bytes_counts_what_follows_per_key():
    # Key "b" has 2 bytes in all: its buckets shrink on their own, key "a" keeps one of 6.
    keys = ["b", "a", "a", "a", "b", "a", "a", "a"]
    buckets = assign_buckets([1] * 8, max_bytes=None, keys=keys, last_max_bytes=6)
    assert buckets == [[7, 6, 5, 3, 2, 1], [4, 0]]
    buckets = assign_buckets([1] * 8, max_bytes=None, keys=keys, last_max_bytes=1)
    assert buckets == [[7, 6, 5], [4], [3], [2], [1], [0]]


def test_last_max_bytes_keeps_a_large_parameter_whole():
    assert assign_buckets([10, 1, 1], max_bytes=None, last_max_bytes=1) == [[2, 1], [0]]


def test_negative_last_max_bytes_is_rejected():
    with pytest.raises(ValueError, match="last_max_bytes"):
        assign_buckets([4], max_bytes=8, last_max_bytes=-1)


def test_bucket_bytes_speaks_mib_with_none_for_one_bucket():
    assert bucket_bytes(None) is None
    assert bucket_bytes(0) == 0
    assert bucket_bytes(1.5) == 3 * 2**19
    assert bucket_bytes(DEFAULT_BUCKET_SIZE_MB) == 25 * 2**20


@pytest.mark.parametrize("size", [-1, math.nan, math.inf])
def test_bucket_bytes_rejects_sizes_that_are_not_finite_and_non_negative(size):
    with pytest.raises(ValueError, match="bucket_size_mb"):
        bucket_bytes(size)


@pytest.mark.parametrize("size", ["25", True])
def test_bucket_bytes_rejects_what_is_not_a_number(size):
    with pytest.raises(TypeError, match="bucket_size_mb"):
        bucket_bytes(size)

"""The rank-spawning test helper: results come back, failures surface, hangs time out."""

import pytest
import torch
import torch.distributed as dist
from spawn_ranks import run_ranks


def _all_reduce_rank(rank: int, world_size: int, scale: float) -> torch.Tensor:
    t = torch.full((3,), float(rank + 1)) * scale
    dist.all_reduce(t)
    return t


def _fail_on_rank_one(rank: int, world_size: int) -> None:
    if rank == 1:
        raise RuntimeError("planted failure")


def test_results_come_back_from_every_rank():
    out = run_ranks(_all_reduce_rank, args=(2.5,))
    for t in out:
        torch.testing.assert_close(t, torch.full((3,), 7.5))


def test_an_exception_on_one_rank_is_raised_here():
    with pytest.raises(Exception, match="planted failure"):
        run_ranks(_fail_on_rank_one)

"""Pure pieces of ShardedOptimizer, no process group: broadcast buckets and state-dict sharding."""

import copy

import pytest
import torch

from zero.broadcast import plan_buckets
from zero.state_dict import check_state_dict, shard_state_dict

# Odd sizes, and two dtypes so that the per-dtype split shows.
_SHAPES = [(7, 3), (5,), (11, 2), (1,), (3, 3), (13,)]


def _params() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=g, requires_grad=True) for s in _SHAPES]
    params[3] = params[3].detach().double().requires_grad_()
    return params


_OWNERS = [0, 1, 0, 1, 0, 0]


def test_zero_cap_gives_one_bucket_per_parameter():
    buckets = plan_buckets(_params(), _OWNERS, max_bytes=0)
    assert [len(b.params) for b in buckets] == [1] * len(_SHAPES)


def test_unbounded_cap_gives_one_bucket_per_owner_and_dtype():
    buckets = plan_buckets(_params(), _OWNERS, max_bytes=None)
    assert sorted((b.owner, str(b.params[0].dtype), len(b.params)) for b in buckets) == sorted(
        [(0, "torch.float32", 4), (1, "torch.float32", 1), (1, "torch.float64", 1)]
    )


@pytest.mark.parametrize("cap", [12, 40, 100])
def test_buckets_respect_the_cap_unless_a_parameter_alone_exceeds_it(cap: int):
    for bucket in plan_buckets(_params(), _OWNERS, max_bytes=cap):
        nbytes = sum(p.numel() * p.element_size() for p in bucket.params)
        assert nbytes <= cap or len(bucket.params) == 1


@pytest.mark.parametrize("cap", [0, 40, None])
def test_every_parameter_lands_once_with_its_owner_in_order(cap: int | None):
    params = _params()
    buckets = plan_buckets(params, _OWNERS, max_bytes=cap)
    placed = [(id(p), b.owner) for b in buckets for p in b.params]
    assert sorted(placed) == sorted((id(p), o) for p, o in zip(params, _OWNERS, strict=True))
    position = {id(p): i for i, p in enumerate(params)}
    for bucket in buckets:
        indices = [position[id(p)] for p in bucket.params]
        assert indices == sorted(indices)
        assert len({p.dtype for p in bucket.params}) == 1


def test_plan_rejects_bad_arguments():
    with pytest.raises(ValueError, match="owners"):
        plan_buckets(_params(), [0, 1], max_bytes=0)
    with pytest.raises(ValueError, match="max_bytes"):
        plan_buckets(_params(), _OWNERS, max_bytes=-1)


def _stepped_adamw(named: bool) -> tuple[torch.optim.AdamW, list[list[torch.Tensor]]]:
    """An AdamW over two groups of random parameters, after two steps on random gradients."""
    params = [p.detach().float().requires_grad_() for p in _params()]
    groups = [params[:4], params[4:]]
    if named:
        spec = [
            {"params": [(f"g{i}.p{j}", p) for j, p in enumerate(g)], "lr": 0.1 * (i + 1)}
            for i, g in enumerate(groups)
        ]
    else:
        spec = [{"params": g, "lr": 0.1 * (i + 1)} for i, g in enumerate(groups)]
    optimizer = torch.optim.AdamW(spec, weight_decay=0.05)
    gen = torch.Generator().manual_seed(1)
    for _ in range(2):
        for p in params[:-1]:  # the last parameter never gets a gradient, so it has no state
            p.grad = torch.randn(p.shape, generator=gen)
        optimizer.step()
    return optimizer, groups


_GROUP_OWNERS = [[0, 1, 1, 0], [1, 0]]


@pytest.mark.parametrize("rank", [0, 1])
def test_shard_loads_into_an_optimizer_over_the_owned_parameters(rank: int):
    full, groups = _stepped_adamw(named=False)
    mine = [
        [p for p, o in zip(g, owners, strict=True) if o == rank]
        for g, owners in zip(groups, _GROUP_OWNERS, strict=True)
    ]
    local = torch.optim.AdamW([{"params": ps} for ps in mine])
    local.load_state_dict(shard_state_dict(copy.deepcopy(full.state_dict()), _GROUP_OWNERS, rank))

    assert [g["lr"] for g in local.param_groups] == [g["lr"] for g in full.param_groups]
    assert local.param_groups[0]["weight_decay"] == 0.05
    owned = [p for ps in mine for p in ps]
    assert set(local.state) == {p for p in owned if p in full.state}
    for p in local.state:
        for name, value in full.state[p].items():
            torch.testing.assert_close(local.state[p][name], value, rtol=0, atol=0)


def test_shard_keeps_the_owned_parameter_names():
    full, _ = _stepped_adamw(named=True)
    shard = shard_state_dict(full.state_dict(), _GROUP_OWNERS, 1)
    assert [g["param_names"] for g in shard["param_groups"]] == [["g0.p1", "g0.p2"], ["g1.p0"]]
    assert [g["params"] for g in shard["param_groups"]] == [[0, 1], [2]]


def test_check_state_dict_accepts_matching_groups():
    full, _ = _stepped_adamw(named=False)
    check_state_dict(full.state_dict(), [4, 2])


@pytest.mark.parametrize(
    ("state_dict", "sizes", "match"),
    [
        ({"state": {}}, [4, 2], "param_groups"),
        ([1, 2], [4, 2], "param_groups"),
        ({"state": {}, "param_groups": [{"params": [0, 1, 2, 3]}]}, [4, 2], r"sizes \[4\]"),
        ({"state": {}, "param_groups": [{"params": [0]}, {"params": [1]}]}, [4, 2], "same"),
    ],
)
def test_check_state_dict_rejects_mismatches(state_dict, sizes, match):
    with pytest.raises(ValueError, match=match):
        check_state_dict(state_dict, sizes)

"""ShardedOptimizer on real process groups (gloo, 2 and 3 ranks; NCCL on 2 GPUs).

Every rank trains on the same full batch, so gradients are identical everywhere and the sharded
run must equal plain AdamW on one process bit for bit (on the CPU). Each spawned run does several
things, each checked by its own test below; the reference runs inside the same process as the
sharded run so that both see the same kernels and thread settings.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from spawn_ranks import run_ranks
from torch import nn

from zero import DEFAULT_BUCKET_SIZE_MB, ShardedOptimizer

VOCAB, DIM, HIDDEN = 13, 6, 7  # odd sizes: nothing divides evenly
BATCH, SEQ = 3, 5
STEPS = 6
ADD_AT = 2  # the adapter's parameter group joins at this step
HALVE_AT = 3  # group 1's lr is halved by hand at this step
RESUME_AT = 4  # checkpoint taken before this step; resumed runs start here
OPTIONS = {"lr": 1e-2, "betas": (0.9, 0.95), "weight_decay": 0.01}
# 0: one broadcast per parameter; 2e-4 MB (~200 bytes): a few parameters per bucket; None: one
# bucket per owner; the default: each owner's whole shard in one bucket at these sizes too.
BUCKET_SIZES_MB = (0.0, 2e-4, None, DEFAULT_BUCKET_SIZE_MB)


class _Net(nn.Module):
    """Tied embedding/head, a frozen layer, a layer used on even steps only, a late adapter."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.body = nn.Linear(DIM, HIDDEN)
        self.side = nn.Linear(HIDDEN, DIM)
        self.frozen = nn.Linear(HIDDEN, DIM).requires_grad_(False)
        self.mix = nn.Parameter(torch.randn(DIM, DIM).t())  # a non-contiguous parameter
        self.adapter = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor, *, use_side: bool, use_adapter: bool) -> torch.Tensor:
        h = torch.tanh(self.body(self.embed(tokens)))  # (batch, seq, HIDDEN)
        out = self.frozen(h) @ self.mix  # (batch, seq, DIM)
        if use_side:
            out = out + self.side(h)
        if use_adapter:
            out = out + self.adapter(out)
        return self.head(out)  # (batch, seq, VOCAB)


def _net(device: torch.device) -> _Net:
    torch.manual_seed(0)  # the same initial weights on every rank and in the reference
    return _Net().to(device)


def _groups(net: _Net) -> list[dict[str, Any]]:
    return [
        {"params": [net.embed.weight, net.body.weight, net.body.bias, net.mix], "lr": 2e-2},
        {"params": [*net.side.parameters(), *net.frozen.parameters()], "lr": 5e-2},
    ]


def _adapter_group(net: _Net) -> dict[str, Any]:
    return {"params": list(net.adapter.parameters()), "lr": 5e-3, "weight_decay": 0.1}


def _batches(device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        tuple(torch.randint(VOCAB, (BATCH, SEQ), generator=g).to(device) for _ in range(2))
        for _ in range(STEPS)
    ]


def _train(net: _Net, optimizer, scheduler, batches, steps: range) -> None:
    for step in steps:
        if step == ADD_AT:
            optimizer.add_param_group(_adapter_group(net))
        if step == HALVE_AT:
            optimizer.param_groups[1]["lr"] *= 0.5
        optimizer.zero_grad()
        tokens, targets = batches[step]
        logits = net(tokens, use_side=step % 2 == 0, use_adapter=step >= ADD_AT)
        F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
        optimizer.step()
        scheduler.step()


def _scheduler(optimizer) -> torch.optim.lr_scheduler.StepLR:
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)


def _cpu(obj: Any) -> Any:
    """A deep copy of ``obj`` with every tensor on the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_cpu(v) for v in obj)
    return copy.deepcopy(obj)


def _params(net: nn.Module) -> list[torch.Tensor]:
    return [p.detach().cpu().clone() for p in net.parameters()]


def _state_numel(optimizer: torch.optim.Optimizer) -> int:
    """Elements of the per-parameter state tensors (AdamW's moments; scalar steps excluded)."""
    return sum(v.numel() for s in optimizer.state.values() for v in s.values() if v.dim() > 0)


def _device(rank: int, device_type: str) -> torch.device:
    return torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")


def _error(fn) -> str | None:
    try:
        fn()
    except ValueError as e:
        return str(e)
    return None


def _resume(device, checkpoint, batches) -> list[torch.Tensor]:
    """A fresh model and ShardedOptimizer restored from ``checkpoint``, trained to the end."""
    net = _net(device)
    net.load_state_dict(checkpoint["model"])
    optimizer = ShardedOptimizer(_groups(net), torch.optim.AdamW, **OPTIONS)
    optimizer.add_param_group(_adapter_group(net))  # it had joined before RESUME_AT
    scheduler = _scheduler(optimizer)
    scheduler.load_state_dict(checkpoint["scheduler"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    _train(net, optimizer, scheduler, batches, range(RESUME_AT, STEPS))
    return _params(net)


def _reference(device, batches) -> dict[str, Any]:
    net = _net(device)
    optimizer = torch.optim.AdamW(_groups(net), **OPTIONS)
    scheduler = _scheduler(optimizer)
    _train(net, optimizer, scheduler, batches, range(RESUME_AT))
    state_dict = _cpu(optimizer.state_dict())
    _train(net, optimizer, scheduler, batches, range(RESUME_AT, STEPS))
    return {
        "params": _params(net),
        "state_dict": state_dict,
        "state_numel": _state_numel(optimizer),
        "options": [
            _cpu({k: v for k, v in g.items() if k != "params"}) for g in optimizer.param_groups
        ],
    }


class _Picky(torch.optim.SGD):
    """SGD that refuses the state of another kind of optimizer, as `lmcore.AdamW` does."""

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        for entry in state_dict["state"].values():
            if set(entry) != {"momentum_buffer"}:
                raise ValueError(f"not an SGD state: {sorted(entry)}")


def _refused_in_one_shard(device: torch.device) -> dict[str, Any]:
    """A consolidated state whose one foreign entry lies in rank 1's shard, loaded on every
    rank: what each rank raised, and whether it loaded anything."""
    torch.manual_seed(2)
    params = [nn.Parameter(torch.randn(n, device=device)) for n in (5, 4, 3)]
    optimizer = ShardedOptimizer(params, _Picky, lr=0.1, momentum=0.9)
    theirs = optimizer._owners[0].index(1)  # a parameter of rank 1's shard
    state = {i: {"momentum_buffer": torch.ones_like(p)} for i, p in enumerate(params)}
    state[theirs] = {"exp_avg": torch.ones_like(params[theirs])}
    group = {**optimizer.param_groups[0], "params": list(range(len(params)))}
    saved = {"state": state, "param_groups": [group]}
    return {
        "error": _error(lambda: optimizer.load_state_dict(saved)),
        "loaded": bool(optimizer.local_optimizer.state),
    }


def _two_rank_worker(rank: int, world_size: int, device_type: str) -> dict[str, Any]:
    device = _device(rank, device_type)
    batches = _batches(device)
    out: dict[str, Any] = {"reference": _reference(device, batches), "params": {}}

    for bucket_size_mb in BUCKET_SIZES_MB:
        net = _net(device)
        optimizer = ShardedOptimizer(
            _groups(net), torch.optim.AdamW, bucket_size_mb=bucket_size_mb, **OPTIONS
        )
        scheduler = _scheduler(optimizer)
        _train(net, optimizer, scheduler, batches, range(RESUME_AT))
        checkpoint = {
            "model": _cpu(net.state_dict()),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
        }
        _train(net, optimizer, scheduler, batches, range(RESUME_AT, STEPS))
        out["params"][bucket_size_mb] = _params(net)

    index = {p: i for i, p in enumerate(net.parameters())}
    out["owned"] = sorted(
        index[p] for g in optimizer.local_optimizer.param_groups for p in g["params"]
    )
    out["with_state"] = sorted(index[p] for p in optimizer.local_optimizer.state)
    out["state_numel"] = _state_numel(optimizer.local_optimizer)
    out["state_is_local"] = optimizer.state is optimizer.local_optimizer.state
    out["options"] = [
        _cpu({k: v for k, v in g.items() if k != "params"}) for g in optimizer.param_groups
    ]
    # loading aliases the dict's CPU tensors (as Optimizer.load_state_dict does): keep a copy
    out["checkpoint"] = _cpu(checkpoint)
    out["resumed"] = _resume(device, checkpoint, batches)

    for p in net.parameters():
        p.grad = torch.randn_like(p)
    optimizer.zero_grad(set_to_none=False)
    out["all_grads_zeroed"] = all(p.grad is not None and not p.grad.any() for p in net.parameters())
    out["closure_loss"] = optimizer.step(closure=lambda: torch.tensor(2.5))

    shape = (3, 2) if rank == 0 else (2, 3)
    out["mismatch_error"] = _error(
        lambda: ShardedOptimizer(
            [torch.randn(shape, device=device, requires_grad=True)], torch.optim.AdamW
        )
    )
    w = torch.randn(4, requires_grad=True, device=device)
    out["duplicate_error"] = _error(lambda: ShardedOptimizer([w, w], torch.optim.AdamW))
    out["frozen_heavy_state_numel"] = _frozen_heavy_state_numel(device)
    out["refused_in_one_shard"] = _refused_in_one_shard(device)
    return out


def _frozen_heavy_state_numel(device: torch.device) -> int:
    """This rank's AdamW state after one step of a model dominated by a frozen embedding."""
    torch.manual_seed(1)
    frozen = nn.Embedding(300, 10).requires_grad_(False).to(device)  # 3,000 frozen elements
    trainable = [nn.Linear(10, 10).to(device) for _ in range(3)]  # 330 trainable elements
    params = [*frozen.parameters(), *(p for layer in trainable for p in layer.parameters())]
    optimizer = ShardedOptimizer(params, torch.optim.AdamW, **OPTIONS)
    for p in params:
        if p.requires_grad:
            p.grad = torch.randn_like(p)
    optimizer.step()
    return _state_numel(optimizer.local_optimizer)


def _three_rank_worker(rank: int, world_size: int, checkpoint: dict[str, Any]) -> dict[str, Any]:
    device = torch.device("cpu")
    batches = _batches(device)
    out: dict[str, Any] = {"reference": _reference(device, batches)}

    net = _net(device)
    optimizer = ShardedOptimizer(_groups(net), torch.optim.AdamW, **OPTIONS)
    _train(net, optimizer, _scheduler(optimizer), batches, range(STEPS))
    out["params"] = _params(net)
    out["shard_numel"] = sum(
        p.numel() for g in optimizer.local_optimizer.param_groups for p in g["params"]
    )
    out["resumed_from_two_ranks"] = _resume(device, checkpoint, batches)

    lone = nn.Parameter(torch.randn(5))  # one parameter, three ranks: two own nothing
    before = lone.detach().clone()
    solo = ShardedOptimizer([lone], torch.optim.SGD, lr=0.5)
    lone.grad = torch.ones_like(lone)  # the same gradient everywhere
    solo.step()
    out["lone_step"] = torch.equal(lone.detach(), before - 0.5)
    return out


@pytest.fixture(scope="module")
def two_ranks() -> list[dict[str, Any]]:
    return run_ranks(_two_rank_worker, world_size=2, args=("cpu",))


@pytest.fixture(scope="module")
def three_ranks(two_ranks) -> list[dict[str, Any]]:
    return run_ranks(_three_rank_worker, world_size=3, args=(two_ranks[0]["checkpoint"],))


def _assert_same(actual: list[torch.Tensor], expected: list[torch.Tensor], **tol: float) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, **(tol or {"rtol": 0.0, "atol": 0.0}))


@pytest.mark.parametrize("bucket_size_mb", BUCKET_SIZES_MB)
def test_training_equals_unsharded_adamw(two_ranks, bucket_size_mb: float | None):
    for out in two_ranks:
        _assert_same(out["params"][bucket_size_mb], out["reference"]["params"])


def test_local_state_covers_only_the_owned_shard(two_ranks):
    owned = [set(out["owned"]) for out in two_ranks]
    assert owned[0].isdisjoint(owned[1])
    for out in two_ranks:
        assert set(out["with_state"]) <= set(out["owned"])
        assert out["state_is_local"]


def test_local_state_is_about_half_of_the_whole(two_ranks):
    total = two_ranks[0]["reference"]["state_numel"]
    assert sum(out["state_numel"] for out in two_ranks) == total
    for out in two_ranks:
        assert 0.35 * total <= out["state_numel"] <= 0.65 * total  # a tiny model splits coarsely


def test_frozen_parameters_do_not_unbalance_the_state(two_ranks):
    numels = [out["frozen_heavy_state_numel"] for out in two_ranks]
    assert sum(numels) == 2 * 330  # two moments per trainable element
    # LPT over the trainable tensors (100, 100, 100, 10, 10, 10): 200 and 130 elements
    assert sorted(numels) == [2 * 130, 2 * 200]


def test_param_groups_carry_the_inner_optimizer_options(two_ranks):
    for out in two_ranks:
        assert out["options"] == out["reference"]["options"]


def test_state_dict_is_the_unsharded_optimizer_state_dict(two_ranks):
    for out in two_ranks:
        sharded, reference = out["checkpoint"]["optimizer"], out["reference"]["state_dict"]
        assert sharded["param_groups"] == reference["param_groups"]
        assert sharded["state"].keys() == reference["state"].keys()
        for index, state in reference["state"].items():
            assert sharded["state"][index].keys() == state.keys()
            _assert_same(list(sharded["state"][index].values()), list(state.values()))


def test_resume_from_state_dict_is_exact(two_ranks):
    for out in two_ranks:
        _assert_same(out["resumed"], out["reference"]["params"])


def test_zero_grad_clears_every_parameter(two_ranks):
    assert all(out["all_grads_zeroed"] for out in two_ranks)


def test_step_returns_the_closure_loss(two_ranks):
    for out in two_ranks:
        torch.testing.assert_close(out["closure_loss"], torch.tensor(2.5))


def test_ranks_with_different_parameters_raise(two_ranks):
    for out in two_ranks:
        assert "differs between rank 0 and rank 1" in out["mismatch_error"]


def test_repeated_parameter_raises(two_ranks):
    for out in two_ranks:
        assert "appears twice" in out["duplicate_error"]


def test_a_shard_refused_on_one_rank_is_refused_on_every_rank(two_ranks):
    # The inner optimizer of rank 1 refuses its shard; rank 0's would load its own. Either
    # every rank loads or none does, each saying why.
    rank0, rank1 = (out["refused_in_one_shard"] for out in two_ranks)
    assert rank1["error"] == "not an SGD state: ['exp_avg']"
    assert rank0["error"] == "rank 1 refuses its shard: not an SGD state: ['exp_avg']"
    assert not rank0["loaded"] and not rank1["loaded"]


def test_three_ranks_uneven_split_equals_unsharded_adamw(three_ranks):
    for out in three_ranks:
        _assert_same(out["params"], out["reference"]["params"])


def test_three_ranks_shards_are_balanced(three_ranks):
    numels = [p.numel() for p in three_ranks[0]["params"]]
    shards = [out["shard_numel"] for out in three_ranks]
    assert sum(shards) == sum(numels)
    assert max(shards) - min(shards) <= max(numels)


def test_two_rank_checkpoint_resumes_on_three_ranks(three_ranks):
    for out in three_ranks:
        _assert_same(out["resumed_from_two_ranks"], out["reference"]["params"])


def test_ranks_owning_nothing_still_step(three_ranks):
    assert all(out["lone_step"] for out in three_ranks)


def test_needs_an_initialised_process_group():
    with pytest.raises(RuntimeError, match="init_process_group"):
        ShardedOptimizer([torch.randn(3, requires_grad=True)], torch.optim.AdamW)


@pytest.mark.parametrize("optimizer_cls", ["AdamW", torch.optim.AdamW.step, ShardedOptimizer])
def test_rejects_what_is_not_an_optimizer_class(optimizer_cls):
    with pytest.raises(TypeError, match="optimizer_cls"):
        ShardedOptimizer([torch.randn(3, requires_grad=True)], optimizer_cls)


@pytest.mark.parametrize("bucket_size_mb", [-1.0, math.nan, math.inf])
def test_rejects_a_negative_or_infinite_bucket_size(bucket_size_mb: float | None):
    with pytest.raises(ValueError, match="bucket_size_mb"):
        ShardedOptimizer(
            [torch.randn(3, requires_grad=True)], torch.optim.AdamW, bucket_size_mb=bucket_size_mb
        )


@pytest.mark.gpu
def test_nccl_training_equals_unsharded_adamw():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    outs = run_ranks(_two_rank_worker, world_size=2, backend="nccl", args=("cuda",))
    # fp32 on the GPU: the same kernels run on the whole model and on a shard, but reductions in
    # cuBLAS may tile differently; allow a few ulps of fp32.
    tol = {"rtol": 1e-5, "atol": 1e-6}
    for out in outs:
        for bucket_size_mb in BUCKET_SIZES_MB:
            _assert_same(out["params"][bucket_size_mb], out["reference"]["params"], **tol)
        _assert_same(out["resumed"], out["reference"]["params"], **tol)
        assert "differs" in out["mismatch_error"]

"""Every wrapper trains exactly like one process: 2 ranks on disjoint halves of each batch match
one process on the whole batch, parameter for parameter.

Each wrapper configuration is run once in spawned ranks (gloo on the CPU; nccl on 2 GPUs), which
play every scenario and return what they saw; the tests below check one behaviour each against
a single-process reference that every rank computes itself, from rank 0's seed, on the full
batch. Models are float64 where the comparison is exact up to summation order.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from spawn_ranks import run_ranks
from torch import nn

from ddp import DDPBucketed, DDPIndividualParameters, FlatDDP, NaiveDDP, assign_buckets

WORLD_SIZE = 2
LOCAL_BATCH, SEQ = 3, 5  # odd on purpose
VOCAB, DIM, HIDDEN = 13, 7, 9
# Whether each rank runs the optional branch, step by step: both, neither (unused everywhere),
# rank 0 only (unused on one rank), both again.
BRANCH_SCHEDULE = [(True, True), (False, False), (True, False), (True, True)]
# Micro-batches of the local batch for gradient accumulation (uneven on purpose), and whether
# each runs the branch: only the first, inside no_sync(), so the branch's gradient exists but its
# hook does not fire in the synchronised backward.
MICRO_BATCHES = [(slice(0, 2), True), (slice(2, 3), False)]
# 200 bytes gives the float64 test model a mix of shared and single-parameter buckets.
MIXED_BUCKET_MB = 200 / 2**20
BUCKET_MB = {"bucketed-one": None, "bucketed-each": 0, "bucketed-mixed": MIXED_BUCKET_MB}
WRAPPERS = ["naive", "flat", "individual", *BUCKET_MB]
OVERLAPPED = ["individual", *BUCKET_MB]
# Unit roundoff of bfloat16 (8 significant bits).
BF16_U = 2.0**-8


class _Net(nn.Module):
    """Embedding tied to the LM head, a frozen layer, BatchNorm buffers and an optional branch."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.fc1 = nn.Linear(DIM, HIDDEN)
        self.norm = nn.BatchNorm1d(HIDDEN).eval()  # normalises with its running-stat buffers
        self.frozen = nn.Linear(HIDDEN, HIDDEN).requires_grad_(False)
        self.branch = nn.Linear(HIDDEN, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor, use_branch: bool = True) -> torch.Tensor:
        h = torch.relu(self.fc1(self.embed(tokens)))  # (batch, seq, hidden)
        h = self.norm(h.transpose(1, 2)).transpose(1, 2)  # BatchNorm1d wants (batch, hidden, seq)
        h = torch.tanh(self.frozen(h))
        if use_branch:
            h = h + torch.tanh(self.branch(h))
        return self.head(self.fc2(h))  # (batch, seq, vocab)


def _build(seed: int, dtype: torch.dtype, device: torch.device) -> _Net:
    torch.manual_seed(seed)
    model = _Net()
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)
        model.norm.bias.normal_(std=0.1)
        model.norm.running_mean.normal_()
        model.norm.running_var.uniform_(0.5, 2.0)
    return model.to(dtype=dtype, device=device)


def _wrap(name: str, module: nn.Module, **options: Any) -> nn.Module:
    if name in BUCKET_MB:
        return DDPBucketed(module, BUCKET_MB[name], **options)
    wrapper = {"naive": NaiveDDP, "flat": FlatDDP, "individual": DDPIndividualParameters}[name]
    return wrapper(module, **options)


def _batch(step: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The full batch of a step, identical on every rank: (tokens, targets), each (batch, seq)."""
    g = torch.Generator().manual_seed(1000 + step)
    shape = (WORLD_SIZE * LOCAL_BATCH, SEQ)
    tokens = torch.randint(VOCAB, shape, generator=g)
    targets = torch.randint(VOCAB, shape, generator=g)
    return tokens.to(device), targets.to(device)


def _shard(t: torch.Tensor, rank: int) -> torch.Tensor:
    return t[rank * LOCAL_BATCH : (rank + 1) * LOCAL_BATCH]


def _loss(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor, use_branch: bool):
    logits = model(tokens, use_branch)  # (batch, seq, vocab); autocast runs the loss in fp32
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def _full_batch_loss(model: nn.Module, step: int, flags: tuple[bool, ...], device: torch.device):
    """What the ranks compute together: the mean of their shards' losses (equal shards)."""
    tokens, targets = _batch(step, device)
    losses = [
        _loss(model, _shard(tokens, r), _shard(targets, r), flags[r]) for r in range(WORLD_SIZE)
    ]
    return sum(losses) / WORLD_SIZE


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def _grads(model: nn.Module) -> dict[str, torch.Tensor | None]:
    return {
        name: None if p.grad is None else p.grad.detach().cpu().clone()
        for name, p in model.named_parameters()
    }


def _train(name, rank, device, *, unused_grads, make_optimizer, set_to_none) -> dict[str, Any]:
    """Train through BRANCH_SCHEDULE, wrapped on this rank's shard and as one process."""
    model = _wrap(name, _build(rank, torch.float64, device), unused_grads=unused_grads)
    reference = _build(0, torch.float64, device)
    optimizer, ref_optimizer = make_optimizer(model), make_optimizer(reference)
    branch_grads = []
    for step, flags in enumerate(BRANCH_SCHEDULE):
        tokens, targets = _batch(step, device)
        model.on_train_batch_start()
        optimizer.zero_grad(set_to_none=set_to_none)
        _loss(model, _shard(tokens, rank), _shard(targets, rank), flags[rank]).backward()
        model.finish_gradient_synchronization()
        branch_grads.append(_grads(model.module)["branch.weight"])
        optimizer.step()
        ref_optimizer.zero_grad(set_to_none=set_to_none)
        _full_batch_loss(reference, step, flags, device).backward()
        ref_optimizer.step()
    return {"state": _state(model.module), "ref": _state(reference), "branch_grads": branch_grads}


def _adamw(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1)


def _broadcast(name: str, rank: int, device: torch.device) -> dict[str, Any]:
    module = _build(rank, torch.float64, device)
    before = _state(module)
    return {"before": before, "after": _state(_wrap(name, module).module)}


def _accumulate(name: str, rank: int, device: torch.device) -> dict[str, Any]:
    """Two steps of micro-batch accumulation with no_sync(), wrapped and as one process."""
    model = _wrap(name, _build(rank, torch.float64, device), record_comm_stats=True)
    reference = _build(0, torch.float64, device)
    optimizer, ref_optimizer = _adamw(model), _adamw(reference)
    local_grads, stats = [], []
    for step in range(2):
        tokens, targets = _batch(10 + step, device)
        x, y = _shard(tokens, rank), _shard(targets, rank)
        model.on_train_batch_start()
        optimizer.zero_grad()
        ref_optimizer.zero_grad()
        (first, first_branch), (last, last_branch) = MICRO_BATCHES
        with model.no_sync():
            weight = (first.stop - first.start) / LOCAL_BATCH
            (weight * _loss(model, x[first], y[first], first_branch)).backward()
            model.finish_gradient_synchronization()  # a no-op inside no_sync()
        local_grads.append(_grads(model.module))
        weight = (last.stop - last.start) / LOCAL_BATCH
        (weight * _loss(model, x[last], y[last], last_branch)).backward()
        model.finish_gradient_synchronization()
        stats.append(model.comm_stats)
        optimizer.step()
        for r in range(WORLD_SIZE):
            xr, yr = _shard(tokens, r), _shard(targets, r)
            for micro, use_branch in MICRO_BATCHES:
                weight = (micro.stop - micro.start) / (LOCAL_BATCH * WORLD_SIZE)
                (weight * _loss(reference, xr[micro], yr[micro], use_branch)).backward()
        ref_optimizer.step()
    return {
        "state": _state(model.module),
        "ref": _state(reference),
        "local_grads": local_grads,
        "stats": stats,
    }


def _autocast(name: str, rank: int, device: torch.device) -> dict[str, Any]:
    """One synchronised backward of a float32 model under bf16 autocast."""
    model = _wrap(name, _build(rank, torch.float32, device))
    reference = _build(0, torch.float32, device)
    tokens, targets = _batch(20, device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss = _loss(model, _shard(tokens, rank), _shard(targets, rank), True)
    loss.backward()
    model.finish_gradient_synchronization()
    with torch.autocast(device.type, dtype=torch.bfloat16):
        ref_loss = _full_batch_loss(reference, 20, (True,) * WORLD_SIZE, device)
    ref_loss.backward()
    return {"grads": _grads(model.module), "ref": _grads(reference)}


def _compressed(name: str, rank: int, device: torch.device) -> dict[str, Any]:
    """One backward of a float32 model communicating in bf16, and this rank's local gradients."""
    model = _wrap(name, _build(rank, torch.float32, device), grad_dtype=torch.bfloat16)
    local = _build(0, torch.float32, device)  # what the wrapped model is after the broadcast
    tokens, targets = _batch(30, device)
    x, y = _shard(tokens, rank), _shard(targets, rank)
    _loss(model, x, y, True).backward()
    model.finish_gradient_synchronization()
    _loss(local, x, y, True).backward()
    return {"grads": _grads(model.module), "local": _grads(local)}


def _misuse(name: str, rank: int, device: torch.device) -> dict[str, str | None]:
    """The errors an overlapped wrapper raises when a step is not driven as documented."""
    model = _wrap(name, _build(rank, torch.float64, device))
    tokens, targets = _batch(40, device)
    x, y = _shard(tokens, rank), _shard(targets, rank)
    _loss(model, x, y, True).backward()
    try:
        model.on_train_batch_start()
        before_finish = None
    except RuntimeError as e:
        before_finish = str(e)
    model.finish_gradient_synchronization()
    loss = _loss(model, x, y, True)
    loss.backward(retain_graph=True)
    try:
        loss.backward()
        second_backward = None
    except RuntimeError as e:
        second_backward = str(e)
    model.finish_gradient_synchronization()
    return {"before_finish": before_finish, "second_backward": second_backward}


def _rewrap(name: str, rank: int, device: torch.device) -> dict[str, Any]:
    """Drop a wrapper, wrap the same module again, and take one synchronised backward."""
    module = _build(rank, torch.float64, device)
    first = _wrap(name, module)
    first_ref = weakref.ref(first)
    del first
    model = _wrap(name, module)
    reference = _build(0, torch.float64, device)
    tokens, targets = _batch(50, device)
    _loss(model, _shard(tokens, rank), _shard(targets, rank), True).backward()
    model.finish_gradient_synchronization()
    _full_batch_loss(reference, 50, (True,) * WORLD_SIZE, device).backward()
    return {
        "collected": first_ref() is None,
        "grads": _grads(model.module),
        "ref": _grads(reference),
    }


def _run_wrapper(name: str, rank: int, device: torch.device) -> dict[str, Any]:
    results = {
        "broadcast": _broadcast(name, rank, device),
        "adamw": _train(
            name, rank, device, unused_grads="none", make_optimizer=_adamw, set_to_none=True
        ),
        "sgd": _train(
            name, rank, device, unused_grads="zeros", make_optimizer=_sgd, set_to_none=False
        ),
        "accumulate": _accumulate(name, rank, device),
        "autocast": _autocast(name, rank, device),
        "compressed": _compressed(name, rank, device),
    }
    if name in OVERLAPPED:
        results["misuse"] = _misuse(name, rank, device)
        results["rewrap"] = _rewrap(name, rank, device)
    return results


def _run_all(rank: int, world_size: int, device_type: str) -> dict[str, dict[str, Any]]:
    # Every wrapper in one set of processes: starting ranks costs far more than the scenarios.
    assert world_size == WORLD_SIZE
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    return {name: _run_wrapper(name, rank, device) for name in WRAPPERS}


@functools.cache
def _all_results(backend: str) -> list[dict[str, dict[str, Any]]]:
    device_type = "cuda" if backend == "nccl" else "cpu"
    return run_ranks(_run_all, world_size=WORLD_SIZE, backend=backend, args=(device_type,))


def _results(name: str, backend: str = "gloo") -> list[dict[str, Any]]:
    """Per rank, what the scenarios of wrapper `name` returned."""
    return [rank_results[name] for rank_results in _all_results(backend)]


def _expected_collectives(name: str) -> int:
    """Collectives of one synchronised step of the test model (float64, 9 trainable tensors)."""
    sizes = [p.numel() * 8 for p in _Net().parameters() if p.requires_grad]
    if name == "flat":
        return 1
    if name in BUCKET_MB:
        limit = BUCKET_MB[name]
        max_bytes = None if limit is None else int(limit * 2**20)
        return len(assign_buckets(sizes, max_bytes=max_bytes))
    return len(sizes)


def _assert_same_state(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], msg=lambda m, k=key: f"{k}: {m}")


def _assert_compression_bound(results: list[dict[str, Any]]) -> None:
    """Every averaged element is within n * u * mean_r |g_r| of the exact average (see docs)."""
    for name, grad in results[0]["grads"].items():
        if grad is None:
            continue
        local = torch.stack([r["local"][name].double() for r in results])
        exact = local.mean(0)
        bound = WORLD_SIZE * BF16_U * (1 + BF16_U) * local.abs().mean(0)
        assert ((grad.double() - exact).abs() <= bound).all(), name


@pytest.mark.parametrize("name", WRAPPERS)
def test_construction_gives_every_rank_rank0s_parameters_and_buffers(name):
    results = _results(name)
    rank0, rank1 = (r["broadcast"] for r in results)
    assert not torch.equal(rank0["before"]["fc1.weight"], rank1["before"]["fc1.weight"])
    assert not torch.equal(
        rank0["before"]["norm.running_mean"], rank1["before"]["norm.running_mean"]
    )
    _assert_same_state(rank0["after"], rank0["before"])
    _assert_same_state(rank1["after"], rank0["before"])


@pytest.mark.parametrize("name", WRAPPERS)
def test_adamw_on_halves_matches_one_process_on_the_full_batch(name):
    for rank_result in _results(name):
        _assert_same_state(rank_result["adamw"]["state"], rank_result["adamw"]["ref"])


@pytest.mark.parametrize("name", WRAPPERS)
def test_unused_grads_none_leaves_none_only_where_no_rank_had_a_gradient(name):
    for rank_result in _results(name):
        used_somewhere = [any(flags) for flags in BRANCH_SCHEDULE]
        got = [g is not None for g in rank_result["adamw"]["branch_grads"]]
        assert got == used_somewhere


@pytest.mark.parametrize("name", WRAPPERS)
def test_sgd_with_in_place_zeroing_matches_one_process(name):
    for rank_result in _results(name):
        _assert_same_state(rank_result["sgd"]["state"], rank_result["sgd"]["ref"])


@pytest.mark.parametrize("name", WRAPPERS)
def test_unused_grads_zeros_gives_zero_gradients_on_every_rank(name):
    unused_step = BRANCH_SCHEDULE.index((False, False))
    for rank_result in _results(name):
        grad = rank_result["sgd"]["branch_grads"][unused_step]
        assert grad is not None
        assert torch.count_nonzero(grad) == 0


@pytest.mark.parametrize("name", WRAPPERS)
def test_no_sync_accumulation_matches_one_process(name):
    for rank_result in _results(name):
        _assert_same_state(rank_result["accumulate"]["state"], rank_result["accumulate"]["ref"])


@pytest.mark.parametrize("name", WRAPPERS)
def test_no_sync_keeps_gradients_local(name):
    rank0, rank1 = (r["accumulate"]["local_grads"][0] for r in _results(name))
    assert not torch.allclose(rank0["fc1.weight"], rank1["fc1.weight"])


@pytest.mark.parametrize("name", WRAPPERS)
def test_comm_stats_count_one_step_of_collectives_and_bytes(name):
    expected_bytes = sum(p.numel() * 8 for p in _Net().parameters() if p.requires_grad)
    for rank_result in _results(name):
        for stats in rank_result["accumulate"]["stats"]:
            assert stats.num_collectives == _expected_collectives(name)
            assert stats.num_bytes == expected_bytes
            assert stats.wait_ms >= 0.0
            assert stats.comm_ms is None  # gloo does not time its collectives


@pytest.mark.parametrize("name", WRAPPERS)
def test_bf16_autocast_matches_one_process_within_bf16_rounding(name):
    # Shards round their bf16 partial sums separately: allow a few bf16 units of the scale.
    for rank_result in _results(name):
        for key, ref in rank_result["autocast"]["ref"].items():
            got = rank_result["autocast"]["grads"][key]
            assert (got is None) == (ref is None), key
            if ref is not None:
                tol = 4 * BF16_U
                torch.testing.assert_close(got, ref, rtol=tol, atol=tol * ref.abs().max().item())


@pytest.mark.parametrize("name", WRAPPERS)
def test_bf16_compression_rounds_exactly_as_documented(name):
    # Each rank's gradient is divided by 2 and rounded to bf16 once, the two are added in bf16.
    results = _results(name)
    for key, grad in results[0]["compressed"]["grads"].items():
        if grad is None:
            continue
        g0, g1 = (r["compressed"]["local"][key] for r in results)
        expected = ((g0 / 2).bfloat16() + (g1 / 2).bfloat16()).float()
        for rank_result in results:
            assert torch.equal(rank_result["compressed"]["grads"][key], expected), key


@pytest.mark.parametrize("name", WRAPPERS)
def test_bf16_compression_error_is_within_the_documented_bound(name):
    _assert_compression_bound([r["compressed"] for r in _results(name)])


def test_mixed_bucket_size_gives_shared_and_single_buckets():
    assert 1 < _expected_collectives("bucketed-mixed") < _expected_collectives("bucketed-each")


@pytest.mark.parametrize("name", OVERLAPPED)
def test_starting_a_batch_before_finishing_the_last_raises(name):
    for rank_result in _results(name):
        assert "finish_gradient_synchronization" in rank_result["misuse"]["before_finish"]


@pytest.mark.parametrize("name", OVERLAPPED)
def test_second_backward_in_one_step_raises(name):
    for rank_result in _results(name):
        assert "no_sync" in rank_result["misuse"]["second_backward"]


@pytest.mark.parametrize("name", OVERLAPPED)
def test_dropped_wrapper_is_collected_and_its_hooks_stop(name):
    for rank_result in _results(name):
        assert rank_result["rewrap"]["collected"]
        for key, ref in rank_result["rewrap"]["ref"].items():
            got = rank_result["rewrap"]["grads"][key]
            assert (got is None) == (ref is None), key
            if ref is not None:
                torch.testing.assert_close(got, ref)


two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")


@pytest.mark.gpu
@two_gpus
@pytest.mark.parametrize("name", WRAPPERS)
def test_nccl_trains_like_one_process(name):
    results = _results(name, "nccl")
    for rank_result in results:
        _assert_same_state(rank_result["broadcast"]["after"], results[0]["broadcast"]["before"])
        for scenario in ("adamw", "sgd", "accumulate"):
            _assert_same_state(rank_result[scenario]["state"], rank_result[scenario]["ref"])
    _assert_compression_bound([r["compressed"] for r in results])

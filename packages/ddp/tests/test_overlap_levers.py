"""The levers for overlap change when gradients travel, never what arrives: shrinking last buckets,
a per-bucket optimizer step from `register_reduced_hook`, and a `comm_group` of its own train
exactly like `DDPBucketed` without them and like torch's DistributedDataParallel.

Every scenario runs in one pair of gloo ranks (starting ranks costs more than the scenarios);
models are float64, whose sums of two ranks' halves are exact, so results are compared for
equality. A GPU test repeats the `comm_group` scenario on NCCL with every NCCL option set.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from spawn_ranks import run_ranks
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp import DDPBucketed, DDPIndividualParameters, comm_group

WORLD_SIZE = 2
VOCAB, DIM, HIDDEN, NUM_BLOCKS = 11, 6, 10, 3
LOCAL_BATCH, SEQ = 3, 5  # odd on purpose
NUM_STEPS = 3
# float64 bytes: an embedding of 528, blocks of 48 + 480 + 480, a head of 528. 1200 bytes per
# bucket holds about two blocks; shrinking to 100 bytes splits the last blocks' tensors apart.
BUCKET_MB = 1200 / 2**20
LAST_BUCKET_MB = 100 / 2**20


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(DIM))
        self.up = nn.Linear(DIM, HIDDEN, bias=False)
        self.down = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x * self.scale)))


class _LM(nn.Module):
    """A language model's registration order: embedding first, blocks, head last."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(_Block() for _ in range(NUM_BLOCKS))
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)  # (batch, seq, dim)
        for block in self.blocks:
            h = block(h)
        return self.head(h)  # (batch, seq, vocab)


def _build(seed: int) -> _LM:
    torch.manual_seed(seed)
    return _LM().double()


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's half of the step's batch: (tokens, targets), each (batch, seq)."""
    g = torch.Generator().manual_seed(100 + step)
    tokens, targets = torch.randint(VOCAB, (2, WORLD_SIZE * LOCAL_BATCH, SEQ), generator=g)
    rows = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
    return tokens[rows], targets[rows]


def _loss(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(tokens).reshape(-1, VOCAB), targets.reshape(-1))


def _adamw(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=0.05, weight_decay=0.1)


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _train(model: nn.Module, rank: int, *, step_per_unit: bool = False) -> dict[str, Any]:
    """NUM_STEPS steps of AdamW; with `step_per_unit`, one AdamW per unit (bucket or parameter),
    made and stepped by a reduced hook. Returns the final state and, per hook call, the step,
    the unit and whether the unit's parameters were the bucket's (`bucket_params`)."""
    seen: list[tuple[int, int, bool]] = []
    per_unit: dict[int, torch.optim.Optimizer] = {}
    step = 0

    def step_unit(unit: int, params: tuple[nn.Parameter, ...]) -> None:
        expected = getattr(model, "bucket_params", None)
        matches = expected is None or [id(p) for p in params] == [id(p) for p in expected[unit]]
        seen.append((step, unit, matches))
        per_unit.setdefault(unit, _adamw(params)).step()

    if step_per_unit:
        model.register_reduced_hook(step_unit)
    whole = None if step_per_unit else _adamw(model.parameters())
    for step in range(NUM_STEPS):
        if hasattr(model, "on_train_batch_start"):
            model.on_train_batch_start()
        _loss(model, *_batch(step, rank)).backward()
        if hasattr(model, "finish_gradient_synchronization"):
            model.finish_gradient_synchronization()
        for optimizer in [whole] if whole is not None else per_unit.values():
            if optimizer is whole:
                optimizer.step()
            optimizer.zero_grad(set_to_none=False)
    module = getattr(model, "module", model)
    return {"state": _state(module), "seen": seen}


def _bucketed(rank: int, **options: Any) -> DDPBucketed:
    return DDPBucketed(_build(rank), BUCKET_MB, **options)


def _removed_hook(rank: int) -> dict[str, int]:
    """A removed hook is not called again; hooks do not fire inside no_sync()."""
    model = _bucketed(rank)
    calls = {"kept": 0, "removed": 0}
    model.register_reduced_hook(lambda bucket, params: calls.__setitem__("kept", calls["kept"] + 1))
    handle = model.register_reduced_hook(
        lambda bucket, params: calls.__setitem__("removed", calls["removed"] + 1)
    )
    _loss(model, *_batch(0, rank)).backward()
    model.finish_gradient_synchronization()
    handle.remove()
    with model.no_sync():
        _loss(model, *_batch(1, rank)).backward()
        model.finish_gradient_synchronization()
    _loss(model, *_batch(2, rank)).backward()
    model.finish_gradient_synchronization()
    return {**calls, "buckets": len(model.bucket_params)}


def _errors(rank: int) -> dict[str, str]:
    messages = {}
    try:
        _bucketed(rank, unused_grads="none").register_reduced_hook(lambda bucket, params: None)
    except ValueError as e:
        messages["unused_none"] = str(e)
    try:
        comm_group(max_ctas=2)
    except ValueError as e:
        messages["nccl_option_on_gloo"] = str(e)
    return messages


def _run_all(rank: int, world_size: int) -> dict[str, Any]:
    assert world_size == WORLD_SIZE
    plain = _bucketed(rank)
    shrunk = _bucketed(rank, last_bucket_size_mb=LAST_BUCKET_MB)
    plans = {  # (bytes, parameters) of each bucket
        name: [
            (sum(p.numel() * p.element_size() for p in params), len(params))
            for params in model.bucket_params
        ]
        for name, model in (("plain", plain), ("shrunk", shrunk))
    }
    return {
        "plans": plans,
        "plain": _train(plain, rank),
        "shrunk": _train(shrunk, rank),
        "hooked": _train(_bucketed(rank), rank, step_per_unit=True),
        "hooked_shrunk": _train(
            _bucketed(rank, last_bucket_size_mb=LAST_BUCKET_MB), rank, step_per_unit=True
        ),
        "hooked_individual": _train(
            DDPIndividualParameters(_build(rank)), rank, step_per_unit=True
        ),
        "own_group": _train(_bucketed(rank, process_group=comm_group()), rank),
        "torch_ddp": _train(DistributedDataParallel(_build(0)), rank),
        "removed_hook": _removed_hook(rank),
        "errors": _errors(rank),
    }


@functools.cache
def _results() -> list[dict[str, Any]]:
    return run_ranks(_run_all, world_size=WORLD_SIZE)


def _assert_equal_states(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]):
    assert actual.keys() == expected.keys()
    for key in expected:
        assert torch.equal(actual[key], expected[key]), key


def test_shrinking_last_buckets_hold_no_more_than_what_follows_them():
    for result in _results():
        plain, shrunk = result["plans"]["plain"], result["plans"]["shrunk"]
        assert sum(size for size, _ in plain) == sum(size for size, _ in shrunk)
        assert len(shrunk) > len(plain)
        sizes = [size for size, _ in shrunk]
        for index, (size, num_params) in enumerate(shrunk):
            limit = min(BUCKET_MB * 2**20, max(sum(sizes[index + 1 :]), LAST_BUCKET_MB * 2**20))
            assert num_params == 1 or size <= limit, (index, shrunk)


@pytest.mark.parametrize("lever", ["shrunk", "hooked", "hooked_shrunk", "own_group"])
def test_lever_trains_exactly_like_plain_bucketed(lever):
    for result in _results():
        _assert_equal_states(result[lever]["state"], result["plain"]["state"])


def test_plain_bucketed_trains_exactly_like_torch_ddp():
    for result in _results():
        _assert_equal_states(result["plain"]["state"], result["torch_ddp"]["state"])


def test_individual_parameters_train_exactly_like_torch_ddp():
    for result in _results():
        _assert_equal_states(result["hooked_individual"]["state"], result["torch_ddp"]["state"])


def test_reduced_hook_sees_every_bucket_once_per_step_in_launch_order():
    for result in _results():
        num_buckets = len(result["plans"]["plain"])
        expected = [(step, b, True) for step in range(NUM_STEPS) for b in range(num_buckets)]
        assert result["hooked"]["seen"] == expected


def test_removed_hook_stops_and_no_sync_calls_no_hook():
    for result in _results():
        calls = result["removed_hook"]
        assert calls["removed"] == calls["buckets"]
        assert calls["kept"] == 2 * calls["buckets"]


def test_reduced_hook_refuses_unused_grads_none():
    for result in _results():
        assert "unused_grads" in result["errors"]["unused_none"]


def test_nccl_options_on_a_gloo_group_raise():
    for result in _results():
        assert "max_ctas" in result["errors"]["nccl_option_on_gloo"]


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"max_ctas": 0}, "max_ctas"),
        ({"min_ctas": 2.5}, "min_ctas"),
        ({"max_ctas": 2, "min_ctas": 4}, "must not exceed"),
        ({"cta_policy": "fast"}, "cta_policy"),
    ],
)
def test_bad_comm_group_options_raise_before_any_collective(options, match):
    with pytest.raises(ValueError, match=match):
        comm_group(**options)


def test_bad_last_bucket_size_names_its_option():
    with pytest.raises(ValueError, match="last_bucket_size_mb"):
        DDPBucketed(nn.Linear(3, 2), last_bucket_size_mb=-1)


def _nccl_group(rank: int, world_size: int) -> dict[str, Any]:
    device = torch.device("cuda", rank)
    group = comm_group(max_ctas=2, min_ctas=1, cta_policy="efficiency", high_priority_stream=True)
    results = {}
    for name, process_group in (("default", None), ("own", group)):
        torch.manual_seed(rank)
        model = DDPBucketed(_LM().double().to(device), BUCKET_MB, process_group=process_group)
        tokens, targets = (t.to(device) for t in _batch(0, rank))
        _loss(model, tokens, targets).backward()
        model.finish_gradient_synchronization()
        results[name] = {n: p.grad.cpu() for n, p in model.module.named_parameters()}
    return results


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_nccl_comm_group_with_every_option_averages_like_the_default_group():
    for result in run_ranks(_nccl_group, world_size=WORLD_SIZE, backend="nccl"):
        for name, grad in result["default"].items():
            assert torch.equal(result["own"][name], grad), name

"""FSDP on real process groups (gloo: 2 ranks and 1; NCCL: 1 GPU) against one-process training.

Each rank trains on its half of every batch. Two references run inside each spawned process (so
they see the same kernels and thread settings as FSDP):

* *half-batch*: one process computes the gradient of each half separately and averages them,
  ``(g0 + g1) / 2``: exactly the arithmetic of a two-rank average (gloo's AVG is a sum and one
  division; a sum of two floats does not depend on order), so FSDP must equal it bit for bit;
* *whole-batch*: one process on the whole batch. Its matmuls sum over all rows at once rather
  than per half, so the same math rounds differently: compared to 1e-6.

One spawned run does many things, each checked by its own test below. Models: a small
`lmcore.TransformerLM` (also with activation checkpointing per block, by segments and nested,
whose recomputation re-enters the units' forward hooks during backward) and a hand-made module
with tied, frozen, sometimes unused, non-contiguous and odd-sized parameters.
"""

from __future__ import annotations

import copy
import io
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from spawn_ranks import run_ranks
from torch import nn

from lmcore import TransformerLM, apply_activation_checkpointing
from lmcore.model import TransformerBlock
from zero import FSDP
from zero.fsdp import _State

VOCAB, DIM, HIDDEN = 13, 5, 7  # 65- and 35-element weights: 2 ranks need padding
BATCH, SEQ = 4, 6
STEPS = 3
WHOLE_BATCH_ATOL = 1e-6


class _Net(nn.Module):
    """Tied embedding/head, a frozen layer, a layer used on even steps only, odd sizes."""

    def __init__(self, *, contiguous_mix: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.body = nn.Linear(DIM, HIDDEN)
        self.side = nn.Linear(HIDDEN, DIM)
        self.frozen = nn.Linear(HIDDEN, DIM).requires_grad_(False)
        mix = torch.randn(DIM, DIM).t()  # non-contiguous, owned by the root
        self.mix = nn.Parameter(mix.contiguous() if contiguous_mix else mix)
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor, step: int = 0) -> torch.Tensor:
        h = torch.tanh(self.body(self.embed(tokens)))  # (batch, seq, HIDDEN)
        out = self.frozen(h) @ self.mix  # (batch, seq, DIM)
        if step % 2 == 0:
            out = out + self.side(h)
        return self.head(self.norm(out))  # (batch, seq, VOCAB)


def _net(*, contiguous: bool = False) -> _Net:
    torch.manual_seed(0)
    return _Net(contiguous_mix=contiguous)


def _lm(*, contiguous: bool = False, num_layers: int = 2) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(
        vocab_size=VOCAB, context_length=SEQ, d_model=8, num_layers=num_layers, num_heads=2, d_ff=11
    )


def _checkpointed_lm(*, contiguous: bool = False) -> TransformerLM:
    return apply_activation_checkpointing(_lm())


def _segments_lm(*, contiguous: bool = False) -> TransformerLM:
    return apply_activation_checkpointing(_lm(num_layers=3), policy="segments:2")


def _nested_lm(*, contiguous: bool = False) -> TransformerLM:
    return apply_activation_checkpointing(_lm(num_layers=3), policy="nested:2")


MODELS = {
    "net": _net,
    "lm": _lm,
    "checkpointed": _checkpointed_lm,
    "segments": _segments_lm,
    "nested": _nested_lm,
}


def _batches(seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(VOCAB, (BATCH, SEQ + 1), generator=g) for _ in range(STEPS)]


def _loss(model: nn.Module, tokens: torch.Tensor, step: int) -> torch.Tensor:
    kwargs = {"step": step} if isinstance(getattr(model, "module", model), _Net) else {}
    tokens = tokens.to(next(model.parameters()).device)
    logits = model(tokens[:, :-1], **kwargs)  # (batch, seq, VOCAB)
    return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


def _optimizer(name: str, params) -> torch.optim.Optimizer:
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def _train_fsdp(
    fsdp: FSDP, optimizer: str, rank: int, world_size: int, *, micro: int = 1, seed: int = 1
) -> dict[str, torch.Tensor]:
    opt = _optimizer(optimizer, fsdp.parameters())
    for step, tokens in enumerate(_batches(seed)):
        opt.zero_grad()
        for part in tokens.chunk(world_size)[rank].chunk(micro):
            (_loss(fsdp, part, step) / micro).backward()
        fsdp.finish_gradient_synchronization()
        opt.step()
    return fsdp.state_dict()


def _train_reference(
    model: nn.Module,
    optimizer: str,
    *,
    halves: int,
    seed: int = 1,
    dtype: torch.dtype | None = None,
) -> dict[str, torch.Tensor]:
    """One process; each step's gradient is the average of the `halves` parts' gradients.

    With `dtype`, forward and backward run on a copy of the weights cast to it (the fp32
    weights stay the masters, as in mixed-precision training).
    """
    opt = _optimizer(optimizer, model.parameters())
    for step, tokens in enumerate(_batches(seed)):
        grads: list[list[torch.Tensor | None]] = []
        for part in tokens.chunk(halves):
            worker = model if dtype is None else _cast_copy(model, dtype)
            worker.zero_grad()
            _loss(worker, part, step).backward()
            grads.append([None if p.grad is None else p.grad.float() for p in worker.parameters()])
        opt.zero_grad()
        for p, gs in zip(model.parameters(), zip(*grads, strict=True), strict=True):
            if gs[0] is not None:
                p.grad = gs[0] if halves == 1 else (gs[0] + gs[1]) / 2
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _cast_copy(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    return copy.deepcopy(model).to(dtype)


def _error(fn) -> str | None:
    try:
        fn()
    except (RuntimeError, ValueError) as e:
        return str(e)
    return None


def _two_rank_worker(rank: int, world_size: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for model, optimizer, units in [
        ("lm", "adamw", (TransformerBlock,)),
        ("lm", "sgd", None),
        ("net", "adamw", None),
        ("net", "sgd", None),
        ("checkpointed", "adamw", (TransformerBlock,)),
        ("segments", "adamw", (TransformerBlock,)),
        ("nested", "sgd", (TransformerBlock,)),
    ]:
        key = f"{model}-{optimizer}-{'blocks' if units else 'default'}"
        fsdp = FSDP(MODELS[model](), units=units)
        if key == "net-adamw-default":
            results["shard_numels"] = {n: p.numel() for n, p in fsdp.module.named_parameters()}
        results[key] = _train_fsdp(fsdp, optimizer, rank, world_size)
        # FSDP computes with contiguous gathered weights; a non-contiguous parameter takes
        # another matmul path (other rounding), so the bit-exact reference uses contiguous ones.
        half = MODELS[model](contiguous=True)
        results[key + "-half"] = _train_reference(half, optimizer, halves=2)
        results[key + "-whole"] = _train_reference(MODELS[model](), optimizer, halves=1)

    # gradients after finish: fp32, shaped like the local data; and the optimizer state size
    fsdp = FSDP(_lm(), compute_dtype=torch.bfloat16, units=(TransformerBlock,))
    _loss(fsdp, _batches()[0].chunk(world_size)[rank], 0).backward()
    fsdp.finish_gradient_synchronization()
    results["grads_match_data"] = all(
        p.grad is not None and p.grad.dtype == torch.float32 and p.grad.shape == p.shape
        for p in fsdp.parameters()
    )
    results["replicated_grads"] = [
        p.grad.clone() for p in fsdp.parameters() if p.dim() == 1 and p.numel() == 8
    ]
    opt = torch.optim.AdamW(fsdp.parameters())
    opt.step()
    results["adam_state_numel"] = sum(s["exp_avg"].numel() for s in opt.state.values())
    results["lm_numel"] = sum(p.numel() for p in _lm().parameters())

    # compute in bf16: against the fp32 whole-batch reference, beside plain bf16 on one process
    fsdp = FSDP(_lm(), compute_dtype=torch.bfloat16, units=(TransformerBlock,))
    results["bf16"] = _train_fsdp(fsdp, "sgd", rank, world_size)
    results["bf16-plain"] = _train_reference(_lm(), "sgd", halves=1, dtype=torch.bfloat16)

    # without prefetching: the same numbers (only the timing of the all-gathers changes)
    fsdp = FSDP(_lm(), units=(TransformerBlock,), prefetch=False)
    results["no_prefetch"] = _train_fsdp(fsdp, "adamw", rank, world_size)

    # gradient accumulation over two micro-batches per rank
    results["accumulated"] = _train_fsdp(FSDP(_net()), "adamw", rank, world_size, micro=2)

    # deterministic algorithms
    torch.use_deterministic_algorithms(True)
    try:
        results["deterministic"] = _train_fsdp(FSDP(_lm()), "adamw", rank, world_size)
    finally:
        torch.use_deterministic_algorithms(False)

    # gather_full_params; a forward without grad frees every unit
    fsdp = FSDP(_net())
    _train_fsdp(fsdp, "adamw", rank, world_size)
    results["full_params"] = {k: v.cpu() for k, v in fsdp.gather_full_params().items()}
    with torch.no_grad():
        fsdp(_batches()[0][:, :-1])
    storage = [u.flat.untyped_storage().nbytes() for u in fsdp._units]
    results["all_free_after_eval"] = storage == [0] * len(storage)

    # checkpoints: 2 ranks -> bytes (torch.save), and a plain module's dict -> 2 ranks
    buffer = io.BytesIO()
    torch.save(results["lm-adamw-blocks"], buffer)
    results["checkpoint"] = buffer.getvalue()
    fsdp = FSDP(_lm(), units=(TransformerBlock,))
    start = _train_reference(_lm(), "sgd", halves=1, seed=7)
    fsdp.load_state_dict(start)
    results["resumed_on_two"] = _train_fsdp(fsdp, "sgd", rank, world_size, seed=2)
    reference = _lm()
    reference.load_state_dict(start)
    results["resumed_on_two-half"] = _train_reference(reference, "sgd", halves=2, seed=2)

    # activation checkpointing: units gathered at once during backward
    for policy in ("blocks", "segments:6", "nested:3"):
        results[f"gathered-{policy}"] = _most_units_gathered(policy, rank, world_size)

    # a state dict with one weight of another shape loads nothing
    fsdp = FSDP(_lm(), units=(TransformerBlock,))
    before = {n: p.detach().clone() for n, p in fsdp.module.named_parameters()}
    bad = dict(_lm().state_dict())
    bad["lm_head.weight"] = bad["lm_head.weight"][:-1]
    results["bad_shape"] = _error(lambda: fsdp.load_state_dict(bad))
    results["bad_shape_untouched"] = all(
        torch.equal(p, before[n]) for n, p in fsdp.module.named_parameters()
    )

    # bad input: models that differ across ranks
    torch.manual_seed(rank)
    results["different_values"] = _error(lambda: FSDP(_Net()))
    results["different_shapes"] = _error(lambda: FSDP(nn.Linear(3, 3 + rank)))
    return results


def _most_units_gathered(policy: str, rank: int, world_size: int) -> int:
    """The most units (the root included) whose weights are gathered at once in one step."""
    fsdp = FSDP(
        apply_activation_checkpointing(_lm(num_layers=6), policy=policy), units=(TransformerBlock,)
    )
    most = 0
    start_gather = fsdp._start_gather

    def counting(unit) -> None:
        nonlocal most
        start_gather(unit)
        most = max(most, sum(u.state is not _State.FREE for u in fsdp._units))

    fsdp._start_gather = counting
    _loss(fsdp, _batches()[0].chunk(world_size)[rank], 0).backward()
    fsdp.finish_gradient_synchronization()
    return most


def _one_rank_worker(rank: int, world_size: int, checkpoint: bytes) -> dict[str, Any]:
    results: dict[str, Any] = {}
    results["lm"] = _train_fsdp(FSDP(_lm(), units=(TransformerBlock,)), "adamw", rank, world_size)
    results["lm-whole"] = _train_reference(_lm(), "adamw", halves=1)
    state = torch.load(io.BytesIO(checkpoint))
    fsdp = FSDP(_lm())
    fsdp.load_state_dict(state)
    results["round_trip"] = fsdp.state_dict()
    results["resumed"] = _train_fsdp(fsdp, "sgd", rank, world_size, seed=3)
    plain = _lm()
    plain.load_state_dict(state)
    results["resumed-whole"] = _train_reference(plain, "sgd", halves=1, seed=3)
    return results


@pytest.fixture(scope="module")
def two_ranks() -> list[dict[str, Any]]:
    return run_ranks(_two_rank_worker, world_size=2)


@pytest.fixture(scope="module")
def one_rank(two_ranks) -> dict[str, Any]:
    return run_ranks(_one_rank_worker, world_size=1, args=(two_ranks[0]["checkpoint"],))[0]


def _assert_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key


def _assert_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], atol: float):
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=atol, msg=key)


CASES = [
    "lm-adamw-blocks",
    "lm-sgd-default",
    "net-adamw-default",
    "net-sgd-default",
    "checkpointed-adamw-blocks",
    "segments-adamw-blocks",
    "nested-sgd-blocks",
]


@pytest.mark.parametrize("case", CASES)
def test_two_ranks_equal_one_process_averaging_the_halves_bit_for_bit(two_ranks, case):
    for rank in two_ranks:
        _assert_equal(rank[case], rank[case + "-half"])


@pytest.mark.parametrize("case", CASES)
def test_two_ranks_equal_one_process_on_the_whole_batch(two_ranks, case):
    _assert_close(two_ranks[0][case], two_ranks[0][case + "-whole"], WHOLE_BATCH_ATOL)


def test_ranks_hold_shards_of_half_the_size_padded(two_ranks):
    numels = two_ranks[0]["shard_numels"]
    assert numels["embed.weight"] == (VOCAB * DIM + 1) // 2  # 65 elements: one of padding
    assert numels["body.weight"] == (DIM * HIDDEN + 1) // 2
    assert numels["frozen.weight"] == (HIDDEN * DIM + 1) // 2
    assert numels["body.bias"] == HIDDEN  # replicated
    assert "head.weight" not in numels  # tied: one parameter


def test_tied_weight_stays_tied_in_the_state_dict(two_ranks):
    state = two_ranks[0]["net-adamw-default"]
    assert torch.equal(state["embed.weight"], state["head.weight"])


def test_frozen_parameters_do_not_move(two_ranks):
    state, initial = two_ranks[0]["net-adamw-default"], _net().state_dict()
    assert torch.equal(state["frozen.weight"], initial["frozen.weight"])
    assert not torch.equal(state["body.weight"], initial["body.weight"])


def test_optimizer_state_covers_only_the_shards(two_ranks):
    state, total = two_ranks[0]["adam_state_numel"], two_ranks[0]["lm_numel"]
    assert state < 0.6 * total  # shards of the matrices, whole norms


def test_gradients_are_fp32_and_shaped_like_the_local_data(two_ranks):
    assert all(rank["grads_match_data"] for rank in two_ranks)


def test_replicated_gradients_are_equal_on_every_rank(two_ranks):
    for a, b in zip(
        two_ranks[0]["replicated_grads"], two_ranks[1]["replicated_grads"], strict=True
    ):
        assert torch.equal(a, b)
    assert two_ranks[0]["replicated_grads"]


def _assert_within_twice_the_plain_error(
    got: dict[str, torch.Tensor], plain: dict[str, torch.Tensor], want: dict[str, torch.Tensor]
) -> None:
    """`got` is at most twice as far from `want` (fp32) as plain bf16 training on one process.

    Measured over the whole model (the norm of every parameter's difference together): one
    tensor's worst element is bf16 rounding noise, which can land either way between two
    equally valid roundings; a real fault (a wrong scale, a stale shard) moves the whole norm.
    """

    def distance(a: dict[str, torch.Tensor]) -> float:
        return sum(((a[k].double() - v.double()) ** 2).sum().item() for k, v in want.items()) ** 0.5

    error, plain_error = distance(got), distance(plain)
    assert plain_error > 0  # bf16 training differs from fp32, or the check means nothing
    assert error <= 2 * plain_error, f"{error:.3g} vs plain bf16's {plain_error:.3g}"


def test_bf16_compute_is_within_bf16_rounding_of_fp32(two_ranks):
    result = two_ranks[0]
    _assert_within_twice_the_plain_error(
        result["bf16"], result["bf16-plain"], result["lm-sgd-default-whole"]
    )


def test_gradient_accumulation_equals_one_process(two_ranks):
    _assert_close(two_ranks[0]["accumulated"], two_ranks[0]["net-adamw-default-whole"], 1e-6)


def test_without_prefetching_training_is_the_same(two_ranks):
    _assert_equal(two_ranks[0]["no_prefetch"], two_ranks[0]["lm-adamw-blocks"])


def test_deterministic_algorithms(two_ranks):
    _assert_equal(two_ranks[0]["deterministic"], two_ranks[0]["lm-adamw-blocks"])


def test_gather_full_params_gives_full_tensors_under_the_module_names(two_ranks):
    full, state = two_ranks[0]["full_params"], two_ranks[0]["net-adamw-default"]
    assert list(full) == [name for name, _ in _net().named_parameters()]
    for name, tensor in full.items():
        assert torch.equal(tensor, state[name]), name


def test_forward_without_grad_frees_every_unit(two_ranks):
    assert all(rank["all_free_after_eval"] for rank in two_ranks)


def test_plain_state_dict_loads_onto_two_ranks(two_ranks):
    _assert_equal(two_ranks[0]["resumed_on_two"], two_ranks[0]["resumed_on_two-half"])


def test_world_size_one_equals_one_process(one_rank):
    _assert_equal(one_rank["lm"], one_rank["lm-whole"])


def test_two_rank_checkpoint_loads_into_a_plain_module_and_one_rank(two_ranks, one_rank):
    saved = two_ranks[0]["lm-adamw-blocks"]
    _lm().load_state_dict(saved)  # strict: every key, every shape
    _assert_equal(one_rank["round_trip"], saved)
    _assert_equal(one_rank["resumed"], one_rank["resumed-whole"])


@pytest.mark.parametrize(("policy", "most"), [("blocks", 3), ("segments:6", 4), ("nested:3", 4)])
def test_recomputed_units_are_gathered_again_and_freed(two_ranks, policy, most):
    # The root, the unit computing and the one prefetched; a recomputation adds one more. A
    # segment of six blocks would otherwise hold all six gathered through its recomputation.
    for rank in two_ranks:
        assert rank[f"gathered-{policy}"] == most


def test_a_state_dict_with_a_wrong_shape_loads_nothing(two_ranks):
    for rank in two_ranks:
        assert "lm_head.weight" in rank["bad_shape"] and "nothing was loaded" in rank["bad_shape"]
        assert rank["bad_shape_untouched"]


def test_ranks_with_different_values_raise(two_ranks):
    for rank in two_ranks:
        assert "different values" in rank["different_values"]
        assert "seed" in rank["different_values"]


def test_ranks_with_different_shapes_raise(two_ranks):
    for rank in two_ranks:
        assert "disagree about the module" in rank["different_shapes"]


def test_needs_an_initialised_process_group():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        FSDP(nn.Linear(2, 2))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"compute_dtype": torch.int8}, "compute_dtype must be one of"),
        ({"compute_dtype": torch.float64}, "compute_dtype must be one of"),
        ({"reduce_dtype": "bf16"}, "reduce_dtype must be one of"),
    ],
)
def test_rejects_unsupported_dtypes(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FSDP(nn.Linear(2, 2), **kwargs)


def test_rejects_parameters_that_are_not_float32():
    with pytest.raises(ValueError, match="float32 master weights"):
        FSDP(nn.Linear(2, 2).double())


def test_rejects_what_is_not_a_module():
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        FSDP(torch.zeros(2))  # type: ignore[arg-type]


def test_rejects_units_that_are_not_module_classes():
    with pytest.raises(TypeError, match="units must be"):
        FSDP(nn.Linear(2, 2), units=(int,))  # type: ignore[arg-type]


def _gpu_worker(rank: int, world_size: int) -> dict[str, Any]:
    fsdp = FSDP(_lm().cuda(), compute_dtype=torch.bfloat16, units=(TransformerBlock,))
    cpu = {k: v.cpu() for k, v in _train_fsdp(fsdp, "sgd", rank, world_size).items()}
    fp32 = _train_reference(_lm().cuda(), "sgd", halves=1)
    bf16 = _train_reference(_lm().cuda(), "sgd", halves=1, dtype=torch.bfloat16)
    return {
        "fsdp": cpu,
        "fp32": {k: v.cpu() for k, v in fp32.items()},
        "bf16": {k: v.cpu() for k, v in bf16.items()},
    }


@pytest.mark.gpu
def test_nccl_bf16_compute_is_within_bf16_rounding_of_fp32():
    result = run_ranks(_gpu_worker, world_size=1, backend="nccl")[0]
    _assert_within_twice_the_plain_error(result["fsdp"], result["bf16"], result["fp32"])

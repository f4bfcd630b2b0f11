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

import lmcore
from lmcore import Embedding, LMHead, TransformerLM, apply_activation_checkpointing
from lmcore.model import TransformerBlock
from zero import FSDP, MixedPrecision, apply_fsdp
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


def _lm(
    *, contiguous: bool = False, num_layers: int = 2, attention: str = "naive"
) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(
        vocab_size=VOCAB, context_length=SEQ, d_model=8, num_layers=num_layers, num_heads=2,
        d_ff=11, attention=attention,
    )  # fmt: skip


def _checkpointed_lm(*, contiguous: bool = False) -> TransformerLM:
    return apply_activation_checkpointing(_lm())


def _segments_lm(*, contiguous: bool = False) -> TransformerLM:
    return apply_activation_checkpointing(_lm(num_layers=3), policy="segments:2")


def _nested_lm(*, contiguous: bool = False) -> TransformerLM:
    return apply_activation_checkpointing(_lm(num_layers=3), policy="nested:2")


def _selective_lm(*, contiguous: bool = False) -> TransformerLM:
    """Each block checkpointed inside its forward, SDPA's output kept: the recomputation runs in
    the unit's backward, without its forward hooks."""
    model = _lm(num_layers=3, attention="sdpa")
    return apply_activation_checkpointing(model, policy="selective")


MODELS = {
    "net": _net,
    "lm": _lm,
    "checkpointed": _checkpointed_lm,
    "segments": _segments_lm,
    "nested": _nested_lm,
    "selective": _selective_lm,
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
    if name == "lmcore-fused-bf16":  # Triton's interpreter on a CPU
        return lmcore.AdamW(
            params, lr=1e-2, weight_decay=0.1, fused=True, moment_dtype=torch.bfloat16
        )
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

    With `dtype`, forward and backward run on a copy of the weights cast to it (the model's
    weights stay the masters, as in mixed-precision training). Gradients are averaged in the
    masters' dtype (bf16 for a bf16 model: one rounding of the sum, as a bf16 reduction).
    """
    opt = _optimizer(optimizer, model.parameters())
    masters = list(model.parameters())
    for step, tokens in enumerate(_batches(seed)):
        grads: list[list[torch.Tensor | None]] = []
        for part in tokens.chunk(halves):
            worker = model if dtype is None else _cast_copy(model, dtype)
            worker.zero_grad()
            _loss(worker, part, step).backward()
            grads.append(
                [
                    None if p.grad is None else p.grad.to(m.dtype)
                    for p, m in zip(worker.parameters(), masters, strict=True)
                ]
            )
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
        ("selective", "adamw", (TransformerBlock,)),
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
    for policy in ("blocks", "segments:6", "nested:3", "selective"):
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
    "selective-adamw-blocks",
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


@pytest.mark.parametrize(
    ("policy", "most"), [("blocks", 3), ("segments:6", 4), ("nested:3", 4), ("selective", 3)]
)
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


def _mixed_dtypes() -> nn.Module:
    module = nn.Linear(2, 2)
    module.bias.data = module.bias.data.bfloat16()
    return module


@pytest.mark.parametrize(
    ("module", "match"),
    [
        (lambda: nn.Linear(2, 2).double(), "keeps its shards in"),
        (lambda: nn.Linear(2, 2).half(), "keeps its shards in"),
        (_mixed_dtypes, "one floating-point dtype"),
    ],
)
def test_rejects_parameters_of_a_dtype_it_cannot_keep(module, match):
    with pytest.raises(ValueError, match=match):
        FSDP(module())


def test_rejects_what_is_not_a_module():
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        FSDP(torch.zeros(2))  # type: ignore[arg-type]


def test_rejects_units_that_are_not_module_classes():
    with pytest.raises(TypeError, match="units must be"):
        FSDP(nn.Linear(2, 2), units=(int,))  # type: ignore[arg-type]


# ---- mixed precision: bf16 storage, the policy, optimizers on bf16 shards ----------------------
#
# bf16 elementwise operations on a CPU round differently in their vectorised body and their
# scalar tail, so an optimizer stepping a 1-D shard and one stepping the whole matrix need not
# agree to the bit: bf16 runs are compared by how far they land from float32 training instead.


def _bf16_lm() -> TransformerLM:
    return _lm().bfloat16()


def _rounded_fp32_lm() -> TransformerLM:
    """The bf16 model's initial weights in float32: the reference for bf16 training."""
    return _lm().bfloat16().float()


def _count_fused_launches() -> list[int]:
    """Count `lmcore.kernels.adamw.adamw_step_` calls (one per kernel launch) in this process."""
    from lmcore.kernels import adamw

    calls: list[int] = []
    launch = adamw.adamw_step_

    def counted(*args, **kwargs):
        calls.append(1)
        return launch(*args, **kwargs)

    adamw.adamw_step_ = counted
    return calls


def _io_dtypes(policy: MixedPrecision, x: torch.Tensor) -> tuple[torch.dtype, ...]:
    """(input dtype the unit saw, output dtype) of a float32 Linear wrapped with `policy`."""
    torch.manual_seed(0)
    seen: list[torch.dtype] = []
    linear = nn.Linear(3, 4)
    linear.register_forward_pre_hook(lambda m, args: seen.append(args[0].dtype))
    fsdp = FSDP(nn.Sequential(linear), mixed_precision=policy, units=(nn.Linear,))
    out = fsdp(x)
    return seen[0], out.dtype


def _precision_worker(rank: int, world_size: int, checkpoint: bytes) -> dict[str, Any]:
    results: dict[str, Any] = {}
    # bf16 storage: a model built in bf16, and a float32 one rounded as it is sharded
    fsdp = FSDP(_bf16_lm(), units=(TransformerBlock,))
    results["shard_dtypes"] = {p.dtype for p in fsdp.parameters()}
    results["bf16"] = _train_fsdp(fsdp, "sgd", rank, world_size)
    results["grad_dtypes"] = {p.grad.dtype for p in fsdp.parameters() if p.grad is not None}
    fsdp = FSDP(
        _lm(),
        units=(TransformerBlock,),
        mixed_precision=MixedPrecision(storage_dtype=torch.bfloat16),
    )
    results["bf16-from-fp32"] = _train_fsdp(fsdp, "sgd", rank, world_size)
    results["bf16-plain"] = _train_reference(_bf16_lm(), "sgd", halves=1)
    results["fp32-reference"] = _train_reference(_rounded_fp32_lm(), "sgd", halves=1)

    # reduce in float32, gradients kept in bf16
    reduced: list[torch.dtype] = []
    scatter = dist.reduce_scatter_tensor
    dist.reduce_scatter_tensor = lambda out, inp, **kw: (
        reduced.append(inp.dtype) or scatter(out, inp, **kw)
    )
    try:
        policy = MixedPrecision(reduce_dtype=torch.float32)
        fsdp = FSDP(_bf16_lm(), units=(TransformerBlock,), mixed_precision=policy)
        results["bf16-reduce-fp32"] = _train_fsdp(fsdp, "sgd", rank, world_size)
    finally:
        dist.reduce_scatter_tensor = scatter
    results["reduced_dtypes"] = set(reduced)
    results["grad_dtypes_reduce_fp32"] = {p.grad.dtype for p in fsdp.parameters()}

    # lmcore's fused AdamW with bf16 moments over the bf16 shards: one launch per step
    launches = _count_fused_launches()
    fsdp = FSDP(_bf16_lm(), units=(TransformerBlock,))
    results["fused"] = _train_fsdp(fsdp, "lmcore-fused-bf16", rank, world_size)
    results["fused_launches"] = len(launches)
    results["adamw-plain"] = _train_reference(_bf16_lm(), "adamw", halves=1)
    results["adamw-reference"] = _train_reference(_rounded_fp32_lm(), "adamw", halves=1)

    # the policy's input and output casts around a float32 module computing in bf16
    x = torch.randn(2, 3)
    results["io"] = _io_dtypes(MixedPrecision(compute_dtype=torch.bfloat16), x)
    results["io-output"] = _io_dtypes(
        MixedPrecision(compute_dtype=torch.bfloat16, output_dtype=torch.float32), x
    )
    uncast = MixedPrecision(compute_dtype=torch.bfloat16, cast_forward_inputs=False)
    results["uncast"] = _error(lambda: _io_dtypes(uncast, x))

    # a checkpoint saved on one rank loads on two, and training goes on as one process's
    fsdp = FSDP(_bf16_lm(), units=(TransformerBlock,))
    fsdp.load_state_dict(torch.load(io.BytesIO(checkpoint)))
    results["resumed"] = _train_fsdp(fsdp, "sgd", rank, world_size, seed=4)
    plain = _bf16_lm()
    plain.load_state_dict(torch.load(io.BytesIO(checkpoint)))
    results["resumed-plain"] = _train_reference(plain, "sgd", halves=1, seed=4)
    fp32 = _rounded_fp32_lm()
    fp32.load_state_dict(torch.load(io.BytesIO(checkpoint)))
    results["resumed-fp32"] = _train_reference(fp32, "sgd", halves=1, seed=4)
    return results


def _bf16_one_rank_worker(rank: int, world_size: int) -> bytes:
    """A bf16-storage FSDP on one rank, trained three steps: its checkpoint, as bytes."""
    state = _train_fsdp(FSDP(_bf16_lm(), units=(TransformerBlock,)), "sgd", rank, world_size)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def bf16_one_rank_checkpoint() -> bytes:
    return run_ranks(_bf16_one_rank_worker, world_size=1)[0]


@pytest.fixture(scope="module")
def precision(bf16_one_rank_checkpoint) -> list[dict[str, Any]]:
    return run_ranks(_precision_worker, world_size=2, args=(bf16_one_rank_checkpoint,))


def test_bf16_storage_keeps_shards_and_gradients_in_bf16(precision):
    for rank in precision:
        assert rank["shard_dtypes"] == rank["grad_dtypes"] == {torch.bfloat16}
        assert all(v.dtype == torch.bfloat16 for v in rank["bf16"].values())


def test_bf16_storage_is_within_twice_the_error_of_one_bf16_process(precision):
    # The same SGD steps in float32 from the same (bf16-rounded) start are the oracle. SGD, not
    # AdamW: a wrong gradient scale moves every update of SGD, while AdamW is invariant to it.
    result = precision[0]
    _assert_within_twice_the_plain_error(
        result["bf16"], result["bf16-plain"], result["fp32-reference"]
    )


def test_a_float32_module_stored_in_bf16_trains_as_a_bf16_module(precision):
    for rank in precision:
        _assert_equal(rank["bf16-from-fp32"], rank["bf16"])


def test_reduce_dtype_is_the_reduction_s_and_gradients_stay_in_storage(precision):
    result = precision[0]
    assert result["reduced_dtypes"] == {torch.float32}
    assert result["grad_dtypes_reduce_fp32"] == {torch.bfloat16}
    _assert_within_twice_the_plain_error(
        result["bf16-reduce-fp32"], result["bf16-plain"], result["fp32-reference"]
    )


def test_lmcore_fused_adamw_steps_bf16_shards_in_one_launch_per_step(precision):
    result = precision[0]
    # one group of one dtype and step count: one launch per step, for every shard and the
    # replicated norm gains
    assert result["fused_launches"] == STEPS
    # against float32 AdamW: at most twice as far as torch's AdamW on one bf16 process
    _assert_within_twice_the_plain_error(
        result["fused"], result["adamw-plain"], result["adamw-reference"]
    )


def test_the_policy_casts_inputs_to_the_compute_dtype_and_outputs_if_asked(precision):
    result = precision[0]
    assert result["io"] == (torch.bfloat16, torch.bfloat16)
    assert result["io-output"] == (torch.bfloat16, torch.float32)
    assert "dtype" in result["uncast"]  # a float32 input meets bf16 weights


def test_a_one_rank_checkpoint_loads_on_two_ranks(precision):
    result = precision[0]
    _assert_within_twice_the_plain_error(
        result["resumed"], result["resumed-plain"], result["resumed-fp32"]
    )


def test_a_two_rank_bf16_checkpoint_loads_into_a_plain_module(precision):
    plain = _bf16_lm()
    plain.load_state_dict(precision[0]["bf16"])  # strict: every key, shape; bf16 values
    assert all(torch.equal(v, precision[0]["bf16"][k]) for k, v in plain.state_dict().items())


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"storage_dtype": torch.float16}, ValueError, "storage_dtype must be one of"),
        ({"compute_dtype": torch.float64}, ValueError, "compute_dtype must be one of"),
        ({"output_dtype": torch.int32}, ValueError, "output_dtype must be one of"),
        ({"cast_forward_inputs": 1}, TypeError, "True or False"),
    ],
)
def test_the_policy_refuses_what_fsdp_does_not_keep(kwargs, error, match):
    with pytest.raises(error, match=match):
        MixedPrecision(**kwargs)


def test_a_policy_and_a_shorthand_together_are_refused():
    with pytest.raises(ValueError, match="not both"):
        FSDP(nn.Linear(2, 2), mixed_precision=MixedPrecision(), compute_dtype=torch.bfloat16)


# ---- compiled per unit: the hooks outside, each unit's forward one graph ----------------------

# Each graph dynamo hands the backend: whether any of its inputs has a symbolic size.
_SYMBOLIC: list[bool] = []


def _aot_eager_recording(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    sizes = [
        size for x in example_inputs for size in (x.shape if isinstance(x, torch.Tensor) else (x,))
    ]
    _SYMBOLIC.append(any(isinstance(size, torch.SymInt) for size in sizes))
    return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)


# Dynamo and AOT autograd without generating kernels: the CPU tests trace what inductor would
# compile (graphs, guards, the saved tensors of the compiled backward) at a fraction of its cost.
CPU_COMPILE = {"backend": _aot_eager_recording, "fullgraph": True}
LM_UNITS = (TransformerBlock, Embedding, LMHead)


def _checkpointed_bf16_lm(policy: str = "blocks", attention: str = "naive") -> TransformerLM:
    model = _lm(num_layers=3, attention=attention).bfloat16()
    return apply_activation_checkpointing(model, policy=policy)


def _compile_worker(rank: int, world_size: int) -> dict[str, Any]:
    from torch._dynamo.utils import counters

    results: dict[str, Any] = {}
    eager = FSDP(_checkpointed_bf16_lm(), units=LM_UNITS)
    results["eager"] = _train_fsdp(eager, "adamw", rank, world_size)
    counters.clear()
    compiled = apply_fsdp(
        _checkpointed_bf16_lm(), units=LM_UNITS, compile=True, compile_options=CPU_COMPILE
    )
    results["compiled"] = _train_fsdp(compiled, "adamw", rank, world_size)
    results["graphs"] = counters["stats"]["unique_graphs"]
    results["units"] = len(compiled.unit_modules)
    # between the forward and the backward: no weights gathered (the root holds no matrix)
    loss = _loss(compiled, _batches()[0].chunk(world_size)[rank], 0)
    results["gathered_after_forward"] = sum(
        u.flat.untyped_storage().nbytes() for u in compiled._units
    )
    loss.backward()
    compiled.finish_gradient_synchronization()
    # selective: the checkpoint (keeping SDPA's output) inside each compiled unit's forward
    selective = ("selective", "sdpa")
    results["selective_eager"] = _train_fsdp(
        FSDP(_checkpointed_bf16_lm(*selective), units=LM_UNITS), "adamw", rank, world_size
    )
    counters.clear()
    compiled = apply_fsdp(
        _checkpointed_bf16_lm(*selective), units=LM_UNITS, compile=True,
        compile_options=CPU_COMPILE,
    )  # fmt: skip
    results["selective_compiled"] = _train_fsdp(compiled, "adamw", rank, world_size)
    results["selective_graphs"] = counters["stats"]["unique_graphs"]
    results["symbolic"] = list(_SYMBOLIC)
    return results


@pytest.fixture(scope="module")
def compiled() -> list[dict[str, Any]]:
    return run_ranks(_compile_worker, world_size=2)


def test_compiled_units_train_as_the_eager_ones(compiled):
    # bf16 storage, block checkpointing (the compiled forward re-run under FSDP's hooks), the
    # fused loss inside the compiled head: the same operations, so the same bits.
    for rank in compiled:
        _assert_equal(rank["compiled"], rank["eager"])


def test_compiled_selective_units_train_as_the_eager_ones(compiled):
    # the recomputation runs inside each unit's compiled backward, on the weights its forward
    # saved (gathered again before it); eagerly, on the weights installed for the backward
    for rank in compiled:
        _assert_equal(rank["selective_compiled"], rank["selective_eager"])
        # one new graph for the three blocks; the embedding's and the head's are the first
        # model's, reused
        assert rank["selective_graphs"] == 1


def test_with_the_embedding_and_head_as_units_nothing_stays_gathered_for_backward(compiled):
    for rank in compiled:
        assert rank["gathered_after_forward"] == 0


def test_compiled_units_keep_their_shapes_static(compiled):
    # each unit class compiles through a frame of its own: the embedding's (batch, seq) ids
    # never meet the blocks' (batch, seq, d_model) activations in one frame's shape history,
    # which made dynamo recompile the blocks with a symbolic sequence length (and fa2 leave its
    # Gluon kernels for its Triton ones)
    for rank in compiled:
        assert rank["symbolic"] and not any(rank["symbolic"])


def test_identical_units_compile_once(compiled):
    # three blocks, the embedding and the head, forward and recomputed over three steps: one
    # graph per unit class
    for rank in compiled:
        assert rank["units"] == 5
        assert rank["graphs"] == len(LM_UNITS)


def _call_compiled() -> nn.Module:
    linear = nn.Linear(2, 2)
    linear.compile()  # compiles the module's call, its hooks included
    return nn.Sequential(linear)


@pytest.mark.parametrize(
    "compiled_model", [lambda: torch.compile(nn.Sequential(nn.Linear(2, 2))), _call_compiled]
)
def test_a_model_compiled_as_a_whole_is_refused(compiled_model):
    with pytest.raises(ValueError, match="compile each unit's forward"):
        apply_fsdp(compiled_model(), units=(nn.Linear,))


def test_compile_options_need_compile():
    with pytest.raises(ValueError, match="compile=True"):
        apply_fsdp(nn.Linear(2, 2), units=(nn.Linear,), compile_options=CPU_COMPILE)


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


def _gluon_units_worker(rank: int, world_size: int) -> list[str]:
    """The kernels of a compiled zero.FSDP step of a model whose attention takes fa2's Gluon
    kernels by default on Hopper (head dim 128, 2,048 tokens, bf16, selective checkpointing, as
    the leaderboard step), after a warm-up step."""
    torch.manual_seed(0)
    model = TransformerLM(
        vocab_size=97, context_length=2048, d_model=256, num_layers=2, num_heads=2, d_ff=512,
        attention="fa2-triton",
    )  # fmt: skip
    apply_activation_checkpointing(model, policy="selective")
    fsdp = apply_fsdp(model.cuda().bfloat16(), units=LM_UNITS, compile=True)
    tokens = torch.randint(97, (1, 2049), device="cuda")

    def step() -> None:
        fsdp(tokens[:, :-1], targets=tokens[:, 1:]).backward()
        fsdp.finish_gradient_synchronization()

    step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return sorted({event.name for event in prof.events() if event.device_type.name == "CUDA"})


@pytest.mark.gpu
def test_nccl_compiled_units_run_fa2s_gluon_kernels_on_hopper():
    # the compiled blocks keep their sequence length static, so fa2 takes its Gluon kernels
    # there; with one frame shared by every unit class they ran its Triton ones
    # (docs/results/step_profile_2xh200_2026-11-28)
    configs = pytest.importorskip("fa2.triton.configs")  # fa2 is not among zero's own deps
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):
        pytest.skip("needs an sm_90 GPU (H100, H200)")
    if not configs.gluon_triton():
        pytest.skip("needs the Triton whose Gluon fa2's kernels are written for")
    kernels = run_ranks(_gluon_units_worker, world_size=1, backend="nccl")[0]
    assert "_gluon_fwd_kernel" in kernels and "_gluon_bwd_kernel" in kernels, kernels
    assert not {"_fwd_kernel", "_dq_kernel", "_dkdv_kernel"} & set(kernels), kernels


def _gpu_lm(attention: str = "fa2-triton") -> TransformerLM:
    """Three checkpointed blocks wide enough for fa2's Triton kernels (head dim 16)."""
    torch.manual_seed(0)
    model = TransformerLM(
        vocab_size=VOCAB, context_length=SEQ, d_model=64, num_layers=3, num_heads=4, d_ff=172,
        attention=attention,
    )  # fmt: skip
    return apply_activation_checkpointing(model, policy="blocks")


def _on_cpu(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.cpu() for k, v in state.items()}


def _gpu_compiled_worker(rank: int, world_size: int) -> dict[str, Any]:
    """bf16 storage, fa2's Triton kernels, block checkpointing, units compiled by inductor."""
    from torch._dynamo.utils import counters

    def bf16() -> TransformerLM:
        return _gpu_lm().cuda().bfloat16()

    def reference(optimizer: str, *, plain: bool) -> dict[str, torch.Tensor]:
        # float32 with naive attention (exact softmax, no TF32): the same weights and steps
        model = bf16() if plain else _gpu_lm("naive").cuda().bfloat16().float()
        return _on_cpu(_train_reference(model, optimizer, halves=1))

    results: dict[str, Any] = {}
    counters.clear()
    for optimizer in ("sgd", "lmcore-fused-bf16"):
        fsdp = apply_fsdp(bf16(), units=LM_UNITS, compile=True)
        results[optimizer] = _on_cpu(_train_fsdp(fsdp, optimizer, rank, world_size))
    results["graphs"] = counters["stats"]["unique_graphs"]
    results["eager"] = _on_cpu(_train_fsdp(FSDP(bf16(), units=LM_UNITS), "sgd", rank, world_size))
    results["sgd-plain"] = reference("sgd", plain=True)
    results["sgd-fp32"] = reference("sgd", plain=False)
    results["adamw-plain"] = reference("adamw", plain=True)
    results["adamw-fp32"] = reference("adamw", plain=False)
    return results


@pytest.fixture(scope="module")
def gpu_compiled() -> dict[str, Any]:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    return run_ranks(_gpu_compiled_worker, world_size=2, backend="nccl")[0]


@pytest.mark.gpu
def test_nccl_compiled_bf16_fa2_units_are_within_twice_the_error_of_one_bf16_process(
    gpu_compiled,
):
    _assert_within_twice_the_plain_error(
        gpu_compiled["sgd"], gpu_compiled["sgd-plain"], gpu_compiled["sgd-fp32"]
    )
    _assert_within_twice_the_plain_error(
        gpu_compiled["eager"], gpu_compiled["sgd-plain"], gpu_compiled["sgd-fp32"]
    )


@pytest.mark.gpu
def test_nccl_fused_adamw_with_bf16_moments_on_compiled_bf16_units(gpu_compiled):
    _assert_within_twice_the_plain_error(
        gpu_compiled["lmcore-fused-bf16"],
        gpu_compiled["adamw-plain"],
        gpu_compiled["adamw-fp32"],
    )


@pytest.mark.gpu
def test_nccl_identical_units_compile_once_under_inductor(gpu_compiled):
    # two models, each three blocks, an embedding and a head: one graph per unit class
    assert gpu_compiled["graphs"] == len(LM_UNITS)


# The leaderboard model's vocabulary and block shape cut small: its two largest weights (the
# embedding and the head, 151,936 × 1024) against four blocks, 8,192 tokens per rank.
_MEMORY_MODEL = {
    "vocab_size": 151_936, "context_length": 8192, "d_model": 1024, "num_layers": 4,
    "num_heads": 8, "d_ff": 2816, "attention": "fa2-triton",
}  # fmt: skip


def _memory_lm() -> TransformerLM:
    with torch.device("meta"):
        model = TransformerLM(**_MEMORY_MODEL)
    model = model.to_empty(device="cuda")
    torch.manual_seed(0)
    model.reset_parameters()
    return apply_activation_checkpointing(model.bfloat16(), policy="blocks")


def _step_peak(model: nn.Module, rank: int) -> int:
    """Bytes a forward and backward adds to what is allocated before it (the second step:
    the first compiles)."""
    g = torch.Generator().manual_seed(rank)
    shape = (1, _MEMORY_MODEL["context_length"])  # (batch, seq) token ids
    tokens, targets = (
        torch.randint(_MEMORY_MODEL["vocab_size"], shape, generator=g).cuda() for _ in range(2)
    )
    for _ in range(2):
        for p in model.parameters():
            p.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        model(tokens, targets=targets).backward()
        getattr(model, "finish_gradient_synchronization", lambda: None)()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    return peak


def _gpu_memory_worker(rank: int, world_size: int) -> tuple[int, int]:
    """(ours, FSDP2's) step peak: bf16 weights, block checkpointing, compiled blocks, fused loss."""
    from torch.distributed.fsdp import fully_shard

    ours = _step_peak(apply_fsdp(_memory_lm(), units=LM_UNITS, compile=True), rank)
    torch.compiler.reset()
    model = _memory_lm()
    for block in model.layers:
        block.compile()  # FSDP2's hooks are skipped by dynamo
        fully_shard(block)
    theirs = _step_peak(fully_shard(model), rank)
    return ours, theirs


@pytest.mark.gpu
def test_nccl_step_peak_is_at_most_fsdp2s_with_the_same_model_and_loss():
    # FSDP2 keeps the root's embedding and head gathered from the forward to the end of the
    # backward, with the head's gradient; ours gathers them around their own passes only.
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    for ours, theirs in run_ranks(_gpu_memory_worker, world_size=2, backend="nccl"):
        print(f"step peak: zero.FSDP {ours / 2**20:.0f} MiB, FSDP2 {theirs / 2**20:.0f} MiB")
        assert ours <= theirs, f"{ours / 2**20:.0f} MiB vs FSDP2's {theirs / 2**20:.0f} MiB"

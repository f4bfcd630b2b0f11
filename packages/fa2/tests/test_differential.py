"""A differential test over fa2's argument space: the Triton path against the PyTorch path.

A seeded generator draws problems for `fa2.api.attend`, which every front door calls: layouts
("bhsd", "bshd" and packed "thd"), odd lengths, no batch dim to two, one to three query heads
per key/value head, head dims the kernels pad, fp32/bf16/fp16, causal masks aligned either
way, windows (sides from 0 to far past the sequence, 2**31 - 1 and beyond), softcaps, scales,
the logsumexp, both backwards, and packed-sequence offsets, valid and broken. Each problem is
called twice with the same tensors, the second time with other offsets or another scale, so
that the second call runs on the Triton path's cached launch plan. Every call must give the
same outcome on both paths: the same error type, or o, the logsumexp and the three gradients
each within twice the error that plain PyTorch attention makes in the inputs' dtype (plus a
floor) of the PyTorch path run in float64 (flash-attn's tolerance, see `_agree`).

On a CPU the Triton kernels run in Triton's interpreter, which is slow, so CI draws
`DEFAULT_PROBLEMS` problems. More on demand, through two environment variables:

    FA2_DIFFERENTIAL_PROBLEMS=200 FA2_DIFFERENTIAL_SEED=7 \\
        uv run pytest packages/fa2/tests/test_differential.py

`FA2_DIFFERENTIAL_SEED` (default 0, so that CI draws the same problems every run) picks the
problems; a failure names the seed and the problem's index, which `_draw` replays.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from fa2 import attention_reference, varlen_attention_reference
from fa2.api import attend
from fa2.masks import NO_WINDOW

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Problems drawn in CI: one to two seconds each in Triton's interpreter on a CPU (two calls of
# forward and backward at these sizes).
DEFAULT_PROBLEMS = 3
NUM_PROBLEMS = int(os.environ.get("FA2_DIFFERENTIAL_PROBLEMS", DEFAULT_PROBLEMS))
SEED = int(os.environ.get("FA2_DIFFERENTIAL_SEED", 0))

_DTYPES = (torch.float32, torch.float32, torch.bfloat16, torch.float16)
# Window sides: unbounded, the diagonal alone, short, longer than any sequence drawn here, and
# sides whose row arithmetic overflows int32 unless they are read as unbounded.
_SIDES = (-1, 0, 3, 17, 50, 2**31 - 1, 2**31, 2**40)
# Ways to break a packed call, each refused by both paths on every call. Those of the offsets'
# values are refused on a GPU by a device-side assert, which ends the process's CUDA context:
# drawn on a CPU only (test_checks_every_call covers the GPU in a process of its own).
_BROKEN_VALUES = ("start", "end-short", "past-end", "decreasing", "max-seqlen-low")
_BROKEN_OFFSETS = ("int64", "max-seqlen-float", "count-mismatch") + (
    _BROKEN_VALUES if DEVICE == "cpu" else ()
)
# Ways to break any call's options.
_BROKEN_OPTIONS = ("window-side", "softcap", "precision", "head-dim")


@dataclass
class Call:
    """One call of `attend` on a problem's tensors: its keyword arguments but q, k, v."""

    options: dict[str, Any]
    broken: str | None = None  # what was broken on purpose, for the failure message


@dataclass
class Problem:
    """Tensors (in their dtype, on DEVICE) and the calls made with them."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    do: torch.Tensor
    calls: list[Call] = field(default_factory=list)


def _lengths(rng: random.Random, count: int) -> list[int]:
    """Packed sequence lengths, empty and single-token ones included."""
    return [rng.choice((0, 1, rng.randint(2, 24), rng.randint(2, 24))) for _ in range(count)]


def _repartition(rng: random.Random, total: int, count: int) -> list[int]:
    """`count` lengths summing to `total` (other boundaries over the same tokens)."""
    cuts = sorted(rng.randint(0, total) for _ in range(count - 1))
    return [b - a for a, b in zip([0, *cuts], [*cuts, total], strict=True)]


def _offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def _packed_options(rng: random.Random, lengths_q: list[int], lengths_k: list[int]) -> dict:
    """The packed-sequence arguments for these lengths, larger max_seqlen now and then."""
    cu_q, cu_k = _offsets(lengths_q), _offsets(lengths_k)
    if lengths_q == lengths_k and rng.random() < 0.5:
        cu_k = cu_q  # self-attention passes one tensor for both
    slack = rng.choice((0, 0, 5))
    return {
        "cu_seqlens_q": cu_q.to(DEVICE),
        "cu_seqlens_k": cu_k.to(DEVICE),
        "max_seqlen_q": max(lengths_q) + slack,
        "max_seqlen_k": max(lengths_k) + slack,
    }


def _break_offsets(rng: random.Random, options: dict, how: str) -> None:
    """Make the packed description invalid in the way `how` names (in place)."""
    cu_q = options["cu_seqlens_q"].clone()
    if how == "int64":
        cu_q = cu_q.long()
    elif how == "start":
        cu_q[0] = 1
    elif how == "end-short":
        cu_q[-1] -= 1
    elif how == "past-end":
        cu_q[-1] += 3
    elif how == "decreasing":
        cu_q[1] = cu_q[-1] + 1
    elif how == "max-seqlen-low":
        options["max_seqlen_q"] = int(cu_q.diff().max()) - 1
    elif how == "max-seqlen-float":
        options["max_seqlen_q"] = float(options["max_seqlen_q"])
    elif how == "count-mismatch":
        cu_q = torch.cat([cu_q, cu_q[-1:]])
    options["cu_seqlens_q"] = cu_q


def _break_options(rng: random.Random, options: dict, how: str) -> None:
    if how == "window-side":
        options["window_size"] = (-2, rng.choice(_SIDES))
    elif how == "softcap":
        options["softcap"] = -1.0
    elif how == "precision":
        options["precision"] = "fp8"


def _draw(seed: int, index: int) -> Problem:
    """Problem `index` of the series `seed` (the same on every run; on a GPU, which draws no
    broken offset values, the series differs from a CPU's)."""
    rng = random.Random(f"fa2-differential-{seed}-{index}")
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    layout = rng.choice(("bhsd", "bshd", "thd"))
    dtype = rng.choice(_DTYPES)
    d = rng.choice((8, 16, 24, 32))  # 24: padded to the next power of two inside the kernels
    # (key/value heads, query heads per key/value head): MHA, MQA, GQA of 2 and 3
    kv_heads, group = rng.choice(((1, 1), (2, 1), (1, 2), (2, 2), (1, 3)))
    heads = kv_heads * group
    broken_option = rng.choice(_BROKEN_OPTIONS) if rng.random() < 0.15 else None
    d_k = d + 8 if broken_option == "head-dim" else d
    options: dict[str, Any] = {
        "causal": rng.random() < 0.5,
        "bottom_right": rng.random() < 0.5,
        "window_size": NO_WINDOW
        if rng.random() < 0.4
        else (rng.choice(_SIDES), rng.choice(_SIDES)),
        "softcap": rng.choice((0.0, 0.0, round(rng.uniform(2.0, 30.0), 2))),
        "scale": rng.choice((None, None, round(rng.uniform(0.05, 1.0), 3))),
        "layout": layout,
        "return_lse": rng.random() < 0.3,
        "deterministic": rng.random() < 0.5,
        "precision": rng.choice((None, None, "ieee")) if dtype == torch.float32 else None,
    }
    if broken_option is not None:
        _break_options(rng, options, broken_option)

    if layout == "thd":
        count = rng.randint(1, 4)
        lengths_q = _lengths(rng, count)
        lengths_k = lengths_q if rng.random() < 0.5 else _lengths(rng, count)
        if sum(lengths_k) == 0:  # at least one key somewhere, or every call is refused
            lengths_k[0] = 1
        q_shape, kv_shape = (sum(lengths_q), heads, d), (sum(lengths_k), kv_heads, d_k)
        first = options | _packed_options(rng, lengths_q, lengths_k)
        # The second call: other boundaries over the same tokens (the same launch plan).
        new_q = _repartition(rng, sum(lengths_q), count)
        new_k = new_q if lengths_k == lengths_q else _repartition(rng, sum(lengths_k), count)
        second = options | _packed_options(rng, new_q, new_k)
        broken = rng.choice(_BROKEN_OFFSETS) if rng.random() < 0.5 else None
        if broken is not None:
            _break_offsets(rng, second, broken)
        calls = [Call(first, broken_option), Call(second, broken or broken_option)]
    else:
        n_q = rng.choice((1, rng.randint(2, 40)))
        n_k = n_q if rng.random() < 0.5 else rng.choice((1, rng.randint(2, 40)))
        batch = rng.choice(((), (2,))) if heads <= 2 else ()  # the interpreter's time: few heads
        if layout == "bhsd":
            q_shape, kv_shape = (*batch, heads, n_q, d), (*batch, kv_heads, n_k, d_k)
        else:
            q_shape, kv_shape = (*batch, n_q, heads, d), (*batch, n_k, kv_heads, d_k)
        again = options | {"scale": rng.choice((None, round(rng.uniform(0.05, 1.0), 3)))}
        calls = [Call(options, broken_option), Call(again, broken_option)]

    def randn(shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randn(shape, generator=generator).to(device=DEVICE, dtype=dtype)

    return Problem(randn(q_shape), randn(kv_shape), randn(kv_shape), randn(q_shape), calls)


def _run(problem: Problem, call: Call, implementation: str, dtype: torch.dtype) -> Any:
    """(o, lse or None, dq, dk, dv) of the call in `dtype`, or the exception it raised."""
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (problem.q, problem.k, problem.v))
    try:
        out = attend(q, k, v, implementation=implementation, **call.options)
        o, lse = out if call.options["return_lse"] else (out, None)
        grads = torch.autograd.grad(o, (q, k, v), problem.do.to(dtype))
    except Exception as exc:  # any outcome is compared, errors included
        return exc
    return (o, lse, *grads)


def _plain(problem: Problem, call: Call, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """(o, lse, dq, dk, dv) of plain attention (the materialised reference) in `dtype`."""
    options = call.options
    layout = options["layout"]
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (problem.q, problem.k, problem.v))
    masks = {
        "causal": options["causal"],
        "scale": options["scale"],
        "window_size": options["window_size"],
        "softcap": options["softcap"],
        "bottom_right": options["bottom_right"],
    }
    if layout == "thd":
        cu_q, cu_k = (options[f"cu_seqlens_{s}"].cpu() for s in "qk")
        o, lse = varlen_attention_reference(q, k, v, cu_q, cu_k, **masks)
    else:
        swap = (lambda t: t) if layout == "bhsd" else (lambda t: t.transpose(-3, -2))
        o, lse = attention_reference(swap(q), swap(k), swap(v), **masks)
        o = swap(o)
    return (o, lse, *torch.autograd.grad(o, (q, k, v), problem.do.to(dtype)))


def _rms(x: torch.Tensor) -> float:
    return x.double().square().mean().sqrt().item() if x.numel() else 0.0


def _agree(ours: tuple, oracle: tuple, plain: tuple, dtype: torch.dtype) -> list[str]:
    """What differs: each output's root-mean-square error against the oracle beyond twice
    plain PyTorch's plus a floor. The floor is relative to the output's own size, but to no
    less than 1, the size of the inputs (unit normal): an output that is exactly 0 (the
    gradients of a query that sees one key) comes out as rounding noise of that size. It is
    1e-5 in fp32 and one unit of the dtype's precision (its eps) in 16 bits, where the
    kernels round the probabilities to the dtype before multiplying them (as FlashAttention
    does) and plain PyTorch on a few keys can be luckier than twice."""
    floor = 1e-5 if dtype == torch.float32 else torch.finfo(dtype).eps
    problems = []
    for name, x, ref, p in zip(("o", "lse", "dq", "dk", "dv"), ours, oracle, plain, strict=True):
        if x is None:
            continue
        if x.shape != ref.shape:
            problems.append(f"{name}: shape {tuple(x.shape)} vs {tuple(ref.shape)}")
            continue
        if name == "lse":  # +inf where a query sees nothing, on both paths
            seen = torch.isfinite(ref)
            if not torch.equal(torch.isfinite(x), seen):
                problems.append("lse: +inf in other places")
                continue
            x, ref, p = x[seen], ref[seen], p[seen]
        ref = ref.double()
        err = _rms(x.double() - ref)
        budget = 2 * _rms(p.double() - ref) + floor * max(_rms(ref), 1.0)
        if not err <= budget:  # NaN fails too
            problems.append(f"{name}: error {err:.2e} > budget {budget:.2e}")
    return problems


def _outcome(result: Any) -> str:
    return f"raised {result!r}" if isinstance(result, Exception) else "ran"


def _check_problem(seed: int, index: int) -> list[str]:
    """Run every call of problem `index` on both paths; what went wrong, if anything."""
    problem = _draw(seed, index)
    failures = []
    for number, call in enumerate(problem.calls):
        where = f"seed {seed}, problem {index}, call {number} (broken: {call.broken})"
        dtype = problem.q.dtype
        triton = _run(problem, call, "triton", dtype)
        pytorch = _run(problem, call, "pytorch", dtype)
        if isinstance(pytorch, Exception) or isinstance(triton, Exception):
            if type(triton) is not type(pytorch):
                failures.append(f"{where}: triton {_outcome(triton)}, pytorch {_outcome(pytorch)}")
            continue
        if call.broken is not None:
            failures.append(f"{where}: a broken call ran on both paths")
            continue
        oracle = _run(problem, call, "pytorch", torch.float64)
        plain = _plain(problem, call, dtype)
        failures += [f"{where}: {p}" for p in _agree(triton, oracle, plain, dtype)]
    return failures


@pytest.mark.parametrize("index", range(NUM_PROBLEMS))
def test_triton_and_pytorch_paths_agree(index):
    failures = _check_problem(SEED, index)
    assert not failures, "\n".join(failures)


def test_the_generator_is_deterministic_and_covers_the_space():
    # The same seed draws the same problems; 400 draws reach every layout, dtype, broken
    # offset and window side the generator knows.
    a, b = _draw(3, 5), _draw(3, 5)
    assert torch.equal(a.q, b.q) and a.calls[1].options.keys() == b.calls[1].options.keys()
    problems = [_draw(0, i) for i in range(400)]
    calls = [c for p in problems for c in p.calls]
    assert {c.options["layout"] for c in calls} == {"bhsd", "bshd", "thd"}
    assert {p.q.dtype for p in problems} == set(_DTYPES)
    assert set(_BROKEN_OFFSETS) | set(_BROKEN_OPTIONS) <= {c.broken for c in calls}
    sides = {s for c in calls for s in c.options["window_size"]}
    assert set(_SIDES) <= sides

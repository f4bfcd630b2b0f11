"""Both implementations against a float64 oracle: outputs, the saved logsumexp, and gradients.

On a machine without CUDA the Triton kernels run in Triton's interpreter (the root conftest sets
TRITON_INTERPRET=1), so shapes stay small; with CUDA every test runs on the GPU.
"""

import math

import pytest
import torch

from fa2 import FlashAttention2PyTorch, FlashAttention2Triton, attention_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
IMPLS = {"pytorch": FlashAttention2PyTorch, "triton": FlashAttention2Triton}


def _inputs(shape_q, n_keys, dtype, *, seed=None):
    """Fresh random q, k, v (std 1, as after a norm layer) that require grad."""
    g = torch.Generator(device=DEVICE)
    g.seed() if seed is None else g.manual_seed(seed)
    *lead, n_q, d = shape_q
    make = lambda n: torch.randn(*lead, n, d, generator=g, device=DEVICE).to(dtype)  # noqa: E731
    return [t.requires_grad_() for t in (make(n_q), make(n_keys), make(n_keys))]


def _run(fn, q, k, v, causal, do):
    o = fn(q, k, v, causal)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    return o, dq, dk, dv


def _oracle(q, k, v, causal, do):
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o, lse = attention_reference(q64, k64, v64, causal=causal)
    return (o, *torch.autograd.grad(o, (q64, k64, v64), do.double())), lse


def _plain(q, k, v, causal, do):
    """The same math in plain PyTorch and the inputs' dtype: sets the error scale of that dtype."""
    qp, kp, vp = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o, _ = attention_reference(qp, kp, vp, causal=causal)
    return (o, *torch.autograd.grad(o, (qp, kp, vp), do))


def _error(x, ref):
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-12)).item()


def _assert_close_to_oracle(impl, q, k, v, causal):
    """Each of o, dq, dk, dv: error vs fp64 at most 2x plain PyTorch's in this dtype, + a floor."""
    do = torch.randn_like(q)
    ours = _run((IMPLS | SINGLE_PASS)[impl].apply, q, k, v, causal, do)
    oracle, _ = _oracle(q, k, v, causal, do)
    plain = _plain(q, k, v, causal, do)
    floor = 1e-5 if q.dtype in (torch.float32, torch.float64) else 1e-3
    for name, x, p, ref in zip(("o", "dq", "dk", "dv"), ours, plain, oracle, strict=True):
        assert torch.isfinite(x).all(), f"{name} has non-finite values"
        if ref.norm() < 1e-9:  # e.g. dq, dk are exactly 0 with a single key
            torch.testing.assert_close(x.double(), ref, atol=1e-5, rtol=0)
            continue
        err, budget = _error(x, ref), 2 * _error(p, ref) + floor
        assert err <= budget, f"{name}: error {err:.2e} > budget {budget:.2e}"


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "n_q, n_k", [(1, 1), (17, 17), (64, 64), (100, 37), (37, 100)], ids=lambda x: str(x)
)
def test_matches_oracle_for_odd_and_unequal_lengths(impl, causal, n_q, n_k):
    q, k, v = _inputs((1, 2, n_q, 32), n_k, torch.float32)
    _assert_close_to_oracle(impl, q, k, v, causal)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("d", [16, 24, 32, 64, 128])
def test_matches_oracle_for_each_head_dim(impl, d):
    q, k, v = _inputs((2, 45, d), 45, torch.float32)
    _assert_close_to_oracle(impl, q, k, v, causal=True)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_matches_oracle_in_16_bit(impl, dtype, causal):
    q, k, v = _inputs((2, 2, 70, 64), 53, dtype)
    _assert_close_to_oracle(impl, q, k, v, causal)


@pytest.mark.parametrize("impl", IMPLS)
def test_long_sequence_spanning_many_tiles(impl):
    n = 1000 if impl == "pytorch" or DEVICE == "cuda" else 300
    q, k, v = _inputs((1, n, 16), n, torch.float32)
    _assert_close_to_oracle(impl, q, k, v, causal=True)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [False, True])
def test_saves_one_logsumexp_of_shape_batch_by_queries(impl, causal):
    q, k, v = _inputs((2, 3, 33, 16), 20, torch.float32)
    o = IMPLS[impl].apply(q, k, v, causal)
    saved = [t for t in o.grad_fn.saved_tensors if t is not None]  # None: no packed sequences
    row_shaped = [t for t in saved if t.shape == q.shape[:-1]]
    assert len(row_shaped) == 1
    assert row_shaped[0].dtype == torch.float32
    _, lse = _oracle(q, k, v, causal, torch.randn_like(o))
    torch.testing.assert_close(row_shaped[0].double(), lse, atol=1e-5, rtol=1e-5)
    assert all(t.numel() < q.shape[-2] * k.shape[-2] * 6 for t in saved)  # no score matrix


@pytest.mark.parametrize("impl", IMPLS)
def test_three_and_four_dim_inputs_agree(impl):
    q, k, v = _inputs((2, 3, 40, 16), 40, torch.float32)
    o4 = IMPLS[impl].apply(q, k, v, True)
    o3 = IMPLS[impl].apply(*(t.reshape(6, 40, 16) for t in (q, k, v)), True)
    torch.testing.assert_close(o4.reshape(6, 40, 16), o3)


@pytest.mark.parametrize("impl", IMPLS)
def test_non_contiguous_inputs(impl):
    # (batch, seq, heads, d) transposed to (batch, heads, seq, d): strided along seq and heads.
    q, k, v = _inputs((2, 30, 3, 16), 3, torch.float32)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    assert not qt.is_contiguous()
    do = torch.randn_like(qt)
    ours = _run(IMPLS[impl].apply, qt, kt, vt, True, do)
    oracle, _ = _oracle(qt, kt, vt, True, do)
    for x, ref in zip(ours, oracle, strict=True):
        assert _error(x, ref) < 1e-5


@pytest.mark.parametrize("impl", IMPLS)
def test_custom_scale(impl):
    q, k, v = _inputs((2, 30, 16), 30, torch.float32)
    o = IMPLS[impl].apply(q, k, v, False, 0.3)
    ref, _ = attention_reference(q.double(), k.double(), v.double(), scale=0.3)
    assert _error(o, ref) < 1e-5
    assert _error(o, attention_reference(q.double(), k.double(), v.double())[0]) > 1e-3


def test_pytorch_path_passes_gradcheck_in_float64():
    q, k, v = (t.detach().double().requires_grad_() for t in _inputs((2, 9, 4), 7, torch.float32))
    for causal in (False, True):
        fn = lambda a, b, c, causal=causal: FlashAttention2PyTorch.apply(a, b, c, causal)  # noqa: E731
        assert torch.autograd.gradcheck(fn, (q, k, v), fast_mode=True)


def test_fp32_error_is_at_fp32_rounding_level():
    q, k, v = _inputs((1, 2, 100, 64), 100, torch.float32)
    o = FlashAttention2Triton.apply(q, k, v, True)
    ref, _ = attention_reference(*(t.double() for t in (q, k, v)), causal=True)
    assert _error(o, ref) < 1e-5 * math.sqrt(64)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape_q, n_k, dtype, causal",
    [
        ((2, 4, 2048, 64), 2048, torch.bfloat16, True),
        ((2, 4, 1000, 64), 3000, torch.bfloat16, True),
        ((1, 2, 1500, 128), 1024, torch.float16, False),
        ((1, 2, 777, 256), 777, torch.bfloat16, True),
        ((1, 2, 1024, 128), 1024, torch.float32, True),
        ((2, 2, 1000, 64), 1000, torch.float32, True),
        # past configs.SHORT_SEQ: the general tiles, with a ragged last tile
        ((1, 2, 5000, 128), 5000, torch.bfloat16, True),
    ],
    ids=str,
)
def test_triton_matches_oracle_at_real_sizes(shape_q, n_k, dtype, causal):
    q, k, v = _inputs(shape_q, n_k, dtype)
    _assert_close_to_oracle("triton", q, k, v, causal)


@pytest.mark.gpu
def test_autotuning_keeps_results_correct(monkeypatch):
    monkeypatch.setenv("FA2_AUTOTUNE", "1")
    q, k, v = _inputs((2, 2, 600, 64), 600, torch.bfloat16)
    _assert_close_to_oracle("triton", q, k, v, causal=True)


def _expand_heads(x, group):
    """k or v with each key/value head repeated for the `group` query heads that share it."""
    return x.repeat_interleave(group, dim=-3)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (6, 1)], ids=["gqa", "mqa"])
@pytest.mark.parametrize("causal", [False, True])
def test_grouped_query_attention_matches_repeated_keys(impl, heads, kv_heads, causal):
    q, _, _ = _inputs((2, heads, 37, 16), 37, torch.float32)
    _, k, v = _inputs((2, kv_heads, 37, 16), 45, torch.float32)
    do = torch.randn_like(q)
    ours = _run(IMPLS[impl].apply, q, k, v, causal, do)
    group = heads // kv_heads
    oracle, _ = _oracle(q, _expand_heads(k, group), _expand_heads(v, group), causal, do)
    # the oracle's dK/dV are per query head: the shared heads' gradients are their sums
    oracle = (*oracle[:2], *(g.unflatten(-3, (kv_heads, group)).sum(-3) for g in oracle[2:]))
    for name, x, ref in zip(("o", "dq", "dk", "dv"), ours, oracle, strict=True):
        assert x.shape == ref.shape, name
        assert _error(x, ref) < 1e-5, name


@pytest.mark.parametrize("impl", IMPLS)
def test_grouped_query_attention_in_16_bit(impl):
    q, _, _ = _inputs((1, 4, 70, 64), 70, torch.bfloat16)
    _, k, v = _inputs((1, 2, 70, 64), 53, torch.bfloat16)
    do = torch.randn_like(q)
    ours = _run(IMPLS[impl].apply, q, k, v, True, do)
    kk, vv = (_expand_heads(t.detach(), 2).requires_grad_() for t in (k, v))
    plain = _plain(q, kk, vv, True, do)
    oracle, _ = _oracle(q, kk, vv, True, do)
    sums = lambda g: g.unflatten(-3, (2, 2)).sum(-3)  # noqa: E731
    plain = (*plain[:2], *(sums(g) for g in plain[2:]))
    oracle = (*oracle[:2], *(sums(g) for g in oracle[2:]))
    for name, x, p, ref in zip(("o", "dq", "dk", "dv"), ours, plain, oracle, strict=True):
        assert _error(x, ref) <= 2 * _error(p, ref) + 1e-3, name


@pytest.mark.parametrize("impl", IMPLS)
def test_heads_that_do_not_divide_are_rejected(impl):
    q, _, _ = _inputs((1, 3, 8, 16), 8, torch.float32)
    _, k, v = _inputs((1, 2, 8, 16), 8, torch.float32)
    with pytest.raises(ValueError, match="multiple of k's heads"):
        IMPLS[impl].apply(q, k, v, False)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [False, True])
def test_returns_the_logsumexp_on_request(impl, causal):
    q, k, v = _inputs((2, 3, 33, 16), 20, torch.float32)
    o, lse = IMPLS[impl].apply(q, k, v, causal, None, True)
    ref_o, ref_lse = attention_reference(*(t.double() for t in (q, k, v)), causal=causal)
    assert _error(o, ref_o) < 1e-5
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)
    assert not lse.requires_grad
    o.sum().backward()  # the output stays differentiable beside it
    assert q.grad is not None


@pytest.mark.parametrize("impl", IMPLS)
def test_double_backward_is_refused(impl):
    q, k, v = _inputs((1, 2, 20, 16), 20, torch.float32)
    o = IMPLS[impl].apply(q, k, v, True)
    (dq,) = torch.autograd.grad(o.square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        dq.sum().backward()


@pytest.mark.parametrize("precision", ["tf32x3", "ieee"])
def test_triton_fp32_precisions_are_exact_enough(precision):
    q, k, v = _inputs((1, 2, 100, 64), 100, torch.float32)
    o = FlashAttention2Triton.apply(q, k, v, True, None, False, precision)
    ref, _ = attention_reference(*(t.double() for t in (q, k, v)), causal=True)
    assert _error(o, ref) < 1e-5 * math.sqrt(64)


def test_triton_rejects_unknown_precision_and_bad_scale():
    q, k, v = _inputs((1, 20, 16), 20, torch.float32)
    with pytest.raises(ValueError, match="precision must be one of"):
        FlashAttention2Triton.apply(q, k, v, True, None, False, "fp8")
    with pytest.raises(ValueError, match="positive softmax scale"):
        FlashAttention2Triton.apply(q, k, v, True, -0.5)


class _SinglePass:
    """FlashAttention2Triton with `deterministic=False`: fp32 takes the single-pass backward."""

    @staticmethod
    def apply(q, k, v, causal=False, scale=None, return_lse=False):
        return FlashAttention2Triton.apply(q, k, v, causal, scale, return_lse, None, False)


SINGLE_PASS = {"triton-single-pass": _SinglePass}  # not in IMPLS: only the tests below


@pytest.fixture
def single_pass_for_16_bit(monkeypatch):
    """Let 16-bit inputs take the single-pass backward too (by default they keep two passes)."""
    from fa2.triton import configs

    monkeypatch.setattr(configs, "single_pass_backward", lambda dtype: True)


def test_single_pass_is_chosen_for_fp32_only():
    from fa2.triton.backward import BackwardPlan
    from fa2.triton.function import run_forward

    for dtype, single in ((torch.float32, True), (torch.bfloat16, False)):
        q, k, v = (t.detach() for t in _inputs((1, 2, 40, 16), 40, dtype))
        o, lse, plan = run_forward(q, k, v, True)
        args = (plan, q, k, v, o, lse, torch.randn_like(q))
        assert ("fused" in BackwardPlan(*args, False, False).launches) == single
        assert "fused" not in BackwardPlan(*args, True, False).launches


@pytest.mark.parametrize("impl", SINGLE_PASS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_k", [(64, 64), (100, 37), (37, 100)], ids=str)
def test_single_pass_matches_oracle(impl, causal, n_q, n_k):
    q, k, v = _inputs((1, 2, n_q, 32), n_k, torch.float32)
    _assert_close_to_oracle(impl, q, k, v, causal)


@pytest.mark.parametrize("impl", SINGLE_PASS)
@pytest.mark.parametrize("d", [24, 64])
def test_single_pass_matches_oracle_for_padded_and_full_head_dims(impl, d):
    q, k, v = _inputs((2, 45, d), 45, torch.float32)
    _assert_close_to_oracle(impl, q, k, v, causal=True)


@pytest.mark.parametrize("impl", SINGLE_PASS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_single_pass_in_16_bit(impl, dtype, single_pass_for_16_bit):
    q, k, v = _inputs((2, 2, 70, 64), 53, dtype)
    _assert_close_to_oracle(impl, q, k, v, causal=True)


@pytest.mark.parametrize("impl", SINGLE_PASS)
def test_single_pass_with_grouped_heads_and_transposed_layout(impl):
    # (batch, seq, heads, d) transposed, 4 query heads per key/value head
    q = torch.randn(2, 33, 4, 16, device=DEVICE).transpose(1, 2).requires_grad_()
    k, v = (torch.randn(2, 41, 1, 16, device=DEVICE).transpose(1, 2).requires_grad_()
            for _ in range(2))  # fmt: skip
    do = torch.randn_like(q)
    ours = _run(SINGLE_PASS[impl].apply, q, k, v, True, do)
    oracle, _ = _oracle(q, _expand_heads(k, 4), _expand_heads(v, 4), True, do)
    oracle = (*oracle[:2], *(g.unflatten(-3, (1, 4)).sum(-3) for g in oracle[2:]))
    for name, x, ref in zip(("o", "dq", "dk", "dv"), ours, oracle, strict=True):
        assert x.shape == ref.shape and x.dtype == q.dtype, name
        assert _error(x, ref) < 1e-5, name


@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape_q, n_k, dtype, causal",
    [
        ((2, 4, 1000, 64), 1000, torch.float32, True),
        ((1, 2, 1024, 128), 1024, torch.float32, False),
        ((2, 4, 1000, 96), 1500, torch.bfloat16, True),
        ((1, 2, 777, 128), 777, torch.bfloat16, False),
    ],
    ids=str,
)
def test_single_pass_matches_oracle_at_real_sizes(shape_q, n_k, dtype, causal, monkeypatch):
    # On a Hopper GPU dQ tiles go through TMA reductions; rows past the end and padded columns
    # (d = 96) are clipped by the TMA unit. 16-bit inputs are forced onto the single pass.
    from fa2.triton import configs

    monkeypatch.setattr(configs, "single_pass_backward", lambda dtype: True)
    q, k, v = _inputs(shape_q, n_k, dtype)
    _assert_close_to_oracle("triton-single-pass", q, k, v, causal)

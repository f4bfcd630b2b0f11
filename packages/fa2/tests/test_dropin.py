"""flash-attn's interface, sliding windows, softcapping, packed sequences and layouts, against
float64 oracles: the materialised reference (itself checked against SDPA with explicit masks).

On a machine without CUDA the Triton kernels run in Triton's interpreter (the root conftest sets
TRITON_INTERPRET=1), so shapes stay small; with CUDA every test runs on the GPU.
"""

import pytest
import torch
import torch.nn.functional as F
from oracle_checks import assert_within_twice_plain as _compare
from oracle_checks import grads as _grads
from oracle_checks import relative_error as _error

from fa2 import (
    attention_reference,
    flash_attention,
    flash_attn_func,
    flash_attn_varlen_func,
    varlen_attention_reference,
)
from fa2.api import attend

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
IMPLS = ("pytorch", "triton")


def _randn(*shape, dtype=torch.float32, device=DEVICE):
    return torch.randn(*shape, device=device).to(dtype).requires_grad_()


def _check_dense(impl, q, k, v, layout="bhsd", **options):
    """`attend` with `options` against `attention_reference` in float64 and in q's dtype."""
    do = torch.randn(q.shape, device=q.device).to(q.dtype)
    o = attend(q, k, v, layout=layout, implementation=impl, scale=None, **options)
    ours = _grads(o, (q, k, v), do)
    bhsd = (lambda t: t) if layout == "bhsd" else (lambda t: t.transpose(-3, -2))
    reference = {k_: options[k_] for k_ in ("window_size", "softcap", "bottom_right")}

    def run(dtype):
        ins = [bhsd(t.detach()).to(dtype).requires_grad_() for t in (q, k, v)]
        ref, _ = attention_reference(*ins, causal=options["causal"], **reference)
        return [bhsd(g) for g in _grads(ref, ins, bhsd(do).to(dtype))]

    _compare(ours, run(torch.float64), run(q.dtype), q.dtype)


# Each case covers an edge: (n_q, n_k, heads, kv_heads, dtype, options)
DENSE_CASES = {
    "causal-window-gqa": (40, 40, 4, 2, torch.float32, dict(causal=True, window_size=(7, -1))),
    "window-both-sides-softcap-mqa-bottom-right": (
        37, 60, 2, 1, torch.float32,
        dict(causal=False, window_size=(5, 9), softcap=10.0, bottom_right=True),
    ),
    "bottom-right-causal-empty-rows-bf16": (
        60, 25, 2, 2, torch.bfloat16, dict(causal=True, bottom_right=True),
    ),
    "softcap-bf16": (33, 33, 4, 4, torch.bfloat16, dict(causal=False, softcap=5.0)),
}  # fmt: skip


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", DENSE_CASES)
def test_windows_softcap_and_alignment_match_the_oracle(impl, case):
    n_q, n_k, heads, kv_heads, dtype, options = DENSE_CASES[case]
    options = {"window_size": (-1, -1), "softcap": 0.0, "bottom_right": False} | options
    q = _randn(1, heads, n_q, 16, dtype=dtype)
    k, v = _randn(1, kv_heads, n_k, 16, dtype=dtype), _randn(1, kv_heads, n_k, 16, dtype=dtype)
    _check_dense(impl, q, k, v, **options)


def test_reference_masks_agree_with_sdpa_and_explicit_masks():
    # The oracle's bands, checked against SDPA given the mask spelled out element by element.
    q, k, v = (torch.randn(3, 11 if i == 0 else 17, 8, dtype=torch.float64) for i in range(3))
    i, j = torch.arange(11)[:, None], torch.arange(17)[None, :]
    cases = [  # (options, explicit mask: query i sees key j)
        (dict(causal=True), j <= i),
        (dict(causal=True, bottom_right=True), j <= i + 6),
        (dict(causal=False, window_size=(2, 3)), (j >= i - 2) & (j <= i + 3)),
        (dict(causal=True, window_size=(4, 9), bottom_right=True), (j >= i + 2) & (j <= i + 6)),
    ]
    for options, mask in cases:
        o, _ = attention_reference(q, k, v, **options)
        torch.testing.assert_close(o, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    s = q @ k.transpose(-1, -2) / 8**0.5
    o, lse = attention_reference(q, k, v, softcap=2.0)
    capped = 2.0 * torch.tanh(s / 2.0)
    torch.testing.assert_close(o, torch.softmax(capped, -1) @ v)
    torch.testing.assert_close(lse, torch.logsumexp(capped, -1))


LENGTHS = [1, 17, 40, 3, 2]  # 1 token, odd, longer than a tile, short ones together


def _cu(lengths, device=DEVICE):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                        device=device)  # fmt: skip


VARLEN_CASES = {
    "causal-gqa": (LENGTHS, 2, 1, torch.float32, dict(causal=True)),
    "cross-lengths-window-softcap-bf16": (
        [3, 20, 40, 1, 5], 2, 2, torch.bfloat16,
        dict(causal=False, window_size=(6, 2), softcap=8.0),
    ),
}  # fmt: skip


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", VARLEN_CASES)
def test_packed_sequences_match_the_oracle(impl, case):
    k_lengths, heads, kv_heads, dtype, options = VARLEN_CASES[case]
    cu_q, cu_k = _cu(LENGTHS), _cu(k_lengths)
    q = _randn(sum(LENGTHS), heads, 16, dtype=dtype)
    k, v = (_randn(sum(k_lengths), kv_heads, 16, dtype=dtype) for _ in range(2))
    do = torch.randn_like(q)
    o = attend(
        q, k, v, layout="thd", implementation=impl, scale=None, cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k, max_seqlen_q=max(LENGTHS), max_seqlen_k=max(k_lengths),
        bottom_right=True, **({"window_size": (-1, -1), "softcap": 0.0} | options),
    )  # fmt: skip
    ours = _grads(o, (q, k, v), do)

    def run(dtype):
        ins = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        ref, _ = varlen_attention_reference(*ins, cu_q.cpu(), cu_k.cpu(), bottom_right=True,
                                            **options)  # fmt: skip
        return _grads(ref, ins, do.to(dtype))

    _compare(ours, run(torch.float64), run(dtype), dtype)


def test_single_pass_backward_takes_packed_sequences_and_windows():
    # deterministic=False: fp32 takes the single pass (dQ added atomically) on the Triton path.
    cu = _cu(LENGTHS)
    q, k, v = (_randn(sum(LENGTHS), 2, 16) for _ in range(3))
    options = dict(causal=True, window_size=(9, -1))
    o = attend(q, k, v, scale=None, softcap=0.0, layout="thd", deterministic=False,
               implementation="triton", cu_seqlens_q=cu, cu_seqlens_k=cu,
               max_seqlen_q=max(LENGTHS), max_seqlen_k=max(LENGTHS), bottom_right=True,
               **options)  # fmt: skip
    do = torch.randn_like(o)
    ours = _grads(o, (q, k, v), do)
    ins = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref, _ = varlen_attention_reference(*ins, cu.cpu(), cu.cpu(), bottom_right=True, **options)
    for x, r in zip(ours, _grads(ref, ins, do.double()), strict=True):
        assert _error(x, r) < 1e-5


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")  # the NaN sequence itself
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("impl", IMPLS)
def test_tiles_never_cross_a_sequence_boundary(impl):
    # NaN in the keys and values of one sequence must stay in that sequence.
    cu = _cu(LENGTHS)
    q = _randn(sum(LENGTHS), 2, 16)
    k, v = (torch.randn(sum(LENGTHS), 2, 16, device=DEVICE) for _ in range(2))
    k[18:58], v[18:58] = float("nan"), float("nan")  # the 40-token sequence, rows 18 to 57
    k, v = k.requires_grad_(), v.requires_grad_()
    o = attend(q, k, v, causal=True, scale=None, window_size=(-1, -1), softcap=0.0,
               layout="thd", implementation=impl, cu_seqlens_q=cu, cu_seqlens_k=cu,
               max_seqlen_q=40, max_seqlen_k=40, bottom_right=True)  # fmt: skip
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), torch.randn_like(o))
    others = torch.cat([torch.arange(0, 18), torch.arange(58, sum(LENGTHS))]).to(DEVICE)
    for x in (o, dq, dk, dv):
        assert torch.isfinite(x[others]).all()
    ins = [t.detach()[others].double() for t in (q, k, v)]
    cu_others = _cu([1, 17, 3, 2], device="cpu")
    ref, _ = varlen_attention_reference(*ins, cu_others, cu_others, causal=True)
    assert _error(o[others], ref) < 1e-5


@pytest.mark.parametrize("impl", IMPLS)
def test_key_tiles_outside_every_window_are_never_read(impl):
    # 16 queries aligned to the end of 200 keys with a window of 10: keys before 174 are seen by
    # nobody. The first 128 hold NaN, which any kernel that loaded them would spread (0 * NaN):
    # whole key tiles of every size the kernels use (and the PyTorch path's 64) lie there.
    q = _randn(1, 2, 16, 16)
    k, v = (torch.randn(1, 2, 200, 16, device=DEVICE) for _ in range(2))
    k[:, :, :128], v[:, :, :128] = float("nan"), float("nan")
    k, v = k.requires_grad_(), v.requires_grad_()
    o = attend(q, k, v, causal=True, scale=None, window_size=(10, -1), softcap=0.0,
               layout="bhsd", implementation=impl, bottom_right=True)  # fmt: skip
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), torch.randn_like(o))
    assert all(torch.isfinite(x[:, :, 128:]).all() for x in (o, dq, dk, dv))
    assert torch.isfinite(dq).all() and (dk[:, :, :174] == 0).all() and (dv[:, :, :174] == 0).all()


def test_flash_attn_func_matches_sdpa_on_the_transposed_tensors():
    # flash-attn's layout (batch, seq, heads, d) in, SDPA on (batch, heads, seq, d) views as the
    # oracle: grouped heads, causal (equal lengths: both alignments agree) and the
    # bottom-right causal mask of unequal lengths, spelled out for SDPA.
    q = _randn(2, 29, 4, 16)
    for n_k, mask in ((29, None), (41, torch.ones(29, 41, dtype=torch.bool).tril(41 - 29))):
        k, v = _randn(2, n_k, 2, 16), _randn(2, n_k, 2, 16)
        o = flash_attn_func(q, k, v, causal=True)
        assert o.shape == q.shape and o.is_contiguous()
        do = torch.randn_like(o)
        ours = _grads(o, (q, k, v), do)
        ts = [t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v)]
        ref = F.scaled_dot_product_attention(
            *ts, attn_mask=None if mask is None else mask.to(DEVICE), is_causal=mask is None,
            enable_gqa=True,
        ).transpose(1, 2)  # fmt: skip
        theirs = [ref, *(g.transpose(1, 2) for g in torch.autograd.grad(ref, ts, do))]
        for x, r in zip(ours, theirs, strict=True):
            torch.testing.assert_close(x, r, atol=1e-5, rtol=1e-5)


def test_the_layout_is_explicit_and_never_guessed():
    # The issue's case: flash-attn-layout q (2, 16, 4, 8), k and v (2, 16, 2, 8). As fa2's
    # documented default ("bhsd") it is valid cross-attention, and that is how it is read; with
    # layout="bshd" it is 16 tokens of grouped-query attention.
    q, k, v = _randn(2, 16, 4, 8), _randn(2, 16, 2, 8), _randn(2, 16, 2, 8)
    as_given = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(flash_attention(q, k, v), as_given, atol=1e-5, rtol=1e-5)
    bshd = flash_attention(q, k, v, layout="bshd")
    transposed = F.scaled_dot_product_attention(
        *(t.transpose(1, 2) for t in (q, k, v)), enable_gqa=True
    ).transpose(1, 2)
    torch.testing.assert_close(bshd, transposed, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(bshd, flash_attn_func(q, k, v))
    # Where only the (batch, seq, heads, d) reading fits, the error says so.
    with pytest.raises(ValueError, match="layout='bshd'"):
        flash_attention(q, _randn(2, 12, 2, 8), _randn(2, 12, 2, 8))


@pytest.mark.parametrize("impl", IMPLS)
def test_outputs_and_gradients_are_contiguous_in_the_callers_layout(impl):
    # Batch > 1 and a length that is not a multiple of the PyTorch path's 64-row tiles: o.view
    # works as on SDPA's output (issue: o.view raised on the PyTorch path's output).
    for layout, shape in (("bhsd", (2, 2, 35, 16)), ("bshd", (2, 35, 2, 16))):
        q, k, v = (_randn(*shape) for _ in range(3))
        o = flash_attention(q, k, v, causal=True, layout=layout, implementation=impl)
        assert o.is_contiguous() and o.view(-1).numel() == q.numel()
        o.sum().backward()
        assert all(t.grad.is_contiguous() for t in (q, k, v))


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda q: flash_attn_func(q, q, q, dropout_p=0.1), NotImplementedError, "dropout_p"),
        (lambda q: flash_attn_func(q, q, q, alibi_slopes=torch.ones(2)), NotImplementedError,
         "alibi_slopes"),
        (lambda q: flash_attn_func(q, q, q, window_size=(-2, 0)), ValueError, "window_size left"),
        (lambda q: flash_attn_func(q, q, q, window_size=4), TypeError, "pair"),
        (lambda q: flash_attn_func(q, q, q, softcap=-1.0), ValueError, "softcap"),
        (lambda q: flash_attention(q, q, q, layout="bsdh"), ValueError, "layout must be"),
        (lambda q: flash_attention(q, q, q, implementation="cuda"), ValueError, "implementation"),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)  # fmt: skip
def test_unsupported_and_bad_options_raise_naming_the_option(call, error, match):
    q = torch.randn(1, 5, 2, 8, device=DEVICE)
    with pytest.raises(error, match=match):
        call(q)


@pytest.mark.parametrize(
    "cu, max_len, match",
    [
        ([0, 3, 5], 3, None),
        (torch.tensor([0, 3, 5]), 3, "int32"),  # int64
        ([1, 3, 5], 3, "start at 0"),
        ([0, 3, 6], 3, "end at the number of tokens"),
        ([0, 4, 3, 5], 4, "never decrease"),
        ([0, 3, 5], 2, "longer than max_seqlen_q"),
    ],
    ids=["valid", "int64", "start", "end", "decreasing", "max_seqlen"],
)
def test_packed_sequence_descriptions_are_checked_on_the_cpu(cu, max_len, match):
    q = torch.randn(5, 2, 8)
    cu = cu if isinstance(cu, torch.Tensor) else torch.tensor(cu, dtype=torch.int32)
    if match is None:
        assert flash_attn_varlen_func(q, q, q, cu, cu, max_len, max_len).shape == q.shape
        return
    with pytest.raises(ValueError, match=match):
        flash_attn_varlen_func(q, q, q, cu, cu, max_len, max_len)


def test_varlen_plans_serve_batches_of_other_lengths():
    # The grid follows max_seqlen and the number of sequences per call: one plan for all.
    from fa2.triton import forward

    q = _randn(60, 2, 16)
    for lengths in ([1, 17, 40, 2], [30, 30], [60]):
        cu = _cu(lengths)
        n = max(lengths)
        o = attend(q, q, q, causal=True, scale=None, window_size=(-1, -1), softcap=0.0,
                   layout="thd", implementation="triton", cu_seqlens_q=cu, cu_seqlens_k=cu,
                   max_seqlen_q=n, max_seqlen_k=n, bottom_right=True)  # fmt: skip
        ref, _ = varlen_attention_reference(*(q.detach().double(),) * 3, cu.cpu(), cu.cpu(),
                                            causal=True)  # fmt: skip
        assert _error(o, ref) < 1e-5
    assert sum(key[0] == q.shape for key in forward._plans.cache) == 1


def test_interpreter_failure_on_numpy_2_4_says_what_to_install(monkeypatch):
    # Triton 3.6's CPU interpreter fails on numpy >= 2.4 with a cryptic InterpreterError; fa2
    # re-raises it with what to install (simulated: this environment keeps numpy < 2.4).
    from triton.runtime.errors import InterpreterError

    from fa2.triton import launch

    def failing(*args, **kwargs):
        raise InterpreterError(
            "InterpreterError(\"TypeError('only 0-dimensional arrays can be converted to "
            "Python scalars')\")"
        )

    class Kernel:
        params = None

        def __getitem__(self, grid):
            return failing

    monkeypatch.setattr(launch, "INTERPRET", True)
    run = launch.CachedLaunch(Kernel(), (1,), {}, num_warps=1, num_stages=1)
    with pytest.raises(RuntimeError, match=r"numpy<2\.4") as info:
        run((torch.empty(4),), ())
    assert isinstance(info.value.__cause__, InterpreterError)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "lengths, heads, kv_heads, d, dtype, options",
    [
        ([1, 777, 2048, 33, 1000, 5], 8, 2, 64, torch.bfloat16, dict(causal=True)),
        ([129, 4096, 1, 2500], 4, 4, 128, torch.bfloat16,
         dict(causal=True, window_size=(511, -1), softcap=30.0)),
        ([300, 1500, 17], 4, 1, 64, torch.float32, dict(causal=False, window_size=(64, 64))),
    ],
    ids=["causal-gqa", "window-softcap-d128", "fp32-two-sided-window"],
)  # fmt: skip
def test_packed_sequences_at_real_sizes(lengths, heads, kv_heads, d, dtype, options):
    cu = _cu(lengths)
    q = _randn(sum(lengths), heads, d, dtype=dtype)
    k, v = (_randn(sum(lengths), kv_heads, d, dtype=dtype) for _ in range(2))
    do = torch.randn_like(q)
    n = max(lengths)
    ours = _grads(flash_attn_varlen_func(q, k, v, cu, cu, n, n, **options), (q, k, v), do)

    def run(dtype):
        ins = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        ref, _ = varlen_attention_reference(*ins, cu.cpu(), cu.cpu(), bottom_right=True,
                                            **options)  # fmt: skip
        return _grads(ref, ins, do.to(dtype))

    _compare(ours, run(torch.float64), run(dtype), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "n_q, n_k, d, dtype, options",
    [
        (4096, 4096, 64, torch.bfloat16, dict(causal=True, window_size=(1023, -1))),
        (1000, 3000, 128, torch.bfloat16, dict(causal=True, softcap=50.0)),
        (3000, 1000, 64, torch.float16, dict(causal=True)),  # bottom-right: empty rows
        (2048, 2048, 128, torch.float32, dict(causal=False, window_size=(256, 256))),
    ],
    ids=str,
)
def test_flash_attn_func_at_real_sizes(n_q, n_k, d, dtype, options):
    q = _randn(2, n_q, 8, d, dtype=dtype)
    k, v = _randn(2, n_k, 2, d, dtype=dtype), _randn(2, n_k, 2, d, dtype=dtype)
    options = {"window_size": (-1, -1), "softcap": 0.0} | options
    _check_dense("triton", q, k, v, layout="bshd", bottom_right=True, **options)


@pytest.mark.gpu
def test_flash_attn_func_matches_cudnn_on_bshd_tensors():
    # The drop-in at a training shape against SDPA's cuDNN backend on the transposed views.
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (_randn(4, 2048, 16, 64, dtype=torch.bfloat16) for _ in range(3))
    o = flash_attn_func(q, k, v, causal=True)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)),
                                             is_causal=True).transpose(1, 2)  # fmt: skip
    assert o.is_contiguous()
    torch.testing.assert_close(o, ref, atol=2e-2, rtol=2e-2)

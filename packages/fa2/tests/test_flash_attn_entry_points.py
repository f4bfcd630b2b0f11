"""The rest of flash-attn's interface: `return_attn_probs` (the logsumexp in flash-attn's shape
and bottom-right alignment), the qkv- and kv-packed variants, and `fa2.bert_padding`, each
against the float64 materialised oracle. Every test runs the tiled PyTorch path and the Triton
kernels (in Triton's interpreter on a CPU machine, so shapes stay small)."""

import functools

import pytest
import torch
import torch.nn.functional as F

import fa2.dropin
from fa2 import (
    attention_reference,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    varlen_attention_reference,
)
from fa2.api import attend
from fa2.bert_padding import pad_input, unpad_input, unpad_input_for_concatenated_sequences

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# fp32 against float64: the error both paths make at these sizes is below 1e-6 (measured here;
# flash-attn's own tests allow twice plain PyTorch's error, which is of the same order).
TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture(params=["pytorch", "triton"])
def impl(request, monkeypatch):
    """Run the flash-attn entry points through one implementation (the front door picks the
    PyTorch path for CPU tensors, so the Triton one is chosen here explicitly)."""
    monkeypatch.setattr(
        fa2.dropin, "attend", functools.partial(attend, implementation=request.param)
    )
    return request.param


def _randn(*shape):
    return torch.randn(*shape, device=DEVICE).requires_grad_()


def _bhsd(t):
    """(batch, seq, heads, d) -> (batch, heads, seq, d), float64, a leaf of its own."""
    return t.detach().transpose(1, 2).double().requires_grad_()


@pytest.mark.parametrize("n_q, n_k", [(23, 12), (9, 30)], ids=["more-queries", "more-keys"])
def test_return_attn_probs_gives_flash_attns_lse_bottom_right(impl, n_q, n_k):
    # 23 queries over 12 keys, causal: the first 11 rows see nothing (lse +inf, out 0).
    q, k, v = _randn(2, n_q, 4, 16), _randn(2, n_k, 2, 16), _randn(2, n_k, 2, 16)
    out, lse, s_dmask = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    ins = [_bhsd(t) for t in (q, k, v)]
    ref, ref_lse = attention_reference(*ins, causal=True, bottom_right=True)
    assert lse.shape == (2, 4, n_q) and lse.dtype == torch.float32
    assert s_dmask.shape == (0,) and s_dmask.dtype == q.dtype
    torch.testing.assert_close(lse.double(), ref_lse, **TOL)  # +inf where the oracle has +inf
    torch.testing.assert_close(out.double(), ref.transpose(1, 2), **TOL)
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), do)
    ref_grads = torch.autograd.grad(ref, ins, do.transpose(1, 2).double())
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g.double(), r.transpose(1, 2), **TOL)


def test_varlen_return_attn_probs_gives_lse_per_head_and_token(impl):
    cu_q = torch.tensor([0, 3, 20, 21], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 9, 14, 30], dtype=torch.int32, device=DEVICE)
    q, k, v = _randn(21, 2, 16), _randn(30, 1, 16), _randn(30, 1, 16)
    out, lse, s_dmask = flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, 17, 16, causal=True, window_size=(4, -1), return_attn_probs=True
    )
    ins = [t.detach().double() for t in (q, k, v)]
    ref, ref_lse = varlen_attention_reference(
        *ins, cu_q.cpu(), cu_k.cpu(), causal=True, window_size=(4, -1), bottom_right=True
    )
    assert lse.shape == (2, 21) and s_dmask.numel() == 0
    torch.testing.assert_close(out.double(), ref, **TOL)
    torch.testing.assert_close(lse.double(), ref_lse, **TOL)


def test_qkv_and_kv_packed_match_the_oracle_with_gradients(impl):
    qkv = _randn(2, 19, 3, 2, 16)  # (batch, seq, 3, heads, d)
    out = flash_attn_qkvpacked_func(qkv, causal=True, softcap=5.0)
    ins = [_bhsd(t) for t in qkv.unbind(2)]
    ref, _ = attention_reference(*ins, causal=True, softcap=5.0)
    torch.testing.assert_close(out.double(), ref.transpose(1, 2), **TOL)
    do = torch.randn_like(out)
    (dqkv,) = torch.autograd.grad(out, qkv, do)
    ref_grads = torch.autograd.grad(ref, ins, do.transpose(1, 2).double())
    torch.testing.assert_close(
        dqkv.double(), torch.stack([g.transpose(1, 2) for g in ref_grads], dim=2), **TOL
    )
    # kv packed: grouped heads, 7 queries at the end of 23 keys, a window
    q, kv = _randn(2, 7, 4, 16), _randn(2, 23, 2, 2, 16)
    out, lse, _ = flash_attn_kvpacked_func(
        q, kv, causal=True, window_size=(5, -1), return_attn_probs=True
    )
    ins = [_bhsd(t) for t in (q, *kv.unbind(2))]
    ref, ref_lse = attention_reference(*ins, causal=True, window_size=(5, -1), bottom_right=True)
    torch.testing.assert_close(out.double(), ref.transpose(1, 2), **TOL)
    torch.testing.assert_close(lse.double(), ref_lse, **TOL)
    (dkv,) = torch.autograd.grad(out, kv, torch.ones_like(out))
    ref_dk, ref_dv = torch.autograd.grad(ref, ins[1:], torch.ones_like(ref))
    torch.testing.assert_close(dkv[:, :, 0].double(), ref_dk.transpose(1, 2), **TOL)
    torch.testing.assert_close(dkv[:, :, 1].double(), ref_dv.transpose(1, 2), **TOL)


def test_varlen_packed_variants_match_the_oracle(impl):
    cu = torch.tensor([0, 5, 6, 26], dtype=torch.int32, device=DEVICE)
    qkv = _randn(26, 3, 2, 16)
    out = flash_attn_varlen_qkvpacked_func(qkv, cu, 20, causal=True)
    ins = [t.detach().double().requires_grad_() for t in qkv.unbind(1)]
    ref, _ = varlen_attention_reference(*ins, cu.cpu(), cu.cpu(), causal=True)
    torch.testing.assert_close(out.double(), ref, **TOL)
    do = torch.randn_like(out)
    (dqkv,) = torch.autograd.grad(out, qkv, do)
    ref_grads = torch.autograd.grad(ref, ins, do.double())
    torch.testing.assert_close(dqkv.double(), torch.stack(ref_grads, dim=1), **TOL)

    cu_k = torch.tensor([0, 8, 8, 30], dtype=torch.int32, device=DEVICE)  # a sequence without keys
    q, kv = _randn(26, 4, 16), _randn(30, 2, 1, 16)
    out = flash_attn_varlen_kvpacked_func(q, kv, cu, cu_k, 20, 22, causal=True)
    ins = [t.detach().double() for t in (q, *kv.unbind(1))]
    ref, _ = varlen_attention_reference(*ins, cu.cpu(), cu_k.cpu(), causal=True, bottom_right=True)
    torch.testing.assert_close(out.double(), ref, **TOL)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda t: flash_attn_qkvpacked_func(t), r"\(batch, seqlen, 3, heads"),
        (lambda t: flash_attn_kvpacked_func(t[:, :, 0], t), r"\(batch, seqlen, 2, kv_heads"),
        (lambda t: flash_attn_varlen_qkvpacked_func(t[0], None, 4), r"\(total_tokens, 3"),
        (lambda t: flash_attn_qkvpacked_func(t[:, :, :3], alibi_slopes=t), "alibi_slopes"),
    ],
    ids=["qkv-with-4", "kv-with-4", "varlen-qkv-4d-expected", "alibi"],
)
def test_packed_variants_check_their_packing(call, match):
    t = torch.randn(1, 5, 4, 2, 8, device=DEVICE)  # 4 where 3 (or 2) stacked tensors belong
    with pytest.raises((ValueError, NotImplementedError), match=match):
        call(t)


def _mask(rows, seqlen):
    """(batch, seqlen) bool mask from (start, stop) of each row's tokens."""
    mask = torch.zeros(len(rows), seqlen, dtype=torch.bool, device=DEVICE)
    for b, (start, stop) in enumerate(rows):
        mask[b, start:stop] = True
    return mask


def test_unpad_and_pad_input_round_trip_with_flash_attns_tuples():
    # Right, left and inner padding; a row with no tokens.
    mask = _mask([(0, 5), (3, 7), (0, 0), (2, 4)], 7)
    mask[1, 5] = False  # inner padding
    x = _randn(4, 7, 3, 2)
    rows, indices, cu, longest, used = unpad_input(x, mask.int())
    assert rows.shape == (int(mask.sum()), 3, 2) and indices.dtype == torch.int64
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 5, 8, 8, 10]
    assert longest == 5 and isinstance(longest, int) and used.tolist() == [5, 3, 0, 2]
    torch.testing.assert_close(rows, x[mask])
    back = pad_input(rows, indices, 4, 7)
    torch.testing.assert_close(back, x * mask[..., None, None])
    (grad,) = torch.autograd.grad(back, x, torch.ones_like(back))
    torch.testing.assert_close(grad, mask[..., None, None].expand_as(x).float())
    # unused_mask: kept in the packed rows (cu_seqlens) but not counted in seqused
    unused = _mask([(5, 6), (0, 0), (0, 0), (0, 0)], 7)
    _, _, cu, longest, used = unpad_input(x, mask, unused)
    assert cu.tolist() == [0, 6, 9, 9, 11] and longest == 6 and used.tolist() == [5, 3, 0, 2]


def test_unpad_attend_pad_equals_attention_with_a_key_padding_mask(impl):
    # flash-attn's recipe for a padded batch: what SDPA computes with the padding masked out.
    mask = _mask([(0, 9), (4, 12), (0, 12)], 12)
    q, k, v = (_randn(3, 12, 2, 16) for _ in range(3))
    q_rows, indices, cu, longest, _ = unpad_input(q, mask)
    k_rows, v_rows = (unpad_input(t, mask)[0] for t in (k, v))
    out = pad_input(
        flash_attn_varlen_func(q_rows, k_rows, v_rows, cu, cu, longest, longest, causal=True),
        indices, 3, 12,
    )  # fmt: skip
    qs, ks, vs = (t.detach().double().transpose(1, 2) for t in (q, k, v))
    causal = torch.ones(12, 12, dtype=torch.bool, device=DEVICE).tril()
    seen = mask[:, None, None, :] & causal & mask[:, None, :, None]  # (batch, 1, 12, 12)
    ref = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=seen.clone())
    ref = torch.where(mask[:, None, :, None], ref, 0.0)  # padded queries: 0 (pad_input's zeros)
    # left padding: each row's tokens renumbered from 0 within it, so the causal masks agree
    torch.testing.assert_close(out.double(), ref.transpose(1, 2), **TOL)


def test_unpad_input_for_concatenated_sequences_splits_each_row():
    lengths = torch.tensor([[2, 3, 0, 0, 0, 0], [6, 0, 0, 0, 0, 0]], device=DEVICE)
    x = torch.arange(12.0, device=DEVICE).view(2, 6, 1)
    rows, indices, cu, longest = unpad_input_for_concatenated_sequences(x, lengths)
    assert cu.tolist() == [0, 2, 5, 11] and longest == 6
    assert rows.flatten().tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11]
    torch.testing.assert_close(pad_input(rows, indices, 2, 6)[0, :5], x[0, :5])
    with pytest.raises(ValueError, match="add up to at most seqlen"):
        unpad_input_for_concatenated_sequences(x.cpu(), torch.tensor([[4, 3, 0, 0, 0, 0]] * 2))


def test_padding_helpers_check_shapes():
    x = torch.randn(2, 5, 3)
    with pytest.raises(ValueError, match=r"\(batch, seqlen\)"):
        unpad_input(x, torch.ones(2, 4))
    with pytest.raises(ValueError, match="one entry per row"):
        pad_input(torch.randn(3, 3), torch.arange(4), 2, 5)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "n_q, n_k", [(3000, 1000), (1000, 3000)], ids=["more-queries", "more-keys"]
)
def test_return_attn_probs_lse_at_real_sizes(n_q, n_k):
    # The Triton kernels' logsumexp in bf16, bottom-right aligned, against float64.
    q = torch.randn(2, n_q, 8, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, n_k, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    _, lse, s_dmask = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    _, ref_lse = attention_reference(*(_bhsd(t) for t in (q, k, v)), causal=True, bottom_right=True)
    assert s_dmask.numel() == 0 and lse.dtype == torch.float32
    torch.testing.assert_close(lse.double(), ref_lse.detach(), atol=1e-3, rtol=1e-3)

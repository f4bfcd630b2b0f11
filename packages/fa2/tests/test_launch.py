"""The Triton path's launch plans: layouts read in place or copied, plans reused across calls,
misaligned tensors, and (on a GPU) the cached-binary launch agreeing with Triton's own."""

import pytest
import torch

from fa2 import FlashAttention2Triton, attention_reference
from fa2.triton.launch import batch_strides

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _oracle_grads(q, k, v, causal, do):
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o, _ = attention_reference(q64, k64, v64, causal=causal)
    return (o, *torch.autograd.grad(o, (q64, k64, v64), do.double()))


def _assert_matches_oracle(q, k, v, causal, do=None, tol=1e-5):
    do = torch.randn_like(q) if do is None else do
    o = FlashAttention2Triton.apply(q, k, v, causal)
    ours = (o, *torch.autograd.grad(o, (q, k, v), do))
    oracle = _oracle_grads(q, k, v, causal, do)
    for name, x, ref in zip(("o", "dq", "dk", "dv"), ours, oracle, strict=True):
        err = ((x.double() - ref).norm() / ref.norm()).item()
        assert err < tol, f"{name}: relative error {err:.2e}"


def test_batch_strides_reads_mergeable_layouts_in_place():
    assert batch_strides(torch.randn(4, 3, 10, 8)) == (80, 8)
    assert batch_strides(torch.randn(6, 10, 8)[::2]) == (160, 8)  # every other batch entry
    assert batch_strides(torch.randn(6, 10, 16)[:, :, :8]) == (160, 16)  # padded rows
    assert batch_strides(torch.randn(10, 8)) == (80, 8)
    assert batch_strides(torch.randn(1, 8).expand(10, 8)) == (0, 0)  # one row, broadcast


def test_batch_strides_refuses_layouts_the_kernels_cannot_index():
    heads_inner = torch.randn(2, 10, 3, 8).transpose(1, 2)  # (batch, heads, seq, d) view
    assert batch_strides(heads_inner) is None
    assert batch_strides(torch.randn(2, 8, 10).transpose(1, 2)) is None  # d not contiguous
    assert batch_strides(torch.randn(4, 2, 10, 8)[::2]) is None  # batch and heads unmergeable


def _leaf(t):
    return t.detach().requires_grad_()


@pytest.mark.parametrize("causal", [False, True])
def test_strided_views_along_batch_and_rows(causal):
    # Every other batch entry, and rows padded to 2x the head dim: both read in place.
    q = _leaf(torch.randn(4, 40, 32, device=DEVICE)[::2, :, :16])
    k, v = (_leaf(torch.randn(4, 33, 16, device=DEVICE)[1::2]) for _ in range(2))
    assert batch_strides(q) == (2 * 40 * 32, 32)
    _assert_matches_oracle(q, k, v, causal)


def test_gradient_of_sum_arrives_expanded_and_still_works():
    q, k, v = (_leaf(torch.randn(2, 37, 16, device=DEVICE)) for _ in range(3))
    FlashAttention2Triton.apply(q, k, v, True).sum().backward()
    _, dq, dk, dv = _oracle_grads(q, k, v, True, torch.ones(2, 37, 16, device=DEVICE))
    for x, ref in ((q.grad, dq), (k.grad, dk), (v.grad, dv)):
        assert ((x.double().cpu() - ref.cpu()).norm() / ref.norm()).item() < 1e-5


def test_plans_are_reused_for_new_data_of_the_same_shape():
    from fa2.triton import backward, forward

    for _ in range(2):  # the second call runs the plans the first one built
        q, k, v = (_leaf(torch.randn(3, 29, 16, device=DEVICE)) for _ in range(3))
        _assert_matches_oracle(q, k, v, causal=False)
    shape_plans = [p for key, p in forward._plans.cache.items() if key[0] == (3, 29, 16)]
    assert len(shape_plans) == 1
    assert any(key[0] == (3, 29, 16) for key in backward._plans.cache)


def test_inputs_not_aligned_to_16_bytes():
    def misaligned(*shape):
        flat = torch.randn(torch.Size(shape).numel() + 1, device=DEVICE)
        return _leaf(flat[1:].view(shape))  # 4 bytes past an aligned address

    q, k, v = misaligned(2, 30, 16), misaligned(2, 30, 16), misaligned(2, 30, 16)
    assert q.data_ptr() % 16
    _assert_matches_oracle(q, k, v, causal=True)


@pytest.mark.gpu
def test_cached_binary_launch_matches_tritons_own_launch():
    from fa2.triton import forward

    q, k, v = (torch.randn(2, 4, 300, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    first = FlashAttention2Triton.apply(q, k, v, True)  # through Triton: compiles, keeps binary
    plan = next(p for key, p in forward._plans.cache.items() if key[0] == q.shape)
    assert plan.launch._binary is not None
    again = FlashAttention2Triton.apply(q, k, v, True)  # straight to the binary
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    _assert_matches_oracle(*(_leaf(t.float()) for t in (q, k, v)), causal=True)

"""`flash_attn_with_kvcache`: keys and values appended in place, attention to each row's cached
tokens with flash-attn's bottom-right alignment, rotary embedding at the cache positions, and
clear errors for what fa2 does not do; against the float64 oracle, through the tiled PyTorch
path and the Triton kernels (Triton's interpreter on a CPU machine: small shapes)."""

import functools

import pytest
import torch

import fa2.kvcache
from fa2 import attention_reference, flash_attn_func, flash_attn_with_kvcache
from fa2.api import attend

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = dict(atol=1e-5, rtol=1e-5)  # fp32 against float64 (as test_flash_attn_entry_points)


@pytest.fixture(params=["pytorch", "triton"])
def impl(request, monkeypatch):
    monkeypatch.setattr(
        fa2.kvcache, "attend", functools.partial(attend, implementation=request.param)
    )
    return request.param


def _cache(batch, seqlen, kv_heads=2, d=16):
    return (torch.randn(batch, seqlen, kv_heads, d, device=DEVICE) for _ in range(2))


def _oracle(q, keys, values, **options):
    """Reference attention of one sequence: q `(seq, heads, d)` over keys `(n, kv_heads, d)`;
    returns (out `(seq, heads, d)`, lse `(heads, seq)`) in float64, bottom-right aligned."""
    o, lse = attention_reference(
        *(t.double().transpose(0, 1) for t in (q, keys, values)), bottom_right=True, **options
    )
    return o.transpose(0, 1), lse


@pytest.mark.parametrize(
    "options", [dict(causal=True), dict(causal=True, window_size=(6, -1), softcap=4.0),
                dict(causal=False)], ids=["causal", "window-softcap", "full"],
)  # fmt: skip
def test_new_keys_are_appended_in_place_and_attended_per_row(impl, options):
    # Rows holding 0, 11 and 27 tokens (of 32) take 3 new ones each; grouped heads (4 over 2).
    k_cache, v_cache = _cache(3, 32)
    before = (k_cache.clone(), v_cache.clone())
    seqlens = torch.tensor([0, 11, 27], dtype=torch.int32, device=DEVICE)
    q = torch.randn(3, 3, 4, 16, device=DEVICE)
    k, v = _cache(3, 3)
    out, lse = flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, cache_seqlens=seqlens, return_softmax_lse=True, **options
    )
    assert out.shape == q.shape and lse.shape == (3, 4, 3)
    for b, n in enumerate(seqlens.tolist()):
        for cache, old, new in ((k_cache, before[0], k), (v_cache, before[1], v)):
            assert torch.equal(cache[b, n : n + 3], new[b])  # written in place
            assert torch.equal(cache[b, :n], old[b, :n]) and torch.equal(
                cache[b, n + 3 :], old[b, n + 3 :]
            )  # nothing else touched
        ref, ref_lse = _oracle(q[b], k_cache[b, : n + 3], v_cache[b, : n + 3], **options)
        torch.testing.assert_close(out[b].double(), ref, **TOL)
        torch.testing.assert_close(lse[b].double(), ref_lse, **TOL)


def test_decoding_token_by_token_equals_attention_over_the_whole_sequence(impl):
    # A prefill of 8 tokens, then one token at a time: the same as causal attention at once.
    q, k, v = (torch.randn(2, 12, 4 if i == 0 else 2, 16, device=DEVICE) for i in range(3))
    k_cache = torch.zeros(2, 16, 2, 16, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    steps = [(0, 8), *((t, t + 1) for t in range(8, 12))]
    outs = [
        flash_attn_with_kvcache(
            q[:, a:b], k_cache, v_cache, k[:, a:b], v[:, a:b], cache_seqlens=a, causal=True
        )
        for a, b in steps
    ]
    whole = flash_attn_func(q, k, v, causal=True)
    torch.testing.assert_close(torch.cat(outs, dim=1), whole, **TOL)
    torch.testing.assert_close(k_cache[:, :12], k)


def test_leftpad_batch_index_and_reading_without_appending(impl):
    # cache_batch_idx picks rows 3 and 0 of a 4-row cache; row 3's keys start at position 4.
    k_cache, v_cache = _cache(4, 20)
    q = torch.randn(2, 1, 2, 16, device=DEVICE)
    rows = torch.tensor([3, 0], dtype=torch.int32, device=DEVICE)
    seqlens = torch.tensor([15, 7], dtype=torch.int32, device=DEVICE)
    leftpad = torch.tensor([4, 0], dtype=torch.int32, device=DEVICE)
    k, v = _cache(2, 1)
    out = flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, cache_seqlens=seqlens, cache_batch_idx=rows,
        cache_leftpad=leftpad, causal=True,
    )  # fmt: skip
    bounds = zip(rows.tolist(), seqlens.tolist(), leftpad.tolist(), strict=True)
    for b, (row, n, start) in enumerate(bounds):
        assert torch.equal(k_cache[row, n], k[b, 0])
        ref, _ = _oracle(
            q[b], k_cache[row, start : n + 1], v_cache[row, start : n + 1], causal=True
        )
        torch.testing.assert_close(out[b].double(), ref, **TOL)
    # Without k and v: attend to what the cache holds (cache_seqlens tokens), or all of it.
    out = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=9)
    torch.testing.assert_close(out[1].double(), _oracle(q[1], k_cache[1, :9], v_cache[1, :9])[0],
                               **TOL)  # fmt: skip
    out = flash_attn_with_kvcache(q, k_cache, v_cache, causal=True)
    torch.testing.assert_close(out[0].double(), _oracle(q[0], k_cache[0], v_cache[0])[0], **TOL)


def _rotary_oracle(x, angles, interleaved):
    """x `(seq, heads, d)` rotated by `angles` `(seq, r / 2)` as complex numbers in float64: the
    pairs (2i, 2i + 1) when interleaved, else (i, i + r / 2); features past r kept."""
    r = 2 * angles.shape[-1]
    x = x.double()
    head = x[..., :r]
    pairs = (
        head.unflatten(-1, (-1, 2))
        if interleaved
        else head.unflatten(-1, (2, -1)).transpose(-1, -2)
    )
    z = (
        torch.view_as_complex(pairs.contiguous())
        * torch.polar(torch.ones_like(angles), angles)[:, None]
    )
    turned = torch.view_as_real(z)
    turned = turned.flatten(-2) if interleaved else turned.transpose(-1, -2).flatten(-2)
    return torch.cat((turned, x[..., r:]), dim=-1)


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "rotate-half"])
def test_rotary_embedding_rotates_at_the_cache_positions(interleaved):
    angles = torch.rand(40, 6, dtype=torch.float64, device=DEVICE) * 6.3  # rotary_dim 12 of 16
    cos, sin = angles.cos().float(), angles.sin().float()
    k_cache, v_cache = _cache(2, 24)
    q, k, v = torch.randn(2, 2, 4, 16, device=DEVICE), *_cache(2, 2)
    seqlens = torch.tensor([3, 17], dtype=torch.int32, device=DEVICE)
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cos, sin, cache_seqlens=seqlens,
                                  causal=True, rotary_interleaved=interleaved)  # fmt: skip
    for b, n in enumerate(seqlens.tolist()):
        at = angles[n : n + 2]
        k_ro = _rotary_oracle(k[b], at, interleaved)
        torch.testing.assert_close(k_cache[b, n : n + 2].double(), k_ro, **TOL)  # rotated k stored
        q_ro = _rotary_oracle(q[b], at, interleaved)
        ref, _ = _oracle(q_ro, k_cache[b, : n + 2], v_cache[b, : n + 2], causal=True)
        torch.testing.assert_close(out[b].double(), ref, **TOL)
    # Not causal: every query at position cache_seqlens, as flash-attn.
    k_cache, v_cache = _cache(2, 24)
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cos, sin, cache_seqlens=seqlens,
                                  rotary_interleaved=interleaved)  # fmt: skip
    n = seqlens[1].item()
    q_ro = _rotary_oracle(q[1], angles[n : n + 1].expand(2, -1), interleaved)
    torch.testing.assert_close(
        out[1].double(), _oracle(q_ro, k_cache[1, : n + 2], v_cache[1, : n + 2])[0], **TOL
    )


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(block_table=torch.zeros(2, 1, dtype=torch.int32)), NotImplementedError,
         "block_table"),
        (dict(alibi_slopes=torch.ones(4)), NotImplementedError, "alibi_slopes"),
        (dict(k="new"), ValueError, "needs cache_seqlens"),
        (dict(cache_seqlens=0, rotary_cos=torch.ones(8, 4), rotary_sin=torch.ones(8, 4)),
         ValueError, "pass k and v too"),
        (dict(k="new", cache_seqlens=7), ValueError, "must fit the cache's 8 positions"),
        (dict(k="half", cache_seqlens=0), TypeError, "cast one"),
        (dict(cache_seqlens=torch.tensor([1.0, 2.0])), ValueError, "int32"),
        (dict(cache_batch_idx=torch.tensor([0, 5], dtype=torch.int32)), ValueError,
         "must index the cache"),
        (dict(num_splits=-1), ValueError, "num_splits"),
    ],
    ids=["block_table", "alibi", "k-without-seqlens", "rotary-without-k", "overflow", "dtype",
         "float-seqlens", "batch-idx-out-of-range", "num_splits"],
)  # fmt: skip
def test_unsupported_and_bad_arguments_raise_naming_them(kwargs, error, match):
    q = torch.randn(2, 2, 4, 16)
    k_cache, v_cache = (torch.randn(2, 8, 2, 16) for _ in range(2))
    new = {"new": torch.randn(2, 2, 2, 16), "half": torch.randn(2, 2, 2, 16).half()}
    if "k" in kwargs:
        kwargs["k"] = kwargs["v"] = new[kwargs["k"]]
    with pytest.raises(error, match=match):
        flash_attn_with_kvcache(q, k_cache, v_cache, **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_decoding_at_real_sizes(dtype):
    # 4 rows of a 4096-token cache at different lengths, 32 query heads over 8, d 128: one new
    # token each (Triton), against float64 attention over each row's tokens.
    k_cache, v_cache = (torch.randn(4, 4096, 8, 128, device="cuda", dtype=dtype) for _ in range(2))
    seqlens = torch.tensor([0, 17, 2049, 4095], dtype=torch.int32, device="cuda")
    q = torch.randn(4, 1, 32, 128, device="cuda", dtype=dtype)
    k, v = (torch.randn(4, 1, 8, 128, device="cuda", dtype=dtype) for _ in range(2))
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens,
                                       causal=True, return_softmax_lse=True)  # fmt: skip
    for b, n in enumerate(seqlens.tolist()):
        ref, ref_lse = _oracle(q[b], k_cache[b, : n + 1], v_cache[b, : n + 1], causal=True)
        torch.testing.assert_close(out[b].double(), ref, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(lse[b].double(), ref_lse, atol=1e-3, rtol=1e-3)

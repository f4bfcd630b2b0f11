"""RMSNorm, RoPE and the initialisation of the linear and embedding layers."""

import math

import pytest
import torch
import torch.nn.functional as F

from lmcore import Embedding, Linear, RMSNorm, RotaryEmbedding

# Standard deviation of a unit normal truncated at ±3: sqrt(1 − 6·φ(3) / (Φ(3) − Φ(−3))).
TRUNCATED_STD = 0.98658


def test_rms_norm_matches_torch_in_float64():
    torch.manual_seed(0)
    norm = RMSNorm(37).double()
    with torch.no_grad():
        norm.weight.copy_(torch.randn(37, dtype=torch.float64))
    x = torch.randn(3, 5, 37, dtype=torch.float64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    weight_ref = norm.weight.detach().clone().requires_grad_()
    upstream = torch.randn(3, 5, 37, dtype=torch.float64)

    (norm(x) * upstream).sum().backward()
    expected = F.rms_norm(x_ref, (37,), weight_ref, eps=1e-5)
    (expected * upstream).sum().backward()

    torch.testing.assert_close(norm(x), expected)
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(norm.weight.grad, weight_ref.grad)


def test_rms_norm_keeps_bf16_dtype_and_computes_in_float32():
    torch.manual_seed(0)
    x = (torch.randn(4, 33) * 300).to(torch.bfloat16)
    out = RMSNorm(33)(x)
    assert out.dtype == torch.bfloat16
    expected = F.rms_norm(x.double(), (33,), eps=1e-5)
    # One bf16 rounding of the output: half an ulp, 2^-8 relative.
    torch.testing.assert_close(out.double(), expected, rtol=2**-8, atol=0)


def _rope_reference(x: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE as complex multiplication: pair (x[2k], x[2k+1]) times exp(i · pos · θ^(-2k/d))."""
    seq, d = x.shape[-2], x.shape[-1]
    freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.arange(seq, dtype=torch.float64)[:, None] * freqs  # (seq, d/2)
    pairs = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(pairs * torch.polar(torch.ones_like(angles), angles)).flatten(-2)


def test_rope_matches_complex_rotation():
    torch.manual_seed(0)
    rope = RotaryEmbedding(12, 40, theta=10_000.0)
    x = torch.randn(2, 3, 29, 12)
    # The tables are float32: each rotated value carries a few float32 roundings.
    torch.testing.assert_close(rope(x).double(), _rope_reference(x, 10_000.0))


def test_rope_dot_products_depend_only_on_distance():
    torch.manual_seed(0)
    rope = RotaryEmbedding(16, 32, theta=500.0)
    q = rope(torch.randn(16).expand(32, 16))
    k = rope(torch.randn(16).expand(32, 16))
    scores = q @ k.T  # (32, 32): scores[m, n] must depend on m - n only
    # Float32 tolerances: the cosine and sine tables are float32.
    for shift in (1, 7):
        torch.testing.assert_close(scores[shift:, shift:], scores[:-shift, :-shift])


def test_rope_tables_recompute_after_to_empty():
    rope = RotaryEmbedding(8, 16, theta=10_000.0)
    with torch.device("meta"):
        lazy = RotaryEmbedding(8, 16, theta=10_000.0)
    lazy = lazy.to_empty(device="cpu")
    lazy.reset_parameters()
    assert torch.equal(lazy.cos, rope.cos) and torch.equal(lazy.sin, rope.sin)


def test_linear_init_is_truncated_normal_with_handout_variance():
    torch.manual_seed(0)
    layer = Linear(300, 500)
    sigma = math.sqrt(2.0 / (300 + 500))
    assert layer.bias is None
    assert layer.weight.abs().max() <= 3 * sigma
    # 150,000 samples: the std estimate is good to about 0.2 %.
    assert layer.weight.std().item() == pytest.approx(sigma * TRUNCATED_STD, rel=0.02)


def test_embedding_init_is_truncated_unit_normal():
    torch.manual_seed(0)
    table = Embedding(1000, 64)
    assert table.weight.abs().max() <= 3.0
    assert table.weight.std().item() == pytest.approx(TRUNCATED_STD, rel=0.02)

"""The front door: dispatch, keyword options, bad input, and working without Triton."""

import os
import subprocess
import sys

import pytest
import torch

from fa2 import FlashAttention2PyTorch, FlashAttention2Triton, attention_reference, flash_attention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _qkv(*shape, dtype=torch.float32, device=DEVICE):
    return [torch.randn(*shape, dtype=dtype, device=device) for _ in range(3)]


def test_flash_attention_matches_reference_with_keywords():
    q, k, v = _qkv(2, 4, 50, 32)
    o = flash_attention(q, k, v, causal=True, scale=0.2)
    ref, _ = attention_reference(q.double(), k.double(), v.double(), causal=True, scale=0.2)
    torch.testing.assert_close(o.double(), ref, atol=2e-5, rtol=2e-5)


def test_flash_attention_options_are_keyword_only():
    q, k, v = _qkv(1, 20, 16)
    with pytest.raises(TypeError, match="positional"):
        flash_attention(q, k, v, True)


def test_is_causal_is_a_synonym_of_causal():
    q, k, v = _qkv(2, 30, 16)
    ref, _ = attention_reference(q.double(), k.double(), v.double(), causal=True)
    for kwargs in ({"is_causal": True}, {"causal": True, "is_causal": True}):
        o = flash_attention(q, k, v, **kwargs)
        torch.testing.assert_close(o.double(), ref, atol=2e-5, rtol=2e-5)
    full = flash_attention(q, k, v, is_causal=False)
    assert (full - flash_attention(q, k, v, causal=True)).abs().max() > 1e-2


def test_causal_and_is_causal_that_disagree_are_rejected():
    q, k, v = _qkv(1, 10, 16)
    with pytest.raises(ValueError, match="disagree"):
        flash_attention(q, k, v, causal=True, is_causal=False)


def test_flash_attention_returns_the_logsumexp_on_request():
    q, k, v = _qkv(2, 3, 25, 16)
    o, lse = flash_attention(q, k, v, causal=True, return_lse=True)
    ref, ref_lse = attention_reference(q.double(), k.double(), v.double(), causal=True)
    torch.testing.assert_close(o.double(), ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-5, rtol=2e-5)


def test_flash_attention_rejects_an_unknown_precision():
    q, k, v = _qkv(1, 10, 16)
    with pytest.raises(ValueError, match="precision must be one of"):
        flash_attention(q, k, v, precision="fp16")


def test_flash_attention_uses_pytorch_path_on_cpu_and_for_float64():
    q, k, v = _qkv(1, 20, 16, dtype=torch.float64, device="cpu")
    o = flash_attention(q.requires_grad_(), k, v)
    assert o.grad_fn.name().startswith("FlashAttention2PyTorch")


def test_deterministic_false_is_accepted_and_keeps_the_pytorch_path_exact():
    q, k, v = (t.requires_grad_() for t in _qkv(2, 30, 16, dtype=torch.float64, device="cpu"))
    o = flash_attention(q, k, v, causal=True, deterministic=False)
    grads = torch.autograd.grad(o.sum(), (q, k, v))
    o2 = flash_attention(q, k, v, causal=True)
    assert torch.equal(o, o2)
    grads2 = torch.autograd.grad(o2.sum(), (q, k, v))
    assert all(torch.equal(a, b) for a, b in zip(grads, grads2, strict=True))


@pytest.mark.gpu
def test_flash_attention_uses_triton_on_cuda():
    q, k, v = _qkv(1, 20, 16, dtype=torch.bfloat16, device="cuda")
    o = flash_attention(q.requires_grad_(), k, v)
    assert o.grad_fn.name().startswith("FlashAttention2Triton")


def test_empty_batch_gives_empty_output():
    q, k, v = _qkv(0, 3, 10, 16)
    assert flash_attention(q, k, v).shape == (0, 3, 10, 16)


@pytest.mark.parametrize("impl", [FlashAttention2PyTorch, FlashAttention2Triton])
@pytest.mark.parametrize(
    "make, error, match",
    [
        (
            lambda: [*_qkv(2, 10, 16)[:2], torch.randn(2, 10, 8, device=DEVICE)],
            ValueError,
            "same shape",
        ),
        (
            lambda: [torch.randn(2, 10, 16, device=DEVICE), *_qkv(2, 10, 8)[1:]],
            ValueError,
            "head dim",
        ),
        (
            lambda: [torch.randn(3, 10, 16, device=DEVICE), *_qkv(2, 10, 16)[1:]],
            ValueError,
            "leading",
        ),
        (lambda: [torch.randn(16, device=DEVICE)] * 3, ValueError, "at least 2 dims"),
        (
            lambda: [torch.ones(2, 4, 8, dtype=torch.int64, device=DEVICE)] * 3,
            TypeError,
            "floating",
        ),
        (
            lambda: [*_qkv(2, 4, 8)[:2], torch.randn(2, 4, 8, device=DEVICE).half()],
            TypeError,
            "share a dtype",
        ),
        (
            lambda: [*_qkv(2, 10, 16)[:2], torch.randn(2, 10, 16, device=DEVICE).numpy()],
            TypeError,
            "Tensor",
        ),
        (
            lambda: [torch.randn(2, 5, 16, device=DEVICE), *_qkv(2, 0, 16)[1:]],
            ValueError,
            "one key",
        ),
    ],
)
def test_bad_input_raises_a_clear_error(impl, make, error, match):
    if DEVICE == "cuda" and "numpy" in str(make.__code__.co_names):
        pytest.skip("numpy() needs a CPU tensor")
    with pytest.raises(error, match=match):
        impl.apply(*make(), False)


def test_triton_rejects_unsupported_head_dim_and_dtype():
    q, k, v = _qkv(1, 8, 512)
    with pytest.raises(ValueError, match="head dim 512"):
        FlashAttention2Triton.apply(q, k, v, False)
    q, k, v = _qkv(1, 8, 16, dtype=torch.float64)
    with pytest.raises(TypeError, match="float64"):
        FlashAttention2Triton.apply(q, k, v, False)


def test_mixed_devices_are_rejected():
    q = torch.randn(1, 8, 16)
    k = torch.randn(1, 8, 16, device="meta")
    with pytest.raises(ValueError, match="one device"):
        FlashAttention2PyTorch.apply(q, k, k, False)


def test_import_and_pytorch_path_work_without_triton():
    # A fresh interpreter where `import triton` fails, as on macOS or Windows.
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch, fa2\n"
        "q = torch.randn(2, 10, 16)\n"
        "print(tuple(fa2.flash_attention(q, q, q, causal=True).shape))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "(2, 10, 16)"
    assert "Triton" not in run.stderr  # no warning on import

"""Attention backends agree with plain PyTorch, alone and inside the model; the registry works."""

import contextlib
import copy
import dataclasses
import importlib.util
import math
import sys
import types

import pytest
import torch

import lmcore.backends
from lmcore import (
    ATTENTION_BACKENDS,
    ModelConfig,
    TransformerLM,
    attention_scores,
    causal_mask,
    fa2_pytorch_attention,
    fa2_triton_attention,
    get_attention,
    naive_attention,
    register_attention,
)

BACKENDS = ["naive", "sdpa", "fa2-pytorch", "fa2-triton"]
_FA2_FUNCTIONS = {"fa2-pytorch": "FlashAttention2PyTorch", "fa2-triton": "FlashAttention2Triton"}

# Head dim 16 is the smallest a Triton `tl.dot` accepts; the sequence length 23 is odd on purpose.
SHAPE = (2, 2, 23, 16)  # (batch, heads, seq, head_dim)


def _device_for(backend: str) -> str:
    """Skip if the backend's package is not there yet; the device to test it on."""
    if backend in _FA2_FUNCTIONS:
        fa2 = pytest.importorskip("fa2", reason="the optional fa2 package is not installed")
        if not hasattr(fa2, _FA2_FUNCTIONS[backend]):
            pytest.skip(f"fa2 does not provide {_FA2_FUNCTIONS[backend]} yet")
    if backend == "fa2-triton":
        if importlib.util.find_spec("triton") is None:
            pytest.skip("triton is not installed")
        # Triton runs CPU tensors only in its interpreter, which is on only without CUDA.
        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cpu"


@contextlib.contextmanager
def _plain_pytorch_precision(device: str):
    """Matmul precision of the plain-PyTorch baseline: on CUDA, Triton's `tl.dot` rounds float32
    inputs to TF32 by default, so the baseline a Triton kernel is held to uses TF32 too."""
    if device != "cuda":
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


# torch.testing's default float32 tolerances: errors below these are float32 rounding noise.
FLOAT32_ATOL, FLOAT32_RTOL = 1e-5, 1.3e-6


def _assert_no_worse_than_plain_pytorch(actual, baseline, exact, what: str) -> None:
    """`actual`'s max error against the float64 `exact` is within float32 rounding noise, or, where
    plain PyTorch in the same precision (`baseline`) is itself worse than that (TF32 on a GPU),
    at most twice plain PyTorch's error."""
    exact = exact.double().cpu()
    error = (actual.double().cpu() - exact).abs().max().item()
    baseline_error = (baseline.double().cpu() - exact).abs().max().item()
    noise = FLOAT32_ATOL + FLOAT32_RTOL * exact.abs().max().item()
    assert error <= max(2 * baseline_error, noise), (
        f"{what}: max error {error:.3g}, plain PyTorch's {baseline_error:.3g}"
    )


def _reference_attention(q, k, v, *, causal):
    """Attention written out independently of lmcore: explicit scores, triu mask, softmax."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        above_diagonal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu(1)
        scores = scores.masked_fill(above_diagonal.to(q.device), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _output_and_grads(fn, q, k, v, upstream, *, causal):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v, causal=causal)
    (out * upstream).sum().backward()
    return out.detach(), q.grad, k.grad, v.grad


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_matches_reference_outputs_and_gradients(backend, causal):
    device = _device_for(backend)
    torch.manual_seed(0)
    q, k, v, upstream = (torch.randn(SHAPE, device=device) for _ in range(4))

    actual = _output_and_grads(get_attention(backend), q, k, v, upstream, causal=causal)
    with _plain_pytorch_precision(device):
        baseline = _output_and_grads(_reference_attention, q, k, v, upstream, causal=causal)
    exact = _output_and_grads(
        _reference_attention, *(t.cpu().double() for t in (q, k, v, upstream)), causal=causal
    )

    for name, a, b, e in zip(("output", "dq", "dk", "dv"), actual, baseline, exact, strict=True):
        _assert_no_worse_than_plain_pytorch(a, b, e, f"{backend} {name}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_shares_key_value_heads(backend):
    # Grouped-query attention: 4 query heads, 2 key/value heads, each shared by 2 query heads.
    device = _device_for(backend)
    torch.manual_seed(0)
    q, upstream = (torch.randn(2, 4, 23, 16, device=device) for _ in range(2))
    k, v = (torch.randn(2, 2, 23, 16, device=device) for _ in range(2))

    actual = _output_and_grads(get_attention(backend), q, k, v, upstream, causal=True)
    k64, v64 = (t.cpu().double().repeat_interleave(2, 1).requires_grad_() for t in (k, v))
    q64 = q.cpu().double().requires_grad_()
    out = _reference_attention(q64, k64, v64, causal=True)
    (out * upstream.cpu().double()).sum().backward()
    shared = lambda g: g.unflatten(1, (2, 2)).sum(2)  # noqa: E731  sum over sharing heads
    exact = (out.detach(), q64.grad, shared(k64.grad), shared(v64.grad))
    for name, a, e in zip(("output", "dq", "dk", "dv"), actual, exact, strict=True):
        assert a.shape == e.shape, name
        torch.testing.assert_close(a.double().cpu(), e, atol=1e-4, rtol=1e-4, msg=name)


# A model small enough for Triton's interpreter: one block, two heads of width 16.
_MODEL_CONFIG = ModelConfig(
    vocab_size=61, context_length=24, d_model=32, num_layers=1, num_heads=2, d_ff=48
)


def _logits_and_grads(model: TransformerLM, tokens: torch.Tensor, upstream: torch.Tensor):
    model.zero_grad()
    logits = model(tokens)
    (logits * upstream).sum().backward()
    return [logits.detach()] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize("num_kv_heads", [None, 1], ids=["mha", "mqa"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_model_with_backend_matches_naive_model(backend, num_kv_heads):
    device = _device_for(backend)
    torch.manual_seed(0)
    config = dataclasses.replace(_MODEL_CONFIG, num_kv_heads=num_kv_heads)
    naive = TransformerLM.from_config(config).to(device)
    model = TransformerLM.from_config(dataclasses.replace(config, attention=backend))
    model = model.to(device)
    model.load_state_dict(naive.state_dict())
    tokens = torch.randint(0, 61, (2, 21), device=device)
    upstream = torch.randn(2, 21, 61, device=device)

    actual = _logits_and_grads(model, tokens, upstream)
    with _plain_pytorch_precision(device):
        baseline = _logits_and_grads(naive, tokens, upstream)
    exact_model = copy.deepcopy(naive).cpu().double()
    exact = _logits_and_grads(exact_model, tokens.cpu(), upstream.cpu().double())

    names = ["logits"] + [name for name, _ in model.named_parameters()]
    for name, a, b, e in zip(names, actual, baseline, exact, strict=True):
        _assert_no_worse_than_plain_pytorch(a, b, e, f"{backend} {name}")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_model_with_backend_under_bf16_autocast_matches_naive(backend):
    _device_for(backend)  # skips a backend whose package is missing
    torch.manual_seed(0)
    naive = TransformerLM.from_config(_MODEL_CONFIG).cuda()
    model = TransformerLM.from_config(dataclasses.replace(_MODEL_CONFIG, attention=backend))
    model = model.cuda()
    model.load_state_dict(naive.state_dict())
    tokens = torch.randint(0, 61, (2, 21), device="cuda")
    upstream = torch.randn(2, 21, 61, device="cuda")

    with torch.autocast("cuda", dtype=torch.bfloat16):
        actual = _logits_and_grads(model, tokens, upstream)
        baseline = _logits_and_grads(naive, tokens, upstream)
    exact_model = copy.deepcopy(naive).cpu().double()
    exact = _logits_and_grads(exact_model, tokens.cpu(), upstream.cpu().double())

    names = ["logits"] + [name for name, _ in model.named_parameters()]
    for name, a, b, e in zip(names, actual, baseline, exact, strict=True):
        _assert_no_worse_than_plain_pytorch(a, b, e, f"{backend} bf16 {name}")


def test_causal_mask_is_lower_triangular():
    mask = causal_mask(5, 5)
    assert torch.equal(mask, torch.ones(5, 5, dtype=torch.bool).tril())


def test_attention_scores_are_scaled_and_masked():
    torch.manual_seed(0)
    q, k = torch.randn(2, 7, 16), torch.randn(2, 7, 16)
    scores = attention_scores(q, k, causal=True)
    below = torch.ones(7, 7, dtype=torch.bool).tril()
    torch.testing.assert_close(scores[:, below], (q @ k.transpose(-2, -1) / 4.0)[:, below])
    assert torch.isneginf(scores[:, ~below]).all()


def test_builtin_backends_are_registered():
    assert set(BACKENDS) <= set(ATTENTION_BACKENDS)


def test_registry_view_is_read_only():
    with pytest.raises(TypeError):
        ATTENTION_BACKENDS["mine"] = naive_attention


@pytest.fixture
def restore_registry():
    saved = dict(lmcore.backends._BACKENDS)
    yield
    lmcore.backends._BACKENDS.clear()
    lmcore.backends._BACKENDS.update(saved)


def test_registered_backend_is_used_by_the_model(restore_registry, tiny_model):
    calls = []

    def counting_attention(q, k, v, *, causal):
        calls.append(causal)
        return naive_attention(q, k, v, causal=causal)

    register_attention("counting", counting_attention)
    config = dataclasses.replace(tiny_model.config, attention="counting")
    model = TransformerLM.from_config(config)
    model.load_state_dict(tiny_model.state_dict())
    tokens = torch.randint(0, config.vocab_size, (2, 9))
    torch.testing.assert_close(model(tokens), tiny_model(tokens), rtol=0, atol=0)
    assert calls == [True] * config.num_layers


def test_registering_a_taken_name_needs_overwrite(restore_registry):
    with pytest.raises(ValueError, match="already registered"):
        register_attention("naive", naive_attention)
    register_attention("naive", naive_attention, overwrite=True)
    assert get_attention("naive") is naive_attention


def test_registering_a_non_callable_is_rejected():
    with pytest.raises(TypeError, match="callable"):
        register_attention("broken", "not a function")


@pytest.mark.parametrize("fn", [fa2_pytorch_attention, fa2_triton_attention])
def test_fa2_backend_without_fa2_says_how_to_install(monkeypatch, fn):
    monkeypatch.setitem(sys.modules, "fa2", None)  # makes `import fa2` fail
    q = torch.randn(1, 1, 4, 16)
    with pytest.raises(ImportError, match=r"cs336sys-fa2.*pip install"):
        fn(q, q, q, causal=True)


def test_fa2_backend_with_old_fa2_names_the_missing_function(monkeypatch):
    monkeypatch.setitem(sys.modules, "fa2", types.ModuleType("fa2"))
    q = torch.randn(1, 1, 4, 16)
    with pytest.raises(ImportError, match="does not provide flash_attention"):
        fa2_triton_attention(q, q, q, causal=False)

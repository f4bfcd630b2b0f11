"""The fused LM head + cross-entropy against `F.cross_entropy(hidden @ W.T, y)` in float64, its
Triton row kernel (Triton's interpreter on a CPU) against the torch step, and what it saves."""

import pytest
import torch
import torch.nn.functional as F

from lmcore import (
    CHUNK_BUDGET_BYTES,
    TransformerLM,
    chunk_rows,
    cross_entropy,
    fused_linear_cross_entropy,
)
from lmcore.linear_cross_entropy import _rows_torch_

TOKENS, FEATURES, VOCAB = 37, 16, 53  # odd sizes: ragged chunks, no power of two


def _inputs(dtype=torch.float64, *, tokens=TOKENS, features=FEATURES, vocab=VOCAB, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, features, generator=g, dtype=torch.float64)
    weight = torch.randn(vocab, features, generator=g, dtype=torch.float64) / features**0.25
    targets = torch.randint(0, vocab, (tokens,), generator=g)
    targets[::7] = -100  # some positions left out
    return hidden.to(dtype).requires_grad_(), weight.to(dtype).requires_grad_(), targets


def _reference(hidden, weight, targets, reduction="mean"):
    """Loss and gradients of the unfused computation in float64."""
    h = hidden.detach().double().requires_grad_()
    w = weight.detach().double().requires_grad_()
    loss = F.cross_entropy(h @ w.T, targets, reduction=reduction)
    loss.backward()
    return loss.detach(), h.grad, w.grad


def _fused(hidden, weight, targets, **kwargs):
    hidden.grad = weight.grad = None
    loss = fused_linear_cross_entropy(hidden, weight, targets, **kwargs)
    loss.backward()
    return loss.detach(), hidden.grad, weight.grad


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize(
    ("use_triton", "chunk_size"), [(False, 1), (False, 8), (False, None), (True, 8), (True, None)]
)
def test_matches_the_unfused_loss_in_float64(reduction, chunk_size, use_triton):
    hidden, weight, targets = _inputs()
    got = _fused(
        hidden, weight, targets, reduction=reduction, chunk_size=chunk_size, use_triton=use_triton
    )
    for a, b in zip(got, _reference(hidden, weight, targets, reduction), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_leading_dimensions_and_the_gradient_of_a_scaled_loss():
    hidden, weight, targets = _inputs()
    hidden3 = hidden.detach().view(1, TOKENS, FEATURES).requires_grad_()
    (3 * fused_linear_cross_entropy(hidden3, weight, targets.view(1, TOKENS))).backward()
    _, dh, dw = _reference(hidden, weight, targets)
    torch.testing.assert_close(hidden3.grad.view(TOKENS, FEATURES), 3 * dh)
    torch.testing.assert_close(weight.grad, 3 * dw)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_a_retained_graph_gives_its_gradients_on_every_backward(dtype):
    # Before: the first backward scaled the saved gradients in place, so a second one through
    # the retained graph raised (or, read past the version check, would scale them twice).
    hidden, weight, targets = _inputs(dtype)
    loss = fused_linear_cross_entropy(hidden, weight, targets)
    first = torch.autograd.grad(2 * loss, (hidden, weight), retain_graph=True)
    second = torch.autograd.grad(3 * loss, (hidden, weight))
    _, dh, dw = _reference(hidden, weight, targets)
    tolerance = {} if dtype == torch.float64 else {"rtol": 2e-2, "atol": 2e-3}
    for factor, (d_hidden, d_weight) in ((2, first), (3, second)):
        torch.testing.assert_close(d_hidden.double(), factor * dh, **tolerance)
        torch.testing.assert_close(d_weight.double(), factor * dw, **tolerance)


def test_ignored_positions_get_no_gradient_and_all_ignored_is_nan():
    hidden, weight, targets = _inputs()
    _, dh, _ = _fused(hidden, weight, targets)
    assert torch.all(dh[targets == -100] == 0) and torch.all(dh[targets != -100] != 0)
    none = torch.full_like(targets, 7)
    assert torch.isnan(fused_linear_cross_entropy(hidden, weight, none, ignore_index=7))
    assert fused_linear_cross_entropy(hidden, weight, none, ignore_index=7, reduction="sum") == 0


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).norm() / want.norm()).item()


@pytest.mark.parametrize("use_triton", [False, True])
def test_bf16_is_no_worse_than_the_unfused_bf16_computation(use_triton):
    # Four chunks of the weight gradient accumulated across chunks, as in a real run.
    hidden, weight, targets = _inputs(torch.bfloat16, tokens=256, features=64, vocab=1000)
    want = _reference(hidden, weight, targets)
    fused = _fused(hidden, weight, targets, chunk_size=64, use_triton=use_triton)
    hidden.grad = weight.grad = None
    plain = F.cross_entropy(hidden @ weight.T, targets)
    plain.backward()
    unfused = (plain.detach(), hidden.grad, weight.grad)
    assert fused[0].dtype == torch.float32 and fused[2].dtype == torch.bfloat16
    for name, f, u, w in zip(("loss", "d hidden", "d weight"), fused, unfused, want, strict=True):
        assert _relative_error(f, w) <= 2 * _relative_error(u, w), name


def test_under_autocast_float32_weights_get_float32_gradients():
    hidden, weight, targets = _inputs(torch.float32, tokens=64, features=32, vocab=300)
    want = _reference(hidden, weight, targets)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = _fused(hidden, weight, targets, chunk_size=16)
        hidden.grad = weight.grad = None
        plain = F.cross_entropy(hidden @ weight.T, targets)
    plain.backward()
    unfused = (plain.detach(), hidden.grad, weight.grad)
    assert fused[1].dtype == fused[2].dtype == torch.float32
    for f, u, w in zip(fused, unfused, want, strict=True):
        assert _relative_error(f, w) <= 2 * _relative_error(u, w)


def test_nothing_of_tokens_times_vocabulary_is_saved_for_backward():
    hidden, weight, targets = _inputs(torch.float32, tokens=64, features=8, vocab=50)
    saved: list[torch.Size] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fused_linear_cross_entropy(hidden, weight, targets, chunk_size=16)
    largest = max(s.numel() for s in saved)
    assert largest == max(hidden.numel(), weight.numel()) < 64 * 50
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        F.cross_entropy(hidden @ weight.T, targets)  # the unfused one keeps the logits
    assert max(s.numel() for s in saved) == 64 * 50


@pytest.mark.parametrize(
    ("dtype", "autocast"), [(torch.bfloat16, False), (torch.float32, True), (torch.float32, False)]
)
def test_the_gradients_wait_for_backward_in_their_inputs_dtypes(dtype, autocast):
    # A bf16 weight's gradient is accumulated in float32 but kept for backward in bf16: half the
    # bytes held from the forward to the backward. Float32 master weights under autocast keep
    # a float32 gradient.
    hidden, weight, targets = _inputs(dtype, tokens=64, features=8, vocab=50)
    saved: list[tuple[torch.Size, torch.dtype]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append((t.shape, t.dtype))
        return t

    with (
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast),
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
    ):
        fused_linear_cross_entropy(hidden, weight, targets, chunk_size=16)
    assert sorted(saved, key=str) == sorted([(hidden.shape, dtype), (weight.shape, dtype)], key=str)


def test_frozen_weight_and_no_grad():
    hidden, weight, targets = _inputs()
    weight.requires_grad_(False)
    fused_linear_cross_entropy(hidden, weight, targets).backward()
    torch.testing.assert_close(hidden.grad, _reference(hidden, weight, targets)[1])
    with torch.no_grad():
        loss = fused_linear_cross_entropy(hidden, weight, targets)
    assert not loss.requires_grad
    torch.testing.assert_close(loss, _reference(hidden, weight, targets)[0])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("max_block", [16, 64])  # several blocks per row, and one
def test_triton_row_kernel_equals_the_torch_step(dtype, max_block):
    from lmcore.kernels.cross_entropy import cross_entropy_rows_

    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(9, VOCAB, generator=g) * 4).to(dtype)
    targets = torch.randint(0, VOCAB, (9,), generator=g)
    targets[2] = -100
    acc = torch.promote_types(dtype, torch.float32)
    scale = torch.tensor(0.25, dtype=acc)
    results = []
    for step in (_rows_torch_, cross_entropy_rows_):
        grads, losses = logits.clone(), torch.empty(9, dtype=acc)
        kwargs = {"max_block": max_block} if step is cross_entropy_rows_ else {}
        step(grads, targets, losses, scale, ignore_index=-100, compute_grad=True, **kwargs)
        results.append((losses, grads))
    (want_loss, want_grad), (loss, grad) = results
    torch.testing.assert_close(loss, want_loss)
    # Both round the same float32 value to the logits' dtype, or nearly: one ulp apart at most.
    torch.testing.assert_close(grad, want_grad, rtol=2**-7 if dtype == torch.bfloat16 else 0,
                               atol=1e-6)  # fmt: skip


def test_triton_row_kernel_marks_an_out_of_range_target_with_nan():
    from lmcore.kernels.cross_entropy import cross_entropy_rows_

    logits, losses = torch.randn(3, 10), torch.empty(3)
    targets = torch.tensor([1, 10, -100])
    scale = torch.tensor(1.0)
    cross_entropy_rows_(logits, targets, losses, scale, ignore_index=-100, compute_grad=True)
    assert torch.isfinite(losses[0]) and torch.isnan(losses[1]) and losses[2] == 0
    assert torch.isnan(logits[1]).all() and torch.all(logits[2] == 0)


def test_chunk_rows_follows_the_memory_budget():
    # The leaderboard's vocabulary in bf16: 3,456 tokens of logits are at most 1 GiB.
    rows = chunk_rows(65_536, 151_936, torch.bfloat16)
    assert rows == 3456 and rows * 151_936 * 2 <= CHUNK_BUDGET_BYTES < (rows + 128) * 151_936 * 2
    assert chunk_rows(64 * 512, 10_000, torch.bfloat16) == 64 * 512  # small: one chunk
    assert chunk_rows(1000, 10**9, torch.float32) == 128  # never fewer than 128 rows
    assert chunk_rows(50, 10**9, torch.float32) == 50


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"targets": torch.randint(0, VOCAB, (TOKENS + 1,))}, ValueError, "shape of hidden"),
        ({"weight": torch.randn(VOCAB, FEATURES + 1)}, ValueError, "vocab_size, features"),
        ({"targets": torch.full((TOKENS,), VOCAB)}, ValueError, r"class ids in \[0, 53\)"),
        ({"targets": torch.rand(TOKENS)}, TypeError, "integer class ids"),
        ({"reduction": "none"}, ValueError, "reduction must be one of"),
        ({"chunk_size": 0}, ValueError, "chunk_size must be a positive integer"),
        ({"hidden": torch.randn(0, FEATURES), "targets": torch.zeros(0, dtype=torch.long)},
         ValueError, "no tokens"),
    ],
)  # fmt: skip
def test_bad_input_is_rejected_with_a_clear_message(kwargs, error, match):
    hidden, weight, targets = _inputs()
    args = {"hidden": hidden, "weight": weight, "targets": targets, **kwargs}
    with pytest.raises(error, match=match):
        fused_linear_cross_entropy(
            args.pop("hidden"), args.pop("weight"), args.pop("targets"), **args
        )


def test_the_model_returns_the_fused_loss_given_targets(tiny_model):
    tokens = torch.randint(0, tiny_model.config.vocab_size, (3, 12))
    x, y = tokens[:, :-1], tokens[:, 1:]
    loss = tiny_model(x, targets=y)
    loss.backward()
    grads = [p.grad.clone() for p in tiny_model.parameters()]
    tiny_model.zero_grad()
    expected = cross_entropy(tiny_model(x), y)
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for got, want in zip(grads, (p.grad for p in tiny_model.parameters()), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_the_model_rejects_targets_of_another_shape(tiny_model):
    tokens = torch.randint(0, tiny_model.config.vocab_size, (2, 6))
    with pytest.raises(ValueError, match="targets must have the shape of token_ids"):
        tiny_model(tokens, targets=tokens[:, 1:])
    with pytest.raises(TypeError, match="targets must be an int64 or int32"):
        tiny_model(tokens, targets=tokens.float())


def test_model_without_targets_still_returns_logits(tiny_model):
    tokens = torch.randint(0, tiny_model.config.vocab_size, (2, 6))
    assert tiny_model(tokens).shape == (2, 6, tiny_model.config.vocab_size)
    assert isinstance(tiny_model, TransformerLM)


# ---- on a GPU: the Triton path and the memory claim -------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_matches_the_unfused_loss_within_twice_its_error(dtype):
    # Odd sizes, four chunks, a vocabulary of two row blocks (16,384 columns each).
    hidden, weight, targets = _inputs(dtype, tokens=4099, features=256, vocab=20_011)
    hidden, weight, targets = (
        hidden.detach().cuda().requires_grad_(),
        weight.detach().cuda().requires_grad_(),
        targets.cuda(),
    )
    want = _reference(hidden, weight, targets)
    fused = _fused(hidden, weight, targets, chunk_size=1024)
    hidden.grad = weight.grad = None
    plain = F.cross_entropy(hidden @ weight.T, targets)
    plain.backward()
    unfused = (plain.detach(), hidden.grad, weight.grad)
    for name, f, u, w in zip(("loss", "d hidden", "d weight"), fused, unfused, want, strict=True):
        assert _relative_error(f, w) <= 2 * _relative_error(u, w) + 1e-7, name


@pytest.mark.gpu
def test_cuda_triton_and_torch_row_steps_agree():
    hidden, weight, targets = _inputs(torch.bfloat16, tokens=777, features=64, vocab=10_000)
    hidden, weight, targets = (
        hidden.detach().cuda().requires_grad_(),
        weight.detach().cuda().requires_grad_(),
        targets.cuda(),
    )
    triton_path = _fused(hidden, weight, targets, use_triton=True)
    torch_path = _fused(hidden, weight, targets, use_triton=False)
    for a, b in zip(triton_path, torch_path, strict=True):
        torch.testing.assert_close(a, b, rtol=2**-7, atol=1e-6)


@pytest.mark.gpu
def test_leaderboard_shape_extra_memory_is_an_eighth_of_the_materialised_logits_and_gradient():
    """65,536 tokens × 4096 features × 151,936 vocabulary in bf16 (the leaderboard's step).

    Materialised, the logits take T·V·2 bytes (19.9 GB) and their gradient as much again. The
    fused loss holds one chunk of logits and a float32 accumulator of the weight's gradient
    (V·d·4 bytes): its peak beyond the inputs and the two gradients it returns must stay within
    an eighth of the materialised pair, and within that analytic sum plus 64 MiB. Between its
    forward and its backward it holds the two gradients in bf16 and nothing else (1 MiB: the
    loss and its per-token scalars).
    """
    tokens, features, vocab = 65_536, 4096, 151_936
    g = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(tokens, features, device="cuda", generator=g).to(torch.bfloat16)
    weight = (torch.randn(vocab, features, device="cuda", generator=g) / 64).to(torch.bfloat16)
    targets = torch.randint(0, vocab, (tokens,), device="cuda", generator=g)
    hidden.requires_grad_()
    weight.requires_grad_()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = fused_linear_cross_entropy(hidden, weight, targets)
    torch.cuda.synchronize()
    returned = hidden.numel() * 2 + weight.numel() * 2  # the two bf16 gradients
    held = torch.cuda.memory_allocated() - base
    assert held <= returned + (1 << 20), f"{held / 2**30:.2f} GiB held for backward"
    loss.backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base - returned
    logits = tokens * vocab * 2
    analytic = vocab * features * 4 + chunk_rows(tokens, vocab, torch.bfloat16) * vocab * 2
    assert extra <= 2 * logits / 8, f"{extra / 2**30:.2f} GiB"
    assert extra <= analytic + (64 << 20), f"{extra / 2**30:.2f} GiB vs {analytic / 2**30:.2f}"


@pytest.mark.gpu
def test_this_torch_accumulates_16_bit_products_in_float32_inside_the_gemm():
    # Without it the weight gradient takes the slower fallback (a product rounded per chunk).
    from lmcore.linear_cross_entropy import _addmm_accumulates_in_float32

    assert _addmm_accumulates_in_float32(torch.device("cuda", torch.cuda.current_device()))

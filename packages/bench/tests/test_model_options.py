"""The shared model options (`bench.core.model_options`), the torch-native step's pieces
(`bench.core.torch_native`), the memory split of a step (`bench.tools.step.memory`), and the
plumbing bench-step adds to bench-plan's (`largest_num_layers`, lmcore-fused's moments) and to
the hardware table (bench-step's `matmul_ceiling`)."""

from __future__ import annotations

import argparse
import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F

import lmcore
from bench.core.memory import tensor_bytes
from bench.core.model_options import checkpointing_spec, with_depth
from bench.core.model_runtime import build_optimizer, next_token_loss, optimizer_class
from bench.core.step import train_step
from bench.core.torch_native import TorchNativeLM, chunked_cross_entropy
from bench.plan.fit import largest_num_layers
from bench.plan.memory import TrainingPlan, estimate_memory
from bench.tools.step.full_step import matmul_ceiling
from bench.tools.step.memory import PhaseReadings, breakdown

# vocabulary 61, context 13, d 16, 3 layers of 2 heads, d_ff 40: odd sizes, milliseconds a step
TINY = lmcore.ModelConfig(
    vocab_size=61, context_length=13, d_model=16, num_layers=3, num_heads=2, d_ff=40
)


def _model(**overrides) -> lmcore.TransformerLM:
    torch.manual_seed(0)
    return lmcore.TransformerLM.from_config(dataclasses.replace(TINY, **overrides))


def _tokens(batch: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, TINY.vocab_size, (batch, TINY.context_length), generator=g)
    y = torch.randint(0, TINY.vocab_size, (batch, TINY.context_length), generator=g)
    return x, y


# ---- the options --------------------------------------------------------------------------


def test_checkpointing_spec_is_lmcores_canonical_form():
    assert checkpointing_spec("segments: 2") == "segments:2"
    assert checkpointing_spec("nested") == "nested"
    for bad in ("segments", "segments:0", "chunks:2", "blocks:2"):
        with pytest.raises(argparse.ArgumentTypeError):
            checkpointing_spec(bad)


def test_optimizers_are_the_three_adamws():
    assert optimizer_class("lmcore") == (lmcore.AdamW, {})
    assert optimizer_class("lmcore-fused") == (lmcore.AdamW, {"fused": True})
    assert optimizer_class("torch-fused") == (torch.optim.AdamW, {"fused": True})
    with pytest.raises(ValueError, match="lmcore, lmcore-fused, torch-fused"):
        optimizer_class("sgd")
    fused = build_optimizer("torch-fused", [torch.nn.Parameter(torch.randn(3))], lr=0.5)
    assert fused.defaults["fused"] and fused.defaults["lr"] == 0.5


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusal")
def test_lmcore_fused_says_what_it_needs_on_a_cpu(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="CUDA"):
        build_optimizer("lmcore-fused", [torch.nn.Parameter(torch.randn(3))])


def test_depth_override_keeps_everything_else():
    small = lmcore.MODEL_SIZES["leaderboard-8b"]
    reduced = with_depth(small, 4)
    assert reduced.num_layers == 4 and dataclasses.replace(reduced, num_layers=34) == small
    assert with_depth(small, None) is small


def test_fused_loss_equals_the_materialised_one_with_gradients():
    model, twin = _model(), _model()
    x, y = _tokens()
    fused = next_token_loss(model, x, y, fused=True)
    plain = next_token_loss(twin, x, y, fused=False)
    torch.testing.assert_close(fused, plain)
    fused.backward()
    plain.backward()
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)


def test_train_step_takes_the_fused_loss_and_checkpointing():
    model = _model()
    twin = copy.deepcopy(model)
    lmcore.apply_activation_checkpointing(model, policy="segments:2")
    x, y = _tokens()
    tokens = [torch.cat([x, y[:, -1:]], dim=1)]  # (batch, seq + 1)
    ours = train_step(model, torch.optim.AdamW(model.parameters()), tokens, fused_loss=True)
    plain = train_step(twin, torch.optim.AdamW(twin.parameters()), tokens)
    torch.testing.assert_close(ours, plain)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b)


# ---- the torch-native step ------------------------------------------------------------------


def test_chunked_cross_entropy_equals_the_full_one_in_float64():
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(37, 12, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(29, 12, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.randint(0, 29, (37,), generator=g)
    ours = chunked_cross_entropy(hidden, weight, targets, chunk_tokens=8, compile=False)
    dh, dw = torch.autograd.grad(ours, (hidden, weight))
    full = F.cross_entropy(hidden @ weight.T, targets)
    rh, rw = torch.autograd.grad(full, (hidden, weight))
    torch.testing.assert_close(ours, full, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dh, rh, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dw, rw, rtol=1e-12, atol=1e-12)


def test_chunked_cross_entropy_keeps_no_logits_for_backward():
    hidden = torch.randn(40, 8, requires_grad=True)
    weight = torch.randn(1000, 8, requires_grad=True)
    targets = torch.randint(0, 1000, (40,))
    sizes = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        chunked_cross_entropy(hidden, weight, targets, chunk_tokens=16, compile=False)
    assert sizes and max(sizes) < 16 * 1000  # not even one chunk's logits is saved


def test_torch_native_lm_is_the_models_loss_with_the_same_gradients():
    model = _model(attention="sdpa")
    twin = copy.deepcopy(model)
    lmcore.apply_activation_checkpointing(model, policy="blocks")
    native = TorchNativeLM(model, compile=False, chunk_tokens=7)
    x, y = _tokens()
    ours = native(x, y)
    theirs = lmcore.cross_entropy(twin(x), y)
    torch.testing.assert_close(ours, theirs)
    ours.backward()
    theirs.backward()
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)
    assert set(dict(native.named_parameters())) == {f"lm.{n}" for n, _ in twin.named_parameters()}


# ---- the memory of a step -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("peaks", "saved", "phase", "split"),
    [
        # early in backward (nothing checkpointed): all the saved activations, a few gradients
        ((170, 175, 150), 100, "backward", (100, 15, 0)),
        # late in backward (checkpointed): few activations, every gradient, a transient
        ((125, 190, 150), 10, "backward", (10, 60, 60)),
        # in the optimizer step: no activations, every gradient, the temporaries
        ((125, 130, 200), 10, "optimizer", (0, 60, 80)),
        # in the forward: no gradient yet
        ((260, 130, 150), 10, "forward", (10, 0, 190)),
    ],
)
def test_the_peak_splits_into_its_parts(peaks, saved, phase, split):
    # parameters 20 B, optimizer state 40 B, gradients 60 B; 70 B in use when the step starts
    # (parameters, state and the batch); the forward leaves `saved` more
    peak_of = dict(zip(("forward", "backward", "optimizer"), peaks, strict=True))
    readings = PhaseReadings(70, {"forward": 70 + saved}, peak_of, {})
    got = breakdown(readings, params=20, grads=60, state=40)
    assert (got.phase, got.peak) == (phase, max(peaks))
    assert (got.activations, got.grads, got.rest) == split
    assert got.params + got.grads + got.state + got.activations + got.rest == got.peak


def test_without_allocator_readings_only_the_tensor_sizes_are_known():
    split = breakdown(PhaseReadings(None, {}, {}, {}), params=3, grads=2, state=6)
    assert (split.peak, split.activations, split.rest) == (None, None, None)
    assert (split.params, split.grads, split.state) == (3, 2, 6)


def test_tensor_bytes_counts_each_storage_once():
    t = torch.zeros(10)
    assert tensor_bytes([t, t[:5], torch.zeros(3, dtype=torch.float64), None, 7], "cpu") == 64


# ---- bench-plan and the hardware table ----------------------------------------------------------


def test_largest_num_layers_fits_and_one_more_does_not():
    plan = TrainingPlan(dataclasses.replace(TINY, num_layers=40), batch=2)
    memory = estimate_memory(dataclasses.replace(plan, model=TINY)).peak.total * 2
    depth = largest_num_layers(plan, memory)
    assert 3 < depth < 40

    def fits(layers):
        model = dataclasses.replace(TINY, num_layers=layers)
        return estimate_memory(dataclasses.replace(plan, model=model)).fits(memory)

    assert fits(depth) and not fits(depth + 1)
    assert largest_num_layers(plan, 1000) is None


def test_every_optimizer_keeps_bf16_moments_for_bf16_parameters():
    """As bench runs them: lmcore's fused AdamW is given `moment_dtype=torch.bfloat16`, the
    precision torch's keeps (the plan and the optimizer bench builds agree)."""

    def state(optimizer: str) -> int:
        plan = TrainingPlan(TINY, batch=2, precision="bf16", optimizer=optimizer)
        return estimate_memory(plan).phase("optimizer step").bytes_of("optimizer state")

    count = lmcore.count_parameters(TINY)
    assert state("lmcore-fused") == state("torch-fused") == 2 * 2 * count
    cls, options = optimizer_class("lmcore-fused", param_dtype=torch.bfloat16)
    assert (cls, options) == (lmcore.AdamW, {"fused": True, "moment_dtype": torch.bfloat16})
    assert optimizer_class("lmcore-fused", param_dtype=torch.float32)[1] == {"fused": True}


def test_matmul_ceiling_prefers_the_measured_rate():
    rate, source = matmul_ceiling("NVIDIA H100 80GB HBM3", "bf16")
    assert "measured" in source and rate < 989.4
    assert matmul_ceiling("NVIDIA H100 80GB HBM3", "tf32")[1].startswith("data-sheet")
    assert matmul_ceiling("NVIDIA H100 PCIe", "bf16")[0] == 756.0
    assert matmul_ceiling("some CPU", "bf16") is None

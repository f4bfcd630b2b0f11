"""The one training step (`bench.core.step.train_step`) against plain PyTorch, on the CPU."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lmcore
from bench.core.step import forward_backward, train_step

VOCAB = 53


def _model(dtype: torch.dtype = torch.float32) -> lmcore.TransformerLM:
    torch.manual_seed(0)
    model = lmcore.TransformerLM.from_size("tiny", context_length=16, vocab_size=VOCAB)
    return model.to(dtype)


def _tokens(batch: int, seq: int = 11) -> torch.Tensor:
    return torch.randint(VOCAB, (batch, seq + 1))  # (batch, seq + 1)


def _reference_step(model: nn.Module, tokens: torch.Tensor, max_norm: float | None) -> float:
    """Forward on the whole batch, torch's cross-entropy, clipping and AdamW: the oracle."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    loss.backward()
    if max_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    return loss.item()


@pytest.mark.parametrize("max_norm", [None, 1e-3])
@pytest.mark.parametrize("num_micro", [1, 3])
def test_step_matches_plain_pytorch(num_micro, max_norm):
    # float64, so that Adam's first step (about lr * sign(grad)) does not amplify rounding.
    tokens = _tokens(6)
    ours, reference = _model(torch.float64), _model(torch.float64)
    expected_loss = _reference_step(reference, tokens, max_norm)
    optimizer = torch.optim.AdamW(ours.parameters(), lr=1e-2)
    loss = train_step(ours, optimizer, tokens.chunk(num_micro), max_grad_norm=max_norm)
    assert loss.item() == pytest.approx(expected_loss, rel=1e-10)
    for p, q in zip(ours.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-9)
    assert all(p.grad is None for p in ours.parameters())  # zero_grad(set_to_none=True) last


def test_set_to_none_false_keeps_zeroed_gradients():
    model = _model()
    train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), [_tokens(2)], set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


def test_bf16_autocast_loss_is_close_to_fp32():
    tokens = _tokens(4)
    fp32 = forward_backward(_model(), [tokens])
    bf16 = forward_backward(_model(), [tokens], autocast_dtype=torch.bfloat16)
    assert bf16.dtype == torch.float32
    assert bf16.item() == pytest.approx(fp32.item(), rel=2e-2)  # bf16 keeps 8 mantissa bits
    assert bf16.item() != fp32.item()  # autocast did run in bf16


class _RecordingWrapper(nn.Module):
    """Records the calls a data-parallel wrapper gets from the training step."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self.calls: list[str] = []
        self.syncing = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append("forward" if self.syncing else "forward (no_sync)")
        return self.module(x)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        self.syncing = False
        try:
            yield
        finally:
            self.syncing = True

    def on_train_batch_start(self) -> None:
        self.calls.append("start")

    def finish_gradient_synchronization(self) -> None:
        self.calls.append("finish")


def test_wrapper_communicates_once_per_step():
    wrapped = _RecordingWrapper(_model())
    train_step(wrapped, torch.optim.SGD(wrapped.parameters(), lr=0.1), _tokens(3).chunk(3))
    assert wrapped.calls == [
        "start",
        "forward (no_sync)",
        "forward (no_sync)",
        "forward",
        "finish",
    ]


def test_no_micro_batch_is_an_error():
    model = _model()
    with pytest.raises(ValueError, match="at least one micro-batch"):
        train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), [])

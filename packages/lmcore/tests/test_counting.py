"""FLOP counts against torch's own FLOP counter on a real forward and backward pass."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from lmcore import (
    ModelConfig,
    TransformerLM,
    forward_flops,
    forward_flops_per_token,
    model_config,
    training_flops,
)

# torch's counter counts matrix multiplications only, as the formula does, so with the naive
# backend (which multiplies the full score matrix, like the formula assumes) the two agree exactly.
_CONFIG = ModelConfig(
    vocab_size=53, context_length=32, d_model=24, num_layers=3, num_heads=2, d_ff=40
)


def _counted(model: TransformerLM, tokens: torch.Tensor, *, backward: bool) -> int:
    counter = FlopCounterMode(display=False)
    with counter:
        logits = model(tokens)
        if backward:
            logits.sum().backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("seq_len", [32, 13])
def test_forward_flops_match_torch_flop_counter(seq_len):
    torch.manual_seed(0)
    model = TransformerLM.from_config(_CONFIG)
    tokens = torch.randint(0, 53, (3, seq_len))
    expected = _counted(model, tokens, backward=False)
    assert forward_flops(_CONFIG, batch_size=3, seq_len=seq_len) == expected


def test_training_flops_match_torch_flop_counter():
    torch.manual_seed(0)
    model = TransformerLM.from_config(_CONFIG)
    tokens = torch.randint(0, 53, (2, 32))
    assert training_flops(_CONFIG, batch_size=2) == _counted(model, tokens, backward=True)


def test_forward_flops_per_token_follows_palm_formula_for_xl():
    cfg = model_config("xl", context_length=1024)
    matmul_params = 32 * (4 * 2560**2 + 3 * 2560 * 10240) + 2560 * 10_000
    assert forward_flops_per_token(cfg) == 2 * matmul_params + 4 * 32 * 1024 * 2560
    assert forward_flops_per_token(cfg, seq_len=256) < forward_flops_per_token(cfg)


@pytest.mark.parametrize("bad", [0, -1, 1.5])
def test_bad_batch_size_is_rejected(bad):
    with pytest.raises(ValueError, match="batch_size"):
        forward_flops(_CONFIG, batch_size=bad)


def test_bad_seq_len_is_rejected():
    with pytest.raises(ValueError, match="seq_len"):
        forward_flops_per_token(_CONFIG, seq_len=0)

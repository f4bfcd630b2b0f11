"""Fixtures shared by lmcore's tests: a tiny model configuration and its model."""

import pytest
import torch

from lmcore import ModelConfig, TransformerLM


@pytest.fixture
def tiny_config() -> ModelConfig:
    # Deliberately odd sizes (vocab 97, d_ff 40) so that no dimension is a power of two, and
    # three heads of width 8 so that head splitting is exercised.
    return ModelConfig(
        vocab_size=97, context_length=24, d_model=24, num_layers=2, num_heads=3, d_ff=40
    )


@pytest.fixture
def tiny_model(tiny_config: ModelConfig) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM.from_config(tiny_config)

"""Model sizes, parameter counts and configuration errors."""

import pytest
import torch

from lmcore import (
    HANDOUT_SIZES,
    MODEL_SIZES,
    VOCAB_SIZE,
    ModelConfig,
    TransformerLM,
    count_parameters,
    cross_entropy,
    model_config,
)

# Table 1 of the CS336 assignment 2 handout: d_model, d_ff, num_layers, num_heads.
HANDOUT_TABLE_1 = {
    "small": (768, 3072, 12, 12),
    "medium": (1024, 4096, 24, 16),
    "large": (1280, 5120, 36, 20),
    "xl": (1600, 6400, 48, 25),
    "2.7B": (2560, 10240, 32, 32),
}


def _meta_model(size: str, **kwargs) -> TransformerLM:
    with torch.device("meta"):
        return TransformerLM.from_size(size, **kwargs)


def test_model_sizes_match_handout_table():
    table = {
        name: (s.d_model, s.d_ff, s.num_layers, s.num_heads)
        for name, s in MODEL_SIZES.items()
        if name in HANDOUT_SIZES
    }
    assert table == HANDOUT_TABLE_1
    assert tuple(HANDOUT_TABLE_1) == HANDOUT_SIZES


def test_tiny_size_trains_a_step_on_the_cpu():
    model = TransformerLM.from_size("tiny", context_length=16)
    tokens = torch.randint(0, model.config.vocab_size, (2, 17))
    loss = cross_entropy(model(tokens[:, :-1]), tokens[:, 1:])
    loss.backward()
    assert count_parameters(model.config) == sum(p.numel() for p in model.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_default_vocabulary_is_ten_thousand():
    assert model_config("small", context_length=8).vocab_size == VOCAB_SIZE == 10_000


@pytest.mark.parametrize("size", list(HANDOUT_TABLE_1))
def test_count_parameters_matches_built_model(size):
    model = _meta_model(size, context_length=128)
    assert count_parameters(model.config) == sum(p.numel() for p in model.parameters())


def test_small_parameter_count_by_hand():
    # 2·V·d (embedding + untied head) + 12·(4·d² + 3·d·d_ff + 2·d) + d, with V=10,000, d=768.
    assert count_parameters(model_config("small", context_length=8)) == 128_625_408


def test_built_model_has_the_named_shape():
    model = _meta_model("medium", context_length=64, attention="sdpa")
    assert len(model.layers) == 24
    assert model.layers[0].attn.num_heads == 16
    assert model.layers[0].ffn.w1.weight.shape == (4096, 1024)
    assert model.lm_head.weight.shape == (10_000, 1024)
    assert model.config == model_config("medium", context_length=64, attention="sdpa")


def test_model_sizes_are_read_only():
    with pytest.raises(TypeError):
        MODEL_SIZES["huge"] = MODEL_SIZES["small"]


def test_unknown_size_lists_valid_sizes():
    with pytest.raises(ValueError, match=r"unknown model size 'huge'.*small, medium, large, xl"):
        TransformerLM.from_size("huge", context_length=16)


def test_d_model_not_divisible_by_heads_is_rejected():
    with pytest.raises(ValueError, match="divisible by num_heads"):
        TransformerLM(
            vocab_size=10, context_length=8, d_model=30, num_layers=1, num_heads=4, d_ff=8
        )


def test_odd_head_dim_is_rejected():
    with pytest.raises(ValueError, match="must be even"):
        TransformerLM(
            vocab_size=10, context_length=8, d_model=15, num_layers=1, num_heads=3, d_ff=8
        )


def test_unknown_attention_backend_lists_valid_backends():
    with pytest.raises(ValueError, match=r"unknown attention backend 'flash'.*naive.*sdpa"):
        TransformerLM(16, 8, 8, 1, 2, 16, attention="flash")


@pytest.mark.parametrize("field", ["vocab_size", "context_length", "num_layers", "d_ff"])
@pytest.mark.parametrize("bad", [0, -3, 2.0])
def test_non_positive_integer_sizes_are_rejected(field, bad):
    kwargs = dict(vocab_size=10, context_length=8, d_model=8, num_layers=1, num_heads=2, d_ff=8)
    kwargs[field] = bad
    with pytest.raises(ValueError, match=field):
        ModelConfig(**kwargs)


def test_non_positive_rope_theta_is_rejected():
    with pytest.raises(ValueError, match="rope_theta"):
        ModelConfig(10, 8, 8, 1, 2, 8, rope_theta=0.0)


@pytest.mark.parametrize("num_kv_heads", [1, 4])
def test_count_parameters_with_shared_key_value_heads(num_kv_heads):
    model = _meta_model("small", context_length=128, num_kv_heads=num_kv_heads)
    assert model.layers[0].attn.k_proj.weight.shape == (num_kv_heads * 64, 768)
    assert count_parameters(model.config) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("bad", [0, 5, -2, 2.0, True])
def test_num_kv_heads_must_divide_num_heads(bad):
    with pytest.raises(ValueError, match="num_kv_heads must be a positive integer dividing"):
        ModelConfig(
            vocab_size=8, context_length=8, d_model=32, num_layers=1, num_heads=4, d_ff=8,
            num_kv_heads=bad,
        )  # fmt: skip

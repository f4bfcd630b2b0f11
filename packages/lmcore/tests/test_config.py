"""Model sizes, parameter counts and configuration errors."""

import pytest
import torch

from lmcore import (
    HANDOUT_SIZES,
    LEADERBOARD_2026,
    MODEL_SIZES,
    VOCAB_SIZE,
    ModelConfig,
    TransformerLM,
    count_parameters,
    cross_entropy,
    describe_size,
    model_config,
)

# Table 1 of the CS336 assignment 2 handout (spring 2026): d_model, d_ff, num_layers, num_heads.
HANDOUT_TABLE_1 = {
    "small": (768, 3072, 12, 12),
    "medium": (1024, 4096, 24, 16),
    "large": (1280, 5120, 36, 20),
    "xl": (2560, 10240, 32, 32),
    "10B": (4608, 12288, 50, 36),
}
# Sizes of the 2025 handout, kept under names that cannot be read as the 2026 ones.
HANDOUT_2025 = {"xl-2025": (1600, 6400, 48, 25), "2.7B": (2560, 10240, 32, 32)}


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


def test_the_2025_sizes_stay_reachable():
    for name, dims in HANDOUT_2025.items():
        s = MODEL_SIZES[name]
        assert (s.d_model, s.d_ff, s.num_layers, s.num_heads) == dims


def test_leaderboard_model_carries_its_vocabulary_and_context():
    # The leaderboard's Config (handout §9): 151,936 tokens, context 32,768, 4096/11008/34/32.
    config = model_config("leaderboard-8b")
    assert (config.vocab_size, config.context_length) == (151_936, 32_768)
    assert (config.d_model, config.d_ff, config.num_layers, config.num_heads) == (
        4096, 11008, 34, 32
    )  # fmt: skip
    assert model_config("leaderboard-8b", context_length=1024).context_length == 1024
    assert count_parameters(config) == sum(
        p.numel() for p in _meta_model("leaderboard-8b").parameters()
    )


def test_the_leaderboard_step_is_the_handouts():
    # Handout §9: the 8B model, batch 2 over two GPUs, bf16; its model at its own vocabulary.
    step = LEADERBOARD_2026
    assert (step.size, step.batch_size, step.num_gpus, step.precision) == (
        "leaderboard-8b", 2, 2, "bf16"
    )  # fmt: skip
    assert step.batch_per_gpu == 1
    assert step.config(attention="sdpa") == model_config("leaderboard-8b", attention="sdpa")


def test_a_size_without_a_context_length_asks_for_one():
    with pytest.raises(ValueError, match="pass context_length"):
        model_config("small")


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("xl", "xl (2560/10240/32L/32H)"),
        ("xl-2025", "xl-2025 (1600/6400/48L/25H)"),
        ("leaderboard-8b", "leaderboard-8b (4096/11008/34L/32H/V151936)"),
    ],
)
def test_describe_size_shows_the_dimensions(name, text):
    assert describe_size(name) == text


def test_describe_size_rejects_unknown_sizes():
    with pytest.raises(ValueError, match="unknown model size 'xxl'"):
        describe_size("xxl")


def test_tiny_size_trains_a_step_on_the_cpu():
    model = TransformerLM.from_size("tiny", context_length=16)
    tokens = torch.randint(0, model.config.vocab_size, (2, 17))
    loss = cross_entropy(model(tokens[:, :-1]), tokens[:, 1:])
    loss.backward()
    assert count_parameters(model.config) == sum(p.numel() for p in model.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_default_vocabulary_is_ten_thousand():
    assert model_config("small", context_length=8).vocab_size == VOCAB_SIZE == 10_000


@pytest.mark.parametrize("size", [*HANDOUT_TABLE_1, *HANDOUT_2025])
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

"""The model against an independent float64 functional reference; causality; input checks."""

import copy
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from lmcore import (
    ModelConfig,
    RotaryEmbedding,
    TransformerLM,
    apply_activation_checkpointing,
    cross_entropy,
)


def _reference_forward(state: dict[str, torch.Tensor], config: ModelConfig, tokens: torch.Tensor):
    """The handout's architecture written as plain float64 functions of the state dict."""
    w = {name: t.double() for name, t in state.items()}
    d, h = config.d_model, config.num_heads
    seq = tokens.shape[1]
    freqs = config.rope_theta ** (-torch.arange(0, d // h, 2, dtype=torch.float64) / (d // h))
    rotation = torch.polar(
        torch.ones(seq, d // h // 2, dtype=torch.float64),
        torch.arange(seq, dtype=torch.float64)[:, None] * freqs,
    )

    def rope(x):  # (batch, heads, seq, head_dim), pairs (2k, 2k+1) as complex numbers
        pairs = torch.view_as_complex(x.unflatten(-1, (-1, 2)).contiguous())
        return torch.view_as_real(pairs * rotation).flatten(-2)

    def heads(x):  # (batch, seq, d) -> (batch, heads, seq, head_dim)
        return x.unflatten(-1, (h, d // h)).transpose(1, 2)

    x = w["token_embeddings.weight"][tokens]
    for i in range(config.num_layers):
        p = f"layers.{i}."
        y = F.rms_norm(x, (d,), w[p + "ln1.weight"], eps=1e-5)
        q = rope(heads(y @ w[p + "attn.q_proj.weight"].T))
        k = rope(heads(y @ w[p + "attn.k_proj.weight"].T))
        v = heads(y @ w[p + "attn.v_proj.weight"].T)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / math.sqrt(d // h))
        x = x + o.transpose(1, 2).flatten(-2) @ w[p + "attn.output_proj.weight"].T
        y = F.rms_norm(x, (d,), w[p + "ln2.weight"], eps=1e-5)
        gated = F.silu(y @ w[p + "ffn.w1.weight"].T) * (y @ w[p + "ffn.w3.weight"].T)
        x = x + gated @ w[p + "ffn.w2.weight"].T
    x = F.rms_norm(x, (d,), w["ln_final.weight"], eps=1e-5)
    return x @ w["lm_head.weight"].T


def test_logits_match_functional_reference(tiny_model, tiny_config):
    torch.manual_seed(1)
    with torch.no_grad():  # random gains, so the norms' weights are exercised too
        for name, p in tiny_model.named_parameters():
            if name.endswith("ln1.weight") or name.endswith("ln2.weight") or "ln_final" in name:
                p.uniform_(0.5, 1.5)
    tokens = torch.randint(0, tiny_config.vocab_size, (3, 19))
    logits = tiny_model(tokens)
    assert logits.shape == (3, 19, tiny_config.vocab_size)
    expected = _reference_forward(tiny_model.state_dict(), tiny_config, tokens)
    # A float32 model against float64: a few float32 roundings per layer, amplified by the norms.
    torch.testing.assert_close(logits.double(), expected, rtol=1e-4, atol=1e-5)


def test_changing_future_tokens_leaves_past_logits_unchanged(tiny_model, tiny_config):
    torch.manual_seed(0)
    tokens = torch.randint(0, tiny_config.vocab_size, (2, 20))
    changed = tokens.clone()
    changed[:, 12:] = (tokens[:, 12:] + 1 + torch.randint(0, 50, (2, 8))) % tiny_config.vocab_size
    before, after = tiny_model(tokens), tiny_model(changed)
    torch.testing.assert_close(after[:, :12], before[:, :12])
    assert not torch.allclose(after[:, 12:], before[:, 12:])


def test_state_dict_has_the_handout_names(tiny_model):
    names = set(tiny_model.state_dict())
    assert {"token_embeddings.weight", "ln_final.weight", "lm_head.weight"} <= names
    assert {
        "layers.1.ln1.weight",
        "layers.1.attn.q_proj.weight",
        "layers.1.attn.output_proj.weight",
        "layers.1.ln2.weight",
        "layers.1.ffn.w1.weight",
        "layers.1.ffn.w2.weight",
    } <= names
    assert not any("rope" in name for name in names)  # the RoPE tables are not saved


def test_lm_head_is_not_tied_to_embedding(tiny_model):
    assert tiny_model.lm_head.weight.data_ptr() != tiny_model.token_embeddings.weight.data_ptr()


def test_meta_build_then_reset_parameters_matches_eager_init(tiny_config):
    torch.manual_seed(3)
    eager = TransformerLM.from_config(tiny_config)
    with torch.device("meta"):
        lazy = TransformerLM.from_config(tiny_config)
    lazy = lazy.to_empty(device="cpu")
    torch.manual_seed(3)
    lazy.reset_parameters()
    for (name, a), b in zip(eager.state_dict().items(), lazy.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    tokens = torch.randint(0, tiny_config.vocab_size, (1, 7))
    torch.testing.assert_close(lazy(tokens), eager(tokens), rtol=0, atol=0)


def test_too_long_sequence_is_rejected(tiny_model, tiny_config):
    tokens = torch.zeros(1, tiny_config.context_length + 1, dtype=torch.long)
    with pytest.raises(ValueError, match="context_length"):
        tiny_model(tokens)


def test_one_dimensional_input_is_rejected(tiny_model):
    with pytest.raises(ValueError, match=r"\(batch, seq\)"):
        tiny_model(torch.tensor([1, 2, 3]))


def test_float_input_is_rejected(tiny_model):
    with pytest.raises(TypeError, match="int64 or int32"):
        tiny_model(torch.rand(1, 4))


# Importing torch.compile's machinery the first time triggers a deprecation warning inside torch.
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_compiles_to_one_graph(tiny_config):
    torch.manual_seed(0)
    model = TransformerLM.from_config(dataclasses.replace(tiny_config, num_layers=1))
    # aot_eager traces forward and backward like inductor does, without needing a C compiler.
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    tokens = torch.randint(0, tiny_config.vocab_size, (2, 11))
    compiled(tokens).sum().backward()
    compiled_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(tokens).sum().backward()
    for compiled_grad, p in zip(compiled_grads, model.parameters(), strict=True):
        torch.testing.assert_close(compiled_grad, p.grad)


# Importing torch.compile's machinery the first time triggers a deprecation warning inside torch.
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_compiled_segments_and_fused_loss_give_the_eager_gradients(tiny_config):
    # One compilation covers both: the checkpoints become the compiler's recomputation regions,
    # the fused loss one opaque custom op (its chunk loop is never traced).
    torch.manual_seed(0)
    config = dataclasses.replace(tiny_config, num_layers=3)
    model = TransformerLM.from_config(config)
    tokens = torch.randint(0, config.vocab_size, (2, 9))
    x, y = tokens[:, :-1], tokens[:, 1:]
    expected = cross_entropy(model(x), y)
    expected.backward()

    checkpointed = apply_activation_checkpointing(copy.deepcopy(model), policy="segments:2")
    checkpointed.zero_grad()
    compiled = torch.compile(checkpointed, backend="aot_eager", fullgraph=True)
    loss = compiled(x, targets=y)
    loss.backward()
    torch.testing.assert_close(loss, expected)
    for got, want in zip(checkpointed.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("cast", [lambda m: m.to(torch.bfloat16), lambda m: m.half()])
def test_rope_tables_stay_float32_when_the_model_is_cast(tiny_model, cast):
    rope = tiny_model.layers[0].attn.rope
    assert isinstance(rope, RotaryEmbedding)
    cos, sin = rope.cos.clone(), rope.sin.clone()
    cast(tiny_model)
    assert rope.cos.dtype == rope.sin.dtype == torch.float32
    assert torch.equal(rope.cos, cos) and torch.equal(rope.sin, sin)
    assert tiny_model.lm_head.weight.dtype != torch.float32  # the weights were cast
    logits = tiny_model(torch.randint(0, tiny_model.config.vocab_size, (1, 5)))
    assert logits.dtype == tiny_model.lm_head.weight.dtype

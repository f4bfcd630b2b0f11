"""Decoding with a KV cache: the same logits as running the whole sequence, the same greedy tokens
as decoding without the cache, one token per step after the prompt, and clear errors."""

import pytest
import torch

from lmcore import KVCache, ModelConfig, TransformerLM, apply_activation_checkpointing, generate


@pytest.fixture
def gqa_model() -> TransformerLM:
    # Grouped-query heads (4 over 2), odd vocabulary, a context short enough to run past.
    config = ModelConfig(vocab_size=61, context_length=20, d_model=32, num_layers=2, num_heads=4,
                         d_ff=48, num_kv_heads=2)  # fmt: skip
    torch.manual_seed(0)
    return TransformerLM.from_config(config).eval()


def test_cached_chunks_give_the_logits_of_the_whole_sequence(gqa_model):
    ids = torch.randint(0, 61, (2, 15))
    with torch.no_grad():
        whole = gqa_model(ids)
        cache = KVCache.for_model(gqa_model, max_length=15)
        parts = [gqa_model(ids[:, a:b], kv_cache=cache) for a, b in ((0, 6), (6, 9), (9, 10),
                                                                       (10, 15))]  # fmt: skip
    assert cache.length == 15
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, atol=1e-5, rtol=1e-5)


def _input_lengths(model):
    """The sequence length of every call of `model`, recorded by a forward pre-hook."""
    lengths = []
    model.register_forward_pre_hook(lambda _, args: lengths.append(args[0].shape[1]))
    return lengths


@pytest.mark.parametrize("prompt_len, new", [(1, 12), (7, 9), (16, 10), (25, 4)],
                         ids=["one-token", "inside-context", "runs-past-context",
                              "prompt-past-context"])  # fmt: skip
def test_cached_decoding_gives_the_uncached_tokens(gqa_model, prompt_len, new):
    prompt = torch.randint(0, 61, (prompt_len,)).tolist()
    lengths = _input_lengths(gqa_model)
    cached = generate(gqa_model, prompt, new, temperature=0.0, use_cache=True)
    calls = list(lengths)
    plain = generate(gqa_model, prompt, new, temperature=0.0, use_cache=False)
    assert cached.tolist() == plain.tolist()
    # one token per step while the sequence fits the context (20), then the whole window
    window = min(prompt_len, 20)
    fits = max(0, min(new - 1, 20 - window))
    assert calls == [window] + [1] * fits + [20] * (new - 1 - fits)


def test_decoding_with_checkpointed_blocks_uses_the_cache(gqa_model):
    reference = generate(gqa_model, [3, 1, 4], 6, temperature=0.0, use_cache=False)
    apply_activation_checkpointing(gqa_model, policy="blocks")
    assert generate(gqa_model, [3, 1, 4], 6, temperature=0.0).tolist() == reference.tolist()


def test_a_full_cache_and_a_model_without_one_are_refused(gqa_model):
    cache = KVCache.for_model(gqa_model, max_length=4)
    with torch.no_grad():
        gqa_model(torch.zeros(1, 3, dtype=torch.long), kv_cache=cache)
        with pytest.raises(ValueError, match="holds 3 of at most 4 tokens"):
            gqa_model(torch.zeros(1, 2, dtype=torch.long), kv_cache=cache)
    with pytest.raises(ValueError, match="exceeds the model's context length"):
        KVCache.for_model(gqa_model, max_length=21)
    with pytest.raises(TypeError, match="use_cache=True needs a TransformerLM"):
        generate(torch.nn.Linear(2, 2), [1], 2, use_cache=True)

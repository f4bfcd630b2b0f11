"""`apply_fused_linear_cross_entropy` on tiny random Hugging Face causal LMs: the same loss and
gradients as the unpatched model, through the fused loss (no logits returned), and the model's
own forward without labels or in eval mode. Skipped where transformers is not installed."""

import pytest
import torch

import lmcore.hf_loss
from lmcore import apply_fused_linear_cross_entropy

transformers = pytest.importorskip("transformers")

_SIZES = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
MODELS = {
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**_SIZES)),
    "qwen2-tied": lambda: transformers.Qwen2ForCausalLM(
        transformers.Qwen2Config(**_SIZES, tie_word_embeddings=True)
    ),
    "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(**_SIZES)),
    "qwen3": lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**_SIZES, head_dim=8)),
}


def _pair(name):
    """(unpatched, patched): two copies of one randomly initialised model, in train mode."""
    torch.manual_seed(0)
    plain = MODELS[name]().train()
    torch.manual_seed(0)
    fused = apply_fused_linear_cross_entropy(MODELS[name]().train())
    return plain, fused


@pytest.fixture
def fused_calls(monkeypatch):
    """How often the fused loss ran (so that a silent fallback to the model's own loss fails)."""
    calls = []
    original = lmcore.hf_loss.fused_linear_cross_entropy

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return original(*args, **kwargs)

    monkeypatch.setattr(lmcore.hf_loss, "fused_linear_cross_entropy", counted)
    return calls


def _batch():
    ids = torch.randint(0, 97, (2, 11))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    labels = ids.masked_fill(mask == 0, -100)
    return ids, mask, labels


@pytest.mark.parametrize("name", MODELS)
def test_patched_models_give_the_same_loss_and_gradients(name, fused_calls):
    plain, fused = _pair(name)
    ids, mask, labels = _batch()
    losses = []
    for model in (plain, fused):
        out = model(ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        losses.append((out.loss, out.logits))
    assert losses[1][1] is None and fused_calls == [(2, 11, 32)]
    torch.testing.assert_close(losses[1][0], losses[0][0], atol=1e-6, rtol=1e-6)
    grads = dict(plain.named_parameters())
    for param_name, p in fused.named_parameters():
        torch.testing.assert_close(p.grad, grads[param_name].grad, atol=1e-6, rtol=1e-5,
                                   msg=param_name)  # fmt: skip


def test_num_items_in_batch_sums_and_divides_as_transformers(fused_calls):
    plain, fused = _pair("llama")
    ids, mask, labels = _batch()
    count = torch.tensor(40)  # tokens of every micro-batch of an accumulated step
    a, b = (
        m(ids, attention_mask=mask, labels=labels, num_items_in_batch=count) for m in (plain, fused)
    )
    torch.testing.assert_close(b.loss, a.loss, atol=1e-6, rtol=1e-6)
    tuple_out = fused(ids, labels=labels, return_dict=False)
    assert isinstance(tuple_out, tuple) and tuple_out[0].dim() == 0 and len(fused_calls) == 2


def test_without_labels_or_in_eval_mode_the_model_runs_as_before(fused_calls):
    plain, fused = _pair("qwen2-tied")
    ids, mask, labels = _batch()
    torch.testing.assert_close(
        fused(ids, attention_mask=mask).logits, plain(ids, attention_mask=mask).logits
    )
    plain.eval(), fused.eval()
    a, b = (m(ids, attention_mask=mask, labels=labels) for m in (plain, fused))
    torch.testing.assert_close(b.logits, a.logits)
    torch.testing.assert_close(b.loss, a.loss)
    assert fused_calls == []


def test_other_architectures_and_a_second_patch_are_refused():
    gemma2 = transformers.Gemma2ForCausalLM(
        transformers.Gemma2Config(**_SIZES, head_dim=8, final_logit_softcapping=30.0)
    )
    with pytest.raises(ValueError, match="model_type 'gemma2'"):
        apply_fused_linear_cross_entropy(gemma2)
    _, fused = _pair("llama")
    with pytest.raises(RuntimeError, match="already applied"):
        apply_fused_linear_cross_entropy(fused)

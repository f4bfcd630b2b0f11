"""The Hugging Face transformers recipe (`fa2.hf`): a tiny, randomly initialised Gemma 2 (grouped
heads, sliding windows on every other layer, logit softcapping) gives the same logits and
gradients with attn_implementation="fa2" as with transformers' own "eager" attention. Skipped
where transformers is not installed (it is an optional test dependency)."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

import fa2.hf  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _tiny_gemma2(attn_implementation):
    config = transformers.Gemma2Config(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=5,
        attn_logit_softcapping=20.0, final_logit_softcapping=None, query_pre_attn_scalar=8,
        max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)  # the same random weights for both implementations
    model = transformers.Gemma2ForCausalLM(config).to(DEVICE)
    model.set_attn_implementation(attn_implementation)
    return model.eval()


@pytest.fixture(scope="module")
def models():
    name = fa2.hf.register()
    return _tiny_gemma2("eager"), _tiny_gemma2(name)


@pytest.fixture
def calls(monkeypatch):
    """How often each of fa2's functions ran (so that a silent fallback to another
    implementation cannot pass)."""
    counts = {"flash_attn_func": 0, "flash_attn_varlen_func": 0}
    for name in counts:
        function = getattr(fa2.hf, name)

        def counted(*args, _name=name, _function=function, **kwargs):
            counts[_name] += 1
            return _function(*args, **kwargs)

        monkeypatch.setattr(fa2.hf, name, counted)
    return counts


def test_fa2_gives_eagers_logits_and_gradients(models, calls):
    eager, ours = models
    ids = torch.randint(0, 97, (2, 13), device=DEVICE)  # longer than the window of 5
    logits = [m(ids).logits for m in (eager, ours)]
    assert calls == {"flash_attn_func": 2, "flash_attn_varlen_func": 0}  # one call per layer
    torch.testing.assert_close(logits[1], logits[0], atol=2e-5, rtol=2e-5)
    grads = []
    for m, out in zip((eager, ours), logits, strict=True):
        m.zero_grad()
        out.logsumexp(-1).sum().backward()
        grads.append(m.model.layers[0].self_attn.q_proj.weight.grad)
    torch.testing.assert_close(grads[1], grads[0], atol=2e-5, rtol=2e-5)


def test_padded_batches_are_unpadded_and_attended_per_sequence(models, calls):
    # Left padding (as for generation): the padded batch's real tokens match each sequence alone.
    eager, ours = models
    ids = torch.randint(0, 97, (2, 11), device=DEVICE)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    with torch.no_grad():
        padded = ours(ids, attention_mask=mask).logits
        alone = eager(ids[1:, 4:]).logits
    assert calls["flash_attn_varlen_func"] == 2
    torch.testing.assert_close(padded[1, 4:], alone[0], atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(padded[0], eager(ids[:1]).logits[0], atol=2e-5, rtol=2e-5)


def test_packed_sequences_never_attend_across_documents(models, calls):
    # Padding-free packing: two documents in one row, positions restarting at 0.
    eager, ours = models
    docs = [torch.randint(0, 97, (1, n), device=DEVICE) for n in (7, 9)]
    positions = torch.cat([torch.arange(7), torch.arange(9)])[None].to(DEVICE)
    with torch.no_grad():
        packed = ours(torch.cat(docs, dim=1), position_ids=positions).logits
        alone = [eager(d).logits[0] for d in docs]
    assert calls["flash_attn_varlen_func"] == 2
    torch.testing.assert_close(packed[0], torch.cat(alone), atol=2e-5, rtol=2e-5)

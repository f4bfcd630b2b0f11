"""`export_hf`: a tiny trained TransformerLM, exported and loaded by transformers'
LlamaForCausalLM, gives the same logits and the same greedy tokens. Skipped where transformers
is not installed (an optional test dependency, in the workspace's dev group)."""

import json

import pytest
import torch

from lmcore import AdamW, ModelConfig, TransformerLM, cross_entropy, export_hf, generate

transformers = pytest.importorskip("transformers")


def _trained(*, tie: bool = False) -> TransformerLM:
    """A tiny model trained for a few dozen steps to continue x -> (5x + 1) mod 53 (so that no
    weight is at its initial value, RMSNorm gains moved off 1, and greedy decoding gives
    varied tokens), with grouped-query heads (4 over 2) and an unusual RoPE base."""
    config = ModelConfig(vocab_size=53, context_length=32, d_model=32, num_layers=2, num_heads=4,
                         d_ff=56, num_kv_heads=2, rope_theta=500.0)  # fmt: skip
    torch.manual_seed(0)
    model = TransformerLM.from_config(config)
    if tie:
        model.lm_head.weight = model.token_embeddings.weight
    optimizer = AdamW(model.parameters(), lr=3e-2)
    for _ in range(30):
        x = torch.randint(0, 53, (8, 1))
        for _ in range(16):
            x = torch.cat((x, (5 * x[:, -1:] + 1) % 53), dim=1)  # (8, 17)
        loss = cross_entropy(model(x[:, :-1]), x[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def _load(folder):
    return transformers.LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_transformers_loads_the_export_and_gives_the_same_logits_and_tokens(tmp_path, tie):
    model = _trained(tie=tie)
    assert (model.layers[0].ln1.weight != 1).all()
    export_hf(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["tie_word_embeddings"] is tie and config["rms_norm_eps"] == 1e-5
    hf = _load(tmp_path)
    ids = torch.randint(0, 53, (2, 29))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids), atol=1e-5, rtol=1e-5)
    prompt = ids[0, :5]
    ours = generate(model, prompt, 20, temperature=0.0, use_cache=False)
    theirs = hf.generate(prompt[None], max_new_tokens=20, do_sample=False)[0, 5:]
    assert theirs.tolist() == ours.tolist()
    assert len(set(ours.tolist())) > 5  # a sequence, not one token repeated


def test_export_casts_to_the_asked_dtype(tmp_path):
    from safetensors.torch import load_file

    export_hf(_trained(), tmp_path, dtype=torch.bfloat16, eos_token_id=52)
    weights = load_file(tmp_path / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and config["eos_token_id"] == 52
    assert len(weights) == 2 + 2 * 9 + 1  # embedding, 9 per block, final norm, head


def test_only_a_transformer_lm_is_exported(tmp_path):
    with pytest.raises(TypeError, match="TransformerLM"):
        export_hf(torch.nn.Linear(2, 2), tmp_path)

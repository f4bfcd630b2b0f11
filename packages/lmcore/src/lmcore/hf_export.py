"""`export_hf`: a `TransformerLM` as a Hugging Face Llama checkpoint (`model.safetensors` and
`config.json`), which `transformers.LlamaForCausalLM.from_pretrained` (and so anything that reads
Llama checkpoints) loads and runs to the same logits.

The two architectures are the same function: pre-norm blocks with RMSNorm, grouped-query
attention with RoPE, a SwiGLU feed-forward network, a final RMSNorm and an LM head, all without
biases. What differs is spelling, and one convention:

- names: `layers.i.attn.q_proj` becomes `model.layers.i.self_attn.q_proj`, `output_proj`
  `o_proj`, `ffn.w1` / `w3` / `w2` `mlp.gate_proj` / `up_proj` / `down_proj`, `ln1` / `ln2`
  `input_layernorm` / `post_attention_layernorm`, `ln_final` `model.norm`;
- RoPE: lmcore rotates adjacent features `(2i, 2i + 1)` of each head, Llama's code (rotate-half)
  rotates `(i, i + head_dim / 2)` by the same angle. Reordering each head's query and key
  features, even ones first then odd ones, turns one into the other; since queries and keys
  are reordered alike, their dot products, and so the attention, do not change. The rows of
  `q_proj` and `k_proj` are permuted that way on export.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from lmcore.model import TransformerLM
from lmcore.norm import RMSNorm

__all__ = ["CONFIG_FILE", "WEIGHTS_FILE", "export_hf", "hf_config", "hf_state_dict"]

# The file names transformers looks for in a checkpoint folder.
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


def _as_lm(model: torch.nn.Module) -> TransformerLM:
    lm = getattr(model, "_orig_mod", model)  # through torch.compile
    if not isinstance(lm, TransformerLM):
        raise TypeError(
            f"export_hf takes a TransformerLM (or a torch.compile of one), got "
            f"{type(lm).__name__}; gather a sharded model's weights into one first"
        )
    return lm


def _rotate_half_order(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """The rows of a q or k projection `(heads * head_dim, d_model)` reordered per head, even
    features first, then odd ones: lmcore's interleaved RoPE pairs become rotate-half pairs."""
    head_dim = weight.shape[0] // heads
    order = torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))
    per_head = weight.view(heads, head_dim, -1)  # (heads, head_dim, d_model)
    return per_head[:, order.to(weight.device)].reshape(weight.shape)


def _tied(model: TransformerLM) -> bool:
    return model.lm_head.weight is model.token_embeddings.weight


def hf_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights of `model` under Llama's names and RoPE convention (see the module
    docstring); no `lm_head.weight` when the head shares the embedding's weight."""
    lm = _as_lm(model)
    config = lm.config
    kv_heads = config.num_kv_heads or config.num_heads
    state: dict[str, torch.Tensor] = {"model.embed_tokens.weight": lm.token_embeddings.weight}
    for i, block in enumerate(lm.layers):
        prefix = f"model.layers.{i}."
        attn, ffn = block.attn, block.ffn
        q_weight = _rotate_half_order(attn.q_proj.weight, config.num_heads)
        state |= {
            prefix + "input_layernorm.weight": block.ln1.weight,
            prefix + "self_attn.q_proj.weight": q_weight,
            prefix + "self_attn.k_proj.weight": _rotate_half_order(attn.k_proj.weight, kv_heads),
            prefix + "self_attn.v_proj.weight": attn.v_proj.weight,
            prefix + "self_attn.o_proj.weight": attn.output_proj.weight,
            prefix + "post_attention_layernorm.weight": block.ln2.weight,
            prefix + "mlp.gate_proj.weight": ffn.w1.weight,
            prefix + "mlp.up_proj.weight": ffn.w3.weight,
            prefix + "mlp.down_proj.weight": ffn.w2.weight,
        }
    state["model.norm.weight"] = lm.ln_final.weight
    if not _tied(lm):
        state["lm_head.weight"] = lm.lm_head.weight
    return {name: t.detach() for name, t in state.items()}


def _rms_norm_eps(model: TransformerLM) -> float:
    """The one epsilon of every RMSNorm (Llama's config has a single `rms_norm_eps`)."""
    values = {m.eps for m in model.modules() if isinstance(m, RMSNorm)}
    if len(values) != 1:
        raise ValueError(
            f"the model's RMSNorms use several epsilons {sorted(values)}; Llama has one"
        )
    return values.pop()


def hf_config(
    model: torch.nn.Module,
    *,
    dtype: torch.dtype | None = None,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
) -> dict[str, Any]:
    """The `config.json` of `model` as a Llama: transformers' `LlamaConfig` fields, with RoPE's
    base under both `rope_parameters` (transformers 5) and `rope_theta` (earlier readers)."""
    lm = _as_lm(model)
    config = lm.config
    dtype = lm.token_embeddings.weight.dtype if dtype is None else dtype
    dtype_name = str(dtype).removeprefix("torch.")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads or config.num_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.context_length,
        "rms_norm_eps": _rms_norm_eps(lm),
        "rope_theta": config.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": _tied(lm),
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "dtype": dtype_name,
        "torch_dtype": dtype_name,
    }


def export_hf(
    model: torch.nn.Module,
    directory: str | os.PathLike[str],
    *,
    dtype: torch.dtype | None = None,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
) -> Path:
    """Write `model` as a Hugging Face Llama checkpoint: `model.safetensors` and `config.json`.

    `transformers.LlamaForCausalLM.from_pretrained(directory)` then computes the logits the
    model computes (see the module docstring for the mapping). Needs the `safetensors`
    package: `pip install 'cs336sys-lmcore[hf]'`.

    Args:
        model: a `TransformerLM` (or a torch.compile of one), its weights on any device.
        directory: the folder to write (created if missing; the two files are replaced).
        dtype: the dtype of the saved weights (e.g. `torch.bfloat16`); default: the model's.
        bos_token_id, eos_token_id: the tokenizer's special ids, for the config (generation
            stops at `eos_token_id`); None: not set.

    Returns:
        The folder, as a `Path`.

    Raises:
        TypeError: not a `TransformerLM`.
        ImportError: safetensors is not installed.

    Example::

        >>> export_hf(model, "out/hf", dtype=torch.bfloat16)
        >>> hf = transformers.LlamaForCausalLM.from_pretrained("out/hf")
    """
    try:
        from safetensors.torch import save_file
    except ImportError as err:
        raise ImportError(
            "export_hf writes safetensors files and needs the safetensors package: "
            "pip install 'cs336sys-lmcore[hf]' (or pip install safetensors)"
        ) from err
    config = hf_config(model, dtype=dtype, bos_token_id=bos_token_id, eos_token_id=eos_token_id)
    state = {
        name: t.to(device="cpu", dtype=dtype or t.dtype).contiguous()
        for name, t in hf_state_dict(model).items()
    }
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, folder / WEIGHTS_FILE, metadata={"format": "pt"})
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return folder

"""A small Transformer language model and the pieces to train it.

The model (`TransformerLM`, the handout's sizes in `MODEL_SIZES`), pluggable attention backends
(`register_attention`), parameter and FLOP counts for MFU, and the training utilities: `AdamW`
(with a fused one-kernel path), `cross_entropy` and `fused_linear_cross_entropy` (the LM head
and the loss without the full logits), `cosine_lr`, `clip_grad_norm`, `get_batch`, checkpoints,
`generate`, and activation checkpointing (`apply_activation_checkpointing`, policies parsed by
`ActivationCheckpointing.parse`).

`import lmcore` imports no torch: the configurations (`MODEL_SIZES`, `ModelConfig`, ...), the
counts and the checkpointing policies (`ActivationCheckpointing`, the memory model) are plain
Python, and every other name imports its module (and torch) when first used.
"""

import importlib
from typing import Any

# Pure Python (no torch): imported with the package, so that `import lmcore` and its sizes,
# configurations, counts and checkpointing policies cost milliseconds (a command line's `--help`
# lists the sizes and parses a policy).
from lmcore.checkpointing_policy import (
    SELECTIVE_KEEPS,
    ActivationCheckpointing,
    memory_optimal_segment_size,
    peak_activation_bytes,
)
from lmcore.config import (
    BUILTIN_ATTENTION,
    DEFAULT_ATTENTION,
    HANDOUT_SIZES,
    LEADERBOARD_2026,
    MODEL_SIZES,
    VOCAB_SIZE,
    LeaderboardStep,
    ModelConfig,
    ModelSize,
    attention_names,
    describe_size,
    model_config,
)
from lmcore.counting import (
    count_parameters,
    forward_flops,
    forward_flops_per_token,
    training_flops,
)

# Everything else needs torch: each name is imported from its module on first use (PEP 562).
_LAZY: dict[str, tuple[str, ...]] = {
    "lmcore.activation_checkpointing": (
        "KEPT_ATTENTION_OPS",
        "CheckpointedBlockStack",
        "apply_activation_checkpointing",
        "checkpoint_keeping_attention",
        "saved_activation_bytes",
    ),
    "lmcore.attention": ("CausalSelfAttention",),
    "lmcore.backends": (
        "ATTENTION_BACKENDS",
        "AttentionBackend",
        "attention_scores",
        "causal_mask",
        "fa2_pytorch_attention",
        "fa2_triton_attention",
        "get_attention",
        "naive_attention",
        "register_attention",
        "repeat_kv_heads",
        "sdpa_attention",
    ),
    "lmcore.clip": ("clip_grad_norm",),
    "lmcore.data": ("get_batch",),
    "lmcore.documents": ("Documents",),
    "lmcore.ffn": ("SwiGLU",),
    "lmcore.generation": ("generate",),
    "lmcore.hf_export": ("export_hf", "hf_config", "hf_state_dict"),
    "lmcore.hf_loss": ("FUSED_LOSS_MODEL_TYPES", "apply_fused_linear_cross_entropy"),
    "lmcore.kv_cache": ("KVCache", "LayerKVCache"),
    "lmcore.linear": ("Embedding", "LMHead", "Linear"),
    "lmcore.linear_cross_entropy": (
        "CHUNK_BUDGET_BYTES",
        "chunk_rows",
        "fused_linear_cross_entropy",
    ),
    "lmcore.loss": ("cross_entropy",),
    "lmcore.model": ("BlockStack", "TransformerBlock", "TransformerLM"),
    "lmcore.norm": ("RMSNorm",),
    "lmcore.optim": ("AdamW",),
    "lmcore.rope": ("RotaryEmbedding",),
    "lmcore.schedule": ("cosine_lr",),
    "lmcore.serialization": ("load_checkpoint", "save_checkpoint"),
}
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}


def __getattr__(name: str) -> Any:
    """Import a torch-backed name from its module the first time it is used, and keep it."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULE_OF})


# The package version; pyproject.toml reads it from here (hatch's version source).
__version__ = "0.1.0"

__all__ = [
    "ATTENTION_BACKENDS",
    "BUILTIN_ATTENTION",
    "CHUNK_BUDGET_BYTES",
    "DEFAULT_ATTENTION",
    "FUSED_LOSS_MODEL_TYPES",
    "HANDOUT_SIZES",
    "KEPT_ATTENTION_OPS",
    "LEADERBOARD_2026",
    "MODEL_SIZES",
    "SELECTIVE_KEEPS",
    "VOCAB_SIZE",
    "ActivationCheckpointing",
    "AdamW",
    "AttentionBackend",
    "BlockStack",
    "CausalSelfAttention",
    "CheckpointedBlockStack",
    "Documents",
    "Embedding",
    "KVCache",
    "LMHead",
    "LayerKVCache",
    "LeaderboardStep",
    "Linear",
    "ModelConfig",
    "ModelSize",
    "RMSNorm",
    "RotaryEmbedding",
    "SwiGLU",
    "TransformerBlock",
    "TransformerLM",
    "apply_activation_checkpointing",
    "apply_fused_linear_cross_entropy",
    "attention_names",
    "attention_scores",
    "causal_mask",
    "checkpoint_keeping_attention",
    "chunk_rows",
    "clip_grad_norm",
    "cosine_lr",
    "count_parameters",
    "cross_entropy",
    "describe_size",
    "export_hf",
    "fa2_pytorch_attention",
    "fa2_triton_attention",
    "forward_flops",
    "forward_flops_per_token",
    "fused_linear_cross_entropy",
    "generate",
    "get_attention",
    "get_batch",
    "hf_config",
    "hf_state_dict",
    "load_checkpoint",
    "memory_optimal_segment_size",
    "model_config",
    "naive_attention",
    "peak_activation_bytes",
    "register_attention",
    "repeat_kv_heads",
    "save_checkpoint",
    "saved_activation_bytes",
    "sdpa_attention",
    "training_flops",
]

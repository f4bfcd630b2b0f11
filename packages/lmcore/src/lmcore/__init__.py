"""A small Transformer language model and the pieces to train it.

The model (`TransformerLM`, the handout's sizes in `MODEL_SIZES`), pluggable attention backends
(`register_attention`), parameter and FLOP counts for MFU, and the training utilities: `AdamW`
(with a fused one-kernel path), `cross_entropy` and `fused_linear_cross_entropy` (the LM head
and the loss without the full logits), `cosine_lr`, `clip_grad_norm`, `get_batch`, checkpoints,
`generate`, and activation checkpointing (`apply_activation_checkpointing`, policies parsed by
`ActivationCheckpointing.parse`).
"""

from lmcore.activation_checkpointing import (
    ActivationCheckpointing,
    CheckpointedBlockStack,
    apply_activation_checkpointing,
    memory_optimal_segment_size,
    peak_activation_bytes,
    saved_activation_bytes,
)
from lmcore.attention import CausalSelfAttention
from lmcore.backends import (
    ATTENTION_BACKENDS,
    AttentionBackend,
    attention_scores,
    causal_mask,
    fa2_pytorch_attention,
    fa2_triton_attention,
    get_attention,
    naive_attention,
    register_attention,
    repeat_kv_heads,
    sdpa_attention,
)
from lmcore.clip import clip_grad_norm
from lmcore.config import (
    DEFAULT_ATTENTION,
    HANDOUT_SIZES,
    MODEL_SIZES,
    VOCAB_SIZE,
    ModelConfig,
    ModelSize,
    describe_size,
    model_config,
)
from lmcore.counting import (
    count_parameters,
    forward_flops,
    forward_flops_per_token,
    training_flops,
)
from lmcore.data import get_batch
from lmcore.ffn import SwiGLU
from lmcore.generation import generate
from lmcore.linear import Embedding, Linear, LMHead
from lmcore.linear_cross_entropy import (
    CHUNK_BUDGET_BYTES,
    chunk_rows,
    fused_linear_cross_entropy,
)
from lmcore.loss import cross_entropy
from lmcore.model import BlockStack, TransformerBlock, TransformerLM
from lmcore.norm import RMSNorm
from lmcore.optim import AdamW
from lmcore.rope import RotaryEmbedding
from lmcore.schedule import cosine_lr
from lmcore.serialization import load_checkpoint, save_checkpoint

# The package version; pyproject.toml reads it from here (hatch's version source).
__version__ = "0.1.0"

__all__ = [
    "ATTENTION_BACKENDS",
    "CHUNK_BUDGET_BYTES",
    "DEFAULT_ATTENTION",
    "HANDOUT_SIZES",
    "MODEL_SIZES",
    "VOCAB_SIZE",
    "ActivationCheckpointing",
    "AdamW",
    "AttentionBackend",
    "BlockStack",
    "CausalSelfAttention",
    "CheckpointedBlockStack",
    "Embedding",
    "LMHead",
    "Linear",
    "ModelConfig",
    "ModelSize",
    "RMSNorm",
    "RotaryEmbedding",
    "SwiGLU",
    "TransformerBlock",
    "TransformerLM",
    "apply_activation_checkpointing",
    "attention_scores",
    "causal_mask",
    "chunk_rows",
    "clip_grad_norm",
    "cosine_lr",
    "count_parameters",
    "cross_entropy",
    "describe_size",
    "fa2_pytorch_attention",
    "fa2_triton_attention",
    "forward_flops",
    "forward_flops_per_token",
    "fused_linear_cross_entropy",
    "generate",
    "get_attention",
    "get_batch",
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

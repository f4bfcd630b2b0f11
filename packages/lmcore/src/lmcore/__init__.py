"""A small Transformer language model and the pieces to train it.

The model (`TransformerLM`, the handout's sizes in `MODEL_SIZES`), pluggable attention backends
(`register_attention`), parameter and FLOP counts for MFU, and the training utilities: `AdamW`,
`cross_entropy`, `cosine_lr`, `clip_grad_norm`, `get_batch`, checkpoints, `generate`, and
`apply_activation_checkpointing`.
"""

from lmcore.activation_checkpointing import apply_activation_checkpointing
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
from lmcore.linear import Embedding, Linear
from lmcore.loss import cross_entropy
from lmcore.model import TransformerBlock, TransformerLM
from lmcore.norm import RMSNorm
from lmcore.optim import AdamW
from lmcore.rope import RotaryEmbedding
from lmcore.schedule import cosine_lr
from lmcore.serialization import load_checkpoint, save_checkpoint

# The package version; pyproject.toml reads it from here (hatch's version source).
__version__ = "0.1.0"

__all__ = [
    "ATTENTION_BACKENDS",
    "DEFAULT_ATTENTION",
    "HANDOUT_SIZES",
    "MODEL_SIZES",
    "VOCAB_SIZE",
    "AdamW",
    "AttentionBackend",
    "CausalSelfAttention",
    "Embedding",
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
    "clip_grad_norm",
    "cosine_lr",
    "count_parameters",
    "cross_entropy",
    "fa2_pytorch_attention",
    "fa2_triton_attention",
    "forward_flops",
    "forward_flops_per_token",
    "generate",
    "get_attention",
    "get_batch",
    "load_checkpoint",
    "model_config",
    "naive_attention",
    "register_attention",
    "repeat_kv_heads",
    "save_checkpoint",
    "sdpa_attention",
    "training_flops",
]

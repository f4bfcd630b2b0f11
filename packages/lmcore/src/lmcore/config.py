"""`ModelConfig` and the named model sizes (Table 1 of the handout and more)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = [
    "BUILTIN_ATTENTION",
    "DEFAULT_ATTENTION",
    "HANDOUT_SIZES",
    "LEADERBOARD_2026",
    "MODEL_SIZES",
    "VOCAB_SIZE",
    "LeaderboardStep",
    "ModelConfig",
    "ModelSize",
    "attention_names",
    "describe_size",
    "model_config",
]

# The handout trains every size on a BPE tokenizer with a 10,000-token vocabulary.
VOCAB_SIZE = 10_000

# RoPE's base wavelength, as in RoFormer and the handout.
DEFAULT_ROPE_THETA = 10_000.0

# The attention backend a model gets when none is named: plain PyTorch, the handout's own.
DEFAULT_ATTENTION = "naive"

# The attention backends lmcore registers itself (`lmcore.backends`, which needs torch), named here
# so that a command line can offer them without importing torch. `ATTENTION_BACKENDS` holds these
# and any registered later.
BUILTIN_ATTENTION = ("naive", "sdpa", "fa2-pytorch", "fa2-triton")


def attention_names() -> tuple[str, ...]:
    """The names of the registered attention backends (the keys of `ATTENTION_BACKENDS`).

    Without importing torch while only the built-ins can be registered: a backend is registered
    through `lmcore.backends`, so until that module is imported the names are
    `BUILTIN_ATTENTION`. A command line offers these as its `--attention` choices.
    """
    backends = sys.modules.get("lmcore.backends")
    return BUILTIN_ATTENTION if backends is None else tuple(backends.ATTENTION_BACKENDS)


@dataclass(frozen=True)
class ModelConfig:
    """Everything needed to build a `TransformerLM`; validated on construction.

    Args:
        vocab_size: number of token ids the embedding and the LM head cover.
        context_length: the longest sequence the model accepts (RoPE tables are this long).
        d_model: width of the residual stream.
        num_layers: number of Transformer blocks.
        num_heads: attention heads per block; must divide `d_model`, and the head dimension
            `d_model // num_heads` must be even because RoPE rotates pairs of features.
        d_ff: hidden width of the SwiGLU feed-forward network.
        rope_theta: RoPE base wavelength.
        attention: name of the attention backend (see `lmcore.ATTENTION_BACKENDS`).
        num_kv_heads: key/value heads per block, shared by `num_heads // num_kv_heads` query
            heads each (grouped-query attention; 1 is multi-query attention); must divide
            `num_heads`. None (the default) gives every query head its own, as in the handout.

    Raises:
        ValueError: a size is not a positive integer, `d_model` is not divisible by
            `num_heads`, the head dimension is odd, `num_kv_heads` does not divide
            `num_heads`, or `rope_theta` is not positive.
    """

    vocab_size: int
    context_length: int
    d_model: int
    num_layers: int
    num_heads: int
    d_ff: int
    rope_theta: float = DEFAULT_ROPE_THETA
    attention: str = DEFAULT_ATTENTION
    num_kv_heads: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.d_model % self.num_heads != 0:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads}); "
                "pick a head count that divides the model width"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(
                f"head dimension d_model // num_heads = {self.head_dim} must be even, because "
                "RoPE rotates pairs of features; change d_model or num_heads"
            )
        if self.num_kv_heads is not None and (
            isinstance(self.num_kv_heads, bool)
            or not isinstance(self.num_kv_heads, int)
            or self.num_kv_heads < 1
            or self.num_heads % self.num_kv_heads != 0
        ):
            raise ValueError(
                f"num_kv_heads must be a positive integer dividing num_heads ({self.num_heads}), "
                f"got {self.num_kv_heads!r}; None gives each query head its own keys and values"
            )
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be positive, got {self.rope_theta!r}")
        if not isinstance(self.attention, str):
            raise TypeError(f"attention must be a backend name (str), got {self.attention!r}")

    @property
    def head_dim(self) -> int:
        """Features per attention head, `d_model // num_heads`."""
        return self.d_model // self.num_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads per block: `num_kv_heads`, or `num_heads` when that is None."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads


@dataclass(frozen=True)
class ModelSize:
    """The shape of one named model size: widths, depth and head count, and its own defaults.

    Most sizes take the handout's vocabulary (`VOCAB_SIZE`) and leave the context length to the
    caller; a size made for one setting (the leaderboard's model) carries its own vocabulary and
    context length, used when the caller gives none.

    Example::

        >>> MODEL_SIZES["small"].config(context_length=256).num_layers
        12
        >>> MODEL_SIZES["xl"].dimensions
        '2560/10240/32L/32H'
    """

    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int
    vocab_size: int = VOCAB_SIZE
    context_length: int | None = None

    @property
    def dimensions(self) -> str:
        """`d_model/d_ff/layersL/headsH`, plus the vocabulary where it is not the handout's.

        Tables print it beside the size's name (see `describe_size`), so a result never reads
        as another size of the same name (the 2025 handout's `xl` was 1600 wide, the 2026 one's
        is 2560).
        """
        text = f"{self.d_model}/{self.d_ff}/{self.num_layers}L/{self.num_heads}H"
        return text if self.vocab_size == VOCAB_SIZE else f"{text}/V{self.vocab_size}"

    def config(
        self,
        *,
        context_length: int | None = None,
        vocab_size: int | None = None,
        rope_theta: float = DEFAULT_ROPE_THETA,
        attention: str = DEFAULT_ATTENTION,
        num_kv_heads: int | None = None,
    ) -> ModelConfig:
        """The full `ModelConfig` of this size for a context length, vocabulary and backend.

        Args:
            context_length: the longest sequence; the size's own when None (an error if it has
                none).
            vocab_size: the vocabulary; the size's own (the handout's 10,000 for most) when None.
            rope_theta: RoPE base wavelength.
            attention: attention backend name.
            num_kv_heads: key/value heads for grouped-query attention (None: one per head).

        Raises:
            ValueError: no context length given and the size has none of its own.
        """
        if context_length is None:
            context_length = self.context_length
        if context_length is None:
            raise ValueError(
                f"this size ({self.dimensions}) has no context length of its own: pass "
                "context_length=..."
            )
        return ModelConfig(
            vocab_size=self.vocab_size if vocab_size is None else vocab_size,
            context_length=context_length,
            d_model=self.d_model,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            d_ff=self.d_ff,
            rope_theta=rope_theta,
            attention=attention,
            num_kv_heads=num_kv_heads,
        )


# Table 1 of the CS336 assignment 2 handout (spring 2026), in its order; then the sizes kept
# from the 2025 handout under names that cannot be mistaken for the 2026 ones (`xl-2025`, the
# 1600-wide xl of 2025; `2.7B`, the 2025 name of today's xl, so old results still read); the
# leaderboard's 8B model (§9: its own vocabulary and context); and `tiny`: two narrow layers, so
# that a training step takes milliseconds on a CPU (tests, CPU defaults, a first
# `bench-train --size tiny`). Read-only, so that no caller can change a size.
MODEL_SIZES: Mapping[str, ModelSize] = MappingProxyType(
    {
        "small": ModelSize(d_model=768, d_ff=3072, num_layers=12, num_heads=12),
        "medium": ModelSize(d_model=1024, d_ff=4096, num_layers=24, num_heads=16),
        "large": ModelSize(d_model=1280, d_ff=5120, num_layers=36, num_heads=20),
        "xl": ModelSize(d_model=2560, d_ff=10240, num_layers=32, num_heads=32),
        "10B": ModelSize(d_model=4608, d_ff=12288, num_layers=50, num_heads=36),
        "xl-2025": ModelSize(d_model=1600, d_ff=6400, num_layers=48, num_heads=25),
        "2.7B": ModelSize(d_model=2560, d_ff=10240, num_layers=32, num_heads=32),
        "leaderboard-8b": ModelSize(
            d_model=4096,
            d_ff=11008,
            num_layers=34,
            num_heads=32,
            vocab_size=151_936,
            context_length=32_768,
        ),
        "tiny": ModelSize(d_model=64, d_ff=256, num_layers=2, num_heads=4),
    }
)
# The sizes of the 2026 handout's Table 1, in its order.
HANDOUT_SIZES: tuple[str, ...] = ("small", "medium", "large", "xl", "10B")


@dataclass(frozen=True)
class LeaderboardStep:
    """A leaderboard's training step: the model, the batch over the GPUs, the dtype it is
    stored in. The one definition every tool reads (bench-step's preset, bench-plan's
    prediction), so that none keeps a copy.

    Attributes:
        size: the model's key in `MODEL_SIZES` (its vocabulary and context length are its own).
        batch_size: sequences per optimizer step, over all the GPUs.
        num_gpus: the GPUs the step runs on.
        precision: what the model is stored and computed in: `bf16`, the handout's
            `torch_dtype=torch.bfloat16` (weights, gradients and activations in bf16).

    Example::

        >>> LEADERBOARD_2026.model_size.vocab_size, LEADERBOARD_2026.batch_per_gpu
        (151936, 1)
    """

    size: str
    batch_size: int
    num_gpus: int
    precision: str

    @property
    def model_size(self) -> ModelSize:
        """The model's `ModelSize`."""
        return _size(self.size)

    @property
    def batch_per_gpu(self) -> int:
        """Sequences each GPU takes per step."""
        return self.batch_size // self.num_gpus

    def config(self, *, attention: str = DEFAULT_ATTENTION) -> ModelConfig:
        """The model's `ModelConfig` at its own context length and vocabulary."""
        return self.model_size.config(attention=attention)


def _size(name: str) -> ModelSize:
    try:
        return MODEL_SIZES[name]
    except KeyError:
        raise ValueError(
            f"unknown model size {name!r}; choose one of {', '.join(MODEL_SIZES)}"
        ) from None


def describe_size(name: str) -> str:
    """A size's name with its dimensions, for tables and plots: `"xl (2560/10240/32L/32H)"`.

    Raises:
        ValueError: `name` is not a key of `MODEL_SIZES` (the message lists them).
    """
    return f"{name} ({_size(name).dimensions})"


def model_config(
    size: str,
    *,
    context_length: int | None = None,
    vocab_size: int | None = None,
    rope_theta: float = DEFAULT_ROPE_THETA,
    attention: str = DEFAULT_ATTENTION,
    num_kv_heads: int | None = None,
) -> ModelConfig:
    """The `ModelConfig` of a named size from `MODEL_SIZES`.

    Args:
        size: one of the keys of `MODEL_SIZES`.
        context_length: the longest sequence the model will see; the size's own when None
            (only `leaderboard-8b` has one).
        vocab_size: vocabulary size; the size's own when None (the handout's 10,000 for all but
            `leaderboard-8b`).
        rope_theta: RoPE base wavelength.
        attention: attention backend name.
        num_kv_heads: key/value heads for grouped-query attention (None: one per head).

    Raises:
        ValueError: `size` is not a known size (the message lists the valid ones), or no
            context length is given for a size without one.
    """
    return _size(size).config(
        context_length=context_length,
        vocab_size=vocab_size,
        rope_theta=rope_theta,
        attention=attention,
        num_kv_heads=num_kv_heads,
    )


# The CS336 spring-2026 leaderboard (handout §9): its 8B model, batch 2 over two GPUs (B200s on
# the leaderboard itself), in bf16.
LEADERBOARD_2026 = LeaderboardStep(
    size="leaderboard-8b", batch_size=2, num_gpus=2, precision="bf16"
)

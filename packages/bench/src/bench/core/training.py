"""The training step every training tool runs, and the data-parallel set-up bench-ddp and
bench-zero share.

- `train_step` (and its first half, `forward_backward`): one optimizer step of next-token
  training over one or more micro-batches, through any model or data-parallel wrapper;
  `clip_grad_norm`, its clipping, which also handles gradients sharded over the ranks (FSDP).
- `TrainingBenchConfig`: the model (size, context, vocabulary), batch per rank, world size,
  variants, warm-up and timed steps, validated once; the device's default (`for_device`: the
  handout's XL at context 128, batch 4 per rank, on 2 GPUs; a tiny model on 2 CPU ranks without
  a GPU) and the words for its notice and the run's title. Each tool subclasses it with its own
  fields.
- `Case`: one measured row, a variant and its bucket size.
- On each rank: `build_model` (an XL model materialised from the meta device on the GPU),
  `token_batches` (each rank its own data), `ADAMW_OPTIONS`.
- On the command line: `bench.core.training_options` (light: the commands import it).

The ranks themselves are run by `bench.core.distributed.measure_cases`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar, Self

import torch
import torch.distributed as dist
from torch import nn

import lmcore
from bench.core.model_runtime import next_token_loss
from bench.core.shapes import CPU_SIZE, shape_named
from bench.core.tool import config_or_default

__all__ = [
    "ADAMW_OPTIONS",
    "Case",
    "TrainingBenchConfig",
    "build_lm",
    "build_model",
    "clip_grad_norm",
    "forward_backward",
    "token_batches",
    "train_step",
]

# The training recipe does not matter for timing or memory beyond the state AdamW keeps (two
# moments per parameter); these are the usual values.
ADAMW_OPTIONS = {"lr": 1e-4, "weight_decay": 0.01}
_DATA_SEED = 1000  # rank r draws its batches from seed 1000 + r: each rank its own data


@dataclass(frozen=True)
class TrainingBenchConfig:
    """The model, data and run bench-ddp and bench-zero share; each tool adds its own fields.

    Args:
        size: a size of `lmcore.MODEL_SIZES` ("xl", or "tiny" on a CPU).
        context_length: tokens per sequence.
        batch: sequences per rank per step.
        vocab_size: vocabulary size.
        world_size: ranks (one GPU each on CUDA).
        variants: what to compare, from the tool's `VARIANTS`, in the order they run.
        warmup: untimed steps first (the first one creates the optimizer state).
        steps: timed steps.
    """

    VARIANTS: ClassVar[tuple[str, ...]] = ()

    size: str
    context_length: int = 128
    batch: int = 4
    vocab_size: int = lmcore.VOCAB_SIZE
    world_size: int = 2
    variants: tuple[str, ...] = ()
    warmup: int = 2
    steps: int = 10

    def __post_init__(self) -> None:
        shape_named(self.size)  # raises on an unknown size, listing the known ones
        if not self.variants or not set(self.variants) <= set(self.VARIANTS):
            raise ValueError(
                f"variants must be non-empty, from {self.VARIANTS}; got {self.variants}"
            )
        sizes = (self.context_length, self.batch, self.vocab_size, self.steps)
        if min(sizes) < 1 or self.warmup < 1 or self.world_size < 2:
            raise ValueError(
                "context_length, batch, vocab_size and steps must be positive, warmup at least 1 "
                f"(it creates the optimizer state) and world_size at least 2; got {self}"
            )

    @classmethod
    def for_device(cls, device: torch.device | str) -> Self:
        """XL at context 128, batch 4 per rank, on 2 GPUs; a tiny model on 2 CPU ranks otherwise."""
        if torch.device(device).type == "cuda":
            return cls(size="xl")
        return cls(size=CPU_SIZE, context_length=32, batch=2, warmup=1, steps=3)

    @classmethod
    def or_default(
        cls, config: Self | None, device: torch.device, *, tool: str
    ) -> tuple[Self, list[str]]:
        """`config`, or `for_device(device)` announced off CUDA (see `cli.config_or_default`)."""
        return config_or_default(
            config, device, default=cls.for_device, tool=tool, describe=cls.cpu_summary
        )

    def cpu_summary(self) -> str:
        """The model and run in words, for the notice that the CPU default ran."""
        s = self.model_size
        return (
            f"{s.num_layers} layers of width {s.d_model}, context {self.context_length}, "
            f"batch {self.batch} per rank, {self.world_size} gloo ranks"
        )

    @property
    def model_size(self) -> lmcore.ModelSize:
        """The widths and depth of `size`."""
        return lmcore.MODEL_SIZES[self.size]

    def summary(self) -> str:
        """The run in words, for a title: ranks, batch, context, warm-up and timed steps."""
        return (
            f"{self.world_size} ranks, batch {self.batch} per rank, context {self.context_length}, "
            f"{self.warmup} warm-up + {self.steps} timed steps"
        )


@dataclass(frozen=True)
class Case:
    """One measured row of a training benchmark: a variant, and its bucket size where it has one
    (in ddp's vocabulary, `None` = one bucket, for the variants that take a size)."""

    variant: str
    bucket_size_mb: float | None = None


def build_lm(
    model_config: lmcore.ModelConfig, device: torch.device, *, seed: int
) -> lmcore.TransformerLM:
    """The `lmcore.TransformerLM` of `model_config` on `device`, initialised from `seed`.

    On a GPU the model is built on the meta device and materialised there, which skips the slow
    CPU initialisation of an XL model.
    """
    torch.manual_seed(seed)
    if device.type == "cpu":
        return lmcore.TransformerLM.from_config(model_config)
    with torch.device("meta"):
        model = lmcore.TransformerLM.from_config(model_config)
    model = model.to_empty(device=device)
    model.reset_parameters()
    return model


def build_model(
    config: TrainingBenchConfig,
    device: torch.device,
    *,
    seed: int,
    attention: str = lmcore.DEFAULT_ATTENTION,
) -> lmcore.TransformerLM:
    """`config`'s `lmcore.TransformerLM` on `device`, initialised from `seed` (see `build_lm`)."""
    model_config = config.model_size.config(
        context_length=config.context_length, vocab_size=config.vocab_size, attention=attention
    )
    return build_lm(model_config, device, seed=seed)


def token_batches(
    config: TrainingBenchConfig, *, rank: int, device: torch.device
) -> Iterator[torch.Tensor]:
    """Endless random token batches `(batch, context_length + 1)` on `device`, one stream per rank.

    Each rank draws its own data, as in data-parallel training; inputs are `[:, :-1]` and the
    next-token targets `[:, 1:]`.
    """
    g = torch.Generator().manual_seed(_DATA_SEED + rank)
    shape = (config.batch, config.context_length + 1)  # (batch, seq + 1)
    while True:
        yield torch.randint(config.vocab_size, shape, generator=g).to(device)


def forward_backward(
    model: nn.Module,
    micro_batches: Sequence[torch.Tensor],
    *,
    autocast_dtype: torch.dtype | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = lmcore.cross_entropy,
    fused_loss: bool = False,
) -> torch.Tensor:
    """Forward and backward of next-token cross-entropy over `micro_batches`; the mean loss.

    Each micro-batch is a token tensor `(batch, seq + 1)`: inputs `[:, :-1]`, targets `[:, 1:]`.
    Each loss is divided by the number of micro-batches, so the accumulated gradients are those
    of their mean. A data-parallel wrapper (ours or torch's) communicates once: every backward
    but the last runs under its `no_sync()`; ours get `on_train_batch_start()` first and
    `finish_gradient_synchronization()` after the last backward (as does any wrapper that has
    them, e.g. `zero.FSDP`).

    Args:
        model: an `lmcore.TransformerLM`, or a wrapper around one.
        micro_batches: one or more token tensors.
        autocast_dtype: run forward and loss under `torch.autocast` in this dtype (e.g.
            `torch.bfloat16`); None runs in the parameters' dtype.
        loss_fn: `(logits, targets) -> mean loss`; `lmcore.cross_entropy` (or a compiled one).
        fused_loss: the model's own fused LM head + loss instead, `model(inputs,
            targets=targets)`, which never holds the logits (`loss_fn` is then not used).

    Returns:
        The mean loss over the micro-batches, detached: a 0-d tensor in at least fp32, left on the
        device (no host synchronisation).

    Raises:
        ValueError: no micro-batch.
    """
    if not micro_batches:
        raise ValueError("forward_backward needs at least one micro-batch")
    if hasattr(model, "on_train_batch_start"):
        model.on_train_batch_start()
    no_sync = getattr(model, "no_sync", contextlib.nullcontext)
    device_type = micro_batches[0].device.type
    losses = []
    for index, tokens in enumerate(micro_batches):
        last = index == len(micro_batches) - 1
        with contextlib.nullcontext() if last else no_sync():
            with torch.autocast(
                device_type, dtype=autocast_dtype, enabled=autocast_dtype is not None
            ):
                loss = next_token_loss(
                    model, tokens[:, :-1], tokens[:, 1:], fused=fused_loss, loss_fn=loss_fn
                )
                loss = loss / len(micro_batches)
            loss.backward()
        losses.append(loss.detach())
    if hasattr(model, "finish_gradient_synchronization"):
        model.finish_gradient_synchronization()
    # (num_micro,) -> (): summed in at least fp32 (a bf16 autocast loss too)
    return torch.stack(losses).sum(dtype=torch.promote_types(losses[0].dtype, torch.float32))


# Added to the norm before dividing, as lmcore.clip_grad_norm and torch do.
_CLIP_EPS = 1e-6


@torch.no_grad()
def clip_grad_norm(
    params: Sequence[torch.Tensor], max_norm: float, *, sharded: Collection[torch.Tensor] = ()
) -> torch.Tensor:
    """Clip the gradients of `params` to a total L2 norm of `max_norm`; return the norm before.

    Without `sharded` this is `lmcore.clip_grad_norm`. The gradients of the `sharded` parameters
    are instead this rank's shards of gradients spread over the ranks of the default process
    group (`zero.FSDP`'s weights of two or more dimensions), and the others are replicated
    (equal on every rank): the squared norm is the shards' squares summed over the ranks (one
    all-reduce, every rank must call) plus the replicated gradients' squares counted once, so
    every rank scales by the norm one process would compute for the whole model.
    """
    if not sharded:
        return lmcore.clip_grad_norm(params, max_norm)
    ids = {id(p) for p in sharded}
    grads = [p.grad for p in params if p.grad is not None]
    shards = [p.grad for p in params if p.grad is not None and id(p) in ids]
    replicated = [p.grad for p in params if p.grad is not None and id(p) not in ids]
    device = grads[0].device
    squares = torch.zeros(2, device=device)  # (shards summed over ranks, replicated)
    for index, group in enumerate((shards, replicated)):
        if group:
            squares[index] = torch.stack(torch._foreach_norm(group)).square().sum()
    shard_squares = squares[:1].clone()
    dist.all_reduce(shard_squares)
    total = (shard_squares[0] + squares[1]).sqrt()
    scale = (max_norm / (total + _CLIP_EPS)).clamp(max=1.0)
    torch._foreach_mul_(grads, scale)
    return total


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[torch.Tensor],
    *,
    autocast_dtype: torch.dtype | None = None,
    max_grad_norm: float | None = None,
    sharded_params: Collection[torch.Tensor] = (),
    set_to_none: bool = True,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = lmcore.cross_entropy,
    fused_loss: bool = False,
) -> torch.Tensor:
    """One training step: `forward_backward`, optional clipping, the optimizer step, zero_grad.

    The one step bench-ddp, bench-zero and bench-train run, so that their numbers measure the
    same work.

    Args:
        model: an `lmcore.TransformerLM`, or a wrapper around one.
        optimizer: steps `model`'s parameters (a torch optimizer, `zero.ShardedOptimizer`, ...).
        micro_batches: one or more token tensors `(batch, seq + 1)` (see `forward_backward`).
        autocast_dtype: autocast dtype of forward and loss; None for none.
        max_grad_norm: clip the gradients' total norm to this (`clip_grad_norm`, after
            synchronisation); None: no clipping.
        sharded_params: the parameters whose gradients are shards spread over the ranks
            (`zero.FSDP`'s weights of two or more dimensions), for the clipping norm.
        set_to_none: `optimizer.zero_grad(set_to_none=...)` after the step; False keeps the
            gradient tensors allocated from step to step.
        loss_fn: the loss of logits and targets (see `forward_backward`).

    Returns:
        The step's mean loss, detached (see `forward_backward`).
    """
    loss = forward_backward(
        model, micro_batches, autocast_dtype=autocast_dtype, loss_fn=loss_fn, fused_loss=fused_loss
    )
    if max_grad_norm is not None:
        clip_grad_norm(list(model.parameters()), max_grad_norm, sharded=sharded_params)
    optimizer.step()
    optimizer.zero_grad(set_to_none=set_to_none)
    return loss

"""The pieces of a torch-native training step: what a user who takes only torch's own tools would
write around the same `lmcore.TransformerLM`.

- `compile_blocks(blocks)`: each block compiled in place (`block.compile()`), torchtitan's way:
  identical blocks compile once (dynamo's guards do not pin the module instance), and a
  checkpoint around a block's call stays outside the compiled code, so it drops what the block
  saves. Ours compile the same way (`bench.core.parallel`).
- `fully_shard_blocks(root, blocks, ...)`: torch's FSDP2 as its documentation advises,
  `fully_shard` on every block (compiled in place first, if asked), then on the root. bench-zero's
  `fsdp:torch` rows, bench-train's `--parallel fsdp:torch` and bench-step's torch-native rows all
  shard this way.
- `chunked_cross_entropy(hidden, weight, targets)`: the LM head and the cross-entropy over chunks
  of tokens, each chunk a compiled `F.cross_entropy(hidden_c @ Wᵀ, y_c)` under
  `torch.utils.checkpoint`, so that no chunk's logits are kept for backward (backward computes
  them again: a fourth `T·V·d` matmul, the price of holding one chunk's logits at a time).
- `TorchNativeLM(model)`: the model's embedding, blocks and final norm, then
  `chunked_cross_entropy` with its LM head's weight: `native(inputs, targets)` is the loss
  (`native(inputs)` the logits); `torch_native_model` builds it with each block compiled, as
  bench-step's torch-native rows and bench-train's `--baseline torch` run it.
  Its blocks are the model's own (checkpointed, if they are, by lmcore's non-reentrant
  `torch.utils.checkpoint` segments, which are torch's).

Example::

    model = lmcore.TransformerLM.from_size("small", context_length=512, attention="sdpa")
    lmcore.apply_activation_checkpointing(model, policy="segments:2")
    native = TorchNativeLM(model, compile=True)
    fully_shard_blocks(native, model.layers, param_dtype=torch.bfloat16)  # ranks > 1
    loss = native(x, y)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import lmcore
from bench.core.model_options import DEFAULT_COMPILE_BACKEND

__all__ = [
    "TorchNativeLM",
    "chunked_cross_entropy",
    "compile_blocks",
    "fully_shard_blocks",
    "torch_native_model",
]


def compile_blocks(blocks: Iterable[nn.Module], *, backend: str = DEFAULT_COMPILE_BACKEND) -> None:
    """`torch.compile` each block in place (`block.compile(backend=backend)`): parameter names
    stay the model's own, blocks of one class share one graph, and a checkpoint around a
    block's call (lmcore's `CheckpointedBlockStack`) stays outside the compiled code."""
    for block in blocks:
        block.compile(backend=backend)


def fully_shard_blocks(
    root: nn.Module,
    blocks: Iterable[nn.Module],
    *,
    param_dtype: torch.dtype | None = None,
    compile: bool = False,
    compile_backend: str = DEFAULT_COMPILE_BACKEND,
) -> nn.Module:
    """torch's FSDP2 applied as its docs advise: `fully_shard` on every block, then on `root`.

    Args:
        root: the module the step calls (its parameters outside the blocks form the root unit).
        blocks: the blocks, each a unit of its own (gathered before its forward, freed after).
        param_dtype: the dtype weights are gathered and gradients reduced in
            (`MixedPrecisionPolicy(param_dtype=...)`); None: the parameters' own.
        compile: `torch.compile` each block in place before sharding it (`compile_blocks`).
        compile_backend: the backend it compiles with.

    Returns:
        `root`, sharded in place (an `FSDPModule`).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=param_dtype)
    blocks = list(blocks)
    if compile:
        compile_blocks(blocks, backend=compile_backend)
    for block in blocks:
        fully_shard(block, mp_policy=policy)
    return fully_shard(root, mp_policy=policy)


def _chunk_loss_sum(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Summed cross-entropy of one chunk: logits `(chunk, V)` computed, upcast to at least
    float32, reduced."""
    logits = hidden @ weight.T  # (chunk, vocab)
    return F.cross_entropy(logits.to(_accumulation(logits.dtype)), targets, reduction="sum")


def _accumulation(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


@functools.cache
def _compiled_chunk_loss(backend: str) -> Callable[..., torch.Tensor]:
    """One compiled chunk loss per backend for the process (each new chunk shape compiles
    once)."""
    return torch.compile(_chunk_loss_sum, dynamic=False, backend=backend)


def chunked_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_tokens: int | None = None,
    compile: bool = True,
    compile_backend: str = DEFAULT_COMPILE_BACKEND,
) -> torch.Tensor:
    """Mean `F.cross_entropy(hidden @ weight.T, targets)` over chunks of tokens, each
    checkpointed, so that only one chunk's logits exist at a time.

    Args:
        hidden: final hidden states `(..., d)`.
        weight: the LM head's weight `(V, d)`.
        targets: token ids of `hidden`'s leading shape.
        chunk_tokens: tokens per chunk; by default lmcore's fused loss's own rule
            (`lmcore.chunk_rows`: 1 GiB of logits per chunk), so the two hold the same chunk.
        compile: each chunk's loss through `torch.compile`.
        compile_backend: the backend it compiles with.

    Returns:
        The mean loss over all tokens, 0-dim, in float32 (float64 for float64 inputs).
    """
    hidden = hidden.flatten(0, -2)  # (tokens, d)
    targets = targets.flatten()
    tokens = hidden.shape[0]
    step = chunk_tokens or lmcore.chunk_rows(tokens, weight.shape[0], hidden.dtype)
    loss_sum = _compiled_chunk_loss(compile_backend) if compile else _chunk_loss_sum
    total = hidden.new_zeros((), dtype=_accumulation(hidden.dtype))
    for start in range(0, tokens, step):
        chunk = slice(start, start + step)
        total = total + checkpoint(
            loss_sum, hidden[chunk], weight, targets[chunk], use_reentrant=False
        )
    return total / tokens


class TorchNativeLM(nn.Module):
    """An `lmcore.TransformerLM`'s forward with torch's own loss: `native(inputs, targets)`.

    Embedding, the model's block stack (with whatever checkpointing it carries), final RMSNorm,
    then `chunked_cross_entropy` against the LM head's weight. The model's modules are held,
    not copied: the same parameters, so `fully_shard_blocks(native, model.layers)` shards them.

    Args:
        model: the model (its attention backend is the caller's choice; SDPA for a torch user).
        compile: the chunk loss through `torch.compile` (blocks are compiled by the caller, in
            place, e.g. `fully_shard_blocks(..., compile=True)` or `compile_blocks`).
        compile_backend: the backend the chunk loss compiles with.
        chunk_tokens: tokens per loss chunk (see `chunked_cross_entropy`).
    """

    def __init__(
        self,
        model: lmcore.TransformerLM,
        *,
        compile: bool = True,
        compile_backend: str = DEFAULT_COMPILE_BACKEND,
        chunk_tokens: int | None = None,
    ) -> None:
        super().__init__()
        self.lm = model
        self.compile_loss = compile
        self.compile_backend = compile_backend
        self.chunk_tokens = chunk_tokens

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """The mean next-token loss of `inputs` `(batch, seq)` against `targets` `(batch, seq)`;
        the logits `(batch, seq, vocab)` without targets (lmcore's own convention)."""
        lm = self.lm
        if targets is None:
            return lm(inputs)
        hidden = lm.ln_final(lm.layers(lm.token_embeddings(inputs)))  # (batch, seq, d_model)
        return chunked_cross_entropy(
            hidden,
            lm.lm_head.weight,
            targets,
            chunk_tokens=self.chunk_tokens,
            compile=self.compile_loss,
            compile_backend=self.compile_backend,
        )


def torch_native_model(
    model: lmcore.TransformerLM,
    *,
    compile: bool,
    compile_backend: str = DEFAULT_COMPILE_BACKEND,
) -> TorchNativeLM:
    """`model` as a torch user runs it on one rank, the strongest plain-torch step: each block
    compiled in place (`compile_blocks`) and `TorchNativeLM`'s chunked, compiled cross-entropy.
    bench-step's torch-native rows and bench-train's `--baseline torch` both run it (on several
    ranks, `fully_shard_blocks` compiles the blocks instead)."""
    if compile:
        compile_blocks(model.layers, backend=compile_backend)
    return TorchNativeLM(model, compile=compile, compile_backend=compile_backend)

"""The one place in bench that wraps a model for data parallelism and builds its optimizer: a
layout of `bench.core.layouts` applied on one rank, in torchtitan's order (the model's storage
dtype, then compile, then the wrapper). bench-train, bench-step, bench-ddp and bench-zero all
build their step through `Parallel`, so a layout name runs the same code in each.

=================== ===========================================================================
wrapper             built as
=================== ===========================================================================
`NaiveDDP`,         `ddp.NaiveDDP(model)`, `ddp.FlatDDP(model)`,
`FlatDDP`, ...      `ddp.DDPIndividualParameters(model)`, each block compiled first
`DDPBucketed`       `ddp.DDPBucketed(model, bucket_size_mb)`, each block compiled first
`DistributedData    `torch.nn.parallel.DistributedDataParallel(model, device_ids=[the GPU],
Parallel`           bucket_cap_mb=torch_bucket_mb)`, compiled after wrapping (torch's way)
`FSDP`              `zero.apply_fsdp(model, units=(TransformerBlock, Embedding, LMHead),
                    mixed_precision=, compile=, prefetch=)` (the layout's `units`): each
                    unit's forward compiled, FSDP's hooks outside
`fully_shard`       FSDP2 per block, then the root (`bench.core.torch_native.fully_shard_blocks`)
=================== ===========================================================================

Ours compile per block, as FSDP2's (`bench.core.torch_native.compile_blocks`; per unit under
`zero.FSDP`): identical blocks compile once, and lmcore's checkpoints stay outside the compiled
code, so fa2's saved tensors are recomputed (`docs/design/zero.md`, "The leaderboard step").

The optimizer: `optimizer_cls(params, **options)`, inside `zero.ShardedOptimizer` (its broadcasts
capped at `broadcast_mb`) or torch's `ZeroRedundancyOptimizer` where the layout shards it.

Example::

    parallel = Parallel("zero1", device=device, precision="bf16-autocast", compile=True)
    wrapped = parallel.wrap(model)
    optimizer = parallel.build_optimizer(wrapped.parameters(), torch.optim.AdamW, {"lr": 1e-3})
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

import ddp
import lmcore
import zero
from bench.core.layouts import (
    DTYPES,
    LAYOUTS,
    PRECISIONS,
    Layout,
    autocast_dtype,
    check_combination,
)
from bench.core.model_options import DEFAULT_COMPILE_BACKEND
from bench.core.torch_native import compile_blocks, fully_shard_blocks
from zero.apply import COMPILE_OPTIONS

__all__ = ["Parallel"]

_OURS_DDP: Mapping[str, Callable[..., ddp.DataParallelBase]] = {
    "NaiveDDP": ddp.NaiveDDP,
    "FlatDDP": ddp.FlatDDP,
    "DDPIndividualParameters": ddp.DDPIndividualParameters,
}


class Parallel:
    """A layout on one rank: how the model is wrapped and its optimizer built.

    Args:
        layout: a name of `bench.core.layouts.LAYOUTS` that runs (not `tp`, `fsdp-tp`).
        device: this rank's device.
        precision: a runnable name of `bench.core.layouts.PRECISIONS`: `bf16` stores the model
            in bf16 before wrapping it; under the sharded wrappers, `bf16-autocast` gathers
            weights and reduces gradients in bf16 over float32 shards (FSDP's mixed precision;
            the step's autocast is the caller's).
        compile: `torch.compile` each `lmcore.TransformerBlock` (before our DDP wrappers; each
            unit's forward under `zero.FSDP`; each block under FSDP2; the whole wrapper under
            torch's DDP).
        compile_backend: `torch.compile`'s backend (`inductor`; `aot_eager` traces the same
            graphs without generating kernels).
        bucket_size_mb: `ddp.DDPBucketed`'s bucket size (MiB; None: one bucket).
        broadcast_mb: `zero.ShardedOptimizer`'s cap on one broadcast (MiB; None: one per
            owner).
        torch_bucket_mb: torch DDP's `bucket_cap_mb` (None: its own default).
        record_comm_stats: our DDP wrappers time their communication (`comm_stats`).

    Raises:
        ValueError: an unknown or predicted-only layout, or a layout and precision that do not
            go together (`bench.core.layouts.check_combination`).
    """

    def __init__(
        self,
        layout: str,
        *,
        device: torch.device,
        precision: str = "fp32",
        compile: bool = False,
        compile_backend: str = DEFAULT_COMPILE_BACKEND,
        bucket_size_mb: float | None = ddp.DEFAULT_BUCKET_SIZE_MB,
        broadcast_mb: float | None = ddp.DEFAULT_BUCKET_SIZE_MB,
        torch_bucket_mb: float | None = None,
        record_comm_stats: bool = False,
    ) -> None:
        spec = LAYOUTS.get(layout)
        if spec is None or not spec.runs:
            runnable = ", ".join(name for name, s in LAYOUTS.items() if s.runs)
            raise ValueError(f"layout {layout!r} does not run; choose one of {runnable}")
        check_combination(layout, precision)
        self.layout: Layout = spec
        self.device, self.precision, self.compile = device, PRECISIONS[precision], compile
        self.compile_backend = compile_backend
        self.bucket_size_mb, self.broadcast_mb = bucket_size_mb, broadcast_mb
        self.torch_bucket_mb, self.record_comm_stats = torch_bucket_mb, record_comm_stats

    @property
    def compute_dtype(self) -> torch.dtype | None:
        """The dtype the sharded wrappers gather weights and reduce gradients in (None: the
        parameters' own)."""
        return autocast_dtype(self.precision.name)

    @property
    def mixed_precision(self) -> zero.MixedPrecision:
        """`zero.FSDP`'s policy: the model's own dtype throughout (`fp32`; `bf16`: bf16 shards,
        gathered and reduced in bf16, as FSDP2 keeps a bf16 module), or float32 shards gathered
        and reduced in bf16 (`bf16-autocast`, FSDP2's `param_dtype=torch.bfloat16`)."""
        return zero.MixedPrecision(compute_dtype=self.compute_dtype)

    def wrap(self, model: nn.Module) -> nn.Module:
        """The model as the step runs it: stored in the precision's dtype, compiled, wrapped
        (FSDP2 shards `model` in place and returns it)."""
        model = model.to(DTYPES[self.precision.weights])
        wrapper, backend = self.layout.wrapper, self.compile_backend
        if wrapper == "DistributedDataParallel":
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            wrapped = DistributedDataParallel(
                model, device_ids=ids, bucket_cap_mb=self.torch_bucket_mb
            )
            return torch.compile(wrapped, backend=backend) if self.compile else wrapped
        if wrapper == "fully_shard":
            return fully_shard_blocks(
                model,
                model.layers,
                param_dtype=self.compute_dtype,
                compile=self.compile,
                compile_backend=backend,
            )
        if wrapper == "FSDP":
            return zero.apply_fsdp(
                model,
                units=tuple(getattr(lmcore, name) for name in self.layout.units),
                mixed_precision=self.mixed_precision,
                compile=self.compile,
                compile_options={**COMPILE_OPTIONS, "backend": backend} if self.compile else None,
                prefetch=self.layout.prefetch,
            )
        if self.compile:
            blocks = [m for m in model.modules() if isinstance(m, lmcore.TransformerBlock)]
            compile_blocks(blocks, backend=backend)
        inner = model
        stats = {"record_comm_stats": self.record_comm_stats}
        if wrapper == "DDPBucketed":
            return ddp.DDPBucketed(inner, self.bucket_size_mb, **stats)
        if wrapper is None:
            return inner
        return _OURS_DDP[wrapper](inner, **stats)

    def build_optimizer(
        self,
        params: Iterable[Any],
        optimizer_cls: type[torch.optim.Optimizer],
        options: Mapping[str, Any],
    ) -> torch.optim.Optimizer:
        """`optimizer_cls(params, **options)` (tensors or groups), sharded over the ranks where
        the layout shards the optimizer state apart from the weights."""
        if self.layout.optimizer == "ShardedOptimizer":
            return zero.ShardedOptimizer(
                params, optimizer_cls, bucket_size_mb=self.broadcast_mb, **options
            )
        if self.layout.optimizer == "ZeroRedundancyOptimizer":
            # imported on use: importing torch.distributed.optim scripts functional optimizers
            # (TorchScript deprecation warnings) in every process that merely imports this
            from torch.distributed.optim import ZeroRedundancyOptimizer

            return ZeroRedundancyOptimizer(params, optimizer_class=optimizer_cls, **options)
        return optimizer_cls(params, **options)

    def local_state(self, optimizer: torch.optim.Optimizer) -> Mapping[Any, Any]:
        """The optimizer state this rank keeps (its shard's, where the layout shards it)."""
        if self.layout.optimizer == "ShardedOptimizer":
            return optimizer.local_optimizer.state
        if self.layout.optimizer == "ZeroRedundancyOptimizer":
            return optimizer.optim.state
        return optimizer.state

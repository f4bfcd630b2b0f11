"""The one place that reads `--parallel`: how the model is wrapped and compiled, how its optimizer
is built, which rank writes which checkpoint, and how the full weights are gathered.

Modes (`MODES`): `none`; `naive`, `flat`, `individual`, `bucketed` (the `ddp` wrappers);
`torch-ddp` (torch's DistributedDataParallel); `zero` (`ddp.DDPBucketed` +
`zero.ShardedOptimizer`, optimizer state sharded); `fsdp` (`zero.FSDP`, one unit per Transformer
block: weights, gradients and optimizer state sharded); `torch-fsdp` (torch's FSDP2:
`fully_shard` on every block, then on the root, with the same mixed precision as `fsdp`:
weights gathered and gradients reduced in the `--precision` dtype, fp32 masters).

Checkpoints: rank 0 writes the run's checkpoint, with the model's full weights and the optimizer's
consolidated state (indexed by parameter, as `torch.optim` saves it) in every mode but `fsdp`,
so a run may resume under any of those modes and rank counts. With `fsdp` each rank also keeps
its shard of the optimizer state in a file of its own, and a resume needs the same ranks.
Collectives: `checkpoint_state` and `gathered_model` are collectives in the sharded modes (and
`checkpoint_state` under `zero`): every rank calls them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import ddp
import lmcore
import zero
from bench.core.launch import torchrun_world_size, under_torchrun
from bench.core.torch_native import fully_shard_blocks
from bench.train.choices import PARALLEL_MODES as MODES

__all__ = ["MODES", "Parallel", "can_compile", "check", "checkpoint_layout", "default_mode"]

_DDP_WRAPPERS: Mapping[str, Callable[[nn.Module], nn.Module]] = {
    "naive": ddp.NaiveDDP,
    "flat": ddp.FlatDDP,
    "individual": ddp.DDPIndividualParameters,
}
_BASELINE_MODES = ("none", "torch-ddp")  # where torch's own step runs: no wrapper of ours


def default_mode(nproc: int) -> str:
    """`--parallel`'s default: `none` for one rank, `bucketed` for several."""
    return "none" if nproc == 1 else "bucketed"


def can_compile(mode: str) -> bool:
    """Whether `--compile` runs under `mode` (not yet under `zero.FSDP`)."""
    return mode != "fsdp"


def check(
    mode: str, *, nproc: int, compile: bool, baseline: str | None, device: torch.device
) -> None:
    """Refuse a mode or a number of ranks that does not go with the other options.

    Raises:
        ValueError: several ranks without a mode, more ranks than GPUs or than torchrun
            started, `--compile` under `fsdp`, or `--baseline` under a wrapper of ours.
    """
    if nproc > 1 and mode == "none":
        raise ValueError(
            f"--nproc {nproc} needs a --parallel mode (each rank would train alone); choose "
            f"one of {', '.join(MODES[1:])}"
        )
    if compile and not can_compile(mode):
        raise ValueError(f"--compile does not run with --parallel {mode} yet; add --no-compile")
    if baseline is not None and mode not in _BASELINE_MODES:
        raise ValueError(f"--baseline runs with --parallel {' or '.join(_BASELINE_MODES)}")
    if under_torchrun() and nproc != torchrun_world_size():
        raise ValueError(
            f"--nproc {nproc} but torchrun started {torchrun_world_size()} processes; "
            "drop --nproc under torchrun"
        )
    if device.type == "cuda" and not under_torchrun() and nproc > torch.cuda.device_count():
        raise ValueError(
            f"--nproc {nproc} needs {nproc} GPUs, found {torch.cuda.device_count()}; lower "
            "--nproc, or use --device cpu for gloo ranks"
        )
    if nproc > 1 and device.type == "cuda" and device.index not in (None, 0):
        raise ValueError("with --nproc, give --device cuda (rank r uses GPU r)")


def checkpoint_layout(mode: str, nproc: int) -> str:
    """What a checkpoint of `mode` on `nproc` ranks holds, in words; a run resumes only from a
    checkpoint of the same layout."""
    if mode == "fsdp":
        return f"--parallel fsdp on {nproc} ranks (a file per rank)"
    return "full weights and consolidated optimizer state"


class Parallel:
    """`--parallel` on one rank: wraps the model, builds the optimizer, saves and loads state.

    Args:
        mode: a key of `MODES`.
        rank: this rank.
        compile: `torch.compile` the model (before wrapping it; per block under `torch-fsdp`).
        bucket_size_mb: `DDPBucketed`'s buckets and `ShardedOptimizer`'s broadcasts (MiB;
            None: one bucket).
        compute_dtype: the dtype the sharded modes gather weights and reduce gradients in.
        device: this rank's device.
    """

    def __init__(
        self,
        mode: str,
        *,
        rank: int,
        compile: bool,
        bucket_size_mb: float | None,
        compute_dtype: torch.dtype | None,
        device: torch.device,
    ) -> None:
        self.mode, self.rank, self.compile = mode, rank, compile
        self.bucket_size_mb, self.compute_dtype, self.device = bucket_size_mb, compute_dtype, device

    def wrap(self, model: lmcore.TransformerLM) -> nn.Module:
        """The model as the step runs it: compiled, then wrapped (FSDP2 shards it in place)."""
        if self.mode == "torch-ddp":
            ids = [self.device.index] if self.device.type == "cuda" else None
            wrapped = DistributedDataParallel(model, device_ids=ids)
            return torch.compile(wrapped) if self.compile else wrapped
        if self.mode == "torch-fsdp":
            return fully_shard_blocks(
                model, model.layers, param_dtype=self.compute_dtype, compile=self.compile
            )
        inner = torch.compile(model) if self.compile else model
        if self.mode == "none":
            return inner
        if self.mode == "fsdp":
            return zero.FSDP(
                inner, compute_dtype=self.compute_dtype, units=(lmcore.TransformerBlock,)
            )
        if self.mode in ("bucketed", "zero"):
            return ddp.DDPBucketed(inner, self.bucket_size_mb)
        return _DDP_WRAPPERS[self.mode](inner)

    def build_optimizer(
        self,
        groups: list[dict[str, Any]],
        optimizer_cls: type[torch.optim.Optimizer],
        options: Mapping[str, Any],
    ) -> torch.optim.Optimizer:
        """`optimizer_cls(groups, **options)`, sharded over the ranks under `zero`."""
        if self.mode == "zero":
            return zero.ShardedOptimizer(
                groups, optimizer_cls, bucket_size_mb=self.bucket_size_mb, **options
            )
        return optimizer_cls(groups, **options)

    def sharded_params(self, model: nn.Module, decayed: set[str]) -> list[nn.Parameter]:
        """The parameters whose gradients are shards held by this rank alone, for clipping's
        norm (`zero.FSDP`'s matrices; FSDP2's DTensors take their norm themselves)."""
        if self.mode != "fsdp":
            return []
        return [p for name, p in model.named_parameters() if name in decayed]

    def checkpoint_state(
        self, model: nn.Module, raw: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """(model state, optimizer state) this rank writes; None where it writes nothing.

        A collective under `zero`, `fsdp` and `torch-fsdp`: every rank calls it.
        """
        if self.mode == "torch-fsdp":
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_model_state_dict,
                get_optimizer_state_dict,
            )

            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            weights = get_model_state_dict(raw, options=options)
            by_name = get_optimizer_state_dict(raw, optimizer, options=options)
            return (weights, _indexed(by_name)) if self.rank == 0 else None
        if self.mode == "fsdp":  # full weights (a collective) and this rank's optimizer shard
            return model.state_dict(), optimizer.state_dict()
        if self.mode == "zero":  # consolidated (a collective); rank 0 writes it
            state = optimizer.state_dict()
            return (raw.state_dict(), state) if self.rank == 0 else None
        return (raw.state_dict(), optimizer.state_dict()) if self.rank == 0 else None

    @property
    def shards_checkpoint(self) -> bool:
        """Whether every rank keeps a checkpoint file of its own (its optimizer shard)."""
        return self.mode == "fsdp"

    def load_state(
        self,
        checkpoint: Mapping[str, Any],
        model: nn.Module,
        raw: nn.Module,
        optimizer: torch.optim.Optimizer,
    ) -> int:
        """Restore weights and optimizer state from this rank's checkpoint; its step."""
        if self.mode == "torch-fsdp":
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
                set_optimizer_state_dict,
            )

            options = StateDictOptions(full_state_dict=True)
            set_model_state_dict(raw, checkpoint["model"], options=options)
            names = {id(p): name for name, p in raw.named_parameters()}
            groups = [[names[id(p)] for p in g["params"]] for g in optimizer.param_groups]
            by_name = _named(checkpoint["optimizer"], groups)
            set_optimizer_state_dict(raw, optimizer, by_name, options=options)
            return checkpoint["iteration"]
        return lmcore.load_checkpoint(checkpoint, model if self.mode == "fsdp" else raw, optimizer)

    def gathered_model(
        self, model: nn.Module, raw: nn.Module, build: Callable[[], nn.Module]
    ) -> nn.Module | None:
        """A model with the full weights on rank 0 (None elsewhere), e.g. to sample from.

        In the sharded modes the weights are gathered (a collective: every rank calls) into a
        fresh model from `build`; otherwise rank 0's `raw` holds them already.
        """
        if self.mode == "fsdp":
            weights = model.state_dict()
        elif self.mode == "torch-fsdp":
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_model_state_dict,
            )

            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            weights = get_model_state_dict(raw, options=options)
        else:
            return raw if self.rank == 0 else None
        if self.rank != 0:
            return None
        full = build()
        full.load_state_dict(weights)
        return full


def _indexed(by_name: Mapping[str, Any]) -> dict[str, Any]:
    """An optimizer state dict keyed by parameter name (torch.distributed.checkpoint's) keyed by
    index instead, as `Optimizer.state_dict()` numbers parameters across its groups."""
    index: dict[str, int] = {}
    groups = []
    for group in by_name["param_groups"]:
        ids = [index.setdefault(name, len(index)) for name in group["params"]]
        groups.append({**group, "params": ids})
    state = {index[name]: value for name, value in by_name["state"].items()}
    return {"state": state, "param_groups": groups}


def _named(indexed: Mapping[str, Any], names: Sequence[Sequence[str]]) -> dict[str, Any]:
    """`_indexed`'s inverse for an optimizer whose groups hold the parameters `names`."""
    groups, by_index = [], {}
    for group, group_names in zip(indexed["param_groups"], names, strict=True):
        by_index.update(zip(group["params"], group_names, strict=True))
        groups.append({**group, "params": list(group_names)})
    state = {by_index[i]: value for i, value in indexed["state"].items()}
    return {"state": state, "param_groups": groups}

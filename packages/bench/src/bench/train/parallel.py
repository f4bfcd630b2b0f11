"""The trainer's side of `--parallel`: which modes go with the other options, which rank writes
which checkpoint, and how the full weights are gathered. The model is wrapped and its optimizer
built by `bench.core.parallel.Parallel`, the harness's one owner of the layouts, which
`TrainerParallel` extends; `--parallel` is read nowhere else in the trainer.

Modes (`MODES`, names of `bench.core.layouts`): `single`; `ddp` (`ddp.DDPBucketed`),
`ddp:naive`, `ddp:flat`, `ddp:individual` (the other `ddp` wrappers), `ddp:torch` (torch's
DistributedDataParallel); `zero1` (`ddp.DDPBucketed` + `zero.ShardedOptimizer`, optimizer state
sharded); `fsdp` (`zero.apply_fsdp`, a unit per Transformer block, the embedding and the LM head:
weights, gradients and optimizer state sharded); `fsdp:torch` (torch's FSDP2: `fully_shard` on
every block, then on the root). Under the sharded modes `--precision bf16-autocast` gathers
weights and reduces gradients in bf16 over float32 masters; `bf16` stores the model in bf16
(zero.FSDP keeps bf16 shards). `--compile` compiles each block in every mode of ours (each
unit's forward under `fsdp`, FSDP's hooks outside), as FSDP2 compiles its blocks.

Checkpoints: rank 0 writes the run's checkpoint, with the model's full weights and the optimizer's
consolidated state (indexed by parameter, as `torch.optim` saves it) in every mode but `fsdp`,
so a run may resume under any of those modes and rank counts. With `fsdp` each rank also keeps
its shard of the optimizer state in a file of its own, and a resume needs the same ranks.
Collectives: `checkpoint_state` and `gathered_model` are collectives in the sharded modes (and
`checkpoint_state` under `zero1`): every rank calls them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

import lmcore
from bench.core.launch import torchrun_world_size, under_torchrun
from bench.core.layouts import LAYOUTS, check_combination
from bench.core.parallel import Parallel
from bench.train.choices import PARALLEL_MODES as MODES

__all__ = [
    "MODES",
    "TrainerParallel",
    "check",
    "checkpoint_layout",
    "default_mode",
]

# Where torch's own step (`--baseline`) runs: no wrapper of ours.
_BASELINE_MODES = ("single", "ddp:torch")


def default_mode(nproc: int) -> str:
    """`--parallel`'s default: `single` for one rank, `ddp` (DDPBucketed) for several."""
    return "single" if nproc == 1 else "ddp"


def check(
    mode: str,
    *,
    nproc: int,
    precision: str,
    baseline: str | None,
    device: torch.device,
) -> None:
    """Refuse a mode or a number of ranks that does not go with the other options.

    Raises:
        ValueError: several ranks without a mode, more ranks than GPUs or than torchrun
            started, a precision only bench-plan predicts, or `--baseline` under a wrapper of
            ours.
    """
    if nproc > 1 and mode == "single":
        raise ValueError(
            f"--nproc {nproc} needs a --parallel mode (each rank would train alone); choose "
            f"one of {', '.join(MODES[1:])}"
        )
    check_combination(mode, precision)
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
    if LAYOUTS[mode].wrapper == "FSDP":
        return f"--parallel {mode} on {nproc} ranks (a file per rank)"
    return "full weights and consolidated optimizer state"


class TrainerParallel(Parallel):
    """`--parallel` on one rank of a training run: `Parallel`'s wrapping and optimizer, and
    what the trainer saves and loads.

    Args:
        mode: a key of `MODES`.
        rank: this rank.
        options: `Parallel`'s (device, precision, compile and its backend, bucket sizes).
    """

    def __init__(self, mode: str, *, rank: int, **options: Any) -> None:
        super().__init__(mode, **options)
        self.rank = rank

    @property
    def _wrapper(self) -> str | None:
        return self.layout.wrapper

    def sharded_params(self, model: nn.Module, decayed: set[str]) -> list[nn.Parameter]:
        """The parameters whose gradients are shards held by this rank alone, for clipping's
        norm (`zero.FSDP`'s matrices; FSDP2's DTensors take their norm themselves)."""
        if self._wrapper != "FSDP":
            return []
        return [p for name, p in model.named_parameters() if name in decayed]

    def checkpoint_state(
        self, model: nn.Module, raw: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """(model state, optimizer state) this rank writes; None where it writes nothing.

        A collective under `zero1`, `fsdp` and `fsdp:torch`: every rank calls it.
        """
        if self._wrapper == "fully_shard":
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_model_state_dict,
                get_optimizer_state_dict,
            )

            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            weights = get_model_state_dict(raw, options=options)
            by_name = get_optimizer_state_dict(raw, optimizer, options=options)
            return (weights, _indexed(by_name)) if self.rank == 0 else None
        if self._wrapper == "FSDP":  # full weights (a collective) and this rank's optimizer shard
            return model.state_dict(), optimizer.state_dict()
        if self.layout.shards_optimizer:  # consolidated (a collective); rank 0 writes it
            state = optimizer.state_dict()
            return (raw.state_dict(), state) if self.rank == 0 else None
        return (raw.state_dict(), optimizer.state_dict()) if self.rank == 0 else None

    @property
    def shards_checkpoint(self) -> bool:
        """Whether every rank keeps a checkpoint file of its own (its optimizer shard)."""
        return self._wrapper == "FSDP"

    def load_state(
        self,
        checkpoint: Mapping[str, Any],
        model: nn.Module,
        raw: nn.Module,
        optimizer: torch.optim.Optimizer,
    ) -> int:
        """Restore weights and optimizer state from this rank's checkpoint; its step."""
        if self._wrapper == "fully_shard":
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
        owner = model if self._wrapper == "FSDP" else raw
        return lmcore.load_checkpoint(checkpoint, owner, optimizer)

    def gathered_model(
        self, model: nn.Module, raw: nn.Module, build: Callable[[], nn.Module]
    ) -> nn.Module | None:
        """A model with the full weights on rank 0 (None elsewhere), e.g. to sample from.

        In the sharded modes the weights are gathered (a collective: every rank calls) into a
        fresh model from `build`; otherwise rank 0's `raw` holds them already.
        """
        if self._wrapper == "FSDP":
            weights = model.state_dict()
        elif self._wrapper == "fully_shard":
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

"""A bench-train run's checkpoints: whether `--out` holds one this run may continue, and saving
and restoring everything a resumed run needs to continue exactly.

A checkpoint is lmcore's (`lmcore.save_checkpoint`: `model`, `optimizer`, `iteration`) with
`extra`: the run's configuration (`config`), the model's (`model_config`, so the weights can be
rebuilt without the run: `bench-generate`), the data generator's state (`data_rng`) and torch's
random number generator states (`rng`). Rank 0 writes `checkpoint.pt`; in the modes whose ranks
keep files of their own (`Parallel.shards_checkpoint`) rank r > 0 writes `checkpoint-rank<r>.pt`
(`rank_file`). What goes in each file, and which ranks write, is `bench.train.parallel`'s call.

A save first takes the state (collectives where the mode needs them), then writes each file to a
temporary name, then commits it by renaming it into place: a crash while writing keeps the
previous checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

import lmcore
from bench.train.config import TrainConfig
from bench.train.options import may_change
from bench.train.parallel import Parallel, checkpoint_layout

if TYPE_CHECKING:
    from torch import nn

__all__ = ["CHECKPOINT", "Checkpointer", "rank_file", "read_checkpoint", "resume_point"]

CHECKPOINT = "checkpoint.pt"


def rank_file(rank: int) -> str:
    """The name of rank `rank`'s checkpoint file in the run's folder."""
    return CHECKPOINT if rank == 0 else f"checkpoint-rank{rank}.pt"


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """A checkpoint file, read onto the CPU (tensors and plain data only)."""
    return torch.load(path, map_location="cpu", weights_only=True)


def resume_point(config: TrainConfig) -> dict[str, Any] | None:
    """The checkpoint to resume from (rank 0's, on the CPU), after checking it fits `config`.

    Raises:
        ValueError: `--resume` without a checkpoint, a checkpoint without `--resume`, a
            checkpoint of another training configuration or of another layout, or one already
            at the last step.
    """
    path = Path(config.out) / CHECKPOINT
    if not config.resume:
        if path.exists():
            raise ValueError(
                f"--out {config.out} already holds a run ({CHECKPOINT}); pass --resume to "
                "continue it, or choose another --out"
            )
        return None
    if not path.is_file():
        raise ValueError(f"--resume: no {CHECKPOINT} in --out {config.out} to resume from")
    checkpoint = read_checkpoint(path)
    saved, mine = checkpoint["extra"]["config"], dataclasses.asdict(config)
    resumable = may_change(TrainConfig)
    differ = sorted(k for k in mine if k not in resumable and saved.get(k) != mine[k])
    if differ:
        changes = ", ".join(
            f"--{k.replace('_', '-')} {saved.get(k)!r} → {mine[k]!r}" for k in differ
        )
        raise ValueError(
            f"--resume: this run's configuration differs from the checkpoint's ({changes}); "
            "use the options of the run being resumed"
        )
    theirs = checkpoint_layout(saved["parallel"], saved["nproc"])
    if theirs != checkpoint_layout(config.parallel, config.nproc):
        raise ValueError(
            f"--resume: the checkpoint holds {theirs}; resume with --parallel "
            f"{saved['parallel']} --nproc {saved['nproc']}"
        )
    if checkpoint["iteration"] >= config.last_step:
        raise ValueError(
            f"--resume: the checkpoint is at step {checkpoint['iteration']}, already past the "
            f"last step {config.last_step}; raise --stop-after or drop it"
        )
    return checkpoint


class _Taken:
    """A state dict already taken, standing in for its module or optimizer where
    `lmcore.save_checkpoint` asks for `state_dict()`."""

    def __init__(self, state: dict[str, Any]) -> None:
        self._state = state

    def state_dict(self) -> dict[str, Any]:
        return self._state


class Checkpointer:
    """Saves and restores one rank's part of the run's checkpoint.

    Args:
        config: the run.
        parallel: the run's parallel mode on this rank.
        rank: this rank.
        model_config: the model's configuration, stored so the weights can be rebuilt.
        device: this rank's device (its RNG state is saved too).
    """

    def __init__(
        self,
        config: TrainConfig,
        parallel: Parallel,
        *,
        rank: int,
        model_config: lmcore.ModelConfig,
        device: torch.device,
    ) -> None:
        self.config, self.parallel, self.rank = config, parallel, rank
        self.model_config, self.device = model_config, device
        self.out = Path(config.out)

    def load(
        self,
        model: nn.Module,
        raw: nn.Module,
        optimizer: torch.optim.Optimizer,
        data_rng: np.random.Generator,
    ) -> int:
        """Restore the checkpoint `--resume` continues (`resume_point`); the step it is at."""
        checkpoint = resume_point(self.config)
        if checkpoint is None:
            return 0
        if self.parallel.shards_checkpoint and self.rank != 0:
            checkpoint = read_checkpoint(self.out / rank_file(self.rank))
        start = self.parallel.load_state(checkpoint, model, raw, optimizer)
        data_rng.bit_generator.state = checkpoint["extra"]["data_rng"]
        torch.set_rng_state(checkpoint["extra"]["rng"]["torch"])
        if self.device.type == "cuda" and "cuda" in checkpoint["extra"]["rng"]:
            torch.cuda.set_rng_state(checkpoint["extra"]["rng"]["cuda"], self.device)
        return start

    def save(
        self,
        step: int,
        model: nn.Module,
        raw: nn.Module,
        optimizer: torch.optim.Optimizer,
        data_rng: np.random.Generator,
    ) -> None:
        """Write this rank's checkpoint file of `step`, if it writes one; every rank calls it."""
        state = self.parallel.checkpoint_state(model, raw, optimizer)
        if state is None:
            return
        rng = {"torch": torch.get_rng_state()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        extra = {
            "config": dataclasses.asdict(self.config),
            "model_config": dataclasses.asdict(self.model_config),
            "data_rng": data_rng.bit_generator.state,
            "rng": rng,
        }
        path = self.out / rank_file(self.rank)
        tmp = path.with_suffix(".tmp")
        weights, optimizer_state = map(_Taken, state)
        lmcore.save_checkpoint(weights, optimizer_state, step, tmp, extra=extra)
        os.replace(tmp, path)  # the commit point

"""A bench-train run's checkpoints: whether `--out` holds one this run may continue, and saving
and restoring everything a resumed run needs to continue exactly.

A checkpoint is lmcore's (`lmcore.save_checkpoint`: `model`, `optimizer`, `iteration`) with
`extra`, the trainer's record: the run's configuration (`config`), the model's (`model_config`,
so the weights can be rebuilt without the run: `bench-generate`), the data generator's state
(`data_rng`), torch's random number generator states (`rng`), the tokenizer's fingerprint
(`tokenizer`), the recorder's totals (`record`, `bench.train.record`), fp16's loss scaler
(`loss_scaler`: its scale, growth tracker and skipped steps; `bench.core.loss_scale`) and the
checkpoint's files (`files`, rank → file name). Rank 0 writes `checkpoint.pt`; in the modes
whose ranks keep files of their own (`Parallel.shards_checkpoint`) rank r > 0 writes
`checkpoint-rank<r>-step<N>.pt` (`rank_file`); what goes in each, `bench.train.parallel`'s call.

One commit point, whatever the number of files: every rank takes its state (collectives where
the mode needs them) and writes its file (rank r > 0 under its step's name, so it replaces
nothing a committed checkpoint names); after a barrier, rank 0 writes `checkpoint.pt`, which
names the other files, to a temporary name and renames it into place. A run killed at any
moment keeps the previous checkpoint whole; rank 0 then removes the files no checkpoint names.
A resume reads only the files `checkpoint.pt` names, and checks that they hold its step. A file
that cannot be written (a full disk) is removed and ends the run with `CheckpointWriteError`,
which says what the checkpoint needs, what is free, and that the previous one is intact.

`--keep-last N` keeps the newest N checkpoints: once `checkpoint.pt` is committed, rank 0 links
it as `checkpoint-step<S>.pt` (`step_file`) and only then removes the step files past the
newest N, with their rank files. Each kept one is whole: to go back to it, copy it over
`checkpoint.pt` (its rank files are kept under their own names).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

import lmcore
from bench.core.loss_scale import LossScaler
from bench.core.options import may_change
from bench.train.checkpoint_files import (
    CHECKPOINT,
    CheckpointWriteError,
    kept_steps,
    prune,
    rank_file,
    remove_checkpoints,
    step_file,
    write_error,
)
from bench.train.config import RESUME_AUTO, TrainConfig
from bench.train.config_files import NAMES_VERSION, recorded_config
from bench.train.faults import kill_point
from bench.train.parallel import TrainerParallel, checkpoint_layout
from bench.train.tokenizer import load_tokenizer

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "CHECKPOINT",
    "CheckpointWriteError",
    "Checkpointer",
    "rank_file",
    "read_checkpoint",
    "remove_checkpoints",
    "resolve_resume",
    "resume_point",
    "step_file",
]

# What every consumer of a checkpoint reads from its `extra`: without these it is not the
# trainer's (bench-generate needs the first two, a resume all four).
_RECORD = ("config", "model_config", "data_rng", "rng")
_START_AGAIN = "start the run again in a new --out (or restore the file from a copy)"


def read_checkpoint(path: str | Path, *, mmap: bool = False) -> dict[str, Any]:
    """A bench-train checkpoint file, read onto the CPU (tensors and plain data only).

    The file's zip records are checked against their CRC-32 first, so a file damaged anywhere
    (truncated, garbled, empty) is refused rather than loaded as other weights. With `mmap`
    the tensors are mapped, not read (to look at the record alone).

    Raises:
        ValueError: the file is missing, damaged, holds anything but tensors and plain data,
            or is not a bench-train checkpoint (no trainer's record); the message names it.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such checkpoint file; {_START_AGAIN}")
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
        if bad is not None:
            raise ValueError(f"its record {bad!r} fails its checksum")
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError:
        raise ValueError(
            f"{path} holds objects other than tensors and plain data: not a bench-train "
            "checkpoint, and not safe to load; give the --out of a bench-train run"
        ) from None
    except (ValueError, zipfile.BadZipFile, OSError, RuntimeError, EOFError) as error:
        raise ValueError(f"{path} is damaged ({error}); {_START_AGAIN}") from None
    extra = checkpoint.get("extra") if isinstance(checkpoint, dict) else None
    lacking = [key for key in _RECORD if not isinstance(extra, dict) or key not in extra]
    if lacking or not {"model", "optimizer", "iteration"} <= checkpoint.keys():
        raise ValueError(
            f"{path} is not a bench-train checkpoint (it lacks the trainer's record: "
            f"{', '.join(lacking) or 'model, optimizer, iteration'}); give the --out of a "
            "bench-train run"
        )
    return checkpoint


def _files(checkpoint: Mapping[str, Any]) -> dict[int, str]:
    """The files of a checkpoint, by rank."""
    return checkpoint["extra"].get("files", {0: CHECKPOINT})


def _check_files(checkpoint: Mapping[str, Any], out: Path) -> None:
    """Every file `checkpoint.pt` names is there, readable, and of its step."""
    step = checkpoint["iteration"]
    for rank, name in sorted(_files(checkpoint).items()):
        if rank == 0:
            continue
        if not (out / name).is_file():
            raise ValueError(
                f"--resume: {CHECKPOINT} (step {step}) names {name} for rank {rank}, which is "
                f"missing from --out {out}; restore it, or {_START_AGAIN}"
            )
        theirs = read_checkpoint(out / name, mmap=True)["iteration"]
        if theirs != step:
            raise ValueError(
                f"--resume: {out / name} holds step {theirs}, but {CHECKPOINT} is at step "
                f"{step}: the files are of different checkpoints; restore {name} of step "
                f"{step}, or {_START_AGAIN}"
            )


def _check_tokenizer(checkpoint: Mapping[str, Any], config: TrainConfig) -> None:
    """The tokenizer in `--out` is the one the checkpoint's model was trained with."""
    saved = checkpoint["extra"].get("tokenizer")
    if saved is None:
        return
    tokenizer = load_tokenizer(config.tokenizer, config.out)
    if tokenizer is None or tokenizer.fingerprint() != saved:
        state = "is missing" if tokenizer is None else "is not the one it was trained with"
        raise ValueError(
            f"--resume: the checkpoint's tokenizer {state} (tokenizer.json in --out "
            f"{config.out}); restore it, or {_START_AGAIN}"
        )


def resolve_resume(config: TrainConfig) -> TrainConfig:
    """`config` with `--resume auto` decided: continue if `--out` holds a checkpoint, else start.

    `checkpoint.pt` is renamed into place whole (the commit point), so one that exists is
    complete. Every process decides alone, before training: under torchrun each rank of a
    restart finds the files its predecessors left, which no rank changes before they all meet.
    """
    if config.resume != RESUME_AUTO:
        return config
    return dataclasses.replace(config, resume=(Path(config.out) / CHECKPOINT).is_file())


def resume_point(config: TrainConfig) -> dict[str, Any] | None:
    """The checkpoint to resume from (rank 0's, on the CPU), after checking it fits `config`.

    A checkpoint at the last step is a run killed after it (while sampling, say) or a finished
    one: resuming it trains nothing and writes the outputs.

    Raises:
        ValueError: `--resume` with `--overwrite`; `--resume`, `--save-every` or
            `--stop-after` under `--no-checkpoint`; `--resume` without a checkpoint, a
            checkpoint without `--resume` (or `--overwrite`, which replaces it), a damaged
            checkpoint or one of another training configuration, layout or tokenizer, files
            of different steps, or a checkpoint past the last step.
    """
    if config.overwrite and config.resume:
        raise ValueError("--overwrite starts a new run, --resume continues one: give one")
    config = resolve_resume(config)
    if not config.checkpoint:
        needs = ("resume", "save_every", "stop_after")
        given = [f"--{name.replace('_', '-')}" for name in needs if getattr(config, name)]
        if given:
            raise ValueError(f"{' and '.join(given)} need checkpoints: drop --no-checkpoint")
    path = Path(config.out) / CHECKPOINT
    if not config.resume:
        if path.exists() and not config.overwrite:
            raise ValueError(
                f"--out {config.out} already holds a run ({CHECKPOINT}); pass --resume to "
                "continue it, --overwrite to replace it, or choose another --out"
            )
        return None
    if not path.is_file():
        raise ValueError(f"--resume: no {CHECKPOINT} in --out {config.out} to resume from")
    checkpoint = read_checkpoint(path)
    saved, mine = recorded_config(checkpoint["extra"]), dataclasses.asdict(config)
    resumable = may_change(TrainConfig)
    # An option newer than the checkpoint has the value it had before there was a choice.
    saved = {f.name: f.default for f in dataclasses.fields(TrainConfig)} | saved
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
    if checkpoint["iteration"] > config.last_step:
        raise ValueError(
            f"--resume: the checkpoint is at step {checkpoint['iteration']}, past the last "
            f"step {config.last_step}; raise --stop-after or drop it"
        )
    _check_files(checkpoint, Path(config.out))
    _check_tokenizer(checkpoint, config)
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
        world_size: the number of ranks.
        model_config: the model's configuration, stored so the weights can be rebuilt.
        tokenizer: the tokenizer's fingerprint (None without one), checked on resume.
        device: this rank's device (its RNG state is saved too).
    """

    def __init__(
        self,
        config: TrainConfig,
        parallel: TrainerParallel,
        *,
        rank: int,
        world_size: int,
        model_config: lmcore.ModelConfig,
        tokenizer: str | None,
        device: torch.device,
    ) -> None:
        self.config, self.parallel, self.rank, self.world_size = config, parallel, rank, world_size
        self.model_config, self.tokenizer, self.device = model_config, tokenizer, device
        self.out = Path(config.out)
        self.saved_step: int | None = None  # the step of the last checkpoint this run holds

    def load(
        self,
        model: nn.Module,
        raw: nn.Module,
        optimizer: torch.optim.Optimizer,
        data_rng: np.random.Generator,
        loss_scaler: LossScaler | None = None,
    ) -> tuple[int, dict[str, Any] | None]:
        """Restore the checkpoint `--resume` continues (checked by `resume_point` on rank 0),
        and the loss scaler's state into `loss_scaler` (fp16).

        Returns:
            The step it is at (0 without one) and the recorder's totals it saved (or None).
        """
        if not self.config.resume:
            return 0, None
        if self.rank == 0:
            checkpoint = resume_point(self.config)
        elif self.parallel.shards_checkpoint:  # its own file, which checkpoint.pt names
            named = _files(read_checkpoint(self.out / CHECKPOINT, mmap=True))
            if self.rank not in named:
                raise ValueError(
                    f"--resume: {CHECKPOINT} names no file for rank {self.rank} (written by "
                    f"an older bench-train); {_START_AGAIN}"
                )
            checkpoint = read_checkpoint(self.out / named[self.rank])
        else:
            checkpoint = read_checkpoint(self.out / CHECKPOINT)
        start = self.parallel.load_state(checkpoint, model, raw, optimizer)
        self.saved_step = start
        extra = checkpoint["extra"]
        if loss_scaler is not None:
            if "loss_scaler" not in extra:
                raise ValueError(
                    f"--resume: {self.out / CHECKPOINT} holds no loss scale (an fp16 run writes "
                    f"it); {_START_AGAIN}"
                )
            loss_scaler.load_state_dict(extra["loss_scaler"])
        data_rng.bit_generator.state = extra["data_rng"]
        torch.set_rng_state(extra["rng"]["torch"])
        if self.device.type == "cuda" and "cuda" in extra["rng"]:
            torch.cuda.set_rng_state(extra["rng"]["cuda"], self.device)
        return start, extra.get("record")

    def save(
        self,
        step: int,
        model: nn.Module,
        raw: nn.Module,
        optimizer: torch.optim.Optimizer,
        data_rng: np.random.Generator,
        *,
        record: Mapping[str, Any],
        loss_scaler: LossScaler | None = None,
    ) -> None:
        """Write and commit the checkpoint of `step` (see the module docstring); every rank
        calls it. `record`: the recorder's totals, restored on resume; `loss_scaler`: fp16's,
        whose state is restored too."""
        state = self.parallel.checkpoint_state(model, raw, optimizer)
        ranks = range(self.world_size) if self.parallel.shards_checkpoint else [0]
        files = {rank: rank_file(rank, step) for rank in ranks}
        path = self.out / files.get(self.rank, CHECKPOINT)
        tmp = path.with_name(path.name + ".tmp")
        if state is not None:  # this rank writes a file
            weights, optimizer_state = map(_Taken, state)
            extra = self._record(data_rng, record=record, files=files)
            if loss_scaler is not None:
                extra["loss_scaler"] = loss_scaler.state_dict()
            try:
                lmcore.save_checkpoint(weights, optimizer_state, step, tmp, extra=extra)
            except (OSError, RuntimeError) as error:  # torch's writer raises RuntimeError
                tmp.unlink(missing_ok=True)  # what was written of it: its space back
                raise write_error(step, tmp, state, error, saved_step=self.saved_step) from None
            if self.rank != 0:
                os.replace(tmp, path)  # its step's own name: no committed checkpoint names it
        if len(files) > 1:
            dist.barrier()  # every rank's file is in place
        if self.rank == 0:
            kill_point("checkpoint", step)
            os.replace(tmp, path)  # the commit point: checkpoint.pt names this step's files
            prune(self.out, kept_steps(self.out, step, self.config.keep_last))
        self.saved_step = step

    def _record(
        self, data_rng: np.random.Generator, *, record: Mapping[str, Any], files: dict[int, str]
    ) -> dict[str, Any]:
        """The trainer's record: a checkpoint's `extra` (see the module docstring)."""
        rng = {"torch": torch.get_rng_state()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        return {
            "names": NAMES_VERSION,
            "config": dataclasses.asdict(self.config),
            "model_config": dataclasses.asdict(self.model_config),
            "data_rng": data_rng.bit_generator.state,
            "rng": rng,
            "tokenizer": self.tokenizer,
            "record": dict(record),
            "files": files,
        }

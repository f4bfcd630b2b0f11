"""bench-train's entry point: check the inputs, train (in this process, on the ranks it starts, or
as one rank of a `torchrun` launch), then write the run's summary, loss plot and sample.

One process trains on one device; `--nproc N` starts N ranks itself (NCCL, one GPU each, or
gloo ranks on the CPU), and under `torchrun` each process is one rank (multi-node too:
torchrun's `--nnodes`, `--rdzv-endpoint`). Only rank 0 checks the inputs first and writes the
outputs, holding the output folder (`--out`) while it runs (`bench.train.lock`: a second run
into the same folder is refused). The folder holds

- `config.toml`: the resolved options (`bench-train --config` reads it back), written once the
  checkpoint a `--resume` continues is loaded (a refused resume leaves the run's own);
- `metrics.jsonl`: per logged step `step`, `loss` (the mean over the global batch), `lr`,
  `tokens_per_s` and `mfu` since the last log, `val_loss` on evaluation steps, and with fp16
  `loss_scale` and `skipped_steps` (optimizer steps skipped for overflowing gradients so far);
- `checkpoint.pt` (and with `fsdp` one file per rank; `bench.train.checkpoint`), every
  `--save-every` steps and at the end (none with `--no-checkpoint`): `--resume` continues from
  it exactly;
- `tokenizer.json` (BPE), `loss.png`, `sample.txt`, `profile.txt` and `profile.pt.trace.json`
  (`--profile-step`: the step's kernel table and Chrome trace) and `tensorboard/` (`--tensorboard`);
- `summary.json`, written last (a run that has one is finished): final losses, tokens/s and MFU
  (over the logged intervals after each invocation's first, which holds compilation and
  warm-up, and without the profiled one), the first step's time, the peak memory of the
  busiest rank (CUDA), fp16's final loss scale and skipped steps, why the run stopped early (if
  it did), the configuration, and the machine, software and command (`env`);
- `run.lock` while a run holds the folder.

A new run (no `--resume`) is refused an `--out` that holds another run's results or
checkpoint, so that a finished run is never overwritten; with `--overwrite` it removes them
first (`RUN_FILES` and the checkpoint files), so that nothing of the old run is read as the
new one's.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from bench.core.cli import usage_errors
from bench.core.env import collect_env, command_line
from bench.core.launch import backend_for, is_primary, launch, under_torchrun
from bench.core.options import given_options
from bench.core.plots import line_plot
from bench.train.checkpoint import (
    CheckpointWriteError,
    remove_checkpoints,
    resolve_resume,
    resume_point,
)
from bench.train.config import CONFIG_FILE, TrainConfig
from bench.train.config_files import NAMES_VERSION, read_config_file
from bench.train.data import Corpus, check_sources
from bench.train.lock import hold
from bench.train.loop import corpus_of, train_on_rank
from bench.train.record import METRICS, PROFILE, PROFILE_TRACE, TENSORBOARD

__all__ = [
    "CONFIG_FILE",
    "LOSS_PLOT",
    "RUN_FILES",
    "SAMPLE",
    "SUMMARY",
    "config_from_args",
    "prepare",
    "run_parsed",
    "run_train",
]

SUMMARY = "summary.json"
LOSS_PLOT = "loss.png"
SAMPLE = "sample.txt"
# What a run leaves in its --out besides its checkpoint files, its configuration and its
# tokenizer (which the next run rewrites or checks): `--overwrite` removes them. The first two
# are its results: a new run is refused an --out that holds either.
RUN_FILES = (SUMMARY, METRICS, LOSS_PLOT, SAMPLE, PROFILE, PROFILE_TRACE, TENSORBOARD)
_RESULTS = RUN_FILES[:2]


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The `TrainConfig` of parsed options: `--config`'s file, then the flags given.

    Raises:
        ValueError: a bad config file, options out of range or that do not go together.
    """
    options = read_config_file(TrainConfig, args.config) if args.config else {}
    return TrainConfig.create(**(options | given_options(args, TrainConfig)))


def prepare(config: TrainConfig) -> Corpus:
    """Everything checked before training: the output folder, the resume point and the data.

    A new run's `--out` must hold no other run's results (`--overwrite`: they are removed).
    Tokenises the text (and trains a BPE tokenizer) if the cache does not hold it yet, so the
    ranks started afterwards find it there. Call it while holding the folder
    (`bench.train.lock.hold`), as `run_train` does.

    Raises:
        ValueError: any bad input.
    """
    resume_point(config)
    corpus = corpus_of(config)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    if not config.resume:
        _claim(out, overwrite=config.overwrite)
    return corpus


def _claim(out: Path, *, overwrite: bool) -> None:
    """Make `out` a new run's: refuse it if another run's results are there, or with
    `overwrite` remove everything that run left (`RUN_FILES`, its checkpoint files)."""
    if overwrite:
        remove_checkpoints(out)
        for name in RUN_FILES:
            path = out / name
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        return
    found = [name for name in _RESULTS if (out / name).exists()]
    if found:
        raise ValueError(
            f"--out {out} already holds a run's results ({', '.join(found)}); choose another "
            "--out, or pass --overwrite to replace that run"
        )


@contextlib.contextmanager
def _owned(config: TrainConfig, command: str) -> Iterator[None]:
    """Hold `--out` (one run at a time) and `prepare` the run; on rank 0 only under torchrun."""
    if not is_primary():
        yield
        return
    check_sources(config.data, config.val_data)  # a mistyped path: refused before --out exists
    with hold(config.out, command=command):
        prepare(config)
        yield


def run_train(config: TrainConfig, *, command: str | None = None) -> dict[str, Any] | None:
    """Check the inputs (`prepare`), train as `config` says, and write the output folder.

    Returns:
        The summary (see the module docstring); None on the other ranks of a torchrun launch.

    Raises:
        ValueError: bad input, or another run holds `--out`, before any training.
    """
    command = command if command is not None else command_line()
    config = resolve_resume(config)
    with _owned(config, command):
        return _train_and_write(config, command=command)


def _train_and_write(config: TrainConfig, *, command: str) -> dict[str, Any] | None:
    if config.nproc == 1 and config.parallel == "single" and not under_torchrun():
        result = train_on_rank(0, 1, config)
    else:
        backend = backend_for(torch.device(config.device))
        result = launch(
            train_on_rank,
            world_size=config.nproc,
            backend=backend,
            args=(config,),
            timeout=config.timeout,
        )[0]
    if under_torchrun() and int(os.environ["RANK"]) != 0:
        return None
    return _write_outputs(config, result, command)


def _write_outputs(config: TrainConfig, result: dict[str, Any], command: str) -> dict[str, Any]:
    """The sample, the loss plot, then the summary: a run with a summary is finished."""
    out = Path(config.out)
    if result["sample"] is not None:
        (out / SAMPLE).write_text(result["sample"])
    rows = [{"step": r["step"], "loss": r["loss"], "split": "train"} for r in result["records"]]
    rows += [
        {"step": r["step"], "loss": r["val_loss"], "split": "validation"}
        for r in result["records"]
        if r.get("val_loss") is not None
    ]
    if rows:
        line_plot(
            rows,
            x="step",
            y="loss",
            series="split",
            path=out / LOSS_PLOT,
            title=f"bench-train: {config.size}, context {config.context_length}",
            xlabel="step",
            ylabel="cross-entropy loss (nats/token)",
        )
    summary = {
        key: result[key]
        for key in ("final_train_loss", "final_val_loss", "steps", "tokens_per_s", "mfu")
    }
    summary |= {
        "stopped_early": result["steps"] < config.steps,
        "stopped_by": result["stopped_by"],
        "first_step_s": result["first_step_s"],
        "parameters": result["parameters"],
        "vocab_size": result["vocab_size"],
        "validation": result["val_source"],
        "world_size": result["world_size"],
        "peak_memory_mib": result["peak_memory_mib"],
        **{key: result[key] for key in ("loss_scale", "skipped_steps") if key in result},
        "names": NAMES_VERSION,
        "config": dataclasses.asdict(config),
        "env": collect_env(config.device, command=command),
    }
    tmp = out / (SUMMARY + ".tmp")
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, out / SUMMARY)
    return summary


def _shown(loss: float | None) -> str:
    return "unknown" if loss is None else f"{loss:.4f}"  # None: metrics.jsonl lost its lines


def run_parsed(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    argv: Sequence[str] | None = None,
) -> int:
    """What `bench-train` runs once its options have parsed (`bench.commands.train`): check the
    inputs, hold `--out`, train, write the outputs; the exit status (0; 1 where a checkpoint
    could not be written). Bad input ends as a usage error of `parser`, before any training."""
    command = command_line(argv, prog=parser.prog)
    with contextlib.ExitStack() as stack:
        with usage_errors(parser):  # bad input ends here, as a usage error, before any training
            config = resolve_resume(config_from_args(args))
            stack.enter_context(_owned(config, command))
        try:
            summary = _train_and_write(config, command=command)
        except CheckpointWriteError as error:  # what it needs and what is kept, no traceback
            print(f"{parser.prog}: error: {error}", file=sys.stderr)
            return 1
    if summary is not None:
        stopped = f" (stopped by --{summary['stopped_by']})" if summary["stopped_by"] else ""
        train, val = (_shown(summary[f"final_{split}_loss"]) for split in ("train", "val"))
        print(
            f"{summary['steps']} steps{stopped}: train loss {train}, validation loss {val}; "
            f"results in {config.out}"
        )
    if under_torchrun():
        # A rank torchrun started ends as the ranks `launch` spawns do: without finalising the
        # interpreter, where a gloo thread that outlives it aborts the process (SIGABRT,
        # "terminate called without an active exception"). Everything is written by now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0

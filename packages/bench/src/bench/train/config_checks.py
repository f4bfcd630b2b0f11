"""The checks of a `TrainConfig` (`bench.train.config`) option by option and across options:
what `TrainConfig.validate` runs, so that every bad combination is a usage error before the run
writes a file. Imports torch (the device and the parallel modes are checked), so the command
line, which reads `bench.train.config`, never imports this module.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

import ddp
import lmcore
from bench.core.layouts import loss_scaled
from bench.core.loss_scale import DEFAULT_INIT_SCALE
from bench.core.options import check_values, flag_of
from bench.train import parallel
from bench.train.config import RESUME_AUTO
from bench.train.tokenizer import EOT_TEXT, TOKEN_SUFFIXES

if TYPE_CHECKING:
    from bench.train.config import TrainConfig

__all__ = ["validate"]


def validate(config: TrainConfig) -> None:
    """Check every option of `config` alone and together.

    Raises:
        ValueError: the first option out of range, or the first that does not go with another,
            by its flag and with what to do.
    """
    c = config
    flag = functools.partial(flag_of, type(c))
    check_values(c)
    positive = ("context_length", "batch_size", "grad_accum", "steps", "nproc")
    for name in (*positive, "eval_batches", "log_every", "keep_last"):
        if getattr(c, name) is not None and getattr(c, name) < 1:
            raise ValueError(f"--{flag(name)} must be at least 1")
    for name in ("eval_every", "save_every", "generate", "weight_decay", "grad_clip"):
        if getattr(c, name) is not None and getattr(c, name) < 0:
            raise ValueError(f"--{flag(name)} must be >= 0 (0 turns it off)")
    if Path(c.out).exists() and not Path(c.out).is_dir():
        raise ValueError(f"--out {c.out} is a file; give a folder (new, or a run's)")
    ddp.bucket_bytes(c.bucket_size_mb)  # --bucket-mb: finite and >= 0, or None
    if not c.lr > 0 or (c.min_lr is not None and not 0 <= c.min_lr <= c.lr):
        raise ValueError("--lr must be positive, and --min-lr in [0, --lr]")
    if c.warmup_steps is not None and not 0 <= c.warmup_steps < c.steps:
        raise ValueError(
            f"--warmup-steps must be in [0, --steps) = [0, {c.steps}): the cosine decay "
            "needs at least one step"
        )
    if c.profile_step is not None and not 1 <= c.profile_step <= c.last_step:
        raise ValueError(f"--profile-step must be in [1, the last step {c.last_step}]")
    if c.stop_after is not None and not 1 <= c.stop_after <= c.steps:
        raise ValueError(f"--stop-after must be in [1, --steps = {c.steps}]")
    if c.time_budget is not None and not c.time_budget > 0:
        raise ValueError("--time-budget must be a positive duration, e.g. 20m")
    if c.timeout is not None and not c.timeout > 0:
        raise ValueError("--timeout must be a positive number of seconds")
    if not c.loss_scale > 0 or (
        c.loss_scale != DEFAULT_INIT_SCALE and not loss_scaled(c.precision)
    ):
        raise ValueError("--loss-scale takes a positive scale and scales fp16's loss only: "
                         "drop it, or add --precision fp16")  # fmt: skip
    if c.generate and not c.prompt:
        raise ValueError("--generate needs a non-empty --prompt to continue")
    if not (c.temperature >= 0 and 0 < c.top_p <= 1):
        raise ValueError("--temperature must be >= 0 and --top-p in (0, 1]")
    if c.batch_size % (c.grad_accum * c.nproc):
        raise ValueError(
            f"--batch-size {c.batch_size} must be a multiple of --grad-accum × ranks = "
            f"{c.grad_accum} × {c.nproc}, so that every rank's micro-batches are equal"
        )
    device = torch.device(c.device)
    parallel.check(
        c.parallel,
        nproc=c.nproc,
        precision=c.precision,
        baseline=c.baseline,
        device=device,
    )
    _check_triton_paths(c, device)
    _check_outputs(c)
    _check_packing(c)
    if c.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ValueError(
            "--tensorboard needs the tensorboard package: pip install 'cs336sys-bench"
            "[tensorboard]' (in the workspace: uv sync --extra tensorboard); or drop it"
        )
    try:
        lmcore.ActivationCheckpointing.parse(c.activation_checkpointing)
    except (TypeError, ValueError) as error:
        raise ValueError(f"--activation-checkpointing: {error}") from None
    c.model_config(vocab_size=256)  # checks the model's shape


def _check_triton_paths(config: TrainConfig, device: torch.device) -> None:
    """The Triton paths (fa2-triton, lmcore-fused) need CUDA, or Triton's CPU interpreter."""
    if device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return
    for name, value, instead in (
        ("attention", "fa2-triton", "sdpa or fa2-pytorch"),
        ("optimizer", "lmcore-fused", "lmcore or torch-fused"),
    ):
        if getattr(config, name) == value:
            raise ValueError(
                f"--{name} {value} runs Triton kernels, which need CUDA; on a {device.type} "
                f"use {instead} (or TRITON_INTERPRET=1 for Triton's interpreter, far slower)"
            )


def _check_outputs(config: TrainConfig) -> None:
    """`--resume auto` and `--keep-last` need checkpoints (`--keep-last` the ones `--save-every`
    writes); `--export-hf` needs safetensors and a folder."""
    if config.resume == RESUME_AUTO and not config.checkpoint:
        raise ValueError(f"--resume {RESUME_AUTO} continues from checkpoints: drop --no-checkpoint")
    if config.keep_last > 1 and not (config.save_every and config.checkpoint):
        raise ValueError(
            f"--keep-last {config.keep_last} keeps the checkpoints --save-every writes: give "
            "--save-every N (and checkpoints)"
        )
    if config.export_hf is None:
        return
    if importlib.util.find_spec("safetensors") is None:
        raise ValueError(
            "--export-hf writes safetensors files: pip install safetensors (or "
            "'cs336sys-lmcore[hf]'); or drop --export-hf"
        )
    if Path(config.export_hf).exists() and not Path(config.export_hf).is_dir():
        raise ValueError(f"--export-hf {config.export_hf} is a file; give a folder")


def _check_packing(config: TrainConfig) -> None:
    """`--pack` needs an end-of-text token and the trainer's own step; `--eot-id` needs
    `--pack`."""
    if config.eot_id is not None and not config.pack:
        raise ValueError("--eot-id says where --pack splits documents: add --pack")
    if not config.pack:
        return
    if config.baseline is not None:
        raise ValueError("--pack runs fa2's varlen kernels; torch's step (--baseline) has none")
    token_file = Path(config.data).suffix in TOKEN_SUFFIXES
    if token_file and config.eot_id is None:
        raise ValueError("--pack on a token file needs its end-of-text id: --eot-id ID")
    if not token_file and config.tokenizer == "bytes":
        raise ValueError(
            f"--pack splits documents at the BPE tokenizer's {EOT_TEXT}; --tokenizer bytes "
            "has no such token: use --tokenizer bpe"
        )

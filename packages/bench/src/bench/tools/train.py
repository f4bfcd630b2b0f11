"""bench-train: train `lmcore.TransformerLM` on a text or token file with every part of the project.

    bench-train --data input.txt --size small --context-length 256 --steps 2000 --out runs/small
    bench-train --data input.txt --size tiny --steps 200 --device cpu --out runs/tiny
    bench-train --data input.txt --nproc 2 --parallel zero --out runs/zero     # 2 GPUs (NCCL)

One process trains on one device; `--nproc N` starts N ranks itself (NCCL, one GPU each, or gloo
ranks on the CPU), and under `torchrun` each process is one rank (multi-node too: torchrun's
`--nnodes`, `--node-rank`, `--rdzv-endpoint` set the usual variables). `--batch-size` counts the
sequences of one optimizer step over all ranks and micro-batches: every rank draws the same
global batch from the same seeded generator and trains on its own slice, so with the same seed
the loss of every step equals the one-process run's.

Every step is the project's one training step (`bench.core.training.train_step`: autocast,
gradient accumulation with the wrapper's `no_sync`, the wrapper's synchronisation, clipping,
the optimizer step), after the learning rate of `lmcore.cosine_lr` (linear warm-up, cosine decay
to `--min-lr` at the last step) is set. `--baseline torch` swaps in a torch-native step of the
same model instead (SDPA attention, `torch.nn.functional.cross_entropy`,
`torch.nn.utils.clip_grad_norm_`, `torch.optim.AdamW(fused=True)`, the model compiled): the
strongest plain-PyTorch set-up a user could pick, to compare speed with side by side.

Parallel modes (`--parallel`): `none`; `naive`, `flat`, `individual`, `bucketed` (the `ddp`
wrappers); `torch-ddp` (torch's DistributedDataParallel); `zero` (`ddp.DDPBucketed` +
`zero.ShardedOptimizer`, optimizer state sharded); `fsdp` (`zero.FSDP`, one unit per Transformer
block: weights, gradients and optimizer state sharded; gradient clipping takes the norm over
the whole model).

The output folder (`--out`) holds

- `metrics.jsonl`: one JSON object per logged step: `step`, `loss` (the mean over the global
  batch), `lr`, `tokens_per_s` and `mfu` over the steps since the last log, and `val_loss` on
  evaluation steps (`--eval-every`, and always after the last step);
- `summary.json`: `final_train_loss`, `final_val_loss`, `steps`, `tokens_per_s` and `mfu` (over
  every logged interval but the first, which holds compilation and warm-up, when there are
  several, and but the one holding `--profile-step`; evaluations are never timed), the
  configuration, the machine and software (`env`), the code's git revision and whether the tree
  had uncommitted changes;
- `checkpoint.pt`: model, optimizer (the consolidated state of a sharded one), step, random
  number generator states and data position, every `--save-every` steps, at `--stop-after` and
  at the end. `--resume` continues from it exactly: a stopped and resumed run reproduces the
  uninterrupted run's losses. The training configuration must match the checkpoint's (the
  options that only say how to run, e.g. `--nproc`, `--parallel`, `--compile`, `--log-every`,
  may change). With `fsdp` every rank r > 0 also writes `checkpoint-rank<r>.pt`, the same with
  its shard of the optimizer state (a resumed fsdp run needs the same number of ranks);
- `tokenizer.json` (BPE), `loss.png` (train and validation loss against step), `sample.txt`
  (`--generate` tokens after `--prompt`).

Model FLOP utilisation is the model's training FLOPs per step (`lmcore.training_flops`: PaLM's
count, 6·N_matmul + 12·L·T·d per token, Chowdhery et al. 2022, appendix B, as nanoGPT uses)
over the step time and the peak dense matmul FLOP/s of all the GPUs in use
(`bench.core.hardware`); it is not reported on the CPU or on GPUs missing from that table.

Tokenisation (`--tokenizer bytes|bpe`) and data (`--data`, `--val-data`: text, `.bin` uint16 or
`.npy` token files; the held-out tail of `--data`, 10%, without `--val-data`) are described in
`bench.core.token_data`; tokenised text is cached in `--cache-dir` so a second run does not
tokenise again. Bad input is reported before any training starts.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

import ddp
import lmcore
import zero
from bench.core.cli import resolve_device, usage_errors
from bench.core.env import collect_env, command_line, device_name
from bench.core.hardware import matmul_format, peak_tflops
from bench.core.launch import backend_for, launch, torchrun_world_size, under_torchrun
from bench.core.plots import hbar_plot, line_plot
from bench.core.results import Run
from bench.core.shapes import CPU_SIZE
from bench.core.token_data import Corpus, default_cache_dir, load_corpus
from bench.core.tokenizer import TOKENIZERS, load_tokenizer
from bench.core.training import bucket_size_mb, build_lm, train_step

__all__ = [
    "PARALLEL_MODES",
    "TrainConfig",
    "build_parser",
    "config_from_args",
    "main",
    "plot_speed",
    "prepare",
    "run_train",
    "speed_comparison",
]

PARALLEL_MODES = ("none", "naive", "flat", "individual", "bucketed", "torch-ddp", "zero", "fsdp")
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}
OPTIMIZERS = ("lmcore", "torch")
BASELINES = ("torch",)
CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
LOSS_PLOT = "loss.png"
SAMPLE = "sample.txt"
PROFILE = "profile.txt"
# AdamW's moment decay rates: GPT-3's (Brown et al., 2020), which nanoGPT and the handout use.
BETAS = (0.9, 0.95)
_DDP_WRAPPERS: dict[str, Callable[..., ddp.DataParallelBase]] = {
    "naive": ddp.NaiveDDP,
    "flat": ddp.FlatDDP,
    "individual": ddp.DDPIndividualParameters,
    "bucketed": ddp.DDPBucketed,
    "zero": ddp.DDPBucketed,
}
# Options that only say how to run, which a resumed run may change; every other field of
# `TrainConfig` must equal the checkpoint's, or the resumed run would not continue the same one.
_HOW_TO_RUN = frozenset(
    {
        "cache_dir",
        "device",
        "attention",
        "compile",
        "parallel",
        "nproc",
        "bucket_size_mb",
        "out",
        "log_every",
        "eval_every",
        "eval_batches",
        "save_every",
        "stop_after",
        "resume",
        "generate",
        "prompt",
        "temperature",
        "top_p",
        "progress",
        "profile_step",
    }
)


# ----------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class TrainConfig:
    """Everything a `bench-train` run needs; the command-line options, resolved for the device.

    Build one with `TrainConfig.create(...)`, which fills the device-dependent defaults (size,
    precision, attention, parallel mode) and validates; the fields are those of the options of
    the same names (see `bench-train --help`).
    """

    data: str
    out: str
    val_data: str | None = None
    tokenizer: str = "bpe"
    vocab_size: int | None = None
    cache_dir: str | None = None
    size: str = "small"
    d_model: int | None = None
    num_layers: int | None = None
    num_heads: int | None = None
    d_ff: int | None = None
    context_length: int = 256
    batch_size: int = 32
    grad_accum: int = 1
    steps: int = 1000
    lr: float = 6e-4
    min_lr: float | None = None
    warmup_steps: int | None = None
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    device: str = "cpu"
    precision: str = "fp32"
    attention: str = "sdpa"
    compile: bool = False
    optimizer: str = "lmcore"
    baseline: str | None = None
    parallel: str = "none"
    nproc: int = 1
    bucket_size_mb: float | None = ddp.DEFAULT_BUCKET_SIZE_MB
    log_every: int = 10
    eval_every: int = 100
    eval_batches: int = 10
    save_every: int = 0
    stop_after: int | None = None
    resume: bool = False
    generate: int = 200
    prompt: str = "\n"
    temperature: float = 0.8
    top_p: float = 0.95
    progress: bool = True
    profile_step: int | None = None

    @classmethod
    def create(cls, **options: Any) -> TrainConfig:
        """A validated configuration; options left out or None take the device's default
        (`bucket_size_mb=None` is one bucket, as in ddp).

        Raises:
            ValueError: an option out of range or options that do not go together.
        """
        # bucket_size_mb=None is a size (one bucket), not an option left out.
        options = {k: v for k, v in options.items() if v is not None or k == "bucket_size_mb"}
        device = resolve_device(options.get("device", "auto"))
        cuda = device.type == "cuda"
        options["device"] = str(device)
        baseline = options.get("baseline")
        if baseline == "torch":
            for name, value in (("attention", "sdpa"), ("optimizer", "torch"), ("compile", True)):
                if options.setdefault(name, value) != value:
                    raise ValueError(
                        f"--baseline torch runs {name} {value}; drop --{name.replace('_', '-')}"
                    )
        defaults = {
            "size": "small" if cuda else CPU_SIZE,
            "precision": "bf16" if cuda else "fp32",
            "attention": "fa2-triton" if cuda else "sdpa",
            "nproc": torchrun_world_size() or 1,
        }
        for name, value in defaults.items():
            options.setdefault(name, value)
        options.setdefault("parallel", "none" if options["nproc"] == 1 else "bucketed")
        config = cls(**options)
        config.validate()
        return config

    def validate(self) -> None:
        """Check every option alone and together (see `create`)."""
        if self.size not in lmcore.MODEL_SIZES:
            raise ValueError(
                f"unknown --size {self.size!r}; choose one of {', '.join(lmcore.MODEL_SIZES)}"
            )
        positive = (
            "context_length",
            "batch_size",
            "grad_accum",
            "steps",
            "nproc",
            "log_every",
            "eval_batches",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        for name in ("eval_every", "save_every", "generate", "weight_decay", "grad_clip"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0 (0 turns it off)")
        ddp.bucket_bytes(self.bucket_size_mb)  # --bucket-mb: finite and >= 0, or None
        if not self.lr > 0 or (self.min_lr is not None and not 0 <= self.min_lr <= self.lr):
            raise ValueError("--lr must be positive and --min-lr in [0, --lr]")
        if self.warmup_steps is not None and not 0 <= self.warmup_steps < self.steps:
            raise ValueError(
                f"--warmup-steps must be in [0, --steps) = [0, {self.steps}): the cosine decay "
                "needs at least one step"
            )
        if self.profile_step is not None and not 1 <= self.profile_step <= self.last_step:
            raise ValueError(f"--profile-step must be in [1, the last step {self.last_step}]")
        if self.stop_after is not None and not 1 <= self.stop_after <= self.steps:
            raise ValueError(f"--stop-after must be in [1, --steps = {self.steps}]")
        if self.generate and not self.prompt:
            raise ValueError("--generate needs a non-empty --prompt to continue")
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(f"--tokenizer must be one of {', '.join(TOKENIZERS)}")
        for name, value, choices in (
            ("precision", self.precision, PRECISIONS),
            ("optimizer", self.optimizer, OPTIMIZERS),
            ("parallel", self.parallel, PARALLEL_MODES),
            ("attention", self.attention, lmcore.ATTENTION_BACKENDS),
        ):
            if value not in choices:
                raise ValueError(f"--{name} {value!r}: choose one of {', '.join(choices)}")
        if self.baseline not in (None, *BASELINES):
            raise ValueError(f"--baseline must be one of {', '.join(BASELINES)}")
        per_step = self.grad_accum * self.nproc
        if self.batch_size % per_step:
            raise ValueError(
                f"--batch-size {self.batch_size} must be a multiple of --grad-accum × ranks = "
                f"{self.grad_accum} × {self.nproc}, so that every rank's micro-batches are equal"
            )
        if self.nproc > 1 and self.parallel == "none":
            raise ValueError(
                f"--nproc {self.nproc} needs a --parallel mode (each rank would train alone); "
                f"choose one of {', '.join(PARALLEL_MODES[1:])}"
            )
        if self.parallel == "fsdp" and self.compile:
            raise ValueError("--compile does not run with --parallel fsdp yet; drop --compile")
        if self.baseline is not None and self.parallel not in ("none", "torch-ddp"):
            raise ValueError("--baseline torch runs with --parallel none or torch-ddp")
        device = torch.device(self.device)
        if device.type == "cuda" and not under_torchrun():
            available = torch.cuda.device_count()
            if self.nproc > available:
                raise ValueError(
                    f"--nproc {self.nproc} needs {self.nproc} GPUs, found {available}; lower "
                    "--nproc, or use --device cpu for gloo ranks"
                )
        if under_torchrun() and self.nproc != torchrun_world_size():
            raise ValueError(
                f"--nproc {self.nproc} but torchrun started {torchrun_world_size()} processes; "
                "drop --nproc under torchrun"
            )
        if self.nproc > 1 and device.type == "cuda" and device.index not in (None, 0):
            raise ValueError("with --nproc, give --device cuda (rank r uses GPU r)")
        self.model_config(vocab_size=256)  # checks the model's shape

    def model_config(self, *, vocab_size: int) -> lmcore.ModelConfig:
        """The model: the named size with the `--d-model`, ... overrides applied."""
        shape = dataclasses.replace(
            lmcore.MODEL_SIZES[self.size],
            **{
                k: v
                for k in ("d_model", "num_layers", "num_heads", "d_ff")
                if (v := getattr(self, k)) is not None
            },
        )
        return shape.config(
            context_length=self.context_length, vocab_size=vocab_size, attention=self.attention
        )

    @property
    def warmup(self) -> int:
        """Warm-up steps: `--warmup-steps`, else a tenth of the run, at most 100."""
        return self.warmup_steps if self.warmup_steps is not None else min(100, self.steps // 10)

    @property
    def final_lr(self) -> float:
        """The learning rate at the last step: `--min-lr`, else a tenth of `--lr`."""
        return self.min_lr if self.min_lr is not None else self.lr / 10

    @property
    def last_step(self) -> int:
        """The step this invocation ends after: `--stop-after`, else `--steps`."""
        return self.stop_after if self.stop_after is not None else self.steps


# ----------------------------------------------------------------------------- run records


def _resume_state(config: TrainConfig) -> dict[str, Any] | None:
    """The checkpoint to resume from (read on the CPU), after checking it fits `config`.

    Raises:
        ValueError: `--resume` without a checkpoint, a checkpoint without `--resume`, or a
            checkpoint of another training configuration.
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
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    saved = checkpoint["extra"]["config"]
    mine = dataclasses.asdict(config)
    differ = sorted(k for k in mine if k not in _HOW_TO_RUN and saved.get(k) != mine[k])
    if "fsdp" in (saved["parallel"], config.parallel) and (
        (saved["parallel"], saved["nproc"]) != (config.parallel, config.nproc)
    ):
        differ.append("parallel")
        differ.append("nproc")
    if differ:
        changes = ", ".join(
            f"--{k.replace('_', '-')} {saved.get(k)!r} → {mine[k]!r}" for k in differ
        )
        raise ValueError(
            f"--resume: this run's configuration differs from the checkpoint's ({changes}); "
            "use the options of the run being resumed"
        )
    if checkpoint["iteration"] >= config.last_step:
        raise ValueError(
            f"--resume: the checkpoint is at step {checkpoint['iteration']}, already past the "
            f"last step {config.last_step}; raise --stop-after or drop it"
        )
    return checkpoint


def prepare(config: TrainConfig) -> Corpus:
    """Everything checked before training: the output folder, the resume point and the data.

    Tokenises the text (and trains a BPE tokenizer) if the cache does not hold it yet, so the
    ranks started afterwards find it there.

    Raises:
        ValueError: any bad input (see the module docstring).
    """
    _resume_state(config)
    Path(config.out).mkdir(parents=True, exist_ok=True)
    return _corpus(config)


def _corpus(config: TrainConfig) -> Corpus:
    return load_corpus(
        config.data,
        val_data=config.val_data,
        tokenizer=config.tokenizer,
        vocab_size=config.vocab_size,
        context_length=config.context_length,
        out_dir=config.out,
        cache_dir=config.cache_dir or default_cache_dir(),
    )


# ----------------------------------------------------------------------------- on each rank


class _Batches:
    """The global batch of every micro-step, drawn from one seeded generator; this rank's rows.

    Every rank draws the same starts (`lmcore.get_batch` with the same generator state) and
    keeps rows `[rank·b, (rank+1)·b)`, so the ranks together train on exactly the batch one
    process would. The generator's state is the data position a checkpoint saves.
    """

    def __init__(
        self, tokens: np.ndarray, config: TrainConfig, *, rank: int, world_size: int, seed: int
    ) -> None:
        self.tokens, self.context_length = tokens, config.context_length
        self.micro = config.batch_size // config.grad_accum  # sequences per micro-step
        self.rows = slice(rank * self.micro // world_size, (rank + 1) * self.micro // world_size)
        self.generator = np.random.default_rng(seed)

    def next(self, device: torch.device) -> torch.Tensor:
        """This rank's tokens `(micro / world_size, context_length + 1)` of the next micro-step."""
        x, y = lmcore.get_batch(
            self.tokens, self.micro, self.context_length, "cpu", generator=self.generator
        )
        tokens = torch.cat((x, y[:, -1:]), dim=1)[self.rows]  # (rows, seq + 1)
        if device.type == "cuda":
            return tokens.pin_memory().to(device, non_blocking=True)
        return tokens


def _param_groups(model: nn.Module, decayed: set[str], weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on the matrices (linear and embedding weights), none on the norm gains.

    `decayed` names the matrices, taken before wrapping: a sharding wrapper replaces them by
    flat shards under the same names.
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [
        {"params": [p for n, p in named if n in decayed], "weight_decay": weight_decay},
        {"params": [p for n, p in named if n not in decayed], "weight_decay": 0.0},
    ]


def _make_optimizer(
    config: TrainConfig, raw_model: nn.Module, decayed: set[str], device: torch.device
) -> torch.optim.Optimizer:
    groups = _param_groups(raw_model, decayed, config.weight_decay)
    if config.optimizer == "torch":
        optimizer_cls, options = torch.optim.AdamW, {"fused": device.type == "cuda"}
    else:
        optimizer_cls, options = lmcore.AdamW, {}
    options |= {"lr": config.lr, "betas": BETAS}
    if config.parallel == "zero":
        return zero.ShardedOptimizer(groups, optimizer_cls, **options)
    return optimizer_cls(groups, **options)


def _wrap(config: TrainConfig, model: nn.Module, device: torch.device) -> nn.Module:
    """The model as the step runs it: compiled and/or wrapped for `--parallel`."""
    if config.parallel == "torch-ddp":
        device_ids = [device.index] if device.type == "cuda" else None
        wrapped = DistributedDataParallel(model, device_ids=device_ids)
        return torch.compile(wrapped) if config.compile else wrapped
    inner = torch.compile(model) if config.compile else model
    if config.parallel == "none":
        return inner
    if config.parallel == "fsdp":
        dtype = PRECISIONS[config.precision]
        return zero.FSDP(inner, compute_dtype=dtype, units=(lmcore.TransformerBlock,))
    if config.parallel in ("bucketed", "zero"):
        return ddp.DDPBucketed(inner, config.bucket_size_mb)
    return _DDP_WRAPPERS[config.parallel](inner)


def _torch_native_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[torch.Tensor],
    *,
    autocast_dtype: torch.dtype | None = None,
    max_grad_norm: float | None = None,
) -> torch.Tensor:
    """`--baseline torch`: the step written with torch's own pieces only, as a user would.

    Deliberately independent of `bench.core.training.train_step`: the reference the project's
    step is compared with, not a second training loop of the project.
    """
    no_sync = getattr(model, "no_sync", contextlib.nullcontext)
    total = torch.zeros((), device=micro_batches[0].device)
    for index, tokens in enumerate(micro_batches):
        last = index == len(micro_batches) - 1
        with contextlib.nullcontext() if last else no_sync():
            with torch.autocast(
                tokens.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None
            ):
                logits = model(tokens[:, :-1])  # (batch, seq, vocab)
                loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
                loss = loss / len(micro_batches)
            loss.backward()
        total += loss.detach()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm, foreach=True)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


def _mean_over_ranks(value: torch.Tensor, distributed: bool) -> float:
    """`value` averaged over the ranks (equal shares, so the mean over the global batch)."""
    if distributed:
        value = value.clone()
        dist.all_reduce(value)
        value /= dist.get_world_size()
    return value.item()


@torch.no_grad()
def _evaluate(
    model: nn.Module,
    corpus: Corpus,
    config: TrainConfig,
    *,
    device: torch.device,
    rank: int,
    world_size: int,
) -> float:
    """Mean validation loss over `--eval-batches` global batches, the same ones every time."""
    batches = _Batches(corpus.val, config, rank=rank, world_size=world_size, seed=config.seed + 1)
    dtype = PRECISIONS[config.precision]
    total = torch.zeros((), device=device)
    for _ in range(config.eval_batches):
        tokens = batches.next(device)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            logits = model(tokens[:, :-1])
        total += lmcore.cross_entropy(logits.float(), tokens[:, 1:])
    return _mean_over_ranks(total / config.eval_batches, world_size > 1)


def _mfu(
    config: TrainConfig, model_config: lmcore.ModelConfig, device: torch.device, world: int
) -> Callable[[int, float], float] | None:
    """(steps, seconds) → model FLOP utilisation; None off CUDA or where the peak is unknown."""
    if device.type != "cuda":
        return None
    dtype = PRECISIONS[config.precision] or torch.float32
    peak = peak_tflops(device_name(device), matmul_format(dtype))
    if peak is None:
        return None
    flops = lmcore.training_flops(model_config, batch_size=config.batch_size)
    return lambda steps, seconds: flops * steps / seconds / (peak * 1e12 * world)


def _rng_state(device: torch.device) -> dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


@contextlib.contextmanager
def _profiled(
    config: TrainConfig, step: int, device: torch.device, primary: bool
) -> Iterator[None]:
    """torch.profiler around `--profile-step`'s step; its table (by device time) to a file."""
    if step != config.profile_step or not primary:
        yield
        return
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profiler:
        yield
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    sort_by = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    table = profiler.key_averages().table(sort_by=sort_by, row_limit=30, max_name_column_width=60)
    (Path(config.out) / PROFILE).write_text(f"step {step}, sorted by {sort_by}\n\n{table}\n")


class _Recorder:
    """Rank 0's outputs: metrics lines, the progress bar or log lines, the interval timer."""

    def __init__(self, config: TrainConfig, *, start: int, primary: bool, mfu) -> None:
        self.config, self.primary, self.mfu = config, primary, mfu
        self.out = Path(config.out)
        self.records: list[dict[str, Any]] = []
        self.steady = [0, 0.0]  # steps and seconds of the intervals after the first
        self.first = [0, 0.0]
        self.intervals = 0
        self.excluded = False  # the current interval holds a profiled step: not a speed sample
        self.last_step, self.started = start, time.perf_counter()
        if primary:
            self.records = self._previous(start)
            with open(self.out / METRICS, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in self.records)
        total = config.last_step - start
        show = primary and config.progress
        self.bar = tqdm(total=total, desc="bench-train", file=sys.stderr, disable=not show)

    def _previous(self, start: int) -> list[dict[str, Any]]:
        path = self.out / METRICS
        if start == 0 or not path.is_file():
            return []
        lines = path.read_text().splitlines()
        return [r for r in map(json.loads, lines) if r["step"] <= start]

    def restart_clock(self) -> None:
        """Leave the time since the last log (evaluation, saving) out of the next interval."""
        self.started = time.perf_counter()

    def exclude_interval(self) -> None:
        """Leave the current interval out of the summary's speed (it ran under the profiler)."""
        self.excluded = True

    def elapsed(self) -> float:
        """Seconds since the last log: read it before an evaluation, which is not training."""
        return time.perf_counter() - self.started

    def log(
        self, step: int, loss: float, lr: float, val_loss: float | None, seconds: float
    ) -> None:
        """Record `step`; `seconds` is the interval's training time (see `elapsed`)."""
        steps = step - self.last_step
        tokens_per_s = steps * self.config.batch_size * self.config.context_length / seconds
        record = {"step": step, "loss": loss, "lr": lr, "tokens_per_s": tokens_per_s}
        record["mfu"] = None if self.mfu is None else self.mfu(steps, seconds)
        if val_loss is not None:
            record["val_loss"] = val_loss
        if not self.excluded:
            bucket = self.first if self.intervals == 0 else self.steady
            bucket[0] += steps
            bucket[1] += seconds
        self.excluded = False
        self.intervals += 1
        self.last_step = step
        self.bar.update(steps)
        if not self.primary:
            return
        self.records.append(record)
        with open(self.out / METRICS, "a") as f:
            f.write(json.dumps(record) + "\n")
        shown = f"loss {loss:.4f}" + ("" if val_loss is None else f" val {val_loss:.4f}")
        if self.config.progress:
            self.bar.set_postfix_str(f"{shown} {tokens_per_s:,.0f} tok/s")
        else:
            print(
                f"step {step}/{self.config.steps}: {shown}, lr {lr:.3g}, {tokens_per_s:,.0f} tok/s",
                file=sys.stderr,
                flush=True,
            )

    def speed(self) -> tuple[float | None, float | None]:
        """tokens/s and MFU over the intervals after the first (all of them if only one)."""
        steps, seconds = self.steady if self.steady[0] else self.first
        if not steps:
            return None, None
        tokens_per_s = steps * self.config.batch_size * self.config.context_length / seconds
        return tokens_per_s, None if self.mfu is None else self.mfu(steps, seconds)

    def close(self) -> None:
        self.bar.close()


def _checkpoint_path(config: TrainConfig, rank: int) -> Path:
    """Rank 0's checkpoint; with fsdp, rank r > 0 keeps its optimizer shard in its own file."""
    name = CHECKPOINT if rank == 0 else f"checkpoint-rank{rank}.pt"
    return Path(config.out) / name


def _save(
    config: TrainConfig,
    *,
    rank: int,
    model: nn.Module,
    raw_model: nn.Module,
    optimizer: torch.optim.Optimizer,
    step: int,
    batches: _Batches,
    device: torch.device,
) -> None:
    """Write the checkpoint (rank 0), atomically: a crash while saving keeps the previous one.

    `zero.ShardedOptimizer.state_dict()` is a collective that every rank joins; with fsdp every
    rank writes its own file (`FSDP.state_dict()`, the full weights, is a collective too).
    """
    fsdp = isinstance(model, zero.FSDP)
    if rank != 0 and not fsdp:
        if isinstance(optimizer, zero.ShardedOptimizer):
            optimizer.state_dict()
        return
    extra = {
        "config": dataclasses.asdict(config),
        "data_rng": batches.generator.bit_generator.state,
        "rng": _rng_state(device),
    }
    path = _checkpoint_path(config, rank)
    tmp = path.with_suffix(".tmp")
    lmcore.save_checkpoint(model if fsdp else raw_model, optimizer, step, tmp, extra=extra)
    os.replace(tmp, path)


def _train(rank: int, world_size: int, config: TrainConfig) -> dict[str, Any]:
    """Train on this rank (the whole run when there is one process); rank 0's summary."""
    distributed = dist.is_initialized()
    device = torch.device(config.device)
    if distributed and device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    elif device.type == "cuda":
        if device.index is None:  # "cuda": the current device, named so later calls agree
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    primary = rank == 0
    if distributed and not primary:
        dist.barrier()  # rank 0 tokenises (or finds the cache) first
    corpus = _corpus(config)
    if distributed and primary:
        dist.barrier()
    checkpoint = _resume_state(config) if config.resume else None
    if checkpoint is not None and config.parallel == "fsdp" and rank != 0:
        path = _checkpoint_path(config, rank)
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)

    model_config = config.model_config(vocab_size=corpus.vocab_size)
    raw_model = build_lm(model_config, device, seed=config.seed)
    decayed = {n for n, p in raw_model.named_parameters() if p.dim() >= 2}
    model = _wrap(config, raw_model, device)
    optimizer = _make_optimizer(config, raw_model, decayed, device)
    fsdp = isinstance(model, zero.FSDP)
    batches = _Batches(corpus.train, config, rank=rank, world_size=world_size, seed=config.seed)
    start = 0
    if checkpoint is not None:
        start = lmcore.load_checkpoint(checkpoint, model if fsdp else raw_model, optimizer)
        batches.generator.bit_generator.state = checkpoint["extra"]["data_rng"]
        _set_rng_state(checkpoint["extra"]["rng"], device)
    if config.baseline == "torch":
        step_fn = _torch_native_step
    else:
        # FSDP's sharded weights are those of two or more dimensions (see zero.FSDP).
        sharded = [p for n, p in raw_model.named_parameters() if fsdp and n in decayed]
        step_fn = functools.partial(train_step, sharded_params=sharded)
    autocast_dtype = PRECISIONS[config.precision]
    recorder = _Recorder(
        config,
        start=start,
        primary=primary,
        mfu=_mfu(config, model_config, device, world_size),
    )

    def evaluate() -> float:
        return _evaluate(model, corpus, config, device=device, rank=rank, world_size=world_size)

    def save(step: int) -> None:
        _save(
            config,
            rank=rank,
            model=model,
            raw_model=raw_model,
            optimizer=optimizer,
            step=step,
            batches=batches,
            device=device,
        )

    loss = val_loss = None
    step = start
    try:
        for step in range(start + 1, config.last_step + 1):
            lr = lmcore.cosine_lr(step - 1, config.lr, config.final_lr, config.warmup, config.steps)
            for group in optimizer.param_groups:
                group["lr"] = lr
            micro_batches = [batches.next(device) for _ in range(config.grad_accum)]
            with _profiled(config, step, device, primary):
                step_loss = step_fn(
                    model,
                    optimizer,
                    micro_batches,
                    autocast_dtype=autocast_dtype,
                    max_grad_norm=config.grad_clip or None,
                )
            if step == config.profile_step:
                recorder.exclude_interval()
            last = step == config.last_step
            evaluating = config.eval_every and step % config.eval_every == 0
            if step % config.log_every == 0 or last or evaluating:
                loss = _mean_over_ranks(step_loss, distributed)  # waits for the step to end
                seconds = recorder.elapsed()  # before evaluating (a compiled model recompiles)
                val_loss = evaluate() if evaluating or last else None
                recorder.log(step, loss, lr, val_loss, seconds)
                if config.save_every and step % config.save_every == 0 and not last:
                    save(step)
                recorder.restart_clock()
            elif config.save_every and step % config.save_every == 0:
                save(step)
                recorder.restart_clock()
        save(step)
    finally:
        recorder.close()
    sample = None
    if config.generate:
        sampled = raw_model
        if fsdp:  # the full weights (a collective), into a plain model on rank 0
            weights = model.state_dict()
            sampled = build_lm(model_config, device, seed=config.seed) if primary else None
            if primary:
                sampled.load_state_dict(weights)
        if primary:
            sample = _sample(config, sampled, corpus, device)
    tokens_per_s, mfu = recorder.speed()
    return {
        "final_train_loss": loss,
        "final_val_loss": val_loss,
        "steps": step,
        "tokens_per_s": tokens_per_s,
        "mfu": mfu,
        "sample": sample,
        "parameters": lmcore.count_parameters(model_config),
        "vocab_size": corpus.vocab_size,
        "val_source": corpus.val_source,
        "records": recorder.records,
        "world_size": world_size,
    }


def _sample(
    config: TrainConfig, model: lmcore.TransformerLM, corpus: Corpus, device: torch.device
) -> str | None:
    """`--generate` tokens after `--prompt`, decoded; None without a tokenizer to decode with."""
    tokenizer = corpus.tokenizer or load_tokenizer(config.tokenizer, config.out)
    if tokenizer is None:
        return None
    prompt = tokenizer.encode(config.prompt)
    if not prompt:
        raise ValueError("--prompt encodes to no tokens; give a non-empty prompt")
    generator = torch.Generator(device).manual_seed(config.seed)
    dtype = PRECISIONS[config.precision]
    with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
        ids = lmcore.generate(
            model,
            prompt,
            config.generate,
            temperature=config.temperature,
            top_p=config.top_p,
            generator=generator,
        )
    return config.prompt + tokenizer.decode(ids.tolist())


# ----------------------------------------------------------------------------- the run


def _write_outputs(config: TrainConfig, result: dict[str, Any], command: str) -> dict[str, Any]:
    out = Path(config.out)
    env = collect_env(config.device, command=command)
    summary = {
        key: result[key]
        for key in ("final_train_loss", "final_val_loss", "steps", "tokens_per_s", "mfu")
    }
    summary |= {
        "stopped_early": result["steps"] < config.steps,
        "parameters": result["parameters"],
        "vocab_size": result["vocab_size"],
        "validation": result["val_source"],
        "world_size": result["world_size"],
        "config": dataclasses.asdict(config),
        "versions": {
            "torch": env["torch"],
            "triton": env["triton"],
            "python": env["python"],
            "cuda": env["cuda"],
        },
        "device_name": env["device_name"],
        "date": env["date"],
        "command": command,
        "git_revision": env["git_revision"],
        "git_dirty": env["git_dirty"],
        "packages": env["packages"],
        "env": env,
    }
    (out / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
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
    return summary


def run_train(config: TrainConfig, *, command: str | None = None) -> dict[str, Any] | None:
    """Check the inputs (`prepare`), train as `config` says, and write the output folder.

    Trains in this process, on `config.nproc` ranks it starts, or as one rank of a `torchrun`
    launch (where only rank 0 checks the inputs first and writes the outputs).

    Returns:
        The summary (see the module docstring); None on the other ranks of a torchrun launch.

    Raises:
        ValueError: bad input, before any training.
    """
    if not under_torchrun() or int(os.environ["RANK"]) == 0:
        prepare(config)
    return _run_checked(config, command=command)


def _run_checked(config: TrainConfig, *, command: str | None) -> dict[str, Any] | None:
    command = command if command is not None else command_line()
    if config.nproc == 1 and config.parallel == "none" and not under_torchrun():
        result = _train(0, 1, config)
    else:
        backend = backend_for(torch.device(config.device))
        result = launch(_train, world_size=config.nproc, backend=backend, args=(config,))[0]
    if under_torchrun() and int(os.environ["RANK"]) != 0:
        return None
    return _write_outputs(config, result, command)


def speed_comparison(
    runs: Sequence[tuple[str, str | Path]], *, baseline: str, command: str | None = None
) -> Run:
    """One table of finished runs' speed side by side, with each run's ratio to `baseline`.

    Args:
        runs: (label, output folder) of runs whose `summary.json` to read, in table order.
        baseline: the label of the run the `vs_baseline` ratios divide by (tokens/s).
        command: the command line to record; the process's own when None.

    Returns:
        A `Run` (tool `"train_speed"`): a row per run with `tokens_per_s`, `mfu`, `vs_baseline`,
        `final_train_loss` and what the run used (attention, compile, optimizer, precision).
        Its environment is the baseline run's (device, versions, date, git revision), so the
        table can be built on any machine from run folders copied off the GPU.

    Raises:
        ValueError: `baseline` is not one of the labels.
    """
    summaries = {label: json.loads((Path(d) / SUMMARY).read_text()) for label, d in runs}
    if baseline not in summaries:
        raise ValueError(f"baseline {baseline!r} is not one of the runs {list(summaries)}")
    reference = summaries[baseline]["tokens_per_s"]
    rows = []
    for label, summary in summaries.items():
        c = summary["config"]
        rows.append(
            {
                "run": label,
                "attention": c["attention"],
                "compile": c["compile"],
                "optimizer": c["optimizer"],
                "step": "torch-native" if c["baseline"] else "bench.core.training",
                "tokens_per_s": summary["tokens_per_s"],
                "mfu": summary["mfu"],
                "vs_baseline": summary["tokens_per_s"] / reference,
                "final_train_loss": summary["final_train_loss"],
            }
        )
    first = summaries[runs[0][0]]
    c = first["config"]
    title = (
        f"bench-train speed: {c['size']}, context {c['context_length']}, batch {c['batch_size']}, "
        f"{c['precision']}, {first['world_size']} rank(s)"
    )
    notes = [
        f"tokens/s and MFU over the steps after the first logged interval of each run; "
        f"vs_baseline = tokens/s over the `{baseline}` run's.",
        "MFU: lmcore.training_flops per step (6·N_matmul + 12·L·T·d per token, PaLM appendix B) "
        "/ step time / the GPU's dense bf16 peak (bench.core.hardware).",
    ]
    return Run.create(
        "train_speed",
        rows,
        device=c["device"],
        config={"runs": {label: str(d) for label, d in runs}, "baseline": baseline},
        command=command,
        title=title,
        notes=notes,
        env=run_env(summaries[baseline]),
    )


def run_env(summary: dict[str, Any]) -> dict[str, Any]:
    """The `collect_env` record of the machine a run's `summary.json` was written on.

    Summaries from before the record was stored whole rebuild the part they kept.
    """
    if "env" in summary:
        return summary["env"]
    device = summary["config"]["device"]
    return {
        "device": device,
        "device_type": torch.device(device).type,
        "device_name": summary["device_name"],
        **summary["versions"],
        "date": summary["date"],
        "command": summary["command"],
        "git_revision": summary["git_revision"],
        "git_dirty": summary["git_dirty"],
        "packages": summary["packages"],
    }


def plot_speed(run: Run, path: str | Path) -> Path:
    """Bars of tokens/s per run of a `speed_comparison`."""
    return hbar_plot(
        run.rows,
        label="run",
        values=(("tokens_per_s", "tokens/s"),),
        path=path,
        title=run.title,
        xlabel="tokens per second (higher is better)",
    )


# ----------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    """The `bench-train` command line."""
    parser = argparse.ArgumentParser(
        prog="bench-train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    data = parser.add_argument_group("data")
    data.add_argument(
        "--data", required=True, help="UTF-8 text file, or .bin (uint16) / .npy tokens"
    )
    data.add_argument(
        "--val-data", help="held-out text or tokens (default: the last 10%% of --data)"
    )
    data.add_argument("--tokenizer", choices=TOKENIZERS, default="bpe", help="bytes or bpe (bpe)")
    data.add_argument(
        "--vocab-size",
        type=int,
        help="BPE vocabulary (10000); for token files the model's vocabulary",
    )
    data.add_argument("--cache-dir", help=f"token cache ({default_cache_dir()})")
    model = parser.add_argument_group("model")
    model.add_argument(
        "--size", choices=list(lmcore.MODEL_SIZES), help=f"model size (small; {CPU_SIZE} on CPU)"
    )
    for name in ("d-model", "num-layers", "num-heads", "d-ff"):
        model.add_argument(f"--{name}", type=int, help="override the size's value")
    model.add_argument("--context-length", type=int, default=256, help="tokens per sequence (256)")
    model.add_argument(
        "--attention",
        choices=list(lmcore.ATTENTION_BACKENDS),
        help="attention backend (fa2-triton on CUDA, sdpa on CPU)",
    )
    train = parser.add_argument_group("training")
    train.add_argument(
        "--batch-size", type=int, default=32, help="sequences per optimizer step, all ranks (32)"
    )
    train.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step (1)")
    train.add_argument("--steps", type=int, default=1000, help="optimizer steps (1000)")
    train.add_argument("--lr", type=float, default=6e-4, help="peak learning rate (6e-4)")
    train.add_argument("--min-lr", type=float, help="learning rate at the end (--lr / 10)")
    train.add_argument(
        "--warmup-steps", type=int, help="linear warm-up steps (a tenth of --steps, at most 100)"
    )
    train.add_argument("--weight-decay", type=float, default=0.1, help="AdamW's, on matrices (0.1)")
    train.add_argument("--grad-clip", type=float, default=1.0, help="max gradient norm; 0: off (1)")
    train.add_argument("--seed", type=int, default=0, help="model initialisation and data (0)")
    train.add_argument("--optimizer", choices=OPTIMIZERS, help="AdamW (lmcore)")
    run = parser.add_argument_group("how to run")
    run.add_argument("--device", default="auto", help="auto, cpu, cuda (auto)")
    run.add_argument("--precision", choices=list(PRECISIONS), help="bf16 autocast (CUDA) or fp32")
    run.add_argument("--compile", action="store_true", help="torch.compile the model")
    run.add_argument("--baseline", choices=BASELINES, help="torch: the torch-native step instead")
    run.add_argument("--parallel", choices=PARALLEL_MODES, help="data parallelism (none; bucketed)")
    run.add_argument("--nproc", type=int, help="ranks to start (1; torchrun's world size)")
    run.add_argument(
        "--bucket-mb",
        dest="bucket_size_mb",
        type=bucket_size_mb,
        default=ddp.DEFAULT_BUCKET_SIZE_MB,
        metavar="MB",
        help=f"DDPBucketed bucket size ({ddp.DEFAULT_BUCKET_SIZE_MB:g}; none: one bucket)",
    )
    out = parser.add_argument_group("output")
    out.add_argument("--out", default="runs/bench-train", help="output folder (runs/bench-train)")
    out.add_argument("--log-every", type=int, default=10, help="steps between metrics (10)")
    out.add_argument(
        "--eval-every", type=int, default=100, help="steps between evals; 0: end (100)"
    )
    out.add_argument("--eval-batches", type=int, default=10, help="batches per evaluation (10)")
    out.add_argument("--save-every", type=int, default=0, help="steps between checkpoints; 0: end")
    out.add_argument("--stop-after", type=int, help="end with a checkpoint after this step")
    out.add_argument("--resume", action="store_true", help="continue from --out's checkpoint")
    out.add_argument("--generate", type=int, default=200, help="tokens to sample at the end (200)")
    out.add_argument("--prompt", default="\n", help="the sample's prompt (a newline)")
    out.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (0.8)")
    out.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass (0.95)")
    out.add_argument("--no-progress", action="store_true", help="log lines instead of a bar")
    out.add_argument(
        "--profile-step", type=int, help=f"torch.profiler around this step, table to {PROFILE}"
    )
    return parser


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The `TrainConfig` of parsed options.

    Raises:
        ValueError: options out of range or that do not go together.
    """
    options = {
        field.name: getattr(args, field.name)
        for field in dataclasses.fields(TrainConfig)
        if hasattr(args, field.name)
    }
    options["progress"] = not args.no_progress
    options["compile"] = args.compile or None
    return TrainConfig.create(**options)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `bench-train` (see the module docstring)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    primary = not under_torchrun() or int(os.environ["RANK"]) == 0
    with usage_errors(parser):  # bad input ends here, as a usage error, before any training
        config = config_from_args(args)
        if primary:
            prepare(config)
    summary = _run_checked(config, command=command_line(argv, prog=parser.prog))
    if summary is not None:
        print(
            f"{summary['steps']} steps: train loss {summary['final_train_loss']:.4f}, "
            f"validation loss {summary['final_val_loss']:.4f}; results in {config.out}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

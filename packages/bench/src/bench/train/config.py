"""bench-train's options, each written once: a field of `TrainConfig` with its default, its help,
its group, and whether a resumed run may change it (its group's rule, or its own).

Everything else is generated from those fields (`bench.core.options`, `bench.train.config_files`):
the command line, the config file a run writes and `--config` reads, the check a resume makes
against its checkpoint. Defaults that depend on the device are a pair (CUDA, CPU) in the field's
option; defaults that follow another option are rules on the class (`warmup`, `final_lr`,
`log_interval`, `eval_interval`, `last_step`) or in `create` (the number of ranks, the parallel
mode, `--baseline`'s settings).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any

import ddp
import lmcore
from bench.core import model_options
from bench.core.cli import bucket_size_mb, resolve_device
from bench.core.layouts import parse_name
from bench.core.loss_scale import DEFAULT_GROWTH_INTERVAL, DEFAULT_INIT_SCALE
from bench.core.options import (
    Group,
    configured,
    flag_of,
    given_values,
    option,
    parse_duration,
)
from bench.core.ranks import DEFAULT_TIMEOUT_S, torchrun_world_size
from bench.core.shapes import CPU_SIZE
from bench.train.choices import BASELINES, PARALLEL_MODES, PRECISIONS
from bench.train.tokenizer import EOT_TEXT, TOKENIZERS

__all__ = ["CONFIG_FILE", "RESUME_AUTO", "TrainConfig"]

# The resolved options a run writes to its `--out` (and `--config` reads back).
CONFIG_FILE = "config.toml"
# `--resume auto`: continue the run in --out if it holds a checkpoint, else start it.
RESUME_AUTO = "auto"
# The default --eval-batches, and its rule: evaluation (a forward per batch) takes at most this
# share of training's work, a backward counted as two forwards (6N against 2N FLOPs a token).
EVAL_BATCHES = 10
EVAL_SHARE = 0.1
BACKWARD_FORWARDS = 2


def _resume_value(text: str) -> str:
    if text != RESUME_AUTO:  # `--resume` alone is True (the option's const)
        raise argparse.ArgumentTypeError(f"--resume takes no value, or {RESUME_AUTO}")
    return text


# The groups, in the order of `--help` and of config files.
DATA = Group("data", "what to train on")
MODEL = Group("model", "the Transformer (lmcore.TransformerLM)")
TRAINING = Group("training", "the optimisation")
_RESUMABLE = "(a resumed run may change these)"
RUN = Group("run", f"how to run: device, speed, ranks, when to stop {_RESUMABLE}", True)
OUTPUT = Group("output", f"what the run writes to --out, and when {_RESUMABLE}", True)
SAMPLING = Group("sampling", f"the sample at the end, and bench-generate's {_RESUMABLE}", True)


@dataclass(frozen=True)
class TrainConfig:
    """Everything a `bench-train` run needs: the options, resolved for the device.

    Build one with `TrainConfig.create(...)`, which fills the defaults that depend on the device
    and on other options, then validates. Each field is the option of the same name (see
    `bench-train --help`, or the `Option` in the field's metadata).
    """

    data: str | None = option(
        None,
        "UTF-8 text file, or .bin (uint16) / .npy tokens (required)",
        group=DATA,
        metavar="FILE",
    )
    val_data: str | None = option(
        None,
        "held-out text or tokens",
        group=DATA,
        default_text="the last 10% of --data",
        metavar="FILE",
    )
    tokenizer: str = option("bpe", "how text becomes tokens", group=DATA, choices=TOKENIZERS)
    pack: bool = option(False, "documents start at the end-of-text token: attention stays in "
                        "each (fa2's varlen kernels), positions restart", group=DATA)  # fmt: skip
    eot_id: int | None = option(None, "a token file's end-of-text id, for --pack", group=DATA,
                                default_text=f"the BPE tokenizer's {EOT_TEXT}")  # fmt: skip
    vocab_size: int | None = option(
        None,
        "BPE vocabulary; for token files the model's vocabulary",
        group=DATA,
        default_text="10000; 256 for bytes",
    )
    cache_dir: str | None = option(
        None,
        "token and tokenizer cache",
        group=DATA,
        may_change=True,
        default_text="$XDG_CACHE_HOME/cs336sys-bench, or ~/.cache/cs336sys-bench",
        metavar="DIR",
    )
    size: str = option(
        "small",
        "model size",
        group=MODEL,
        choices=lambda: list(lmcore.MODEL_SIZES),
        cpu=CPU_SIZE,
    )
    d_model: int | None = option(None, "override the size's width", group=MODEL)
    num_layers: int | None = option(None, model_options.HELP["num_layers"], group=MODEL)
    num_heads: int | None = option(None, "override the size's attention heads", group=MODEL)
    num_kv_heads: int | None = option(
        None, model_options.HELP["num_kv_heads"], group=MODEL, default_text="one per head"
    )
    d_ff: int | None = option(None, "override the size's feed-forward width", group=MODEL)
    context_length: int = option(256, "tokens per sequence", group=MODEL)
    attention: str = option(
        "fa2-triton",
        "attention backend",
        group=MODEL,
        may_change=True,
        choices=lmcore.attention_names,
        cpu="sdpa",
    )
    activation_checkpointing: str = option(
        model_options.DEFAULT_CHECKPOINTING,
        model_options.HELP["activation_checkpointing"],
        group=MODEL,
        may_change=True,
        parse=model_options.checkpointing_spec,
        metavar="SPEC",
    )
    batch_size: int = option(
        32, "sequences per optimizer step, over all ranks and micro-batches", group=TRAINING
    )
    grad_accum: int = option(1, "micro-batches per step", group=TRAINING)
    steps: int = option(1000, "optimizer steps (the schedule's length)", group=TRAINING)
    lr: float = option(6e-4, "peak learning rate", group=TRAINING)
    min_lr: float | None = option(
        None, "learning rate at the last step", group=TRAINING, default_text="--lr / 10"
    )
    warmup_steps: int | None = option(
        None,
        "linear warm-up steps",
        group=TRAINING,
        default_text="a tenth of --steps, at most 100",
    )
    weight_decay: float = option(0.1, "AdamW's, on matrices", group=TRAINING)
    grad_clip: float = option(1.0, "max gradient norm; 0: off", group=TRAINING)
    seed: int = option(0, "model initialisation, data order and sample", group=TRAINING)
    optimizer: str = option(
        "torch-fused", model_options.HELP["optimizer"], group=TRAINING, may_change=True,
        choices=model_options.OPTIMIZERS, cpu="lmcore",
    )  # fmt: skip
    loss: str = option(
        model_options.DEFAULT_LOSS, model_options.HELP["loss"], group=TRAINING, may_change=True,
        choices=model_options.LOSSES,
    )  # fmt: skip
    device: str = option("auto", "auto (CUDA when present), cpu, cuda", group=RUN, metavar="DEVICE")
    precision: str = option(
        "bf16-autocast", "fp32; bf16-autocast: float32 weights, matmuls in bf16 under autocast; "
        "fp16: the same in fp16 with the loss scaled (torch.amp.GradScaler; steps whose "
        "gradients overflow are skipped and counted); bf16: the model stored in bf16",
        group=TRAINING, choices=PRECISIONS, cpu="fp32",
        parse=parse_name(command="bench-train", offered=PRECISIONS),
    )  # fmt: skip
    loss_scale: float = option(
        DEFAULT_INIT_SCALE, "fp16's first loss scale; halved at every overflow, doubled after "
        f"{DEFAULT_GROWTH_INTERVAL} clean steps", group=TRAINING, metavar="SCALE",
        default_text="2^16, torch.amp.GradScaler's",
    )  # fmt: skip
    compile: bool = option(
        True,
        "torch.compile each block (each unit's forward under --parallel fsdp) and the loss; "
        "the first step's time is printed",
        group=RUN,
        cpu=False,
    )
    compile_backend: str = option(
        model_options.DEFAULT_COMPILE_BACKEND, model_options.HELP["compile_backend"], group=RUN,
        choices=model_options.COMPILE_BACKENDS,
    )  # fmt: skip
    baseline: str | None = option(
        None, "run torch's own step instead (SDPA, fused torch AdamW, compiled), to compare speed",
        group=TRAINING, choices=list(BASELINES), default_text="off",
    )  # fmt: skip
    parallel: str | None = option(
        None,
        "data parallelism: ddp (DDPBucketed), the other ddp wrappers, torch DDP, ZeRO-1, "
        "zero.FSDP, torch's FSDP2",
        group=RUN,
        choices=PARALLEL_MODES,
        parse=parse_name(command="bench-train", offered=PARALLEL_MODES),
        default_text="single; ddp with several ranks",
    )
    nproc: int | None = option(
        None,
        "ranks to start (one GPU each on CUDA, gloo on a CPU)",
        group=RUN,
        default_text="1; torchrun's world size under torchrun",
    )
    bucket_size_mb: float | None = option(
        ddp.DEFAULT_BUCKET_SIZE_MB,
        "bucket size (MiB) of DDPBucketed and of ShardedOptimizer's broadcasts; none: one bucket",
        group=RUN,
        flag="bucket-mb",
        parse=bucket_size_mb,
        none="none",
        metavar="MB",
    )
    time_budget: float | None = option(
        None,
        "end cleanly (evaluation, checkpoint, sample) once training has run this long: 20m, "
        "90s, 1h30m",
        group=RUN,
        parse=parse_duration,
        default_text="none",
        metavar="DURATION",
    )
    timeout: float | None = option(
        DEFAULT_TIMEOUT_S,
        "seconds the ranks --nproc starts may take in all before they are stopped (under "
        "torchrun: torchrun's own limits)",
        group=RUN,
        default_text="no limit",
        metavar="S",
    )
    stop_after: int | None = option(
        None,
        "end with a checkpoint after this step (resume later)",
        group=RUN,
        saved=False,
        default_text="--steps",
    )
    resume: bool | str = option(
        False,
        f"continue the run in --out from its checkpoint; {RESUME_AUTO}: if there is one, else "
        "start it (one command for a first start and every restart)",
        group=RUN,
        saved=False,
        parse=_resume_value,
        const=True,
        metavar=RESUME_AUTO,
    )
    overwrite: bool = option(
        False, "replace another run in --out (its files removed first)", group=OUTPUT, saved=False
    )
    out: str = option("runs/bench-train", "output folder", group=OUTPUT, metavar="DIR")
    log_every: int | None = option(
        None,
        "steps between metrics lines",
        group=OUTPUT,
        default_text="a hundredth of --steps, at least 1",
    )
    eval_every: int | None = option(
        None,
        "steps between evaluations; 0: only at the end",
        group=OUTPUT,
        default_text="a tenth of --steps, at least 1",
    )
    eval_batches: int | None = option(None, "batches per evaluation", group=OUTPUT,
                                      default_text=f"{EVAL_BATCHES}, fewer where that is "
                                      f"over {EVAL_SHARE:.0%} of the run")  # fmt: skip
    save_every: int = option(0, "steps between checkpoints; 0: only at the end", group=OUTPUT)
    keep_last: int = option(1, "checkpoints kept: with --save-every, the newest N as "
                            "checkpoint-step<N>.pt too", group=OUTPUT, metavar="N")  # fmt: skip
    export_hf: str | None = option(None, "also write the final model as a Hugging Face Llama "
                                   "checkpoint (safetensors) to DIR", group=OUTPUT,
                                   default_text="none", metavar="DIR")  # fmt: skip
    checkpoint: bool = option(True, "write checkpoints; off: the run cannot resume", group=OUTPUT)
    progress: bool = option(True, "a progress bar (else log lines)", group=OUTPUT)
    profile_step: int | None = option(
        None,
        "torch.profiler around this step: its table to profile.txt, its trace to "
        "profile.pt.trace.json",
        group=OUTPUT,
        default_text="off",
    )
    tensorboard: bool = option(
        False,
        "also log the metrics to --out/tensorboard (needs the tensorboard extra)",
        group=OUTPUT,
    )
    generate: int = option(200, "tokens to sample at the end; 0: none", group=SAMPLING)
    prompt: str = option("\n", "the sample's prompt", group=SAMPLING)
    temperature: float = option(0.8, "sampling temperature; 0: greedy", group=SAMPLING)
    top_p: float = option(0.95, "nucleus sampling mass, in (0, 1]", group=SAMPLING)

    @classmethod
    def create(cls, **options: Any) -> TrainConfig:
        """A validated configuration; options left out (or None) take their defaults.

        `bucket_size_mb=None` is a size (one bucket), not an option left out.

        Raises:
            ValueError: a missing `--data`, an option out of range, or options that do not go
                together.
        """
        from bench.train import parallel  # imports torch, so here and not at the top

        given = given_values(cls, options)
        if given.get("data") is None:
            raise ValueError("give --data FILE (on the command line or in --config)")
        device = resolve_device(given.get("device", "auto"))
        given["device"] = str(device)
        if given.get("baseline") is not None and "loss" in given:
            raise ValueError(f"--baseline {given['baseline']} runs torch's own loss; drop --loss")
        for name, value in BASELINES.get(given.get("baseline"), {}).items():
            if given.setdefault(name, value) != value:
                flag = flag_of(cls, name)
                raise ValueError(f"--baseline {given['baseline']} runs --{flag} {value}; drop it")
        given.setdefault("nproc", torchrun_world_size() or 1)
        given.setdefault("parallel", parallel.default_mode(given["nproc"]))
        config = configured(cls, cuda=device.type == "cuda", **given)
        config.validate()
        return config

    def validate(self) -> None:
        """Check every option alone and together (`bench.train.config_checks`)."""
        from bench.train.config_checks import validate  # imports torch, so here

        validate(self)

    @property
    def eval_batch_count(self) -> int:
        """Batches per evaluation: `--eval-batches`, else `EVAL_BATCHES`, fewer where the
        run's evaluations (forwards) would take more than `EVAL_SHARE` of its training
        (forwards and backwards of every micro-batch), and at least one."""
        if self.eval_batches is not None:
            return self.eval_batches
        every = self.eval_interval
        evaluations = self.steps // every + (self.steps % every != 0) if every else 1
        training = (1 + BACKWARD_FORWARDS) * self.steps * self.grad_accum
        return max(1, min(EVAL_BATCHES, int(EVAL_SHARE * training / evaluations)))

    def model_config(self, *, vocab_size: int) -> lmcore.ModelConfig:
        """The model: the named size with the `--d-model`, ... overrides applied."""
        overrides = ("d_model", "num_layers", "num_heads", "d_ff")
        shape = dataclasses.replace(
            lmcore.MODEL_SIZES[self.size],
            **{k: v for k in overrides if (v := getattr(self, k)) is not None},
        )
        return shape.config(
            context_length=self.context_length,
            vocab_size=vocab_size,
            attention=self.attention,
            num_kv_heads=self.num_kv_heads,
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
    def log_interval(self) -> int:
        """Steps between metrics lines: `--log-every`, else a hundredth of the run, at least 1."""
        return self.log_every if self.log_every is not None else max(1, self.steps // 100)

    @property
    def eval_interval(self) -> int:
        """Steps between evaluations (0: only at the end): `--eval-every`, else a tenth of the
        run, at least 1, so that even a short run draws a validation curve."""
        return self.eval_every if self.eval_every is not None else max(1, self.steps // 10)

    @property
    def last_step(self) -> int:
        """The step this invocation ends after at the latest: `--stop-after`, else `--steps`."""
        return self.stop_after if self.stop_after is not None else self.steps

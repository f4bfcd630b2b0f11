"""bench-step: one full training step of `lmcore.TransformerLM`, ours beside a torch-native one.

The step is the CS336 2026 leaderboard's `train_step`: `optimizer.zero_grad(set_to_none=True)`,
the forward, the mean next-token cross-entropy, `loss.backward()`, the AdamW step
(`bench.tools.step.full_step`). Two kinds of row, from the same model (random weights and tokens):

- `ours`: lmcore's model with the options given: attention backend, `--loss` (the fused LM
  head + cross-entropy, or the full logits), `--optimizer` (lmcore's AdamW, its fused kernel, or
  torch's fused one; each keeps AdamW's moments in the parameters' dtype, bf16 for a bf16
  model, the precision torch's row keeps), `--activation-checkpointing`, `--compile` (each block,
  identical blocks once), and on several ranks `--parallel zero1` (ZeRO-1: `ddp.DDPBucketed`
  with `zero.ShardedOptimizer`; the default) and/or `fsdp` (`zero.apply_fsdp`: a unit per
  block, the embedding and the LM head; each unit's forward compiled, FSDP's hooks outside).
- `torch-native`: what torch's own tools give for the same model: SDPA attention,
  `torch.utils.checkpoint` around the same segments, a compiled chunked cross-entropy (each
  chunk of tokens checkpointed: one chunk's logits at a time), `torch.optim.AdamW(fused=True)`,
  each block compiled, and on several ranks torch's FSDP2 (`fully_shard` per block, then the
  root). It follows ours' rows of the same checkpointing; `time_vs_native` and
  `peak_vs_native` are ours over it.

Per row: the median step time of `triton.testing.do_bench` over the whole step (the
leaderboard's method, with budgets of `--warmup-ms` and `--rep-ms` instead of its 10 s and 30 s;
on several ranks a number of steps all ranks agree on, each step as long as its slowest rank:
two steps set the count and warm up, then at least three are timed; off CUDA the project's
timed loop), the first step's time (compilation included: compiled, each row runs in
processes of its own with Inductor and Triton cache folders of its own, so that no row finds the
kernels an earlier one compiled; under torchrun the rows share its processes), tokens/s, MFU
(against the measured bf16 matmul ceiling of the H100 where known, else the data sheet's peak;
causal attention counted as half the scores, recomputation not at all), the time of each phase
(forward, backward with its recomputation, optimizer) and of the attention (the backend alone
at the step's shape, times the blocks, plus a forward per recomputed block but none under
`selective`), and the peak memory with what it is made of: parameters, gradients,
optimizer state, activations, rest (`bench.tools.step.memory`; the busiest rank's). Out of
memory is a row, not a crash. Rows carry the keys `bench-plan --check` reads, so its
predictions can sit beside these measurements.

`--num-layers fit` takes the most blocks whose step every row fits in the GPU's memory (or
`--memory`) less `--headroom`, by bench-plan's memory model. `--study checkpointing` measures
the bytes one block saves for backward (A) and takes as input (b), asks lmcore's
`memory_optimal_segment_size` for the best k, and runs segments of k − 1, k and k + 1 blocks and
the nested form (the handout's §3.2 problem (b)). `--preset leaderboard-2026` runs the handout's
leaderboard configuration (`lmcore.LEADERBOARD_2026`: the 8B model, context 32,768, batch 2
over 2 ranks, bf16) with our fastest options, every row at torch's precision (bf16 weights,
gradients, reductions and AdamW moments): ours on `zero.FSDP`, ours on ZeRO-1, then the
torch-native FSDP2 row: seven steps a row (the first, compiling one; two that set the count
and warm up; three timed; one instrumented), the fewest the multi-rank timer takes, since the
budgets cover less than one of its steps. `--preset leaderboard-2026-4gpu` is the same step
at batch 4 over 4 ranks, ours on `zero.FSDP` beside FSDP2. Both need their GPUs, each with the
memory bench-plan predicts for ours on `zero.FSDP` and for torch-native, less `--headroom`;
elsewhere they say which row does not fit and print the depth-reduced command (`--num-layers
fit`): on 2 smaller GPUs the preset's two ranks cut to the deepest model they fit, on one GPU
that GPU's share of the batch. The ZeRO-1 row runs where it is predicted to fit too, and is
left out (with a note) where not: on two 80 GB H100s, where its tensors alone would take
69,490 MiB (as measured on H200s). `--memory 80GB` on larger GPUs also caps each rank's
allocator there, so that two H200s show what two H100s would run.

`--profile DIR` shows where each row's step spends its time: after the row's timed steps and
its instrumented one (neither runs under the profiler), one more step on every rank under
`torch.profiler`, its phases (forward, backward, optimizer) marked as ranges. DIR receives per
row and rank a gzipped Chrome/Perfetto trace and a kernel table, and `<DIR name>.json` / `.md`:
per row, rank and phase the kernel time by category (matmul, attention, softmax, elementwise,
communication, optimizer, other; the number of kernels, ms, share), and the phase's wall time
beside its compute kernels' time, the NCCL time and the part of it no compute kernel ran beside
(exposed communication), and the time no kernel ran (`bench.tools.step.profile`). It works with
the preset, on one rank, on several, and on a CPU (gloo; the operators are the work there).

Examples::

    bench-step                                        # GPU: the depth-reduced leaderboard model
    bench-step --size leaderboard-8b --num-layers fit --batch 1 --precision bf16 \\
        --attention fa2-triton --loss fused --optimizer lmcore-fused torch-fused \\
        --activation-checkpointing blocks --compile --json step.json --plot step.png
    bench-step --study checkpointing --size xl --context-length 2048 --batch 4 \\
        --precision bf16-autocast --optimizer torch-fused --no-compile --no-native
    bench-step --preset leaderboard-2026              # 2 GPUs, 80 GB each (H100s) or more
    bench-step --preset leaderboard-2026-4gpu         # 4 GPUs
    bench-step --size small --context-length 512 --batch 8 --nproc 2 --parallel fsdp zero1 \\
        --precision bf16                              # zero.FSDP, ZeRO-1 and torch's FSDP2
    bench-step --preset leaderboard-2026 --profile step_profile  # where each row's time goes

Without a GPU a tiny model runs on the CPU (and says so): fp32, SDPA, not compiled.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import lmcore
from bench.core.cli import Command, add_timeout_arg
from bench.core.layouts import parse_name
from bench.core.model_options import (
    COMPILE_BACKENDS,
    DEFAULT_COMPILE_BACKEND,
    HELP,
    LOSSES,
    OPTIMIZERS,
    checkpointing_spec,
    positive_int,
    with_depth,
)
from bench.core.options import Group, option
from bench.core.ranks import torchrun_world_size
from bench.core.shapes import CPU_SIZE
from bench.plan.fit import memory_argument
from lmcore import MODEL_SIZES, attention_names

__all__ = [
    "COMMAND",
    "CPU_BUDGET_MS",
    "CUDA_BUDGET_MS",
    "DEFAULT_HEADROOM",
    "FIT",
    "PARALLEL",
    "PRECISIONS",
    "PRESETS",
    "STUDIES",
    "StepConfig",
    "add_options",
    "depth_reduced_argv",
    "main",
    "step_given",
]

STUDIES = ("checkpointing",)
# `--precision`: float32; float32 weights under bf16 or (loss-scaled) fp16 autocast; the model
# stored in bf16 (the leaderboard's `torch_dtype`) (`bench.core.layouts` says what each keeps).
PRECISIONS = ("fp32", "bf16-autocast", "fp16", "bf16")
# `--parallel`: ours on several ranks (`bench.core.layouts`): ZeRO-1 or zero.FSDP.
PARALLEL = ("single", "zero1", "fsdp")
# `--num-layers fit`: the deepest model every row fits, by bench-plan's memory model.
FIT = "fit"
# do_bench budgets (ms): the leaderboard's are 10,000 (warm-up) and 30,000 (measurement); a
# CPU's, for a tiny model, are milliseconds.
CUDA_BUDGET_MS = (1000.0, 3000.0)
CPU_BUDGET_MS = (5.0, 20.0)
# Headroom `--num-layers fit` leaves below the memory: the model predicts eager residuals and
# leaves out the CUDA context, cuBLAS workspaces and the allocator's rounding.
DEFAULT_HEADROOM = 0.15
_LEADERBOARD = lmcore.LEADERBOARD_2026
# The handout's leaderboard step (lmcore's `LEADERBOARD_2026`: the model at its own depth,
# vocabulary and context, named here as well so that no device's default replaces them; its
# batch over its GPUs; its precision) with our fastest options:
# fa2, the fused loss, the fused AdamW (bf16 moments, torch's precision), every block
# checkpointed but its attention (`selective`: 0.88x the step time of `blocks`, ours and
# torch's, on 2 H200s: docs/results/step_leaderboard_2xh200_2026-11-28_selective.md; both
# fit 80 GB), compiled; ours on zero.FSDP, then on ZeRO-1, then the torch-native FSDP2 row.
# The 4-GPU variant: the same batch per GPU over 4 ranks (batch 4), ours on zero.FSDP beside
# FSDP2, for the scaling from 2 ranks.
_LEADERBOARD_STEP: dict[str, Any] = {
    "size": _LEADERBOARD.size,
    "num_layers": _LEADERBOARD.model_size.num_layers,
    "context_length": _LEADERBOARD.model_size.context_length,
    "batch": _LEADERBOARD.batch_per_gpu,
    "precision": _LEADERBOARD.precision,
    "attention": ("fa2-triton",),
    "loss": ("fused",),
    "optimizer": ("lmcore-fused",),
    "activation_checkpointing": ("selective",),
    "compile": True,
    "native": True,
}
PRESETS: Mapping[str, dict[str, Any]] = {
    "leaderboard-2026": {
        **_LEADERBOARD_STEP,
        "nproc": _LEADERBOARD.num_gpus,
        "parallel": ("fsdp", "zero1"),
    },
    "leaderboard-2026-4gpu": {**_LEADERBOARD_STEP, "nproc": 4, "parallel": ("fsdp",)},
}
MODEL = Group("model")
OURS = Group("ours (several values multiply; torch-native keeps its own)")
RUN = Group("run")


def _num_layers(text: str) -> int | str:
    return FIT if text == FIT else positive_int(text)


@dataclass(frozen=True)
class StepConfig:
    """What `bench.tools.step.run_step` measures; each field is the option of its name. Tuples
    are sweep dimensions of `ours` (all combinations); each checkpointing gets its torch-native
    row too. The rows' steps (`bench.tools.step.step_specs`) check the options together.

    Raises:
        ValueError: an unknown name, a bad number, or a study that cannot run.
    """

    size: str = option(
        "leaderboard-8b", "model size; its own depth unless --num-layers says otherwise",
        group=MODEL, choices=list(MODEL_SIZES), cpu=CPU_SIZE,
    )  # fmt: skip
    num_layers: int | str | None = option(
        FIT, "blocks, overriding the size's; fit: the most every row fits in the GPU's memory (or "
        "--memory) less --headroom, by bench-plan's model", group=MODEL, parse=_num_layers,
        cpu=None, default_text="fit with CUDA, the size's own on a CPU", metavar="N|fit",
    )  # fmt: skip
    context_length: int | None = option(
        None, "tokens", group=MODEL, parse=positive_int, cpu=64, default_text="the size's own"
    )
    batch: int = option(1, "sequences per rank", group=MODEL, parse=positive_int, cpu=2)
    vocab_size: int | None = option(
        None, "vocabulary", group=MODEL, parse=positive_int, default_text="the size's own"
    )
    num_kv_heads: int | None = option(
        None, HELP["num_kv_heads"], group=MODEL, parse=positive_int, default_text="one per head"
    )
    attention: tuple[str, ...] = option(
        ("fa2-triton",), "ours' attention backends", group=OURS, choices=attention_names,
        cpu=("sdpa",),
    )  # fmt: skip
    loss: tuple[str, ...] = option(("fused",), HELP["loss"], group=OURS, choices=LOSSES)
    optimizer: tuple[str, ...] = option(
        ("lmcore-fused",), HELP["optimizer"], group=OURS, choices=OPTIMIZERS, cpu=("lmcore",)
    )
    activation_checkpointing: tuple[str, ...] = option(
        ("blocks",), HELP["activation_checkpointing"], group=OURS, parse=checkpointing_spec,
        metavar="SPEC",
    )  # fmt: skip
    precision: str = option(
        "bf16", "fp32; bf16-autocast (float32 weights); fp16: autocast in fp16, the loss "
        "scaled (torch.amp.GradScaler, in both steps); bf16: the model built in bf16, the "
        "leaderboard's", group=RUN, choices=PRECISIONS,
        parse=parse_name(command="bench-step", offered=PRECISIONS), cpu="fp32",
    )  # fmt: skip
    compile: bool = option(
        True, "torch.compile each block (under zero.FSDP each unit)", group=RUN, cpu=False
    )
    compile_backend: str = option(
        DEFAULT_COMPILE_BACKEND, HELP["compile_backend"], group=RUN, choices=COMPILE_BACKENDS
    )
    native: bool = option(True, "the torch-native rows", group=RUN)
    nproc: int = option(
        1, "ranks", group=RUN, parse=positive_int, default_text="1; torchrun's under torchrun"
    )
    parallel: tuple[str, ...] = option(
        ("single",), "ours' layouts on several ranks, a row each: zero1, fsdp", group=RUN,
        choices=PARALLEL, parse=parse_name(command="bench-step", offered=PARALLEL),
        default_text="single; zero1 on several ranks",
    )  # fmt: skip
    study: str | None = option(
        None, "checkpointing: k−1, k, k+1 and nested", group=RUN, choices=STUDIES,
        default_text="none",
    )  # fmt: skip
    memory_bytes: int | None = option(
        None, "the memory per GPU: what --num-layers fit fills, the preset's check, and, below "
        "the GPU's, a cap on each rank's allocator (a larger GPU standing in for a smaller)",
        group=RUN, flag="memory", parse=memory_argument,
        default_text="the GPU's", metavar="SIZE",
    )  # fmt: skip
    headroom: float = option(DEFAULT_HEADROOM, "share --num-layers fit leaves free", group=RUN)
    warmup_ms: float = option(
        CUDA_BUDGET_MS[0], "timing warm-up budget", group=RUN, cpu=CPU_BUDGET_MS[0], metavar="MS"
    )
    rep_ms: float = option(
        CUDA_BUDGET_MS[1], "timing measurement budget", group=RUN, cpu=CPU_BUDGET_MS[1],
        metavar="MS",
    )  # fmt: skip
    profile_dir: str | None = option(
        None, "after each row's timed steps, one more step per rank under torch.profiler: "
        "traces, kernel tables and time per kernel category, phase and rank in DIR",
        group=RUN, flag="profile", default_text="none", metavar="DIR",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.size not in lmcore.MODEL_SIZES:
            raise ValueError(
                f"unknown size {self.size!r}; choose one of {', '.join(lmcore.MODEL_SIZES)}"
            )
        sweeps = {
            "attention": (self.attention, tuple(lmcore.ATTENTION_BACKENDS)),
            "loss": (self.loss, LOSSES),
            "optimizer": (self.optimizer, OPTIMIZERS),
            "activation_checkpointing": (self.activation_checkpointing, None),
            "parallel": (self.parallel, PARALLEL),
        }
        for name, (given, allowed) in sweeps.items():
            if not given or (allowed is not None and not set(given) <= set(allowed)):
                raise ValueError(f"{name} must be non-empty, from {allowed}; got {given}")
        if self.study not in (None, *STUDIES):
            raise ValueError(f"study must be one of {STUDIES}, got {self.study!r}")
        if self.num_layers not in (None, FIT) and not (
            isinstance(self.num_layers, int) and self.num_layers >= 1
        ):
            raise ValueError(f"num_layers must be positive or 'fit', got {self.num_layers!r}")
        if self.study and self.num_layers == FIT:
            raise ValueError("--study checkpointing runs a set depth (--num-layers N), not fit")
        if not 0 <= self.headroom < 1:
            raise ValueError(f"--headroom must be in [0, 1), got {self.headroom}")
        self.model_config(self.attention[0])  # a context length, given or the size's own

    def model_config(self, attention: str) -> lmcore.ModelConfig:
        """The model of a row with `attention` (the size's own depth for `fit` until resolved).

        Raises:
            ValueError: no context length, given or the size's own.
        """
        depth = None if self.num_layers == FIT else self.num_layers
        size = with_depth(lmcore.MODEL_SIZES[self.size], depth)
        if self.context_length is None and size.context_length is None:
            raise ValueError(f"size {self.size} has no context length of its own: give one")
        return size.config(
            context_length=self.context_length,
            vocab_size=self.vocab_size,
            attention=attention,
            num_kv_heads=self.num_kv_heads,
        )


def step_given(args: argparse.Namespace, given: dict[str, Any]) -> dict[str, Any]:
    """The fields given, with the rules that follow other options: `--preset`'s fields under
    them; torchrun's ranks; `zero1` on several ranks; a named size at its own depth (CUDA's
    default is `fit`)."""
    given = {**(PRESETS[args.preset] if args.preset else {}), **given}
    if "nproc" not in given and torchrun_world_size():
        given["nproc"] = torchrun_world_size()
    if given.get("nproc", 1) > 1 and "parallel" not in given:
        given["parallel"] = ("zero1",)
    if "size" in given and "num_layers" not in given:
        given["num_layers"] = lmcore.MODEL_SIZES[given["size"]].num_layers
    return given


def depth_reduced_argv(*, num_gpus: int) -> list[str]:
    """The command (argv) that stands in for the leaderboard preset where its GPUs are too small
    (or too few): the preset's model, options and batch per rank, with `--num-layers fit`.

    With the preset's GPUs or more it keeps the preset's ranks and layouts (the deepest model
    two such GPUs fit); with fewer it is one GPU's share of the batch; without a GPU it names
    the memory to fit (`--memory 80GB`), so that it runs as printed.

    Example::

        >>> " ".join(depth_reduced_argv(num_gpus=2)[:5])
        'bench-step --size leaderboard-8b --num-layers fit'
    """
    preset = PRESETS["leaderboard-2026"]
    argv = ["bench-step", "--size", preset["size"], "--num-layers", FIT]
    argv += ["--batch", str(preset["batch"]), "--precision", preset["precision"]]
    argv += ["--attention", *preset["attention"], "--loss", *preset["loss"]]
    argv += ["--optimizer", *preset["optimizer"]]
    argv += ["--activation-checkpointing", *preset["activation_checkpointing"], "--compile"]
    if num_gpus >= preset["nproc"]:
        argv += ["--nproc", str(preset["nproc"]), "--parallel", *preset["parallel"]]
    return argv + ([] if num_gpus else ["--memory", "80GB"])


def add_options(parser: argparse.ArgumentParser) -> None:
    """`--preset` and `--timeout`, the options that are no field of `StepConfig`."""
    run = parser.add_argument_group("preset and time limit")
    run.add_argument(
        "--preset",
        choices=list(PRESETS),
        help="the handout's leaderboard step (on its 2 GPUs, or at batch 4 over 4)",
    )
    add_timeout_arg(run, scope="for all ranks")


def check(args: argparse.Namespace) -> None:
    """The options that exclude each other (before anything heavy is imported)."""
    if getattr(args, "study", None) and getattr(args, "activation_checkpointing", None):
        raise ValueError("--study checkpointing picks the checkpointing itself; drop it")


COMMAND = Command(
    "bench-step",
    __doc__,
    config=StepConfig,
    add_options=add_options,
    run="bench.tools.step:TOOL",
    check=check,
)
main = COMMAND.main

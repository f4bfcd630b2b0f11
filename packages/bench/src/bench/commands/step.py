"""bench-step: one full training step of `lmcore.TransformerLM`, ours beside a torch-native one.

The step is the CS336 2026 leaderboard's `train_step`: `optimizer.zero_grad(set_to_none=True)`,
the forward, the mean next-token cross-entropy, `loss.backward()`, the AdamW step
(`bench.core.full_step`). Two kinds of row, from the same model (random weights and tokens):

- `ours`: lmcore's model with the options given: attention backend, `--loss` (the fused LM
  head + cross-entropy, or the full logits), `--optimizer` (lmcore's AdamW, its fused kernel, or
  torch's fused one), `--activation-checkpointing`, `--compile` (the whole model), and on several
  ranks `--parallel zero1` (ZeRO-1: `ddp.DDPBucketed` with `zero.ShardedOptimizer`; the
  default) or `fsdp` (`zero.FSDP`, a unit per block).
- `torch-native`: what torch's own tools give for the same model: SDPA attention,
  `torch.utils.checkpoint` around the same segments, a compiled chunked cross-entropy (each
  chunk of tokens checkpointed: one chunk's logits at a time), `torch.optim.AdamW(fused=True)`,
  each block compiled, and on several ranks torch's FSDP2 (`fully_shard` per block, then the
  root). It follows ours' rows of the same checkpointing; `time_vs_native` and
  `peak_vs_native` are ours over it.

Per row: the median step time of `triton.testing.do_bench` over the whole step (the
leaderboard's method, with budgets of `--warmup-ms` and `--rep-ms` instead of its 10 s and 30 s;
on several ranks a number of steps all ranks agree on, each step as long as its slowest rank;
off CUDA the project's timed loop), the first step's time (compilation included, from Inductor
and Triton cache folders fresh for the run: kernels an earlier row of the run compiled may be
found there), tokens/s, MFU (against the measured bf16 matmul ceiling of the H100 where known,
else the data sheet's peak; causal attention counted as half the scores, recomputation not at
all), the time of each phase (forward, backward with its recomputation, optimizer) and of the
attention (the backend alone at the step's shape, times the blocks, plus a forward per
recomputed block), and the peak memory with what it is made of: parameters, gradients,
optimizer state, activations, rest (`bench.core.step_memory`; the busiest rank's). Out of
memory is a row, not a crash. Rows carry the keys `bench-plan --check` reads, so its
predictions can sit beside these measurements.

`--num-layers fit` takes the most blocks whose step every row fits in the GPU's memory (or
`--memory`) less `--headroom`, by bench-plan's memory model. `--study checkpointing` measures
the bytes one block saves for backward (A) and takes as input (b), asks lmcore's
`memory_optimal_segment_size` for the best k, and runs segments of k − 1, k and k + 1 blocks and
the nested form (the handout's §3.2 problem (b)). `--preset leaderboard-2026` runs the handout's
leaderboard configuration (the 8B model, context 32,768, batch 2 over 2 ranks, bf16) with our
fastest options; it needs 2 GPUs of at least 140 GB: elsewhere it says so and prints the
depth-reduced command (`--num-layers fit`): on 2 smaller GPUs the preset's two ranks cut to the
deepest model they fit, on one GPU that GPU's share of the batch.

Examples::

    bench-step                                        # GPU: the depth-reduced leaderboard model
    bench-step --size leaderboard-8b --num-layers fit --batch 1 --precision bf16 \\
        --attention fa2-triton --loss fused --optimizer lmcore-fused torch-fused \\
        --activation-checkpointing blocks --compile --json step.json --plot step.png
    bench-step --study checkpointing --size xl --context-length 2048 --batch 4 \\
        --precision bf16-autocast --optimizer torch-fused --no-compile --no-native
    bench-step --preset leaderboard-2026              # 2 GPUs of >= 140 GB each
    bench-step --size small --context-length 512 --batch 8 --nproc 2 --parallel fsdp \\
        --precision bf16-autocast --no-compile        # zero.FSDP beside torch's FSDP2

Without a GPU a tiny model runs on the CPU (and says so): fp32, SDPA, not compiled.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from bench.core.cli import Command, add_timeout_arg
from bench.core.layouts import parse_name
from bench.core.model_options import add_model_options, positive_int
from bench.plan.fit import memory_argument
from lmcore import MODEL_SIZES, attention_names

__all__ = [
    "COMMAND",
    "CUDA_BUDGET_MS",
    "DEFAULT_HEADROOM",
    "FIT",
    "PARALLEL",
    "PRECISIONS",
    "PRESETS",
    "PRESET_RANKS",
    "STUDIES",
    "add_options",
    "depth_reduced_argv",
    "main",
]

STUDIES = ("checkpointing",)
# `--precision`: float32; float32 weights under bf16 autocast; the model stored in bf16 (the
# leaderboard's `torch_dtype`) (`bench.core.layouts` says what each keeps).
PRECISIONS = ("fp32", "bf16-autocast", "bf16")
# `--parallel`: ours on several ranks (`bench.core.layouts`): ZeRO-1 or zero.FSDP.
PARALLEL = ("single", "zero1", "fsdp")
# `--num-layers fit`: the deepest model every row fits, by bench-plan's memory model.
FIT = "fit"
# do_bench budgets (ms): the leaderboard's are 10,000 (warm-up) and 30,000 (measurement).
CUDA_BUDGET_MS = (1000.0, 3000.0)
# Headroom `--num-layers fit` leaves below the memory: the model predicts eager residuals and
# leaves out the CUDA context, cuBLAS workspaces and the allocator's rounding.
DEFAULT_HEADROOM = 0.15
PRESET_RANKS = 2
_LEADERBOARD = MODEL_SIZES["leaderboard-8b"]
# The handout's leaderboard configuration (8B model, context 32,768, batch 2 over 2 ranks, bf16)
# with our fastest options: ZeRO-1 (so the model compiles), fa2, the fused loss and AdamW.
PRESETS: Mapping[str, dict[str, Any]] = {
    "leaderboard-2026": {
        "size": "leaderboard-8b",
        "num_layers": _LEADERBOARD.num_layers,
        "context_length": _LEADERBOARD.context_length,
        "batch": 1,
        "precision": "bf16",
        "attention": ("fa2-triton",),
        "loss": ("fused",),
        "optimizer": ("lmcore-fused",),
        "activation_checkpointing": ("blocks",),
        "compile": True,
        "native": True,
        "nproc": PRESET_RANKS,
        "parallel": "zero1",
    }
}


def depth_reduced_argv(*, num_gpus: int) -> list[str]:
    """The command (argv) that stands in for the leaderboard preset where its GPUs are too small
    (or too few): the preset's model, options and batch per rank, with `--num-layers fit`.

    With `PRESET_RANKS` GPUs or more it keeps the preset's ranks and layout (the deepest model
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
    if num_gpus >= PRESET_RANKS:
        argv += ["--nproc", str(preset["nproc"]), "--parallel", preset["parallel"]]
    return argv + ([] if num_gpus else ["--memory", "80GB"])


def _num_layers(text: str) -> int | str:
    return FIT if text == FIT else positive_int(text)


def add_options(parser: argparse.ArgumentParser) -> None:
    """bench-step's options: the model, ours' options (the shared model options), the run."""
    model = parser.add_argument_group("model")
    model.add_argument(
        "--size",
        choices=list(MODEL_SIZES),
        help="model size (leaderboard-8b with CUDA, tiny on a CPU); its own depth unless "
        "--num-layers says otherwise",
    )
    model.add_argument(
        "--num-layers",
        type=_num_layers,
        metavar="N|fit",
        help="blocks, overriding the size's; fit: the most every row fits in the GPU's memory "
        "(or --memory) less --headroom, by bench-plan's model (the default on CUDA)",
    )
    model.add_argument(
        "--context-length", type=positive_int, metavar="N", help="tokens (the size's own)"
    )
    model.add_argument(
        "--batch", type=positive_int, metavar="N", help="sequences per rank (1; 2 on a CPU)"
    )
    model.add_argument(
        "--vocab-size", type=positive_int, metavar="N", help="vocabulary (the size's own)"
    )
    model.add_argument("--attention", nargs="+", choices=attention_names(), help="ours' backends")
    ours = parser.add_argument_group("ours (several values multiply; torch-native keeps its own)")
    add_model_options(
        ours,
        several=True,
        optimizer=True,
        num_layers=False,
        defaults={
            "activation_checkpointing": "blocks",
            "loss": "fused",
            "optimizer": "lmcore-fused on CUDA, lmcore on a CPU",
        },
    )
    run = parser.add_argument_group("run")
    run.add_argument(
        "--precision",
        type=parse_name(command="bench-step", offered=PRECISIONS),
        choices=PRECISIONS,
        help="fp32; bf16-autocast (float32 weights); bf16: the model built in bf16, the "
        "leaderboard's (the default with CUDA; fp32 on a CPU)",
    )
    run.add_argument(
        "--compile", action=argparse.BooleanOptionalAction, help="torch.compile (on with CUDA)"
    )
    run.add_argument(
        "--native", action=argparse.BooleanOptionalAction, help="the torch-native rows (on)"
    )
    run.add_argument(
        "--nproc", type=positive_int, metavar="N", help="ranks (1; torchrun's under torchrun)"
    )
    run.add_argument(
        "--parallel",
        type=parse_name(command="bench-step", offered=PARALLEL),
        choices=PARALLEL,
        help="ours on several ranks: zero1 (default) or fsdp",
    )
    run.add_argument("--preset", choices=list(PRESETS), help="the handout's leaderboard step")
    run.add_argument("--study", choices=STUDIES, help="checkpointing: k−1, k, k+1 and nested")
    run.add_argument(
        "--memory", type=memory_argument, metavar="SIZE", help="what --num-layers fit fills (80GB)"
    )
    run.add_argument(
        "--headroom",
        type=float,
        metavar="X",
        help=f"share --num-layers fit leaves free ({DEFAULT_HEADROOM})",
    )
    run.add_argument(
        "--warmup-ms",
        type=float,
        metavar="MS",
        help=f"timing warm-up budget ({CUDA_BUDGET_MS[0]:g} with CUDA)",
    )
    run.add_argument(
        "--rep-ms",
        type=float,
        metavar="MS",
        help=f"timing measurement budget ({CUDA_BUDGET_MS[1]:g} with CUDA)",
    )
    add_timeout_arg(run, scope="for all ranks")


def check(args: argparse.Namespace) -> None:
    """The options that exclude each other (before anything heavy is imported)."""
    if args.study and args.activation_checkpointing:
        raise ValueError("--study checkpointing picks the checkpointing itself; drop it")


COMMAND = Command(
    "bench-step", __doc__, add_options=add_options, run="bench.tools.step:TOOL", check=check
)
main = COMMAND.main

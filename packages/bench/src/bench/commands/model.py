"""bench-model: end-to-end timing of `lmcore.TransformerLM` (the handout's §1.1.3 to §1.1.6).

A model of a named size (Table 1: small … 2.7B) or of explicit dimensions, random weights, a
random batch (default 4 sequences, vocabulary 10,000), run in one or more modes:

- `forward`: the forward pass alone, under `torch.no_grad()` (inference).
- `forward-backward`: forward with the cross-entropy loss, then backward.
- `train-step`: forward, backward and an `lmcore.AdamW` step.

Each configuration gets `--warmup` untimed steps and `--steps` timed ones; the device is
synchronised around every timed region (forward, backward, optimizer), so each is timed on its
own and a step is their sum. Reported: mean ± std per region and per step, the first timed step,
tokens per second, peak memory (CUDA), and MFU where the device's peak is known (the assumed peak
is in the notes; FLOPs from `lmcore.forward_flops` / `training_flops`).

Options multiply: several `--size`, `--context-length`, `--mode`, `--precision` (fp32, or
bf16-autocast), `--attention`, `--compile both`, `--activation-checkpointing` (lmcore's forms: none,
blocks, every:K, segments:K, nested, nested:K), `--loss` (materialized or fused: lmcore's LM head +
cross-entropy without the logits) and `--optimizer` (lmcore, lmcore-fused, torch-fused; the
train step's AdamW) run every combination (the loss only in the training modes, the optimizer
only in the train step). `--num-layers N` overrides the sizes' depth (a depth-reduced model) and
`--num-kv-heads N` gives grouped-query attention; the vocabulary is the size's own (10,000, or
the leaderboard model's 151,936) unless `--vocab-size` says otherwise. `--nvtx` marks warm-up,
steps, forward/backward/optimizer and, inside attention, scores/softmax/output for Nsight
Systems. `--memory-snapshot PATH` records the allocator's history over the timed steps and writes
the pickle (for pytorch.org/memory_viz) and a PNG timeline made here. `--profile DIR` runs the
timed steps under `torch.profiler` and writes, per configuration, a Chrome/Perfetto trace
(`<configuration>.pt.trace.json`) and kernel tables (`<configuration>_kernels.md`), plus
`DIR/<DIR name>.json`, a run of tool `profile` that bench-report reads: CUDA kernels only (CPU
operators without a GPU), ranked by total time per phase (forward, backward, optimizer, whole
step) with the share of matmuls, softmax, elementwise kernels and the optimizer, and the
`record_function` ranges reported separately, as ranges: softmax against the two matmuls inside
naive attention comes from the same profile (see `bench.core.profiling`).
`--warmup-study` re-runs the configuration in fresh processes with 0, 1, 2 and 5 warm-up steps.
`--study residuals` measures what one TransformerBlock of each size saves for backward (the
handout's §2.1.6 (f) and §3.1): the bytes by operation, the five largest with their share, with
and without activation checkpointing, and the gradient bytes the block produces in backward
(`bench.core.saved_tensors`; no GPU or Nsight needed). Examples::

    bench-model --size small --context-length 128 256 --mode forward train-step \\
        --precision fp32 bf16-autocast
    bench-model --size xl --context-length 128 2048 --mode forward train-step --warmup 1 \\
        --steps 1 --memory-snapshot memory.pickle
    bench-model --size small --context-length 256 --mode forward train-step --profile profile
    bench-model --size xl --context-length 128 2048 --precision fp32 bf16-autocast \\
        --study residuals
    bench-model --size xl --context-length 2048 --batch 4 --precision bf16-autocast \\
        --mode train-step \\
        --attention fa2-triton --activation-checkpointing none blocks segments:2 nested \\
        --loss fused --optimizer lmcore-fused
    bench-model --size leaderboard-8b --num-layers 4 --context-length 8192 --batch 1 \\
        --precision bf16-autocast --attention fa2-triton --mode forward-backward \\
        --loss materialized fused

Without a GPU a tiny model runs on the CPU by default (and says so).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.core.cli import Command, add_timing_args
from bench.core.layouts import parse_name
from bench.core.model_options import DEFAULT_CHECKPOINTING, DEFAULT_LOSS, add_model_options
from lmcore import DEFAULT_ATTENTION, MODEL_SIZES, VOCAB_SIZE, attention_names

__all__ = ["COMMAND", "MODES", "PRECISIONS", "STUDIES", "WARMUP_STUDY", "add_options", "main"]

MODES = ("forward", "forward-backward", "train-step")
# float32 throughout, or float32 weights with the forward and loss under bf16 autocast
# (`bench.core.layouts` says what each keeps).
PRECISIONS = ("fp32", "bf16-autocast")
WARMUP_STUDY = (0, 1, 2, 5)  # the handout's §2.1.3 (c)
STUDIES = ("residuals",)


def add_options(parser: argparse.ArgumentParser) -> None:
    """bench-model's options: the model, the run, the timing and the profiling."""
    model = parser.add_argument_group("model")
    model.add_argument("--size", nargs="+", choices=list(MODEL_SIZES), help="named sizes")
    model.add_argument(
        "--d-model", type=int, help="explicit width (with --d-ff, --num-heads, --num-layers)"
    )
    model.add_argument("--d-ff", type=int, help="explicit feed-forward width")
    model.add_argument("--num-heads", type=int, help="explicit head count")
    model.add_argument("--name", default="custom", help="table name of explicit dimensions")
    model.add_argument("--context-length", type=int, nargs="+", help="sequence lengths")
    model.add_argument("--batch", type=int, help="batch size (4)")
    model.add_argument(
        "--vocab-size", type=int, help=f"vocabulary (the size's own: {VOCAB_SIZE:,} for most)"
    )
    model.add_argument(
        "--attention",
        nargs="+",
        choices=attention_names(),
        help=f"backends ({DEFAULT_ATTENTION})",
    )
    add_model_options(
        model,
        several=True,
        optimizer=True,
        defaults={
            "activation_checkpointing": DEFAULT_CHECKPOINTING,
            "loss": DEFAULT_LOSS,
            "optimizer": "lmcore",
        },
    )
    run = parser.add_argument_group("run")
    run.add_argument("--mode", nargs="+", choices=MODES, help="modes (all three)")
    run.add_argument(
        "--precision",
        "--dtype",  # its name before the one vocabulary
        dest="dtype",
        nargs="+",
        type=parse_name(command="bench-model", offered=PRECISIONS),
        choices=PRECISIONS,
        help="fp32 and/or bf16-autocast (fp32)",
    )
    run.add_argument("--compile", choices=["off", "on", "both"], help="torch.compile (off)")
    add_timing_args(parser, warmup=None, steps=None)
    tools = parser.add_argument_group("profiling")
    tools.add_argument("--nvtx", action="store_true", help="NVTX ranges for Nsight Systems")
    tools.add_argument("--memory-snapshot", type=Path, metavar="PATH", help="allocator pickle")
    tools.add_argument(
        "--profile", type=Path, metavar="DIR", help="torch.profiler traces and kernel tables"
    )
    tools.add_argument(
        "--study",
        choices=STUDIES,
        help="residuals: what one block saves for backward, by operation (no timing)",
    )
    tools.add_argument(
        "--warmup-study",
        type=int,
        nargs="*",
        metavar="W",
        help="re-run in fresh processes with these warm-up counts "
        f"({' '.join(map(str, WARMUP_STUDY))} when none given)",
    )


COMMAND = Command("bench-model", __doc__, add_options=add_options, run="bench.tools.model:TOOL")
main = COMMAND.main

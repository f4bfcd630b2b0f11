"""bench-train-results' implementation: result files for `docs/results/` from finished
`bench-train` runs; its command line is `bench.commands.train_results`.

Three kinds, each `.md` + `.json` + `.png` under the standard names (`result_stem`):

- `train_text_<device>_<date>`: one real-text run: its summary and metrics, the loss curve,
  the best validation loss and where it fell, the generated sample, and (`--text-baseline`)
  its speed beside the same command's under `--baseline torch`;
- `train_speed_<device>_<date>`: several short runs side by side (`speed_comparison`), each
  run's ratio to a baseline run, and the profiler table of one step when a run wrote one;
- `train_scaling_<devices>_<date>`: runs of the same training on one rank and on several:
  tokens/s, scaling efficiency, peak memory and the losses against the one-rank run's
  (`bench.train.scaling`).

Everything is read from the run folders (`summary.json`, `metrics.jsonl`, `loss.png`,
`sample.txt`, `profile.txt`), so the files can be built on any machine from folders copied off
the GPU. Only `--measure-ceiling` needs CUDA: it times a bf16 matmul on this GPU, the ceiling a
step made only of matmuls would meet. Usage (also `python -m bench train-results`)::

    bench-train-results --out docs/results --text RUN --text-baseline RUN_UNDER_BASELINE \\
        --speed default=RUN_A torch-baseline=RUN_B --baseline torch-baseline \\
        --scaling one-gpu=RUN_1 fsdp=RUN_2

The run folders are read by `bench.train.summary` (`speed_comparison` builds the speed table,
`plot_speed` its bars).
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.core.cli import usage_errors
from bench.core.hardware import peak_tflops
from bench.core.results import code_line, result_stem, save_csv, save_json
from bench.train.record import PROFILE, read_metrics
from bench.train.run import LOSS_PLOT, SAMPLE
from bench.train.summary import plot_speed, read_summary, run_env, speed_comparison

__all__ = [
    "matmul_tflops",
    "run_parsed",
    "speed_result",
    "text_result",
    "text_title",
]


def text_title(summary: dict[str, Any]) -> str:
    """What a real-text run trained, in one line: data, size, context, batch, precision,
    attention, tokenizer and steps (the title of its `train_text_*` result)."""
    c = summary["config"]
    return (
        f"bench-train on {Path(c['data']).name}: {c['size']}, context {c['context_length']}, "
        f"batch {c['batch_size']}, {c['precision']}, {c['attention']}, {c['tokenizer']} "
        f"tokens, {summary['steps']} steps"
    )


def text_result(
    run: str | Path,
    out: str | Path,
    *,
    baseline: str | Path | None = None,
    notes: Sequence[str] = (),
) -> Path:
    """Write `train_text_*` for the run folder `run` under `out`; returns the `.md` path.

    Args:
        run: the run's folder.
        out: the results folder.
        baseline: the folder of the same command run with `--baseline torch`, whose tokens/s
            the run's is compared with.
        notes: sentences to add (e.g. what else ran on the machine).
    """
    folder, out = Path(run), Path(out)
    summary, metrics = read_summary(folder), read_metrics(folder)
    env = run_env(summary)
    stem = out / result_stem("train_text", env)
    record = {"summary": summary, "metrics": metrics, "notes": list(notes)}
    stem.with_suffix(".json").write_text(json.dumps(record))
    shutil.copyfile(folder / LOSS_PLOT, stem.with_suffix(".png"))
    c, mfu = summary["config"], summary["mfu"]
    evaluated = [m for m in metrics if m.get("val_loss") is not None]
    best = min(evaluated, key=lambda m: m["val_loss"])
    if mfu is not None:
        mfu_text = f"{mfu:.1%}"
    elif env.get("device_type") == "cpu":
        mfu_text = "not measured on a CPU"
    else:
        mfu_text = "unknown (GPU not in the peak table)"
    parts = [
        f"### {text_title(summary)}",
        f"Device: {env['device_name']}; torch {env['torch']}, triton {env['triton']}; "
        f"{env['date']}. Command: `{env['command']}`. {code_line(env)}",
        f"- final train loss {summary['final_train_loss']:.4f}, validation loss "
        f"{summary['final_val_loss']:.4f} ({summary['validation']}); lowest validation loss "
        f"{best['val_loss']:.4f} at step {best['step']}",
        f"- {summary['parameters']:,} parameters, vocabulary {summary['vocab_size']:,}",
        f"- {summary['tokens_per_s']:,.0f} tokens/s, MFU {mfu_text} (after the first logged "
        f"interval; evaluation time left out); compile {_shown(c['compile'])}, optimizer "
        f"{c['optimizer']}, first step {_seconds(summary.get('first_step_s'))}",
        *([] if baseline is None else [_against(summary, read_summary(baseline))]),
        *(f"- {note}" for note in notes),
        f"![loss]({stem.with_suffix('.png').name})",
        f"Sample ({c['generate']} tokens after the prompt {c['prompt']!r}, temperature "
        f"{c['temperature']}, top-p {c['top_p']}):",
        "```text\n" + (folder / SAMPLE).read_text() + "\n```",
    ]
    stem.with_suffix(".md").write_text("\n\n".join(parts) + "\n")
    return stem.with_suffix(".md")


def _shown(flag: bool) -> str:
    return "on" if flag else "off"


def _seconds(value: float | None) -> str:
    return "not recorded" if value is None else f"{value:.1f} s"


def _against(summary: dict[str, Any], theirs: dict[str, Any]) -> str:
    """The run's tokens/s beside the same command's under `--baseline torch`."""
    ratio = summary["tokens_per_s"] / theirs["tokens_per_s"]
    return (
        f"- the same command with `--baseline torch` (torch's own step: SDPA, fused "
        f"torch.optim.AdamW, compiled) ran at {theirs['tokens_per_s']:,.0f} tokens/s: this run "
        f"is {ratio:.2f}× that (final train loss there {theirs['final_train_loss']:.4f})"
    )


def matmul_tflops(n: int = 8192, calls: int = 20) -> float:
    """TFLOP/s of a bf16 n×n×n `torch.matmul` on the current CUDA device."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        a @ a
    end.record()
    torch.cuda.synchronize()
    return 2 * n**3 * calls / (start.elapsed_time(end) / 1e3) / 1e12


def speed_result(
    runs: Sequence[tuple[str, str | Path]],
    out: str | Path,
    *,
    baseline: str,
    ceiling_tflops: float | None = None,
    notes: Sequence[str] = (),
    topic: str = "train_speed",
) -> Path:
    """Write `<topic>_*` for the (label, run folder) pairs under `out`; returns the `.md`.

    Args:
        runs: the runs in table order; the rows are sorted fastest first.
        out: the results folder.
        baseline: the label whose tokens/s the ratios divide by.
        ceiling_tflops: a bf16 matmul's TFLOP/s measured on the same GPU (`matmul_tflops`).
        notes: sentences to add (e.g. how the runs were scheduled).
        topic: the files' name before the device and date (`result_stem`).
    """
    run = speed_comparison(runs, baseline=baseline)
    run.notes.extend(notes)
    name = run.env["device_name"]
    peak = peak_tflops(name, "bf16")
    if ceiling_tflops and peak:
        run.notes.append(
            f"Matmul ceiling: a bf16 8192³ torch.matmul runs at {ceiling_tflops:.0f} TFLOP/s on "
            f"this GPU, {ceiling_tflops / peak:.1%} of the {peak:g} TFLOP/s peak: the MFU a step "
            "made only of such matmuls would show."
        )
    run.rows.sort(key=lambda r: -r["tokens_per_s"])
    stem = Path(out) / result_stem(topic, run.env)
    run.plots.append(plot_speed(run, stem.with_suffix(".png")).name)
    save_json(run, stem.with_suffix(".json"))
    save_csv(run, stem.with_suffix(".csv"))
    text = run.to_markdown()
    for label, folder in runs:
        profile = Path(folder) / PROFILE
        if profile.is_file():
            text += f"\n\nOne step of `{label}` under torch.profiler:\n\n```text\n"
            text += profile.read_text() + "```"
    stem.with_suffix(".md").write_text(text + "\n")
    return stem.with_suffix(".md")


def run_parsed(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    argv: Sequence[str] | None = None,
) -> int:
    """What `bench-train-results` runs once its options have parsed
    (`bench.commands.train_results`): write the result files asked for and print their tables;
    the exit status (0)."""
    if args.measure_ceiling and not torch.cuda.is_available():
        parser.error("--measure-ceiling needs a CUDA device")
    args.out.mkdir(parents=True, exist_ok=True)
    # A folder that is no finished run, a repeated label, runs that do not compare: usage
    # errors naming them (`bench.train.summary.read_summaries`).
    with usage_errors(parser):
        if args.text is not None:
            print(text_result(args.text, args.out, baseline=args.text_baseline, notes=args.note))
        if args.speed:
            ceiling = matmul_tflops() if args.measure_ceiling else None
            print(speed_result(args.speed, args.out, baseline=args.baseline,
                               ceiling_tflops=ceiling, notes=args.note,
                               topic=args.speed_topic))  # fmt: skip
        if args.scaling:
            from bench.train.scaling import scaling_result  # imported on use: the table's own

            print(scaling_result(args.scaling, args.out, notes=args.note))
        if args.precision:
            from bench.train.precisions import precision_result  # imported on use: the table's own

            print(precision_result(args.precision, args.out, notes=args.note))
    return 0

"""Result files for `docs/results/` from finished `bench-train` runs.

Two kinds, each `.md` + `.json` + `.png` under the standard names (`result_stem`):

- `train_text_<device>_<date>`: one real-text run: its summary and metrics, the loss curve,
  the best validation loss and where it fell, and the generated sample;
- `train_speed_<device>_<date>`: several short runs side by side (`speed_comparison`), each
  run's ratio to a baseline run, and the profiler table of one step when a run wrote one.

Everything is read from the run folders (`summary.json`, `metrics.jsonl`, `loss.png`,
`sample.txt`, `profile.txt`), so the files can be built on any machine from folders copied off
the GPU. Only `--measure-ceiling` needs CUDA: it times a bf16 matmul on this GPU, the ceiling a
step made only of matmuls would meet. Usage (also `python -m bench.train_results`)::

    bench-train-results --out docs/results --text RUN \\
        --speed fa2-triton=RUN_A torch-baseline=RUN_B --baseline torch-baseline
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch

from bench.core.hardware import peak_tflops
from bench.core.results import result_stem, save_json
from bench.tools.train import plot_speed, run_env, speed_comparison

__all__ = ["matmul_tflops", "speed_result", "text_result"]


def text_result(run: str | Path, out: str | Path) -> Path:
    """Write `train_text_*` for the run folder `run` under `out`; returns the `.md` path."""
    folder, out = Path(run), Path(out)
    summary = json.loads((folder / "summary.json").read_text())
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    stem = out / result_stem("train_text", run_env(summary))
    stem.with_suffix(".json").write_text(json.dumps({"summary": summary, "metrics": metrics}))
    shutil.copyfile(folder / "loss.png", stem.with_suffix(".png"))
    c, mfu = summary["config"], summary["mfu"]
    evaluated = [m for m in metrics if m.get("val_loss") is not None]
    best = min(evaluated, key=lambda m: m["val_loss"])
    mfu_text = "unknown (GPU not in the peak table)" if mfu is None else f"{mfu:.1%}"
    parts = [
        f"### bench-train on {Path(c['data']).name}: {c['size']}, context {c['context_length']}, "
        f"batch {c['batch_size']}, {c['precision']}, {c['attention']}, {c['tokenizer']} "
        f"tokens, {summary['steps']} steps",
        f"Device: {summary['device_name']}; torch {summary['versions']['torch']}, triton "
        f"{summary['versions']['triton']}; {summary['date']}; git {summary['git_revision']} "
        f"(uncommitted changes: {summary['git_dirty']}). Command: `{summary['command']}`",
        f"- final train loss {summary['final_train_loss']:.4f}, validation loss "
        f"{summary['final_val_loss']:.4f} ({summary['validation']}); lowest validation loss "
        f"{best['val_loss']:.4f} at step {best['step']}",
        f"- {summary['parameters']:,} parameters, vocabulary {summary['vocab_size']:,}",
        f"- {summary['tokens_per_s']:,.0f} tokens/s, MFU {mfu_text} (after the first logged "
        "interval; evaluation time left out)",
        f"![loss]({stem.with_suffix('.png').name})",
        f"Sample ({c['generate']} tokens after the prompt {c['prompt']!r}, temperature "
        f"{c['temperature']}, top-p {c['top_p']}):",
        "```text\n" + (folder / "sample.txt").read_text() + "\n```",
    ]
    stem.with_suffix(".md").write_text("\n\n".join(parts) + "\n")
    return stem.with_suffix(".md")


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
) -> Path:
    """Write `train_speed_*` for the (label, run folder) pairs under `out`; returns the `.md`.

    Args:
        runs: the runs in table order; the rows are sorted fastest first.
        out: the results folder.
        baseline: the label whose tokens/s the ratios divide by.
        ceiling_tflops: a bf16 matmul's TFLOP/s measured on the same GPU (`matmul_tflops`).
        notes: sentences to add (e.g. how the runs were scheduled).
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
    stem = Path(out) / result_stem("train_speed", run.env)
    run.plots.append(plot_speed(run, stem.with_suffix(".png")).name)
    save_json(run, stem.with_suffix(".json"))
    text = run.to_markdown()
    for label, folder in runs:
        profile = Path(folder) / "profile.txt"
        if profile.is_file():
            text += f"\n\nOne step of `{label}` under torch.profiler:\n\n```text\n"
            text += profile.read_text() + "```"
    stem.with_suffix(".md").write_text(text + "\n")
    return stem.with_suffix(".md")


def _labelled(value: str) -> tuple[str, str]:
    label, sep, folder = value.partition("=")
    if not sep or not label or not folder:
        raise argparse.ArgumentTypeError(f"expected LABEL=RUN_FOLDER, got {value!r}")
    return label, folder


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(
        prog="bench-train-results",
        description="Result files (Markdown, JSON, PNG) from finished bench-train run folders.",
    )
    parser.add_argument("--out", type=Path, required=True, help="results folder")
    parser.add_argument("--text", type=Path, help="a real-text run's folder: train_text_*")
    parser.add_argument(
        "--speed", nargs="+", type=_labelled, default=[], metavar="LABEL=RUN",
        help="runs for the speed table, in order: train_speed_*",
    )  # fmt: skip
    parser.add_argument("--baseline", help="the --speed label the ratios divide by")
    parser.add_argument(
        "--measure-ceiling", action="store_true", help="time a bf16 matmul here (needs CUDA)"
    )
    parser.add_argument("--note", action="append", default=[], help="a sentence for the table")
    args = parser.parse_args(argv)
    if args.speed and args.baseline is None:
        parser.error("--speed needs --baseline LABEL")
    if args.measure_ceiling and not torch.cuda.is_available():
        parser.error("--measure-ceiling needs a CUDA device")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.text is not None:
        print(text_result(args.text, args.out))
    if args.speed:
        ceiling = matmul_tflops() if args.measure_ceiling else None
        try:
            print(speed_result(args.speed, args.out, baseline=args.baseline,
                               ceiling_tflops=ceiling, notes=args.note))  # fmt: skip
        except ValueError as exc:
            parser.error(str(exc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

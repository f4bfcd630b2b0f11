#!/usr/bin/env bash
# bench-train on one GPU: a real-text run and the speed table, results for docs/results.
#
#   packages/bench/scripts/train_gpu.sh TEXT_FILE OUT_DIR
#
# (a) trains `small` at context 256 in bf16 with fa2-triton for STEPS steps (eval every 200,
#     a generated sample at the end): train_text_<device>_<date>.{md,json,png};
# (b) the speed table: `small` at context 512, batch BATCH, bf16, fa2-triton and sdpa, eager and
#     compiled, beside `--baseline torch` (SDPA + torch.optim.AdamW(fused=True) + compile), SPEED_STEPS
#     steps each, with a torch.profiler table of one step of fa2-triton eager and the bf16 matmul
#     ceiling measured on the same GPU: train_speed_<device>_<date>.{md,json,png}.
# Runs from the repository root without installing (PYTHONPATH = every package's src/). The run
# folders (checkpoints) go to RUNS (a temporary folder by default); OUT_DIR gets only results.
# PARTS=a or PARTS=b runs one part alone (both by default), e.g. under a per-command time limit.
set -euo pipefail

TEXT=${1:?usage: train_gpu.sh TEXT_FILE OUT_DIR}
OUT=${2:?usage: train_gpu.sh TEXT_FILE OUT_DIR}
STEPS=${STEPS:-2500}
BATCH=${BATCH:-64}
SPEED_STEPS=${SPEED_STEPS:-30}
PARTS=${PARTS:-ab}
RUNS=${RUNS:-$(mktemp -d)}
PYTHONPATH=$(ls -d "$PWD"/packages/*/src | paste -sd:)${PYTHONPATH:+:$PYTHONPATH}
export PYTHONPATH
mkdir -p "$OUT"
CACHE="$RUNS/cache"
# BPE needs the `tokenizers` library; without it every run uses the UTF-8 bytes (and says so).
TOKENIZER=${TOKENIZER:-bpe}
if ! python3 -c "import tokenizers" 2>/dev/null; then
  echo "no tokenizers library here: --tokenizer bytes" >&2
  TOKENIZER=bytes
fi
train() {
  python3 -m bench.train --data "$TEXT" --tokenizer "$TOKENIZER" --cache-dir "$CACHE" \
    --no-progress "$@"
}

# (a) the real-text run
[[ $PARTS == *a* ]] && train --size small --context-length 256 --batch-size 32 --precision bf16 \
  --attention fa2-triton --steps "$STEPS" --log-every 50 --eval-every 200 --eval-batches 20 \
  --generate 300 --out "$RUNS/text"

# (b) the speed table: the same tokenizer (from the cache), short runs
SPEED=(--size small --context-length 512 --batch-size "$BATCH" --precision bf16
  --steps "$SPEED_STEPS" --log-every 10 --eval-every 0 --eval-batches 1 --generate 0)
labels=()
run_speed() {  # label, options...; a run that fails is reported and left out of the table
  local label=$1; shift
  if train "${SPEED[@]}" --out "$RUNS/speed-$label" "$@"; then labels+=("$label")
  else echo "speed run $label failed" >&2; fi
}
if [[ $PARTS == *b* ]]; then
  run_speed fa2-triton --attention fa2-triton --profile-step $((SPEED_STEPS - 5))
  run_speed fa2-triton-compile --attention fa2-triton --compile
  run_speed sdpa --attention sdpa
  run_speed sdpa-compile --attention sdpa --compile
  run_speed torch-baseline --baseline torch
fi

python3 - "$OUT" "$RUNS" "${labels[@]+"${labels[@]}"}" <<'PY'
import datetime
import json
import re
import shutil
import sys
from pathlib import Path

import torch

from bench.core.hardware import peak_tflops
from bench.core.results import save_json
from bench.tools.train import plot_speed, speed_comparison

out, runs, labels = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
name = torch.cuda.get_device_name()
match = re.search(r"[AHB]\d{3}", name)
device = match.group(0).lower() if match else re.sub(r"[^a-z0-9]+", "-", name.lower())
date = datetime.date.today().isoformat()


def text_run(folder: Path) -> None:
    """(a): summary and metrics as JSON, the loss curve, the numbers and the sample in Markdown."""
    summary = json.loads((folder / "summary.json").read_text())
    stem = out / f"train_text_{device}_{date}"
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    metrics = [json.loads(line) for line in lines]
    stem.with_suffix(".json").write_text(json.dumps({"summary": summary, "metrics": metrics}))
    shutil.copyfile(folder / "loss.png", stem.with_suffix(".png"))
    c, mfu = summary["config"], summary["mfu"]
    mfu_text = "unknown (GPU not in the peak table)" if mfu is None else f"{mfu:.1%}"
    parts = [
        f"### bench-train on {Path(c['data']).name}: {c['size']}, context {c['context_length']}, "
        f"batch {c['batch_size']}, {c['precision']}, {c['attention']}, {summary['steps']} steps",
        f"Device: {summary['device_name']}; torch {summary['versions']['torch']}, triton "
        f"{summary['versions']['triton']}; {summary['date']}; git {summary['git_revision']} "
        f"(dirty: {summary['git_dirty']}). Command: `{summary['command']}`",
        f"- final train loss {summary['final_train_loss']:.4f}, validation loss "
        f"{summary['final_val_loss']:.4f} ({summary['validation']}); "
        f"{summary['parameters']:,} parameters, vocabulary {summary['vocab_size']:,}",
        f"- {summary['tokens_per_s']:,.0f} tokens/s, MFU {mfu_text}",
        f"![loss]({stem.with_suffix('.png').name})",
        f"Sample ({c['generate']} tokens after the prompt, temperature {c['temperature']}):",
        "```text\n" + (folder / "sample.txt").read_text() + "\n```",
    ]
    stem.with_suffix(".md").write_text("\n\n".join(parts) + "\n")


def matmul_tflops(n: int = 8192, calls: int = 20) -> float:
    """TFLOP/s of a bf16 n×n×n torch.matmul on this GPU: the ceiling a matmul-bound step meets."""
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


def speed_table() -> None:
    """(b): the speed runs side by side, the matmul ceiling, one step's profile."""
    run = speed_comparison(
        [(label, runs / f"speed-{label}") for label in labels], baseline="torch-baseline"
    )
    ceiling, peak = matmul_tflops(), peak_tflops(name, "bf16")
    if peak:
        run.notes.append(
            f"Matmul ceiling: a bf16 8192³ torch.matmul runs at {ceiling:.0f} TFLOP/s here, "
            f"{ceiling / peak:.1%} of the {peak:g} TFLOP/s peak: the MFU a step made only of "
            "such matmuls would show."
        )
    run.rows.sort(key=lambda r: -r["tokens_per_s"])
    stem = out / f"train_speed_{device}_{date}"
    run.plots.append(plot_speed(run, stem.with_suffix(".png")).name)
    save_json(run, stem.with_suffix(".json"))
    text = run.to_markdown()
    profile = runs / "speed-fa2-triton" / "profile.txt"
    if profile.is_file():
        text += "\n\nOne step of fa2-triton eager under torch.profiler:\n\n```text\n"
        text += profile.read_text() + "```"
    stem.with_suffix(".md").write_text(text + "\n")
    print(text)


if (runs / "text" / "summary.json").is_file():
    text_run(runs / "text")
if "torch-baseline" in labels:
    speed_table()
print(f"results in {out}")
PY

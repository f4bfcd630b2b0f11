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
set -euo pipefail

TEXT=${1:?usage: train_gpu.sh TEXT_FILE OUT_DIR}
OUT=${2:?usage: train_gpu.sh TEXT_FILE OUT_DIR}
STEPS=${STEPS:-2500}
BATCH=${BATCH:-64}
SPEED_STEPS=${SPEED_STEPS:-40}
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
train --size small --context-length 256 --batch-size 32 --precision bf16 \
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
run_speed fa2-triton --attention fa2-triton --profile-step $((SPEED_STEPS - 5))
run_speed fa2-triton-compile --attention fa2-triton --compile
run_speed sdpa --attention sdpa
run_speed sdpa-compile --attention sdpa --compile
run_speed torch-baseline --baseline torch

python3 - "$OUT" "$RUNS" "${labels[@]}" <<'PY'
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
summary = json.loads((runs / "text" / "summary.json").read_text())
date = summary["date"][:10]

# (a) the real-text run: summary + metrics as JSON, the loss curve, the sample, in Markdown
stem = out / f"train_text_{device}_{date}"
metrics = [json.loads(line) for line in (runs / "text" / "metrics.jsonl").read_text().splitlines()]
stem.with_suffix(".json").write_text(json.dumps({"summary": summary, "metrics": metrics}, indent=1))
shutil.copyfile(runs / "text" / "loss.png", stem.with_suffix(".png"))
c = summary["config"]
lines = [
    f"### bench-train on {Path(c['data']).name}: {c['size']}, context {c['context_length']}, "
    f"batch {c['batch_size']}, {c['precision']}, {c['attention']}, {summary['steps']} steps",
    f"Device: {summary['device_name']}; torch {summary['versions']['torch']}, triton "
    f"{summary['versions']['triton']}; {summary['date']}; git {summary['git_revision']} "
    f"(dirty: {summary['git_dirty']}). Command: `{summary['command']}`",
    f"- final train loss {summary['final_train_loss']:.4f}, validation loss "
    f"{summary['final_val_loss']:.4f} ({summary['validation']}); {summary['parameters']:,} "
    f"parameters, vocabulary {summary['vocab_size']:,}",
    f"- {summary['tokens_per_s']:,.0f} tokens/s, MFU "
    + ("unknown (GPU not in the peak table)" if summary["mfu"] is None else f"{summary['mfu']:.1%}"),
    f"![loss]({stem.with_suffix('.png').name})",
    "Sample (" + str(c["generate"]) + " tokens, temperature " + str(c["temperature"]) + "):",
    "```text\n" + (runs / "text" / "sample.txt").read_text() + "\n```",
]
stem.with_suffix(".md").write_text("\n\n".join(lines) + "\n")

# (b) the speed table, the matmul ceiling and the profile
if "torch-baseline" in labels:
    pairs = [(label, runs / f"speed-{label}") for label in labels]
    run = speed_comparison(pairs, baseline="torch-baseline")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        a @ a
    end.record()
    torch.cuda.synchronize()
    matmul_tflops = 2 * 8192**3 * 20 / (start.elapsed_time(end) / 1e3) / 1e12
    peak = peak_tflops(name, "bf16")
    if peak:
        run.notes.append(
            f"Matmul ceiling: a bf16 8192³ torch.matmul runs at {matmul_tflops:.0f} TFLOP/s on "
            f"this GPU, {matmul_tflops / peak:.1%} of the {peak:g} TFLOP/s peak: the highest MFU "
            "any step made of such matmuls could show."
        )
    run.rows.sort(key=lambda r: -r["tokens_per_s"])
    speed = out / f"train_speed_{device}_{date}"
    run.plots.append(plot_speed(run, speed.with_suffix(".png")).name)
    save_json(run, speed.with_suffix(".json"))
    text = run.to_markdown()
    profile = runs / "speed-fa2-triton" / "profile.txt"
    if profile.is_file():
        text += "\n\nOne step of fa2-triton eager under torch.profiler:\n\n```text\n"
        text += profile.read_text() + "```"
    speed.with_suffix(".md").write_text(text + "\n")
    print(text)
print(f"results in {out}")
PY

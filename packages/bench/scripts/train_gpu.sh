#!/usr/bin/env bash
# bench-train on one GPU: a real-text run and the speed table, results for docs/results.
#
#   packages/bench/scripts/train_gpu.sh TEXT_FILE OUT_DIR
#
# (a) the README's GPU command: `small` at context 512, batch 64, BPE (TOKENIZER), STEPS steps
#     with the fast default (compiled, bf16-autocast, fa2-triton, fused AdamW; eval every 20, a
#     sample at the end), then the same command with `--baseline torch` (torch's own step,
#     bench-step's torch-native one: SDPA, compiled blocks, F.cross_entropy over checkpointed
#     chunks, fused torch.optim.AdamW), for train_text_<device>_<date>.{md,json,png}
#     with the run's tokens/s beside the baseline's: the README's loss and same-run ratio;
# (b) the speed table: `small` at context 512, batch BATCH, bf16-autocast, SPEED_STEPS steps
#     each: the fast default (`default`, with a torch.profiler table of one step), `--baseline torch`
#     (`torch-baseline`, the ratios' denominator), and what each part of the default buys:
#     `--no-compile` (`eager`), `--optimizer lmcore` (`lmcore-adamw`), `--attention sdpa`
#     (`sdpa`); with the bf16 matmul ceiling measured on the same GPU:
#     train_speed_<device>_<date>.{md,json,png}.
# Runs from the repository root without installing (PYTHONPATH = every package's src/). The run
# folders (checkpoints) go to RUNS (a temporary folder by default); OUT_DIR gets only results.
# PARTS=a or PARTS=b runs one part alone (both by default), and SPEED_RUNS="default torch-baseline"
# some of (b)'s runs, e.g. under a per-command time limit: with the same RUNS, each call's result
# files hold every run finished there so far.
set -euo pipefail

TEXT=${1:?usage: train_gpu.sh TEXT_FILE OUT_DIR}
OUT=${2:?usage: train_gpu.sh TEXT_FILE OUT_DIR}
STEPS=${STEPS:-200}
BATCH=${BATCH:-64}
SPEED_STEPS=${SPEED_STEPS:-40}
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
  python3 -m bench train --data "$TEXT" --cache-dir "$CACHE" --no-progress "$@"
}

# (a) the README's GPU command, then the same under --baseline torch
TEXT_RUN=(--size small --tokenizer "$TOKENIZER" --context-length 512 --batch-size "$BATCH"
  --steps "$STEPS" --log-every 10 --eval-every 20 --eval-batches 20)
if [[ $PARTS == *a* ]]; then
  train "${TEXT_RUN[@]}" --generate 500 --out "$RUNS/text"
  train "${TEXT_RUN[@]}" --generate 0 --baseline torch --out "$RUNS/text-baseline"
fi

# (b) the speed table: BPE (TOKENIZER; trained once, then read from the cache), short runs
SPEED=(--tokenizer "$TOKENIZER" --size small --context-length 512 --batch-size "$BATCH"
  --steps "$SPEED_STEPS" --log-every 10 --eval-every 0 --eval-batches 1 --generate 0)
LABELS=(default torch-baseline eager lmcore-adamw sdpa)  # the table's runs, in its order
declare -A OPTIONS=([default]="--profile-step $((SPEED_STEPS - 5))" [torch-baseline]="--baseline torch"
  [eager]="--no-compile" [lmcore-adamw]="--optimizer lmcore" [sdpa]="--attention sdpa")
SPEED_RUNS=${SPEED_RUNS:-${LABELS[*]}}  # a subset runs now; the table takes every run in RUNS
if [[ $PARTS == *b* ]]; then
  for label in $SPEED_RUNS; do  # a run that fails is reported and left out of the table
    # shellcheck disable=SC2086  # the options are words
    train "${SPEED[@]}" --out "$RUNS/speed-$label" ${OPTIONS[$label]} ||
      echo "speed run $label failed" >&2
  done
fi

speed=()
for label in "${LABELS[@]}"; do
  [[ -f $RUNS/speed-$label/summary.json ]] && speed+=("$label=$RUNS/speed-$label")
done
results=(--out "$OUT")
[[ -f $RUNS/text/summary.json ]] && results+=(--text "$RUNS/text")
[[ -f $RUNS/text-baseline/summary.json ]] && results+=(--text-baseline "$RUNS/text-baseline")
[[ -f $RUNS/speed-torch-baseline/summary.json ]] &&
  results+=(--speed "${speed[@]}" --baseline torch-baseline --measure-ceiling)
python3 -m bench train-results "${results[@]}"

#!/usr/bin/env bash
# The GPU measurements of issue 38 (what the seed projects had): the kernel x parallel-mode
# matrix on one and two GPUs, and fp16 with loss scaling against bf16 autocast on real text.
# Every result goes into OUT_DIR (default docs/results) under the standard names
# (<topic>_<device>_<date>.{json,csv,md,png}).
#
#   matrix  2 GPUs, at most 175 s: bench-matrix, `small` (768/3072/12L/12H) at context 256,
#           global batch 32, bf16 autocast, eager, 30 steps per cell on TEXT's UTF-8 bytes;
#           SDPA and fa2-triton x one GPU (single), DDPBucketed and zero.FSDP on two: six
#           cells, tokens/s, step time, the busiest GPU's peak memory, and the final losses,
#           which must agree across the modes (1 %)                                   matrix_2x<gpu>
#   fp16    1 GPU, at most 120 s: two bench-train runs of `small` at context 256, batch 32,
#           300 steps on TEXT's UTF-8 bytes, eager, SDPA (no kernel to compile in the budget),
#           evaluated every 50 steps: bf16 autocast, then fp16 autocast with torch.amp.GradScaler
#           (dynamic scale); the precision table sets fp16's losses, skipped steps and final
#           scale beside bf16's, with both loss curves                          train_precision_<gpu>
#
# Allowances, not measurements: no committed result has timed these shapes yet (a 2-rank cell
# starts two processes and NCCL; fa2's kernels compile on their first call, once per process
# unless Triton's cache has them). Each run stops cleanly at its --time-budget, ahead of its
# limit; a matrix stopped by its limit keeps the cells it finished (matrix.json in RUNS) and
# reads them back when run again. Bytes, not BPE: no tokenizer to train in the budget.
# Usage, from the repository root (no installation needed):
#
#   packages/bench/scripts/seeds_gpu.sh matrix|fp16|all|list TEXT [OUT_DIR]
#
# DRY_RUN=1 prints each command (tab-separated: limit, name, command) instead of running it.
set -u
part=${1:?usage: seeds_gpu.sh matrix|fp16|all|list TEXT [OUT_DIR]}
text=${2:-}
out=${3:-docs/results}
root=$(cd "$(dirname "$0")/../../.." && pwd)
export PYTHONPATH=$(ls -d "$root"/packages/*/src | paste -sd:)
if [ "${DRY_RUN:-0}" = 1 ]; then runs=${RUNS:-RUNS}; else runs=${RUNS:-$(mktemp -d)}; fi
if [ "$part" != list ] && [ -z "$text" ]; then
    echo "seeds_gpu.sh: give the text file, e.g. seeds_gpu.sh $part tinyshakespeare.txt" >&2
    exit 2
fi
PY=python3

. "$(dirname "$0")/gpu_lib.sh"

matrix() {
    local name
    name=$(stem matrix 2)
    run 175 "attention x parallel mode matrix on 2 GPUs" $PY -m bench matrix --data "$text" \
        --out "$runs/matrix" --size small --attention sdpa fa2-triton --parallel single ddp fsdp \
        --nproc 2 --steps 30 --batch-size 32 --context-length 256 --precision bf16-autocast \
        --tokenizer bytes --no-compile --no-progress --csv "$out/$name.csv" $(files "$name")
}

fp16() {
    local common=(--data "$text" --cache-dir "$runs/cache" --size small --tokenizer bytes
        --context-length 256 --batch-size 32 --steps 300 --log-every 10 --eval-every 50
        --eval-batches 10 --attention sdpa --no-compile --time-budget 35s --generate 0
        --no-progress)
    run 55 "bench-train bf16 autocast" $PY -m bench train "${common[@]}" \
        --precision bf16-autocast --out "$runs/bf16"
    run 55 "bench-train fp16, loss-scaled" $PY -m bench train "${common[@]}" \
        --precision fp16 --out "$runs/fp16"
    run 10 "the precision table" $PY -m bench train-results --out "$out" \
        --precision "bf16=$runs/bf16" "fp16=$runs/fp16"
}

case $part in
matrix | fp16) "$part" ;;
all) matrix; fp16 ;;
list) sed -n '2,/^# Usage/p' "$0" ;;
*) echo "seeds_gpu.sh: unknown part '$part'; choose matrix fp16 all list" >&2; exit 2 ;;
esac

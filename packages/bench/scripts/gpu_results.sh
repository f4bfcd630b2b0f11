#!/usr/bin/env bash
# The GPU results of bench that a CPU cannot produce, in one run of about five minutes on one
# H100, each written under $1 with the standard result names (<topic>_<device>_<date>):
#
#   attn_*       bench-attn's default (fa2-triton vs SDPA and naive)              about 1 min
#   memory_fp32_*, memory_bf16_*
#                2.7B memory snapshots at context 128/256/512, forward-only and
#                full training step (a cell that runs out of memory says OOM);
#                PNG timelines beside the json, the allocator pickles (large:
#                copy them only if wanted) under $1/snapshots/                    about 1 min each
#   warmup_*     the warm-up study (0, 1, 2, 5 warm-up steps, fresh processes)    about 40 s
#   compile_*    the small model, eager and torch.compile'd, a training step      about 1 min
#   profile_*/   torch.profiler traces, kernel tables and profile_*.json           about 20 s
#
# The times are expectations, not measurements. Each part has its own time limit; a part that
# fails or runs out of time is reported and the others still run. Usage, from the repository
# root (no installation needed):
#
#   packages/bench/scripts/gpu_results.sh docs/results
#   uv run bench-report docs/results -o docs/results/REPORT.md   # then, on any machine
set -u
out=${1:?usage: gpu_results.sh OUT_DIR}
root=$(cd "$(dirname "$0")/../../.." && pwd)
export PYTHONPATH=$(ls -d "$root"/packages/*/src | paste -sd:)
mkdir -p "$out/snapshots"
. "$(dirname "$0")/gpu_lib.sh"

attn=$(stem attn)
run 120 bench-attn python3 -m bench attn --no-progress $(files "$attn")

for precision in fp32 bf16-autocast; do  # one result each: a slow half cannot cost the other
    memory=$(stem "memory_${precision%-autocast}")  # the topic names memory_fp32, memory_bf16
    run 120 "memory $precision" python3 -m bench model --size 2.7B --context-length 128 256 512 \
        --mode forward train-step --precision "$precision" --warmup 1 --steps 1 --no-progress \
        --memory-snapshot "$out/snapshots/${memory}_snapshot.pickle" $(files "$memory")
done
mv "$out"/snapshots/*.png "$out"/ 2>/dev/null

warmup=$(stem warmup)
run 90 warm-up python3 -m bench model --size small --context-length 256 \
    --mode forward-backward --steps 5 --warmup-study --no-progress $(files "$warmup")

compiled=$(stem compile)
run 150 compile python3 -m bench model --size small --context-length 256 --mode train-step \
    --compile both --warmup 3 --steps 5 --no-progress $(files "$compiled")

profile=$(stem profile)
run 60 profile python3 -m bench model --size small --context-length 256 \
    --mode forward train-step --warmup 2 --steps 3 --no-progress \
    --profile "$out/$profile" --json "$out/${profile}_timing.json"

echo "== all parts finished in $SECONDS s; results in $out" >&2

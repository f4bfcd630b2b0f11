#!/usr/bin/env bash
# The GPU measurements of the full training step (issues 24 and 25), in one call of ten minutes
# on one H100 (the commands' limits add up to 540 s). Every result goes into OUT_DIR (default
# docs/results) under the standard names (<topic>_<device>_<date>.{json,md,png}).
#
#   a  the depth-reduced leaderboard model on one GPU: leaderboard-8b (4096/11008/32 heads,
#      vocabulary 151,936) at context 32,768, batch 1 (one GPU's share of the leaderboard's
#      batch of 2 on 2 GPUs), bf16 (the handout's torch_dtype), with as many blocks as every row
#      fits in the GPU's memory less 15 % (--num-layers fit: bench-plan's memory model); ours
#      (fa2-triton, the fused loss, every block checkpointed = segments:1, compiled) with
#      lmcore's fused AdamW and with torch's, beside the torch-native step (SDPA, the same
#      checkpoints, a compiled chunked cross-entropy, fused torch AdamW, compiled blocks):
#      step time, first step, peak and its parts, phases, attention time, MFU     step_leaderboard
#   b  fa2 at the leaderboard's attention shape, (2, 32, 32768, 128) causal bf16 as 64 heads of
#      (32768, 128), beside SDPA's flash and cuDNN backends, forward and backward   flash_leaderboard
#   c  the handout's checkpointing study (§3.2 (b)): xl (2560/10240/32/32) at batch 4, context
#      2048, bf16 autocast, full training steps with torch's fused AdamW; k from the measured
#      bytes one block saves (lmcore.memory_optimal_segment_size), segments of k-1, k, k+1 and
#      the nested form (k-1 = 0 is no checkpointing, which does not fit: an out-of-memory row;
#      should segments of k not fit beside xl's 54.6 GB of float32 weights, gradients and
#      moments either, rerun c on an nvidia-h200)                                   step_checkpointing
#
# The limits are allowances (compilation of a 30-odd-block model, Triton autotuning at a new
# shape), not measurements. A command that fails or runs out of time is reported and the others
# still run. Usage, from the repository root (no installation needed):
#
#   packages/bench/scripts/step_gpu.sh all [OUT_DIR]     # or a, b, c, or list
#   uv run bench-plan --check docs/results ...           # then, on any machine
#
# DRY_RUN=1 prints each command (tab-separated: limit, name, command) instead of running it.
set -u
part=${1:?usage: step_gpu.sh a|b|c|all|list [OUT_DIR]}
out=${2:-docs/results}
root=$(cd "$(dirname "$0")/../../.." && pwd)
export PYTHONPATH=$(ls -d "$root"/packages/*/src | paste -sd:)
dry=${DRY_RUN:-0}
PY=python3

. "$(dirname "$0")/gpu_lib.sh"

a() {
    local step
    step=$(stem step_leaderboard)
    run 360 "depth-reduced leaderboard step" $PY -m bench step --size leaderboard-8b \
        --num-layers fit --batch 1 --precision bf16 --attention fa2-triton --loss fused \
        --optimizer lmcore-fused torch-fused --activation-checkpointing blocks --compile \
        --native --no-progress $(files "$step")
}

b() {
    local flash
    flash=$(stem flash_leaderboard)
    run 90 "fa2 at the leaderboard's attention shape" $PY -m bench flash --preset d128 \
        --batch 64 --seq 32768 --impls fa2-triton fa2-triton-compiled sdpa-flash sdpa-cudnn \
        --no-progress $(files "$flash")
}

c() {
    local study
    study=$(stem step_checkpointing)
    run 90 "checkpointing study, xl" $PY -m bench step --study checkpointing --size xl \
        --context-length 2048 --batch 4 --precision bf16-autocast --attention fa2-triton \
        --loss materialized --optimizer torch-fused --no-compile --no-native \
        --warmup-ms 200 --rep-ms 1000 --no-progress $(files "$study")
}

parts="a b c"
case "$part" in
list) echo "$parts" ;;
all | a | b | c)
    [ "$dry" = 1 ] || mkdir -p "$out"
    for p in $([ "$part" = all ] && echo "$parts" || echo "$part"); do "$p"; done
    [ "$dry" = 1 ] || echo "== step_gpu.sh $part finished in $SECONDS s; results in $out" >&2
    ;;
*)
    echo "unknown part $part; choose one of: $parts, all, list" >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# The GPU runs the 2026 CS336 handout asks for (issue 26), in parts that each fit one call of ten
# minutes on one H100 (each part's commands have their own limits, at most 540 s in all). Every
# result goes into OUT_DIR (default docs/results) under the standard names
# (<topic>_<device>_<date>.{json,md,png}); bulky artefacts (allocator pickles, Chrome traces),
# which are not meant to be committed, go under $HANDOUT_BULK (default OUT_DIR/bulk).
#
#   part1  model study: small medium large xl 10B, context 512, forward /
#          forward-backward / train-step (AdamW), fp32 and bf16, 5 warm-up + 10 steps
#          (10B's training modes record out-of-memory rows); warm-up study
#          (0, 1, 2, 5 warm-up steps, small, context 512)                        ~ 5 min
#   part2  memory: xl at context 128 and 2048, fp32 and bf16, forward and train
#          step, with allocator timelines (2048's training step records OOM);
#          residuals of one xl block (contexts 128, 2048; fp32, bf16; with and
#          without checkpointing); profiles of small at contexts 256/512/1024    ~ 6 min
#   part3  profiles of xl at contexts 256/512/1024, forward and train step        ~ 6 min
#   part4  attention grid: all 20 cells (d 16…128 × seq 256…16384), naive and
#          torch.compile'd, 100 calls (out of memory is a row)                    ~ 6 min
#   part5  whole-model torch.compile: small and xl, context 512, forward /
#          forward-backward / train step, eager and compiled                       ~ 6 min
#   part6  FlashAttention-2 sweep: batch 1, causal, seq 128…65536, d 16…128,
#          bf16 and fp32; fa2-triton, plain PyTorch attention (naive) and SDPA     ~ 6 min
#   part7  attention grid with fa2-triton and SDPA (their ratios against SDPA)    ~ 2 min
#   quick  the minimum each question the committed results leave open needs, in at most
#          QUICK_BUDGET_S (300) seconds on one H200, most needed first: xl memory
#          timelines (fp32, contexts 128 and 2048, snapshots kept); profiles of small and
#          medium training steps at contexts 256/512/1024 (one profiled step: the forward,
#          backward and optimizer phases answer (a)-(e)); fa2-triton against plain PyTorch
#          attention on part of the sweep's grid (seq 128, 1024, 8192, 65536; d 16, 64, 128;
#          bf16 and fp32; shorter do_bench budgets); the whole small model compiled, forward
#          and training step; the warm-up study at context 512. Each command's limit is cut
#          to what is left of the budget, and a command with under 15 s left is skipped
#          (so the warm-up study, last, runs only if the others took less than their limits).
#          Expected ~ 4 to 5 min, an estimate from the committed results' timestamps on one
#          H100 (xl memory study 22 s, warm-up study 45 s, one compiled mode 69 s, a profile
#          of two cells 39 s, each with its process start), not a measurement
#
# The times are estimates from the committed results' timings, not measurements. A command
# that fails or runs out of time is reported and the others still run. Usage, from the
# repository root (no installation needed; `xl` must be the 2026 xl, 2560 wide):
#
#   packages/bench/scripts/handout_gpu.sh part1 [OUT_DIR]     # ... part7, or `all`, or `list`
#   uv run bench-report docs/results -o docs/results/REPORT.md   # then, on any machine
#
# DRY_RUN=1 prints each command (tab-separated: limit, name, command) instead of running it.
# TINY=1 rehearses `quick` on the CPU (a tiny model, short contexts: the options `tiny`
# appends), a check that every command runs end to end, not a measurement.
set -u
part=${1:?usage: handout_gpu.sh part1..part7|all|list [OUT_DIR]}
out=${2:-docs/results}
bulk=${HANDOUT_BULK:-$out/bulk}
root=$(cd "$(dirname "$0")/../../.." && pwd)
export PYTHONPATH=$(ls -d "$root"/packages/*/src | paste -sd:)
dry=${DRY_RUN:-0}
tiny=${TINY:-0}
[ "$tiny" = 1 ] && export STEM_DEVICE=cpu
PY=python3

. "$(dirname "$0")/gpu_lib.sh"
check_sizes() {  # the 2026 names: xl is 2560 wide and 10B exists (lmcore's 2026 table)
    [ "$dry" = 1 ] && return
    $PY -c "from lmcore import MODEL_SIZES as S; import sys; \
sys.exit(0 if S['xl'].d_model == 2560 and '10B' in S else \
'lmcore lacks the 2026 sizes (xl 2560 wide, 10B): run this on a tree with them')" || exit 2
}

part1() {
    local model warmup
    model=$(stem model)
    run 330 "model study" $PY -m bench model --size small medium large xl 10B \
        --context-length 512 --mode forward forward-backward train-step \
        --precision fp32 bf16-autocast \
        --warmup 5 --steps 10 --no-progress $(files "$model")
    warmup=$(stem warmup)
    run 150 "warm-up study" $PY -m bench model --size small --context-length 512 \
        --mode forward-backward --steps 10 --warmup-study --no-progress $(files "$warmup")
}

part2() {
    local memory residuals profile precision
    for precision in fp32 bf16-autocast; do  # one result each: a slow half cannot cost the other
        memory=$(stem "memory_${precision%-autocast}")  # the topics memory_fp32, memory_bf16
        run 150 "memory $precision" $PY -m bench model --size xl --context-length 128 2048 \
            --mode forward train-step --precision "$precision" --warmup 1 --steps 1 \
            --no-progress \
            --memory-snapshot "$bulk/${memory}_snapshot.pickle" $(files "$memory")
    done
    [ "$dry" = 1 ] || mv "$bulk"/*.png "$out"/ 2>/dev/null
    residuals=$(stem residuals)
    run 90 "residuals" $PY -m bench model --size xl --context-length 128 2048 \
        --precision fp32 bf16-autocast --study residuals --no-progress \
        --json "$out/$residuals.json" --markdown "$out/$residuals.md"
    profile=$(stem profile_small)
    run 120 "profile small" $PY -m bench model --size small --context-length 256 512 1024 \
        --mode forward train-step --warmup 2 --steps 3 --no-progress \
        --profile "$out/$profile" --json "$out/${profile}_timing.json"
    traces "$out/$profile"
}

part3() {
    local profile
    profile=$(stem profile_xl)
    run 520 "profile xl" $PY -m bench model --size xl --context-length 256 512 1024 \
        --mode forward train-step --warmup 2 --steps 3 --no-progress \
        --profile "$out/$profile" --json "$out/${profile}_timing.json"
    traces "$out/$profile"
}

traces() {  # move a profile's Chrome traces (tens of MB each) to the bulk folder
    [ "$dry" = 1 ] && return
    mkdir -p "$bulk/$(basename "$1")"
    mv "$1"/*.pt.trace.json "$bulk/$(basename "$1")"/ 2>/dev/null
}

part4() {
    local attn
    attn=$(stem attn_grid)
    run 530 "attention grid, naive and compiled" $PY -m bench attn --grid handout \
        --impls naive compiled --no-progress $(files "$attn")
}

part5() {
    local compiled
    compiled=$(stem compile)
    run 530 "whole-model compile" $PY -m bench model --size small xl --context-length 512 \
        --mode forward forward-backward train-step --compile both --warmup 3 --steps 5 \
        --no-progress $(files "$compiled")
}

part6() {
    local flash dtype
    for dtype in bf16 fp32; do
        flash=$(stem "flash_sweep_$dtype")
        run 265 "flash sweep $dtype" $PY -m bench flash --preset sweep --dtype "$dtype" \
            --impls fa2-triton naive sdpa --no-progress $(files "$flash")
    done
}

part7() {
    local attn
    attn=$(stem attn_grid_fused)
    run 300 "attention grid, fa2-triton and SDPA" $PY -m bench attn --grid handout \
        --impls fa2-triton sdpa --no-progress $(files "$attn")
}

budget_left() {  # budget_left LIMIT NAME: sets `limit` to LIMIT or what is left of the budget
    [ "$tiny" = 1 ] && set -- $(($1 * TINY_SLACK)) "$2"
    local used=$((SECONDS - quick_start))
    [ "$dry" = 1 ] && used=$quick_spent  # a dry run counts each limit as spent in full
    local left=$((QUICK_BUDGET_S - used))
    limit=$(($1 < left ? $1 : left))
    quick_spent=$((quick_spent + limit))
    [ "$limit" -ge 15 ] || { echo "== skipped (budget spent): $2" >&2; return 1; }
}

# Under TINY=1 every limit and the budget are this many times longer: two shared CPU cores start
# Python, import torch and compile far slower than the GPU machine the limits are set for.
TINY_SLACK=4

tiny() {  # tiny WHAT: the options that shrink quick's commands under TINY=1 (appended)
    [ "$tiny" = 1 ] || return 0
    case $1 in
    model) echo --device cpu --size tiny --context-length 32 64 --warmup 1 --steps 1 ;;
    compile) echo --device cpu --size tiny --context-length 32 --warmup 1 --steps 1 ;;
    warmup) echo --device cpu --size tiny --context-length 32 --steps 1 ;;
    flash) echo --device cpu --seq 64 128 --d 16 ;;
    esac
}

quick() {
    local memory profile flash compiled warmup limit suffix
    QUICK_BUDGET_S=${QUICK_BUDGET_S:-$((300 * (tiny == 1 ? TINY_SLACK : 1)))}
    quick_start=$SECONDS quick_spent=0
    suffix=$(stem quick)  # one interpreter start for every name: `<topic>_<device>_<date>`
    suffix=${suffix#quick}
    memory=memory_fp32$suffix
    budget_left 45 "memory fp32" && run "$limit" "memory fp32" $PY -m bench model --size xl \
        --context-length 128 2048 --mode forward train-step --precision fp32 --warmup 1 \
        --steps 1 --no-progress --memory-snapshot "$bulk/${memory}_snapshot.pickle" \
        $(files "$memory") $(tiny model)
    [ "$dry" = 1 ] || mv "$bulk"/*.png "$out"/ 2>/dev/null
    profile=profile_small_medium$suffix
    budget_left 70 "profiles" && run "$limit" "profiles" $PY -m bench model \
        --size small medium --context-length 256 512 1024 --mode train-step --warmup 1 \
        --steps 1 --no-progress --profile "$out/$profile" --json "$out/${profile}_timing.json" \
        $(tiny model)
    traces "$out/$profile"
    flash=flash_naive$suffix
    budget_left 60 "flash against naive" &&
        run "$limit" "flash against naive" $PY -m bench flash --preset sweep \
            --seq 128 1024 8192 65536 --d 16 64 128 --dtype bf16 fp32 --impls fa2-triton naive \
            --budget-ms 5 20 --no-progress $(files "$flash") $(tiny flash)
    compiled=compile$suffix
    budget_left 120 "whole-model compile" &&
        run "$limit" "whole-model compile" $PY -m bench model --size small --context-length 512 \
            --mode forward train-step --compile both --warmup 2 --steps 3 --no-progress \
            $(files "$compiled") $(tiny compile)
    warmup=warmup$suffix
    budget_left 60 "warm-up study" && run "$limit" "warm-up study" $PY -m bench model \
        --size small --context-length 512 --mode forward-backward --steps 5 --warmup-study \
        --no-progress $(files "$warmup") $(tiny warmup)
    return 0
}

parts="part1 part2 part3 part4 part5 part6 part7 quick"
case "$part" in
list) echo "$parts" ;;
all)
    check_sizes
    mkdir -p "$out" "$bulk"
    for p in $parts; do "$p"; done
    ;;
part[1-7] | quick)
    [ "$tiny" = 1 ] || check_sizes
    [ "$dry" = 1 ] || mkdir -p "$out" "$bulk"
    "$part"
    [ "$dry" = 1 ] || echo "== $part finished in $SECONDS s; results in $out" >&2
    ;;
*)
    echo "unknown part $part; choose one of: $parts, all, list" >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# The measurements that need two GPUs (issue 27), on one machine of 2 H100s or 2 H200s, in parts
# that each fit one call of ten minutes (each part's commands have their own limits, at most
# 540 s in all). Results go into OUT_DIR (default docs/results) under the standard names,
# <topic>_2x<gpu>_<date>.{json,md,png}; bulky artefacts that are not meant to be committed
# (Chrome traces, bench-train's run folders) under $TWO_GPU_BULK (default OUT_DIR/bulk).
#
#   zero         bench-zero: ddp:torch, zero1:torch-ddp, zero1:torch, fsdp, fsdp:torch,
#                fsdp:no-prefetch (the FSDP rows in fp32 and bf16), at the 2026 xl (2560 wide)
#                and at xl-2025 (1600
#                wide, for continuity with zero_2xh200_2026-11-22), each FSDP row with a
#                torch.profiler trace of one step (rank 0's; `gather_overlap`: the share of its
#                all-gather time beside compute)                      zero_*, zero_xl-2025_*
#   train-small  bench-train at `small`: `single` on 1 GPU; ddp, ddp:torch, zero1, fsdp,
#                fsdp:torch on 2; Tiny Shakespeare (TEXT_FILE) as bytes, seed 0, global batch
#                32 x 256 tokens, 200 steps, bf16-autocast, eager (zero.FSDP does not compile
#                yet, so no mode does), no checkpoints; then the scaling table of every run so far
#   train-xl-1   the same at the 2026 xl, global batch 8 x 256, 100 steps: single, ddp,
#                ddp:torch                                              (and the table)
#   train-xl-2   xl: zero1, fsdp, fsdp:torch                            (and the table)
#   train-table  only the table, from the run folders under $TWO_GPU_BULK/train_runs (any
#                machine; copy the train parts' folders there first)    train_scaling_*
#   ddp          bench-ddp at xl and xl-2025: single, the four wrappers, torch DDP, and a flat
#                all-reduce of every gradient alone, for hidden_e2e = 1 - (step - single step)
#                / all-reduce                                         ddp_*, ddp_xl-2025_*
#   step         bench-plan's prediction for the leaderboard step's rows (zero1 and FSDP at
#                this GPU's memory), then bench-step --preset leaderboard-2026 (ours, ZeRO-1,
#                beside the torch-native step on FSDP2); on GPUs under 140 GB the tool refuses
#                and prints the depth-reduced command (2 ranks, --num-layers fit), which then
#                runs in the time left                   plan_leaderboard_*, step_leaderboard_*
#   tests        python3 -m pytest -m gpu: fa2's, then every other package's   gpu_tests_*
#
# Limits are allowances, estimated from the committed results: a step of xl-2025 took 254 ms
# under DDP on 2 H200s (zero_2xh200_2026-11-22), the 2026 xl has 1.7x its parameters; the
# depth-reduced leaderboard step's first step took 102 s (19 blocks, compiled) and each step
# 3.1 s on one H100 (step_leaderboard_h100_2026-11-25); fa2's GPU tests 147 s on one H100
# (gpu_tests_h100_2026-11-25). A command that fails or runs out of time is reported and the
# others still run; the train parts skip runs already finished, so a part can be called again.
# Usage, from the repository root (no installation needed):
#
#   packages/bench/scripts/two_gpu.sh PART [OUT_DIR [TEXT_FILE]]   # list: the parts
#   DRY_RUN=1 packages/bench/scripts/two_gpu.sh PART ...  # print each command (limit, name, command)
#   TINY=1 packages/bench/scripts/two_gpu.sh all OUT_DIR TEXT_FILE   # CPU rehearsal, see below
#
# The train parts need TEXT_FILE (Tiny Shakespeare). NVLink multicast stays off
# (NCCL_NVLS_ENABLE=0) for every process the parts start. TINY=1 runs every command on the CPU
# instead, 2 gloo ranks, at tiny sizes and few steps (the options the `tiny` function appends:
# argparse keeps the last of an option): a rehearsal that every command runs end to end, not a
# measurement. In DRY_RUN output a command named `or: ...` runs only in place of the one before.
set -u
part=${1:?usage: two_gpu.sh PART [OUT_DIR [TEXT_FILE]] (two_gpu.sh list: the parts)}
out=${2:-docs/results}
text=${3:-TEXT_FILE}
bulk=${TWO_GPU_BULK:-$out/bulk}
runs=$bulk/train_runs
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
scripts=${here#"$root"/}  # as run from the root: the commands name no machine's paths
export PYTHONPATH=$(ls -d "$root"/packages/*/src | paste -sd:)
export NCCL_NVLS_ENABLE=0  # NVLink multicast off: it can take shared machines' GPUs out of service
dry=${DRY_RUN:-0}
tiny=${TINY:-0}
PY=python3
GPUS=2
[ "$tiny" = 1 ] && export STEM_DEVICE=cpu

. "$here/gpu_lib.sh"

tiny() {  # tiny WHAT: the options that shrink WHAT's commands under TINY=1 (appended)
    [ "$tiny" = 1 ] || return 0
    case $1 in
    zero | ddp) echo --device cpu --size tiny --context-length 32 --batch 2 --warmup 1 --steps 2 ;;
    train) echo --device cpu --size tiny --context-length 32 --batch-size 8 --steps 12 \
        --log-every 4 --eval-batches 2 ;;
    preset) echo --device cpu ;;
    step) echo --device cpu --size tiny --num-layers 2 --context-length 64 --precision fp32 \
        --attention sdpa --optimizer lmcore --no-compile --nproc 2 --parallel zero1 \
        --warmup-ms 5 --rep-ms 20 ;;
    esac
}

gpu_memory() {  # what one GPU holds, as bench-plan reads it (80GB where none is asked)
    if [ "$dry" = 1 ] || [ "$tiny" = 1 ]; then
        echo 80GB
        return
    fi
    echo "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0)MiB"
}

zero() {
    local size topic name limit result
    for size in xl xl-2025; do
        topic=zero_$size limit=210  # xl-2025: 1600 wide, 0.6x xl's parameters
        [ "$size" = xl ] && topic=zero limit=300
        result=$(stem "$topic" "$GPUS")
        run "$limit" "bench-zero $size" $PY -m bench zero --size "$size" --nproc "$GPUS" \
            --variants ddp:torch zero1:torch-ddp zero1:torch fsdp fsdp:torch fsdp:no-prefetch \
            --fsdp-dtypes fp32 bf16 --trace "$bulk/${result}_traces" --no-progress \
            $(files "$result") $(tiny zero)
    done
}

# bench-train's scaling runs: the modes, and each size's run (global batch and steps)
MODES="single ddp ddp:torch zero1 fsdp fsdp:torch"
declare -A SIZE_RUN=([small]="--batch-size 32 --steps 200" [xl]="--batch-size 8 --steps 100")

train() {  # train SIZE LIMIT_S MODE...: one run per mode (single on 1 GPU, the others on 2)
    local size=$1 limit=$2 mode nproc folder
    shift 2
    if [ "$dry" != 1 ] && [ ! -f "$text" ]; then
        echo "the train parts need TEXT_FILE (Tiny Shakespeare): two_gpu.sh $part OUT_DIR TEXT_FILE" >&2
        exit 2
    fi
    for mode in "$@"; do
        nproc=$GPUS
        [ "$mode" = single ] && nproc=1
        folder=$runs/$size-${mode//:/-}  # a folder name without a colon
        if [ "$dry" != 1 ]; then
            [ -f "$folder/summary.json" ] && continue  # finished in an earlier call
            rm -rf "$folder"                           # killed: start it again
        fi
        # shellcheck disable=SC2086  # SIZE_RUN's options are words
        run "$limit" "bench-train $size $mode" $PY -m bench train --data "$text" \
            --tokenizer bytes --size "$size" --context-length 256 ${SIZE_RUN[$size]} --seed 0 \
            --nproc "$nproc" --parallel "$mode" --no-compile --no-checkpoint --generate 0 \
            --eval-every 0 --eval-batches 10 --log-every 10 --cache-dir "$runs/cache" \
            --out "$folder" --no-progress $(tiny train)
    done
    train_table
}

train_table() {  # the scaling table of every finished run under $runs
    local size mode folder scaling=()
    for size in small xl; do
        for mode in $MODES; do
            folder=$runs/$size-${mode//:/-}
            if [ "$dry" = 1 ] || [ -f "$folder/summary.json" ]; then
                scaling+=("$size-$mode=$folder")
            fi
        done
    done
    if [ ${#scaling[@]} = 0 ]; then
        echo "no finished bench-train run under $runs yet: no table" >&2
        return
    fi
    run 60 "scaling table" $PY -m bench train-results --out "$out" --scaling "${scaling[@]}"
}

ddp() {
    local size topic limit result
    for size in xl xl-2025; do
        topic=ddp_$size limit=210  # xl-2025: 1600 wide, 0.6x xl's parameters
        [ "$size" = xl ] && topic=ddp limit=300
        result=$(stem "$topic" "$GPUS")
        run "$limit" "bench-ddp $size" $PY -m bench ddp --size "$size" --nproc "$GPUS" \
            --no-progress $(files "$result") $(tiny ddp)
    done
}

step() {
    local plan result refused instead start limit=470
    plan=$(stem plan_leaderboard "$GPUS")
    run 60 "bench-plan: the leaderboard step's rows" $PY -m bench plan --size leaderboard-8b \
        --context-length 32768 --batch 1 --precision bf16 --layout zero1 fsdp --dp "$GPUS" \
        --attention fa2-triton --activation-checkpointing blocks --loss fused \
        --optimizer lmcore-fused torch-fused --memory "$(gpu_memory)" --no-progress \
        $(files "$plan")
    result=$(stem step_leaderboard "$GPUS")
    refused=$bulk/step_preset_stderr.txt
    [ "$dry" = 1 ] || mkdir -p "$bulk"
    start=$SECONDS
    RUN_STDERR=$refused run "$limit" "leaderboard step (--preset)" $PY -m bench step \
        --preset leaderboard-2026 --no-progress $(files "$result") $(tiny preset)
    if [ "$dry" = 1 ]; then  # what the tool prints on 2 GPUs under 140 GB, from its own function
        instead=$($PY -c "import shlex; from bench.commands.step import depth_reduced_argv; \
print(shlex.join(depth_reduced_argv(num_gpus=$GPUS)[1:]))")
    else
        instead=$(sed -n 's/^  bench-step //p' "$refused")
    fi
    [ -n "$instead" ] || return 0
    # shellcheck disable=SC2086  # the printed command is words
    run $((limit - (SECONDS - start))) "or: the depth-reduced leaderboard step it printed" \
        $PY -m bench step $instead --no-progress $(files "$result") $(tiny step)
}

tests() {
    local record=("$PY" "$scripts/script_results.py" tests --out "$out" --gpus "$GPUS" --)
    run 240 "GPU tests: fa2" "${record[@]}" -m gpu packages/fa2 -q -p no:cacheprovider -rs
    run 300 "GPU tests: the other packages" "${record[@]}" -m gpu packages/bench packages/ddp \
        packages/lmcore packages/zero tests -q -p no:cacheprovider -rs
}

parts="zero train-small train-xl-1 train-xl-2 train-table ddp step tests"
one() {  # one PART: its commands
    RUN_TAG=$1
    case $1 in
    zero) zero ;;
    train-small) train small 75 $MODES ;;
    train-xl-1) train xl 150 single ddp ddp:torch ;;
    train-xl-2) train xl 150 zero1 fsdp fsdp:torch ;;
    train-table) train_table ;;
    ddp) ddp ;;
    step) step ;;
    tests) tests ;;
    esac
}

case "$part" in
list) echo "$parts" ;;
all | zero | train-small | train-xl-1 | train-xl-2 | train-table | ddp | step | tests)
    [ "$dry" = 1 ] || mkdir -p "$out" "$bulk"
    for p in $([ "$part" = all ] && echo "$parts" || echo "$part"); do one "$p"; done
    [ "$dry" = 1 ] || echo "== two_gpu.sh $part finished in $SECONDS s; results in $out" >&2
    ;;
*)
    echo "unknown part $part; choose one of: $parts, all, list" >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# The measurements that need several GPUs (issues 27 and 35), on one machine of GPUS GPUs (the
# visible ones by default), in parts that each fit one call of ten minutes (each part's commands
# have their own limits, at most 540 s in all). Results go into OUT_DIR (default docs/results)
# under the standard names, <topic>_<GPUS>x<gpu>_<date>.{json,md,png}; bulky artefacts that are
# not meant to be committed (Chrome traces, bench-train's run folders) under $MULTI_GPU_BULK
# (default OUT_DIR/bulk). `two_gpu.sh` is this script with GPUS=2. `gpu_plan.py` runs parts of it
# side by side on disjoint GPUs of one machine, each part seeing its own GPUs as all there are.
#
#   allreduce    bench-allreduce on 2, 4, ... GPUS ranks (every even count), NCCL and gloo,
#                1 MB to 1 GB (gloo's 1 GB too, `--full`): the handout's §5 table  allreduce_*
#   zero         bench-zero: ddp:torch, zero1:torch-ddp, zero1:torch, fsdp, fsdp:torch,
#                fsdp:no-prefetch (the FSDP rows in fp32 and bf16) at the 2026 xl (2560 wide),
#                and on 2 GPUs also at xl-2025 (1600 wide, for continuity with
#                zero_2xh200_2026-11-22), each FSDP row with a torch.profiler trace of one step
#                (rank 0's; `gather_overlap`: the share of its all-gather time beside compute)
#                                                                     zero_*, zero_xl-2025_*
#   train-small  bench-train at `small`: `single` on 1 GPU; ddp, zero1, fsdp, fsdp:torch,
#                ddp:torch on GPUS (on 1 GPU: `single` alone); Tiny Shakespeare (TEXT_FILE) as
#                bytes, seed 0, global batch 32 x 256 tokens whatever the GPU count (so every
#                run trains on the same batches and its loss matches the one-GPU run's), 200
#                steps, bf16-autocast, eager (zero.FSDP does not compile yet, so no mode does),
#                no checkpoints; then the scaling table of every run so far  train_scaling_*
#   train-xl-1   the same at the 2026 xl, global batch 8 x 256, 100 steps: single, ddp, zero1
#   train-xl-2   xl: fsdp, fsdp:torch, ddp:torch                        (and the table)
#   train-table  only the table, from the run folders under $MULTI_GPU_BULK/train_runs (any
#                machine; copy the train parts' folders there first)    train_scaling_*
#   ddp          bench-ddp on GPUS ranks at xl, and on 2 GPUs also at xl-2025: single, the four
#                wrappers, torch DDP, and a flat all-reduce of every gradient alone, for
#                hidden_e2e = 1 - (step - single step) / all-reduce, each training row with a
#                torch.profiler trace of one step (rank 0's; `comm_overlap`: the share of its
#                all-reduce time beside compute)                       ddp_*, ddp_xl-2025_*
#   ddp-overlap  scripts/ddp_overlap.py on the first two GPUs: each ddp overlap lever alone and
#                combined, end to end, with traces                    ddp_overlap_*/ (a folder)
#   step         bench-plan's prediction for the leaderboard step's rows (zero1 and FSDP at
#                this GPU's memory), then bench-step --preset leaderboard-2026 (ours, ZeRO-1,
#                beside the torch-native step on FSDP2); where bench-plan predicts zero.FSDP's
#                or FSDP2's row above the GPUs' memory the tool refuses and prints the
#                depth-reduced command (2 ranks, --num-layers fit), which then runs in the
#                time left                   plan_leaderboard_*, step_leaderboard_*
#   tests        python3 -m pytest -m gpu: fa2's, then every other package's   gpu_tests_*
#
# Every part but train-* and tests needs 2 GPUs or more. Limits are allowances, estimated from
# the committed results (each beside its part below). A command that fails or runs out of time
# is reported and the others still run; the train parts skip runs already finished, so a part
# can be called again, and two parts may share the run folders (one claims a run, the other
# skips it). Usage, from the repository root (no installation needed):
#
#   packages/bench/scripts/multi_gpu.sh PART [OUT_DIR [TEXT_FILE]]   # list: the parts
#   GPUS=4 DRY_RUN=1 packages/bench/scripts/multi_gpu.sh PART ...  # each command: limit, name, command
#   GPUS=4 TINY=1 packages/bench/scripts/multi_gpu.sh all OUT_DIR TEXT_FILE   # CPU rehearsal
#
# SIZES (e.g. SIZES=xl) replaces the zero and ddp parts' sizes.
# GPUS is the count of CUDA_VISIBLE_DEVICES where that is set, else nvidia-smi's, else 2 (a
# machine without GPUs: DRY_RUN or TINY). The train parts need TEXT_FILE (Tiny Shakespeare).
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0) for every process the parts start. TINY=1 runs
# every command on the CPU instead, on GPUS gloo ranks, at tiny sizes and few steps (the options
# the `tiny` function appends: argparse keeps the last of an option): a rehearsal that every
# command runs end to end, not a measurement. In DRY_RUN output a command named `or: ...` runs
# only in place of the one before.
set -u
part=${1:?usage: multi_gpu.sh PART [OUT_DIR [TEXT_FILE]] (multi_gpu.sh list: the parts)}
out=${2:-docs/results}
text=${3:-TEXT_FILE}
bulk=${MULTI_GPU_BULK:-${TWO_GPU_BULK:-$out/bulk}}
runs=$bulk/train_runs
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
scripts=${here#"$root"/}  # as run from the root: the commands name no machine's paths
export PYTHONPATH=$(ls -d "$root"/packages/*/src | paste -sd:)
export NCCL_NVLS_ENABLE=0  # NVLink multicast off: it can take shared machines' GPUs out of service
dry=${DRY_RUN:-0}
tiny=${TINY:-0}
PY=python3
[ "$tiny" = 1 ] && export STEM_DEVICE=cpu

gpu_count() {  # the GPUs this script may use (see the header)
    if [ -n "${GPUS:-}" ]; then
        echo "$GPUS"
    elif [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
        tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .
    elif [ "$dry" != 1 ] && [ "$tiny" != 1 ] && nvidia-smi -L >/dev/null 2>&1; then
        nvidia-smi -L | grep -c '^GPU'
    else
        echo 2
    fi
}
GPUS=$(gpu_count)
if ! [[ $GPUS =~ ^[1-9][0-9]*$ ]]; then
    echo "GPUS must be a count of GPUs (1 or more), not '$GPUS'" >&2
    exit 2
fi

. "$here/gpu_lib.sh"

tiny() {  # tiny WHAT: the options that shrink WHAT's commands under TINY=1 (appended)
    [ "$tiny" = 1 ] || return 0
    case $1 in
    zero | ddp) echo --device cpu --size tiny --context-length 32 --batch 2 --warmup 1 --steps 2 ;;
    allreduce) echo --device cpu --backend gloo --sizes-mb 1 10 --warmup 1 --steps 2 ;;
    train) echo --device cpu --size tiny --context-length 32 --batch-size 8 --steps 12 \
        --log-every 4 --eval-batches 2 ;;
    ddp-overlap) echo --tiny ;;
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

sizes() {  # bench-zero's and bench-ddp's sizes: $SIZES, else xl, and on 2 GPUs xl-2025 too
    if [ -n "${SIZES:-}" ]; then
        echo "$SIZES"
        return
    fi
    echo xl
    [ "$GPUS" = 2 ] && echo xl-2025
}

# All-reduce allowance: 4 launches (2 backends x 2 world sizes on 4 GPUs) of about 15 s of
# start-up each (the CPU rehearsal's commands took 14-34 s, two_gpu_rehearsal_cpu_2026-11-25),
# plus gloo's 1 GB, 25 calls (5 warm-up + 20 timed) of 0.64 s on 4 ranks and 0.45 s on 2 (the
# medians, 641.4 and 451 ms, of allreduce_4xh200_2026-11-28): 60 + 25 x 1.09 = about 90 s;
# NCCL's rows take well under a second each.
allreduce() {
    local result
    result=$(stem allreduce "$GPUS")
    run 150 "bench-allreduce" $PY -m bench allreduce --backend nccl gloo \
        --nproc $(seq 2 2 "$GPUS") --sizes-mb 1 10 100 1000 --full --no-progress \
        $(files "$result") $(tiny allreduce)
}

per_size() {  # per_size TOOL: bench-TOOL on GPUS ranks at each of sizes(), a result each
    local tool=$1 size topic limit result
    for size in $(sizes); do
        topic=${tool}_$size limit=210  # xl-2025: 1600 wide, 0.6x xl's parameters
        [ "$size" = xl ] && topic=$tool limit=300
        result=$(stem "$topic" "$GPUS")
        run "$limit" "bench-$tool $size" $PY -m bench "$tool" --size "$size" \
            --nproc "$GPUS" $("${tool}_options" "$result") --no-progress \
            $(files "$result") $(tiny "$tool")
    done
}

zero_options() {  # zero_options RESULT: every variant, FSDP in both dtypes, traced
    echo --variants ddp:torch zero1:torch-ddp zero1:torch fsdp fsdp:torch fsdp:no-prefetch \
        --fsdp-dtypes fp32 bf16 --trace "$bulk/${1}_traces"
}

ddp_options() {  # ddp_options RESULT: bench-ddp's defaults (every wrapper, torch DDP and the
    # all-reduce alone), each training row with a torch.profiler trace of one step (rank 0's)
    echo --trace "$bulk/${1}_traces"
}

# bench-train's scaling runs: the modes (ddp:torch last: the run the issue's four-GPU scaling
# does without, so the first a part cut short loses), and each size's run (global batch, steps).
MODES="single ddp zero1 fsdp fsdp:torch ddp:torch"
declare -A SIZE_RUN=([small]="--batch-size 32 --steps 200" [xl]="--batch-size 8 --steps 100")
# Allowances per run: start-up (bench-train's commands in the CPU rehearsal took 14-23 s, nearly
# all of it start-up, two_gpu_rehearsal_cpu_2026-11-25) plus the steps on one GPU, an upper
# bound for more: small, 200 steps of 8192 tokens at fa2-triton eager's 220,578 tokens/s on an
# H100 (train_speed_h100_2026-11-23) = 7 s, leaving time to compile fa2's kernels; xl, 100
# steps of its bf16 training step at 2048 tokens, 299 ms on an H100 (model_h100_2026-11-25) =
# 30 s.
declare -A SIZE_LIMIT=([small]=60 [xl]=90)

run_folder() {  # run_folder SIZE MODE RANKS: a run's folder (its name is its label in the table)
    local mode=$2
    echo "$runs/$1-${mode//:/-}-x$3"  # a folder name without a colon
}

claimed=
claim() {  # claim FOLDER: take FOLDER's run; false while another part's process has it
    local lock=$1.running holder
    if ! mkdir "$lock" 2>/dev/null; then
        holder=$(cat "$lock/pid" 2>/dev/null)
        # no pid yet: claimed this instant; a live one: running
        if [ -z "$holder" ] || kill -0 "$holder" 2>/dev/null; then
            return 1
        fi
        rm -rf "$lock" # its holder was killed: take the run over, unless another part just did
        mkdir "$lock" 2>/dev/null || return 1
    fi
    echo $$ >"$lock/pid"
    claimed=$lock
}

release() {
    [ -n "$claimed" ] && rm -rf "$claimed"
    claimed=
}
trap 'release; exit 143' TERM  # stopped (timeout, gpu_plan.py): leave no claim behind

train() {  # train SIZE MODE...: a run per mode (single on 1 GPU, the others on GPUS)
    local size=$1 mode nproc folder
    shift
    if [ "$dry" != 1 ] && [ ! -f "$text" ]; then
        echo "the train parts need TEXT_FILE (Tiny Shakespeare): multi_gpu.sh $part OUT_DIR TEXT_FILE" >&2
        exit 2
    fi
    for mode in "$@"; do
        nproc=$GPUS
        [ "$mode" = single ] && nproc=1
        [ "$mode" = single ] || [ "$nproc" -ge 2 ] || continue  # data parallel needs 2 ranks
        folder=$(run_folder "$size" "$mode" "$nproc")
        if [ "$dry" != 1 ]; then
            [ -f "$folder/summary.json" ] && continue  # finished in an earlier call
            mkdir -p "$runs"
            if ! claim "$folder"; then
                echo "== bench-train $size $mode x$nproc: another part runs it" >&2
                continue
            fi
            if [ -f "$folder/summary.json" ]; then  # another part finished it meanwhile
                release
                continue
            fi
            rm -rf "$folder"  # killed: start it again
        fi
        # shellcheck disable=SC2086  # SIZE_RUN's options are words
        run "${SIZE_LIMIT[$size]}" "bench-train $size $mode x$nproc" $PY -m bench train \
            --data "$text" --tokenizer bytes --size "$size" --context-length 256 \
            ${SIZE_RUN[$size]} --seed 0 --nproc "$nproc" --parallel "$mode" --no-compile \
            --no-checkpoint --generate 0 --eval-every 0 --eval-batches 10 --log-every 10 \
            --cache-dir "$runs/cache" --out "$folder" --no-progress $(tiny train)
        release
    done
    train_table
}

train_table() {  # the scaling table of every finished run under $runs
    local size mode folder ranks scaling=()
    for size in small xl; do
        for mode in $MODES; do
            if [ "$dry" = 1 ]; then  # the runs this machine's train parts make
                ranks=$GPUS
                [ "$mode" = single ] && ranks=1
                [ "$mode" = single ] || [ "$ranks" -ge 2 ] || continue
                folder=$(run_folder "$size" "$mode" "$ranks")
                scaling+=("$(basename "$folder")=$folder")
                continue
            fi
            for folder in $(ls -d "$(run_folder "$size" "$mode" "")"* 2>/dev/null | sort -V); do
                [ -f "$folder/summary.json" ] && scaling+=("$(basename "$folder")=$folder")
            done
        done
    done
    if [ ${#scaling[@]} = 0 ]; then
        echo "no finished bench-train run under $runs yet: no table" >&2
        return
    fi
    run 60 "scaling table" $PY -m bench train-results --out "$out" --scaling "${scaling[@]}"
}

ddp_overlap() {  # its own budget (330 s from its ranks' start) and hard margin (25 s), + start-up
    run 390 "ddp overlap levers" $PY "$scripts/ddp_overlap.py" \
        --out "$out/$(stem ddp_overlap 2)" $(tiny ddp-overlap)
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
    if [ "$dry" = 1 ]; then  # what the tool prints where a row does not fit, from its own function
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

parts="allreduce zero train-small train-xl-1 train-xl-2 train-table ddp ddp-overlap step tests"
one() {  # one PART: its commands
    RUN_TAG=$1
    case $1 in
    allreduce) allreduce ;;
    zero) per_size zero ;;
    train-small) train small $MODES ;;
    train-xl-1) train xl single ddp zero1 ;;
    train-xl-2) train xl fsdp fsdp:torch ddp:torch ;;
    train-table) train_table ;;
    ddp) per_size ddp ;;
    ddp-overlap) ddp_overlap ;;
    step) step ;;
    tests) tests ;;
    esac
}

case "$part" in
list) echo "$parts" ;;
all | allreduce | zero | train-small | train-xl-1 | train-xl-2 | train-table | ddp | ddp-overlap | step | tests)
    selected=$([ "$part" = all ] && echo "$parts" || echo "$part")
    if [ "$GPUS" -lt 2 ] && [[ " $selected " =~ \ (allreduce|zero|ddp|ddp-overlap|step)\  ]]; then
        echo "$part needs 2 GPUs or more; GPUS is $GPUS (train-*, train-table and tests run on 1)" >&2
        exit 2
    fi
    [ "$dry" = 1 ] || mkdir -p "$out" "$bulk"
    for p in $selected; do one "$p"; done
    [ "$dry" = 1 ] || echo "== multi_gpu.sh $part on $GPUS GPUs finished in $SECONDS s; results in $out" >&2
    ;;
*)
    echo "unknown part $part; choose one of: $parts, all, list" >&2
    exit 2
    ;;
esac

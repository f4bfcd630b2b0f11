# Shell helpers the GPU result scripts share (sourced, not run): the standard result name of a
# topic, a timed command that is never fatal, and a result's output options. They read `out`
# (the results folder) and `DRY_RUN` (1: print each command, tab-separated limit, name and
# command, instead of running it; names get the device `dryrun`). Optional, for a record of a
# script's calls: `RUN_LOG` (a file each command appends a tab-separated line to: `RUN_TAG`,
# limit, name, seconds, exit status, command), `RUN_STDERR` (a file that receives a copy of
# the next command's stderr) and `STEM_DEVICE` (the device result names describe: cuda, or cpu
# for a CPU rehearsal).

stem() {  # stem TOPIC [GPUS]: the standard result name of a topic on this machine today
    if [ "${DRY_RUN:-0}" = 1 ]; then
        echo "${1}_dryrun_$(date -u +%F)"
        return
    fi
    python3 -c "import sys, torch; from bench.core.env import collect_env; \
from bench.core.results import result_stem; \
print(result_stem(sys.argv[1], collect_env(torch.device(sys.argv[3])), \
num_devices=int(sys.argv[2])))" "$1" "${2:-1}" "${STEM_DEVICE:-cuda}"
}

run() {  # run LIMIT_S NAME COMMAND...: one command, timed, never fatal (its status: $last_status)
    local limit=$1 name=$2 start=$SECONDS
    shift 2
    if [ "${DRY_RUN:-0}" = 1 ]; then
        printf '%s\t%s\t%s\n' "$limit" "$name" "$*"
        return
    fi
    echo "== $name (limit ${limit} s): $*" >&2
    if [ -n "${RUN_STDERR:-}" ]; then  # stderr to the terminal and to the file, in order
        { timeout "$limit" "$@" 2>&1 1>&3 | tee "$RUN_STDERR" >&2; } 3>&1
        last_status=${PIPESTATUS[0]}
    else
        timeout "$limit" "$@"
        last_status=$?
    fi
    if [ "$last_status" = 0 ]; then
        echo "== $name done in $((SECONDS - start)) s" >&2
    else
        echo "== $name FAILED or timed out after $((SECONDS - start)) s (exit $last_status)" >&2
    fi
    if [ -n "${RUN_LOG:-}" ]; then
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "${RUN_TAG:-}" "$limit" "$name" \
            "$((SECONDS - start))" "$last_status" "$*" >>"$RUN_LOG"
    fi
}

files() {  # --json/--markdown/--plot of a result name
    echo --json "$out/$1.json" --markdown "$out/$1.md" --plot "$out/$1.png"
}

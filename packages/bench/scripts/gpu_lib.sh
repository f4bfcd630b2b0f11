# Shell helpers the GPU result scripts share (sourced, not run): the standard result name of a
# topic, a timed command that is never fatal, and a result's output options. They read `out`
# (the results folder) and `DRY_RUN` (1: print each command, tab-separated limit, name and
# command, instead of running it; names get the device `dryrun`).

stem() {  # the standard result name of a topic on this machine today
    if [ "${DRY_RUN:-0}" = 1 ]; then
        echo "${1}_dryrun_$(date -u +%F)"
        return
    fi
    python3 -c "import sys, torch; from bench.core.env import collect_env; \
from bench.core.results import result_stem; \
print(result_stem(sys.argv[1], collect_env(torch.device('cuda'))))" "$1"
}

run() {  # run LIMIT_S NAME COMMAND...: one command, timed, never fatal
    local limit=$1 name=$2
    shift 2
    if [ "${DRY_RUN:-0}" = 1 ]; then
        printf '%s\t%s\t%s\n' "$limit" "$name" "$*"
        return
    fi
    local start=$SECONDS
    echo "== $name (limit ${limit} s): $*" >&2
    if timeout "$limit" "$@"; then
        echo "== $name done in $((SECONDS - start)) s" >&2
    else
        echo "== $name FAILED or timed out after $((SECONDS - start)) s (exit $?)" >&2
    fi
}

files() {  # --json/--markdown/--plot of a result name
    echo --json "$out/$1.json" --markdown "$out/$1.md" --plot "$out/$1.png"
}

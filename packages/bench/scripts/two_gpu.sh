#!/usr/bin/env bash
# The measurements that need two GPUs (issue 27): multi_gpu.sh on a machine of two GPUs, its
# parts, options and results as that script's header describes them (GPUS=2 there).
#
#   packages/bench/scripts/two_gpu.sh PART [OUT_DIR [TEXT_FILE]]   # list: the parts
GPUS=2 exec "$(dirname "$0")/multi_gpu.sh" "$@"

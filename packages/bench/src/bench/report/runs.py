"""The GPU runs the 2026 handout asks for that the committed results may lack, as commands.

A section whose run is missing says which command makes it and on what hardware; the commands
live here, once, as `packages/bench/scripts/handout_gpu.sh` runs them (the tests check each
against the script), with the bench tools' entry points in place of its `python -m bench`.
Result names follow `<topic>_<device>_<date>` (`bench.core.results.result_stem`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ALLREDUCE_GLOO_FULL",
    "ALLREDUCE_MORE_GPUS",
    "CHECKPOINTING_STUDY",
    "COMPILE_MODEL",
    "DDP_TRACES",
    "FLASH_NAIVE",
    "FSDP_PLAN",
    "FSDP_TRACES",
    "MEMORY_TIMELINES",
    "PROFILES",
    "SCRIPT",
    "GpuRun",
]

SCRIPT = "packages/bench/scripts/handout_gpu.sh"
ONE_GPU = "one 80 GB H100"
TWO_GPUS = "two GPUs of one node"


@dataclass(frozen=True)
class GpuRun:
    """A run the report may lack: the script's part that makes it, the command, its size.

    Attributes:
        part: the `handout_gpu.sh` part (`part2`), or "" for a command the script lacks.
        command: the bench command that makes the result (paths with `<device>_<date>`).
        minutes: the script's estimate of the part's time (None: no estimate).
        hardware: what it runs on.
    """

    part: str
    command: str
    minutes: int | None = None
    hardware: str = ONE_GPU

    def sentence(self) -> str:
        """`handout_gpu.sh partN` (hardware, time) runs `command`, as a clause."""
        where = f"`{SCRIPT} {self.part}`" if self.part else "the command"
        time = f", about {self.minutes} min by the script's estimate" if self.minutes else ""
        return f"{where} (on {self.hardware}{time}) runs `{self.command}`"


# `handout_gpu.sh quick` makes each of these within its five-minute budget on one GPU.
QUICK = "one GPU (an H200 or H100), at most 5 min for the whole part"
PROFILES = (
    GpuRun(
        "quick",
        "bench-model --size small medium --context-length 256 512 1024 --mode train-step "
        "--warmup 1 --steps 1 --profile docs/results/profile_small_medium_<device>_<date> "
        "--json docs/results/profile_small_medium_<device>_<date>_timing.json",
        hardware=QUICK,
    ),
)
MEMORY_TIMELINES = GpuRun(
    "quick",
    "bench-model --size xl --context-length 128 2048 --mode forward train-step --precision fp32 "
    "--warmup 1 --steps 1 --memory-snapshot "
    "docs/results/bulk/memory_fp32_<device>_<date>_snapshot.pickle "
    "--json docs/results/memory_fp32_<device>_<date>.json",
    hardware=QUICK,
)
COMPILE_MODEL = GpuRun(
    "quick",
    "bench-model --size small --context-length 512 --mode forward train-step --compile both "
    "--warmup 2 --steps 3 --json docs/results/compile_<device>_<date>.json",
    hardware=QUICK,
)
FLASH_NAIVE = GpuRun(
    "quick",
    "bench-flash --preset sweep --seq 128 1024 8192 65536 --d 16 64 128 --dtype bf16 fp32 "
    "--impls fa2-triton naive --budget-ms 5 20 "
    "--json docs/results/flash_naive_<device>_<date>.json",
    hardware=QUICK,
)
CHECKPOINTING_STUDY = GpuRun(
    "",
    "bench-step --study checkpointing --size xl --context-length 2048 --batch 4 "
    "--precision bf16-autocast --attention fa2-triton --loss materialized "
    "--optimizer torch-fused --no-compile --no-native "
    "--json docs/results/step_checkpointing_<device>_<date>.json",
)
# NCCL needs a GPU per process on one node; the report fills in the process counts (`{nproc}`).
ALLREDUCE_MORE_GPUS = GpuRun(
    "",
    "bench-allreduce --backend nccl --nproc {nproc} "
    "--json docs/results/allreduce_<device>_<date>.json",
    hardware="one node with a GPU per process",
)
# gloo's 1 GB is opt-in (`--full`: several GB of host memory and minutes on 6 ranks); gloo runs
# on the CPU, so any of the GPU machines' hosts makes it, GPUs or not. The report fills in
# the process counts and sizes its table lacks (`{nproc}`, `{sizes}`).
ALLREDUCE_GLOO_FULL = GpuRun(
    "",
    "bench-allreduce --backend gloo --nproc {nproc} --sizes-mb {sizes} --full "
    "--json docs/results/allreduce_<device>_<date>.json",
    hardware="the host of the other all-reduce runs, whose CPU gloo uses",
)
DDP_TRACES = GpuRun(
    "",
    "bench-ddp --variants single ddp:naive ddp:flat ddp:individual --trace "
    "docs/results/bulk/ddp_traces --json docs/results/ddp_<device>_<date>.json",
    hardware=TWO_GPUS,
)
FSDP_TRACES = GpuRun(
    "",
    "bench-zero --variants ddp:torch zero1:torch-ddp fsdp --trace docs/results/bulk/zero_traces "
    "--json docs/results/zero_<device>_<date>.json",
    hardware=TWO_GPUS,
)
# bench-plan runs on any machine: the prediction §7 (a) reads, at §6's setting (bench-zero's).
FSDP_PLAN = GpuRun(
    "",
    "bench-plan --size xl-2025 xl --context-length 128 --batch 4 --precision fp32 --layout "
    "ddp:torch zero1:torch-ddp fsdp --dp 2 --optimizer torch "
    "--json docs/results/plan_fsdp_<date>.json",
    hardware="any machine (no GPU)",
)

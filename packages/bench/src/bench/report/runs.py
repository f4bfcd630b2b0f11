"""The GPU runs the 2026 handout asks for that the committed results may lack, as commands.

A section whose run is missing says which command makes it and on what hardware; the commands
live here, once, as `packages/bench/scripts/handout_gpu.sh` runs them (the tests check each
against the script), with the bench tools' entry points in place of its `python -m bench`.
Result names follow `<topic>_<device>_<date>` (`bench.core.results.result_stem`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CHECKPOINTING_STUDY",
    "COMPILE_MODEL",
    "FLASH_NAIVE",
    "MEMORY_TIMELINES",
    "PROFILES",
    "SCRIPT",
    "GpuRun",
]

SCRIPT = "packages/bench/scripts/handout_gpu.sh"
ONE_GPU = "one 80 GB H100"


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


PROFILES = (
    GpuRun(
        "part2",
        "bench-model --size small --context-length 256 512 1024 --mode forward train-step "
        "--warmup 2 --steps 3 --profile docs/results/profile_small_<device>_<date> "
        "--json docs/results/profile_small_<device>_<date>_timing.json",
        6,
    ),
    GpuRun(
        "part3",
        "bench-model --size xl --context-length 256 512 1024 --mode forward train-step "
        "--warmup 2 --steps 3 --profile docs/results/profile_xl_<device>_<date> "
        "--json docs/results/profile_xl_<device>_<date>_timing.json",
        6,
    ),
)
MEMORY_TIMELINES = GpuRun(
    "part2",
    "bench-model --size xl --context-length 128 2048 --mode forward train-step --precision fp32 "
    "--warmup 1 --steps 1 --memory-snapshot "
    "docs/results/bulk/memory_fp32_<device>_<date>_snapshot.pickle "
    "--json docs/results/memory_fp32_<device>_<date>.json",
    6,
)
COMPILE_MODEL = GpuRun(
    "part5",
    "bench-model --size small xl --context-length 512 --mode forward forward-backward "
    "train-step --compile both --warmup 3 --steps 5 "
    "--json docs/results/compile_<device>_<date>.json",
    6,
)
FLASH_NAIVE = GpuRun(
    "part6",
    "bench-flash --preset sweep --dtype bf16 --impls fa2-triton naive sdpa "
    "--json docs/results/flash_sweep_bf16_<device>_<date>.json",
    6,
)
CHECKPOINTING_STUDY = GpuRun(
    "",
    "bench-step --study checkpointing --size xl --context-length 2048 --batch 4 "
    "--precision bf16-autocast --attention fa2-triton --loss materialized "
    "--optimizer torch-fused --no-compile --no-native "
    "--json docs/results/step_checkpointing_<device>_<date>.json",
)

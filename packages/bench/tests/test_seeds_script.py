"""scripts/seeds_gpu.sh: every command parses, each part fits the time the issue gives it (the
matrix 3 minutes on 2 GPUs, fp16 against bf16 2 minutes on one), and the results are named."""

from __future__ import annotations

import importlib
import subprocess
from pathlib import Path

import pytest
from gpu_scripts import dry_run

from bench.__main__ import commands as bench_commands

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "seeds_gpu.sh"
LIMITS_S = {"matrix": 180, "fp16": 120}


def _commands(part: str) -> list[tuple[int, str, list[str]]]:
    return dry_run(SCRIPT, part, "tinyshakespeare.txt", "results", env={"RUNS": "runs"})


@pytest.mark.parametrize("part", LIMITS_S)
def test_every_command_parses_and_the_part_fits_its_time(part):
    commands = _commands(part)
    assert sum(limit for limit, _, _ in commands) <= LIMITS_S[part]
    for _, name, argv in commands:
        assert argv[:3] == ["python3", "-m", "bench"], name
        module = bench_commands()["bench-" + argv[3]].partition(":")[0]
        importlib.import_module(module).COMMAND.parser().parse_args(argv[4:])
    assert all(
        "tinyshakespeare.txt" in argv for _, _, argv in commands if argv[3] != "train-results"
    )


def test_the_results_land_in_the_results_folder_under_their_names():
    (matrix,) = _commands("matrix")
    argv = matrix[2]
    assert argv[argv.index("--json") + 1].startswith("results/matrix_dryrun_")
    assert argv[argv.index("--parallel") + 1 : argv.index("--nproc")] == ["single", "ddp", "fsdp"]
    *runs, table = _commands("fp16")
    assert [a[a.index("--precision") + 1] for _, _, a in runs] == ["bf16-autocast", "fp16"]
    assert table[2][-2:] == ["bf16=runs/bf16", "fp16=runs/fp16"]
    assert _commands("all") == _commands("matrix") + _commands("fp16")


def test_a_part_needs_the_text_and_an_unknown_part_is_refused():
    for args in (["fp16"], ["x", "text.txt"]):
        proc = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True)
        assert proc.returncode == 2, args

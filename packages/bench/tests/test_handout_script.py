"""scripts/handout_gpu.sh: every command of every part parses, and each part fits one call."""

from __future__ import annotations

import importlib
import os
import subprocess
from pathlib import Path

import pytest
from gpu_scripts import dry_run

from bench.__main__ import commands as bench_commands
from lmcore import MODEL_SIZES

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "handout_gpu.sh"
CALL_LIMIT_S = 540  # one device call is 600 s; leave a minute for start-up and copying
# Sizes the 2026 names bring (branch lmcore-big, see CONTRACTS); parsed as `tiny` until then.
COMING_SIZES = {"10B", "xl-2025"}


def _commands(part: str) -> list[tuple[int, str, list[str]]]:
    return dry_run(SCRIPT, part, "results")


def _parts() -> list[str]:
    env = {**os.environ, "DRY_RUN": "1"}
    out = subprocess.run(["bash", str(SCRIPT), "list"], capture_output=True, text=True, env=env)
    return out.stdout.split()


@pytest.mark.parametrize("part", _parts())
def test_every_command_parses_and_the_part_fits_one_call(part):
    commands = _commands(part)
    assert commands and sum(limit for limit, _, _ in commands) <= CALL_LIMIT_S
    for _, name, argv in commands:
        assert argv[:3] == ["python3", "-m", "bench"], name
        module = bench_commands()["bench-" + argv[3]].partition(":")[0]
        command = importlib.import_module(module).COMMAND
        args = argv[4:]
        if "--size" in args:
            start = args.index("--size") + 1
            end = next((i for i in range(start, len(args)) if args[i].startswith("-")), len(args))
            sizes = args[start:end]
            assert set(sizes) <= set(MODEL_SIZES) | COMING_SIZES, name
            args[start:end] = ["tiny" if s in COMING_SIZES else s for s in sizes]
        parsed = command.parser().parse_args(args)
        assert parsed.json is not None and parsed.json.parent == Path("results"), name


def test_an_unknown_part_is_refused():
    proc = subprocess.run(["bash", str(SCRIPT), "part9"], capture_output=True, text=True)
    assert proc.returncode == 2 and "part1" in proc.stderr


def test_quick_runs_the_open_questions_within_five_minutes_most_needed_first():
    commands = _commands("quick")
    assert sum(limit for limit, _, _ in commands) <= 300  # a dry run spends every limit in full
    names = [name for _, name, _ in commands]
    assert names[:3] == ["memory fp32", "profiles", "flash against naive"]
    argv = {name: " ".join(args) for _, name, args in commands}
    assert (
        "--memory-snapshot" in argv["memory fp32"]
        and "--context-length 128 2048" in argv["memory fp32"]
    )
    assert "--size small medium" in argv["profiles"] and "--profile" in argv["profiles"]
    assert "--impls fa2-triton naive" in argv["flash against naive"]
    assert "--compile both" in argv["whole-model compile"]
    assert "--mode forward train-step" in argv["whole-model compile"]


def test_quick_cuts_the_last_commands_to_a_smaller_budget():
    commands = dry_run(SCRIPT, "quick", "results", env={"QUICK_BUDGET_S": "150"})
    assert sum(limit for limit, _, _ in commands) <= 150
    assert [name for _, name, _ in commands] == ["memory fp32", "profiles", "flash against naive"]
    assert commands[-1][0] == 150 - 45 - 70  # what was left of the budget

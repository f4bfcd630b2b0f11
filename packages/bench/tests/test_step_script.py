"""scripts/step_gpu.sh: every command parses, and all of them fit one call."""

from __future__ import annotations

import importlib
import subprocess
from pathlib import Path

import pytest
from gpu_scripts import dry_run

from bench.__main__ import commands as bench_commands

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "step_gpu.sh"
CALL_LIMIT_S = 540  # one device call is 600 s; leave a minute for start-up and copying


def _commands(part: str) -> list[tuple[int, str, list[str]]]:
    return dry_run(SCRIPT, part, "results")


def test_every_command_parses_and_all_fit_one_call():
    commands = _commands("all")
    assert len(commands) == 3 and sum(limit for limit, _, _ in commands) <= CALL_LIMIT_S
    for _, name, argv in commands:
        assert argv[:3] == ["python3", "-m", "bench"], name
        module = bench_commands()["bench-" + argv[3]].partition(":")[0]
        parsed = importlib.import_module(module).COMMAND.parser().parse_args(argv[4:])
        assert parsed.json is not None and parsed.json.parent == Path("results"), name


@pytest.mark.parametrize("part", ["a", "b", "c"])
def test_each_part_runs_alone(part):
    (command,) = _commands(part)
    assert command in _commands("all")


def test_an_unknown_part_is_refused():
    proc = subprocess.run(["bash", str(SCRIPT), "d"], capture_output=True, text=True)
    assert proc.returncode == 2 and "a b c" in proc.stderr

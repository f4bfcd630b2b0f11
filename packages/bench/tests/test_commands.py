"""Every command answers `--help`, and refuses a bad option, before anything heavy is imported.

Each command runs in a fresh interpreter (a test process has imported torch long ago) as its
console script does (`from bench.commands.attn import main; main()`); the interpreter reports at
exit which of torch, numpy, matplotlib and triton it imported: none may be. A command added to
`[project.scripts]` is checked without being named here.
"""

from __future__ import annotations

import json

import pytest
from fresh_interpreter import run_fresh
from lazy_package import check_lazy_package

import bench.train
from bench.__main__ import commands

_EXITS = "exit statuses:"


def _run_alone(target: str, *argvs: list[str]):
    """Call the entry point `module:function` with each argv in one fresh interpreter; its
    `FreshRun` and the exit statuses, in order."""
    module, _, function = target.partition(":")
    code = (
        f"import sys\nfrom {module} import {function} as main\ncodes = []\n"
        f"for argv in {list(argvs)!r}:\n"
        "    try:\n        codes.append(main(argv))\n"
        "    except SystemExit as exc:\n        codes.append(exc.code)\n"
        f"print({_EXITS!r}, codes, file=sys.stderr)\n"
    )
    run = run_fresh(code)
    assert run.returncode == 0, run.stderr
    before, _, codes = run.stderr.rpartition(_EXITS)
    return run, before, json.loads(codes)


@pytest.mark.parametrize(("name", "target"), sorted(commands().items()))
def test_help_and_a_usage_error_come_before_torch(name, target):
    run, stderr, codes = _run_alone(target, ["--help"], ["--no-such-option"])
    assert codes == [0, 2]
    assert run.stdout.startswith(f"usage: {name}") and "options:" in run.stdout
    assert f"{name}: error:" in stderr  # unrecognized, or a required option missing
    assert not run.loaded, f"{name}: --help or a usage error imported {sorted(run.loaded)}"


def test_python_dash_m_bench_is_as_light():
    run, _, codes = _run_alone("bench.__main__:main", ["--help"], ["attn", "--help"])
    assert codes == [0, 0]
    assert "usage: bench-attn" in run.stdout
    assert not run.loaded, sorted(run.loaded)


def test_the_trainer_package_imports_its_modules_on_first_use():
    """bench-train's command reads `bench.train.config`, which runs `bench/train/__init__.py`."""
    check_lazy_package(bench.train, light_use="from bench.train.config import TrainConfig")

"""The package's layout: plumbing (`bench.core`) never imports a tool, tools do not take the names
of the packages they measure, and every tool runs as a `bench-*` command and `python -m`."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import bench

SRC = Path(bench.__file__).parent
PYPROJECT = SRC.parents[1] / "pyproject.toml"
MEASURED_PACKAGES = {"lmcore", "fa2", "ddp", "zero"}
# `python -m bench.<name>` -> the tool module it runs.
RUNNERS = {
    "attn": "attn",
    "model": "model",
    "flash": "flash",
    "precision": "precision",
    "allreduce": "allreduce",
    "ddp": "data_parallel",
    "zero": "sharding",
    "report": "report",
    "train": "train",
    "train_results": "train_results",
    "ops": "ops",
}


def _imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (also inside functions), as absolute names."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import; use absolute `bench.` names"
            names.add(node.module or "")
    return names


@pytest.mark.parametrize("path", sorted((SRC / "core").glob("*.py")), ids=lambda p: p.name)
def test_plumbing_imports_no_tool(path):
    bench_imports = {m for m in _imported_modules(path) if m == "bench" or m.startswith("bench.")}
    assert all(m.startswith("bench.core.") for m in bench_imports), (
        f"bench/core/{path.name} imports {sorted(bench_imports)}; plumbing may import only "
        "bench.core modules"
    )


def test_no_module_is_named_after_a_measured_package():
    modules = {p.stem for folder in ("core", "tools") for p in (SRC / folder).glob("*.py")}
    assert not modules & MEASURED_PACKAGES


def test_runners_only_call_their_tool():
    for runner, tool in RUNNERS.items():
        path = SRC / f"{runner}.py"
        assert _imported_modules(path) == {f"bench.tools.{tool}"}, path.name
        module = importlib.import_module(f"bench.{runner}")
        assert module.main is importlib.import_module(f"bench.tools.{tool}").main


def test_every_tool_has_a_runner_and_a_command():
    tools = {p.stem for p in (SRC / "tools").glob("*.py")} - {"__init__"}
    assert tools == set(RUNNERS.values())
    scripts = tomllib.loads(PYPROJECT.read_text())["project"]["scripts"]
    for command, target in scripts.items():
        module, _, function = target.partition(":")
        assert module.startswith("bench.tools."), command
        assert callable(getattr(importlib.import_module(module), function)), command
    assert {t.removeprefix("bench.tools.").split(":")[0] for t in scripts.values()} == tools


def test_python_dash_m_runs_the_tool():
    proc = subprocess.run(
        [sys.executable, "-m", "bench.ddp", "--help"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: bench-ddp")

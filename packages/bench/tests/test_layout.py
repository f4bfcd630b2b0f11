"""The package's layout, its wings and the arrows between them: plumbing (`bench.core`) imports
no other wing; the planner (`bench.plan`) imports only plumbing; tools (`bench.tools`) and the
trainer (`bench.train`) never import each other, and the trainer never imports a command; only
the report (`bench.report`) imports the report, and it may read tools and the trainer; a command
(`bench.commands`) names its implementation instead of importing it; no module takes the name of
a package it measures; every trainer file stays under 400 lines; plumbing stays within its size;
and every command runs as a console script and as `python -m bench <command>`. That each
command's `--help` and usage errors come before torch is checked by test_commands.py."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import bench
from bench.__main__ import commands
from bench.__main__ import main as dispatch
from bench.core.cli import Command

SRC = Path(bench.__file__).parent
PYPROJECT = SRC.parents[1] / "pyproject.toml"
MEASURED_PACKAGES = {"lmcore", "fa2", "ddp", "zero"}
# plumbing, the commands, tools, the trainer, the planner and the report
LAYERS = ("core", "commands", "tools", "train", "plan", "report")
# The report's wing: it alone may read both tools and the trainer.
REPORT = "report"
# What a command may import of the trainer: its options (bench-train's and bench-generate's
# command lines are generated from `TrainConfig`) and the names they offer, which import no torch.
TRAINER_OPTIONS = {"bench.train.config", "bench.train.choices", "bench.train.matrix_config"}
MAX_TRAINER_LINES = 400
# Plumbing serves three consumers or more; what one tool alone uses lives beside it. The issue
# that gave the planner and the report wings of their own set these bounds. Plumbing every tool
# shares grew since (the CSV writer, the GPU table, fp16's loss scaling); it keeps within them
# because what served one tool or wing went beside it (bench-model's profile tables, bench-step's
# memory phases, the trainer's record names), not because the bounds moved.
MAX_CORE_FILES, MAX_CORE_LINES = 28, 5500


def _imported_modules(path: Path) -> set[str]:
    """Every bench module `path` imports, at any depth (also inside functions)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import; use absolute `bench.` names"
            module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)  # `from bench import x`
    return {n for n in names if n == "bench" or n.startswith("bench.")}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def _modules(layer: str) -> list[Path]:
    return sorted((SRC / layer).glob("*.py"))


@pytest.mark.parametrize("path", _modules("core"), ids=lambda p: p.name)
def test_plumbing_imports_no_other_wing(path):
    others = {m for m in _imported_modules(path) if _layer(m) != "core"}
    assert not others, (
        f"bench/core/{path.name} imports {sorted(others)}; plumbing may import only bench.core"
    )


def test_plumbing_stays_within_its_size():
    lines = sum(len(p.read_text().splitlines()) for p in _modules("core"))
    assert len(_modules("core")) <= MAX_CORE_FILES and lines <= MAX_CORE_LINES, (
        f"bench/core holds {len(_modules('core'))} files and {lines} lines; give what one tool "
        "alone uses a place beside it"
    )


@pytest.mark.parametrize("path", _modules("plan"), ids=lambda p: p.name)
def test_the_planner_imports_only_plumbing(path):
    """bench-plan's model (`bench.plan`) builds on `bench.core` and the measured packages; no
    tool, command, trainer or report module."""
    others = {m for m in _imported_modules(path) if _layer(m) not in ("core", "plan")}
    assert not others, f"bench/plan/{path.name} imports {sorted(others)}"


@pytest.mark.parametrize(
    ("layer", "other"),
    [("tools", "train"), ("train", "tools"), ("train", "commands")],
    ids=["tools", "train", "train-commands"],
)
def test_tools_and_the_trainer_never_import_each_other_nor_the_trainer_a_command(layer, other):
    for path in _modules(layer):
        crossing = {m for m in _imported_modules(path) if _layer(m) == other}
        assert not crossing, f"bench/{layer}/{path.name} imports {sorted(crossing)}"


def test_only_the_layers_and_the_dispatcher_sit_at_the_package_root():
    assert {p.name for p in SRC.glob("*.py")} == {"__init__.py", "__main__.py"}
    folders = {p.name for p in SRC.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(LAYERS)


def test_only_the_report_imports_the_report():
    """`bench.report` (the document and its sections) may read the tools' row keys and the
    trainer's results; no other wing imports it (its command names it by string)."""
    for layer in LAYERS:
        if layer == REPORT:
            continue
        for path in _modules(layer):
            uses = {m for m in _imported_modules(path) if _layer(m) == REPORT}
            assert not uses, f"bench/{layer}/{path.name} imports {sorted(uses)}"


def test_no_module_is_named_after_a_measured_package():
    modules = {p.stem for layer in LAYERS for p in _modules(layer)}
    assert not modules & MEASURED_PACKAGES


@pytest.mark.parametrize("path", _modules("train"), ids=lambda p: p.name)
def test_every_trainer_file_is_under_400_lines(path):
    assert len(path.read_text().splitlines()) < MAX_TRAINER_LINES


@pytest.mark.parametrize("path", _modules("commands"), ids=lambda p: p.name)
def test_a_command_names_its_implementation_instead_of_importing_it(path):
    imported = {m for m in _imported_modules(path) if _layer(m) in ("tools", "train", REPORT)}
    allowed = {
        m for m in imported if m.rpartition(".")[0] in TRAINER_OPTIONS or m in TRAINER_OPTIONS
    }
    assert imported == allowed, (
        f"bench/commands/{path.name} imports {sorted(imported - allowed)}: name the "
        "implementation in Command(run='module:name') and keep the options' vocabulary here"
    )


def test_every_tool_is_a_command_and_every_command_a_main():
    scripts = tomllib.loads(PYPROJECT.read_text())["project"]["scripts"]
    assert commands() == scripts  # what `python -m bench` dispatches to
    implementations = set()
    for name, target in scripts.items():
        module, _, function = target.partition(":")
        assert name.startswith("bench-") and _layer(module) == "commands", name
        assert function == "main", name
        command = importlib.import_module(module).COMMAND
        assert isinstance(command, Command) and command.prog == name, name
        assert callable(command.runner()), name
        implementations.add(command.run.partition(":")[0])
    stems = {target.partition(":")[0].rsplit(".", 1)[1] for target in scripts.values()}
    assert stems == {p.stem for p in _modules("commands") if p.stem != "__init__"}
    tools = {f"bench.tools.{p.stem}" for p in _modules("tools") if p.stem != "__init__"}
    assert tools <= implementations, f"tools without a command: {sorted(tools - implementations)}"


def test_python_dash_m_bench_runs_a_command():
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "ddp", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: bench-ddp")


def test_the_dispatcher_lists_its_commands_and_refuses_unknown_ones(capsys):
    assert dispatch(["--help"]) == 0
    listed = capsys.readouterr().out
    assert all(name.removeprefix("bench-") in listed for name in commands())
    assert dispatch(["no-such-tool"]) == 2
    assert "unknown command 'no-such-tool'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # both spellings of a name reach the command
        dispatch(["train_results", "--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("usage: bench-train-results")

"""Each package can be installed and tested alone: it declares what it imports, ships the
license and type marker, and reads its version from its own `__init__`."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["lmcore", "fa2", "ddp", "zero", "bench"]


def _pyproject(name: str) -> dict:
    return tomllib.loads((ROOT / "packages" / name / "pyproject.toml").read_text())


def _declared(project: dict) -> set[str]:
    """Distribution names a project requires, its optional extras included."""
    specs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        specs.extend(extra)
    return {Requirement(s).name for s in specs}


def _top_level_imports(folder: Path) -> set[str]:
    """Top-level modules that the Python files under `folder` import, at any depth of a file."""
    found: set[str] = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names)


def _imported_top_level(name: str) -> set[str]:
    """Top-level modules that the package's sources import, other than itself."""
    return _top_level_imports(ROOT / "packages" / name / "src" / name) - {name}


def _distributions() -> dict[str, list[str]]:
    """Import name -> distribution names; the workspace's own packages are editable installs,
    which importlib's mapping does not list."""
    return importlib.metadata.packages_distributions() | {
        other: [f"cs336sys-{other}"] for other in PACKAGES
    }


@pytest.mark.parametrize("name", PACKAGES)
def test_every_third_party_import_is_declared(name):
    distributions = _distributions()
    declared = _declared(_pyproject(name)["project"])
    missing = {
        module: distributions.get(module)
        for module in _imported_top_level(name)
        if not declared & set(distributions.get(module, [module]))
    }
    assert not missing, f"cs336sys-{name} imports {missing} without declaring them"


@pytest.mark.parametrize("name", PACKAGES)
def test_ships_the_root_license_and_a_type_marker(name):
    package = ROOT / "packages" / name
    assert (package / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()
    assert (package / "src" / name / "py.typed").is_file()
    project = _pyproject(name)["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert project["urls"] and project["classifiers"]


@pytest.mark.parametrize("name", PACKAGES)
def test_version_is_single_sourced_from_init(name):
    pyproject = _pyproject(name)
    assert pyproject["project"]["dynamic"] == ["version"]
    assert pyproject["tool"]["hatch"]["version"]["path"] == f"src/{name}/__init__.py"
    version = importlib.import_module(name).__version__
    assert Version(version) == Version(importlib.metadata.version(f"cs336sys-{name}"))


@pytest.mark.parametrize("name", PACKAGES)
def test_has_its_own_pytest_for_uv_run_package(name):
    dev = _pyproject(name)["dependency-groups"]["dev"]
    assert "pytest" in {Requirement(s).name for s in dev}


@pytest.mark.parametrize("name", PACKAGES)
def test_its_tests_import_only_what_its_own_test_environment_holds(name):
    # `uv run --package cs336sys-<name> pytest packages/<name>` installs the package, its
    # dependencies and its `dev` group, nothing else; a test importing anything more fails there
    # (at collection, or later inside a test), though it passes in the full workspace. Modules
    # under tests/support are on pytest's path for every package.
    distributions = _distributions()
    pyproject = _pyproject(name)
    available = _declared(pyproject["project"]) | {
        Requirement(s).name for s in pyproject["dependency-groups"]["dev"]
    }
    support = {p.stem for p in (ROOT / "tests" / "support").glob("*.py")}
    missing = {
        module: distributions.get(module)
        for module in _top_level_imports(ROOT / "packages" / name / "tests") - {name} - support
        if not available & set(distributions.get(module, [module]))
    }
    assert not missing, (
        f"packages/{name}/tests import {missing}, which `uv run --package cs336sys-{name}` does "
        f"not install: add them to the dev group of packages/{name}/pyproject.toml"
    )


def test_every_package_accepts_the_same_torch_range():
    ranges = {
        name: next(
            str(Requirement(s).specifier)
            for s in _pyproject(name)["project"]["dependencies"]
            if Requirement(s).name == "torch"
        )
        for name in PACKAGES
    }
    assert len(set(ranges.values())) == 1, ranges

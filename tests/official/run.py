"""Run a checkout of the official CS336 assignment 2 tests against this project.

The course's suite (github.com/stanford-cs336/assignment2-systems: tag `spring2025` for the
spring-2025 suite, the main branch for spring 2026) reaches an implementation only through its
`tests/adapters.py`. This script copies the checkout's `tests/` folder (and its `pyproject.toml`,
for the suite's pytest settings) into a scratch folder, replaces `adapters.py` there with this
project's (`tests/official/adapters.py`), puts the checkout's reference `cs336-basics` package on
the path (the 2026 FSDP tests build their toy model from it) and runs pytest there. The checkout
is only read; nothing of the course's is copied into this repository.

Usage, from the repository root (the suites import einops, and the 2026 `cs336_basics` also
einx and jaxtyping, which this workspace does not install)::

    git clone https://github.com/stanford-cs336/assignment2-systems ../a2
    uv run --with einops --with einx --with jaxtyping \\
        python tests/official/run.py ../a2 [--json out.json --markdown out.md] [-- -k fsdp]

Without a GPU the Triton tests skip (the suite's own `skipif`). The exit status is pytest's.
`--json`/`--markdown` write one row per test (suite, version, commit, outcome, seconds, the
failure's first line) as a bench result, which `bench-report` lists with the other results.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ADAPTERS = HERE / "adapters.py"
# Modules the suites import beyond this workspace's dependencies, with the packages that have them.
EXTRA_MODULES = {"einops": "einops", "einx": "einx", "jaxtyping": "jaxtyping"}
COLUMNS = ["suite", "version", "test", "outcome", "seconds", "message"]


def adapter_names(path: Path) -> list[str]:
    """The top-level functions an `adapters.py` defines, in order."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]


def missing_adapters(checkout: Path) -> list[str]:
    """The adapters the checkout's suite declares that this project's file lacks."""
    ours = set(adapter_names(ADAPTERS))
    return [n for n in adapter_names(checkout / "tests" / "adapters.py") if n not in ours]


def describe(checkout: Path) -> dict[str, Any]:
    """The suite's name, version (its pyproject) and commit (None outside a git checkout)."""
    project = tomllib.loads((checkout / "pyproject.toml").read_text()).get("project", {})
    version = str(project.get("version", "unknown"))
    suite = "spring2025" if version.startswith("1.") else f"spring20{version.split('.')[0]}"
    try:
        commit = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return {"suite": suite, "version": version, "commit": commit}


def prepare(checkout: Path, scratch: Path) -> Path:
    """Copy the checkout's tests and pytest settings into `scratch`, with our adapters.

    Returns:
        The scratch folder to run pytest in.

    Raises:
        FileNotFoundError: `checkout` has no `tests/adapters.py`.
        ValueError: the suite declares adapters this project does not provide.
    """
    if not (checkout / "tests" / "adapters.py").is_file():
        raise FileNotFoundError(
            f"{checkout} has no tests/adapters.py; pass a checkout of "
            "github.com/stanford-cs336/assignment2-systems"
        )
    missing = missing_adapters(checkout)
    if missing:
        raise ValueError(f"tests/official/adapters.py lacks the suite's {', '.join(missing)}")
    shutil.copytree(checkout / "tests", scratch / "tests", ignore=shutil.ignore_patterns("*.pyc"))
    shutil.copy2(checkout / "pyproject.toml", scratch / "pyproject.toml")
    shutil.copy2(ADAPTERS, scratch / "tests" / "adapters.py")
    return scratch


_ERROR_LINE = re.compile(r"^(?:E\s+)?([\w.]*(?:Error|Exception): \S.*)$")


def _reason(text: str) -> str | None:
    """The most telling line of a failure: the last `SomeError: message` line with a message
    (the assertion a spawned rank raised, rather than the spawn wrapper around it)."""
    lines = [m.group(1) for line in text.splitlines() if (m := _ERROR_LINE.match(line.strip()))]
    if lines:
        return lines[-1][:300]
    stripped = text.strip()
    return stripped.splitlines()[0][:300] if stripped else None


def outcomes(junit: Path) -> list[dict[str, Any]]:
    """One row per test case of a pytest JUnit XML report."""
    rows = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome, message = "passed", None
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error"}.get(child.tag, "skipped")
                message = _reason(f"{child.get('message') or ''}\n{child.text or ''}")
        module = case.get("classname", "").removeprefix("tests.")
        rows.append(
            {
                "test": f"{module}::{case.get('name')}",
                "outcome": outcome,
                "seconds": float(case.get("time", 0.0)),
                "message": message,
            }
        )
    return rows


def run_suite(checkout: Path, pytest_args: list[str]) -> tuple[int, list[dict[str, Any]], float]:
    """Run the suite of `checkout` against this project; `(exit status, rows, seconds)`."""
    with tempfile.TemporaryDirectory(prefix="cs336-official-") as tmp:
        scratch = prepare(checkout, Path(tmp))
        env = dict(os.environ)
        basics = checkout / "cs336-basics"
        paths = [str(basics)] if basics.is_dir() else []
        env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        junit = scratch / "junit.xml"
        command = [sys.executable, "-m", "pytest", "tests", "-p", "no:cacheprovider"]
        start = time.perf_counter()
        status = subprocess.call(
            [*command, f"--junitxml={junit}", *pytest_args], cwd=scratch, env=env
        )
        seconds = time.perf_counter() - start
        rows = outcomes(junit) if junit.is_file() else []
    return status, rows, seconds


def _record(
    args: argparse.Namespace, info: dict[str, Any], rows: list[dict[str, Any]], seconds: float
) -> None:
    """Write the rows as a bench result (`--json`, `--markdown`)."""
    import torch

    from bench.core.results import Run, save_json

    counts = {
        o: sum(r["outcome"] == o for r in rows) for o in ("passed", "failed", "error", "skipped")
    }
    run = Run.create(
        "official_tests",
        [{"suite": info["suite"], "version": info["version"], **r} for r in rows],
        device=torch.device("cuda" if torch.cuda.is_available() else "cpu"),
        config={**info, "pytest_args": args.pytest_args},
        command=" ".join(["python tests/official/run.py", "<checkout>", *args.pytest_args]),
        title=f"Official CS336 {info['suite']} tests ({info['version']}, commit "
        f"{(info['commit'] or 'unknown')[:12]}) against this project",
        columns=COLUMNS,
        notes=[
            ", ".join(f"{n} {o}" for o, n in counts.items() if n) + f" in {seconds:.0f} s.",
            "The suite's own tests, run from a scratch copy with tests/official/adapters.py in "
            "place of its adapters.py; tests marked skipped need a GPU (the suite's skipif).",
        ],
    )
    if args.json:
        save_json(run, args.json)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(run.to_markdown() + "\n")


def main(argv: list[str] | None = None) -> int:
    """Entry point (see the module docstring); returns pytest's exit status."""
    parser = argparse.ArgumentParser(
        prog="tests/official/run.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("checkout", type=Path, help="a checkout of assignment2-systems")
    parser.add_argument("--json", type=Path, help="write the per-test rows as a bench result")
    parser.add_argument("--markdown", type=Path, help="write them as a Markdown table")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed on to pytest")
    args = parser.parse_args(argv)
    absent = [m for m in EXTRA_MODULES if importlib.util.find_spec(m) is None]
    if absent:
        parser.error(
            f"the suite needs {', '.join(absent)}: run through "
            f"`uv run {' '.join('--with ' + EXTRA_MODULES[m] for m in EXTRA_MODULES)} "
            "python tests/official/run.py ...`"
        )
    try:
        info = describe(args.checkout)
        status, rows, seconds = run_suite(args.checkout.resolve(), args.pytest_args)
    except (FileNotFoundError, ValueError) as exc:
        parser.error(str(exc))
    if args.json or args.markdown:
        _record(args, info, rows, seconds)
    return status


if __name__ == "__main__":
    raise SystemExit(main())

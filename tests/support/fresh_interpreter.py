"""Run code in a fresh interpreter and learn which heavy modules it imported.

A test process has imported torch long before any test runs (the workspace's conftest does), so
whether an import or a command line stays light can only be seen in a process of its own. The
code may exit any way it likes (a command's `--help` raises `SystemExit`): the modules are read
when the interpreter exits.

    run = run_fresh("import lmcore; lmcore.MODEL_SIZES")
    assert run.returncode == 0 and not run.loaded
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["HEAVY_MODULES", "FreshRun", "run_fresh"]

# What a light import or a command's `--help` must not cost: each takes from a fraction of a
# second (numpy) to seconds (torch, matplotlib) to import.
HEAVY_MODULES = ("torch", "numpy", "matplotlib", "triton")
_MARK = "fresh-interpreter-loaded:"


@dataclass(frozen=True)
class FreshRun:
    """What the fresh interpreter did: its exit status and output (without the report line), and
    which of the watched modules it had imported when it exited."""

    returncode: int
    stdout: str
    stderr: str
    loaded: frozenset[str]


def run_fresh(code: str, *, watch: Sequence[str] = HEAVY_MODULES, timeout: float = 120) -> FreshRun:
    """Run `code` with this interpreter in a new process; report `watch`'s modules it imported.

    Raises:
        AssertionError: the process did not report (it died before the interpreter's exit).
    """
    report = (
        "import atexit as _atexit, json as _json, sys as _sys\n"
        f"_atexit.register(lambda: _sys.__stderr__.write('\\n{_MARK}' + _json.dumps("
        f"sorted(m for m in {list(watch)!r} if m in _sys.modules)) + '\\n'))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", report + code],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    stderr, mark, loaded = proc.stderr.rpartition(_MARK)
    assert mark, f"the fresh interpreter did not report its imports:\n{proc.stderr}"
    return FreshRun(
        proc.returncode, proc.stdout, stderr.rstrip("\n"), frozenset(json.loads(loaded))
    )

"""Where a measurement ran: device, versions, date and command line, for every result record.

A number without its hardware and software is not a result. Every tool stores
`collect_env()` beside its rows. No host name or user name is recorded. Importing this module
imports no torch (command lines use `command_line`); the functions that ask torch import it.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["code_version", "collect_env", "command_line", "cpu_name", "device_name", "now_iso"]

# The distributions whose code a measurement runs, by import name.
PACKAGES = {
    "cs336sys-lmcore": "lmcore",
    "cs336sys-fa2": "fa2",
    "cs336sys-ddp": "ddp",
    "cs336sys-zero": "zero",
    "cs336sys-bench": "bench",
}


def now_iso() -> str:
    """The current time in UTC, ISO 8601 to the second (`2025-05-01T12:00:00+00:00`)."""
    return _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()


def cpu_name() -> str:
    """The CPU model (`/proc/cpuinfo`'s "model name" on Linux), else the platform's best guess."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def device_name(device: torch.device | str) -> str:
    """A human name for `device`: the GPU's marketing name on CUDA, the CPU model otherwise."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def command_line(argv: Sequence[str] | None = None, *, prog: str | None = None) -> str:
    """The command as a shell would accept it.

    Args:
        argv: the arguments after the program name; `sys.argv[1:]` when None.
        prog: the program name; the basename of `sys.argv[0]` when None.
    """
    if prog is None:
        prog = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    args = list(sys.argv[1:] if argv is None else argv)
    return shlex.join([prog, *args])


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def _git(*args: str) -> str | None:
    """`git args` run in the folder of this file: its output, or None outside a git checkout."""
    try:
        done = subprocess.run(
            ["git", *args],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def _package_version(distribution: str, module: str) -> str | None:
    """The installed version of `distribution`, else the `__version__` of `module` (sources on
    `PYTHONPATH`, not installed), else None."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        return getattr(importlib.import_module(module), "__version__", None)
    except ImportError:
        return None


# Names the commit whose tree the sources are, where their git metadata cannot: a copy of a
# commit's files run on another machine whose checkout still points at an older commit.
REVISION_VARIABLE = "BENCH_GIT_REVISION"


def code_version() -> dict[str, Any]:
    """Which code a measurement runs: the git revision of the checkout the bench sources live in,
    whether its tracked files differ from that revision, and the cs336sys package versions.

    When `BENCH_GIT_REVISION` is set, it names the revision instead (the sources are a copy of
    that commit's tree, e.g. sent to another machine), `git_dirty` is unknown (None) and
    `git_revision_source` says where the revision came from.

    Returns:
        `{"git_revision": sha or None, "git_dirty": bool or None, "packages": {name: version}}`
        (plus `git_revision_source` when named by the variable); None for both git keys when the
        sources are not in a git checkout (an installed wheel).
    """
    packages = {d: _package_version(d, m) for d, m in PACKAGES.items()}
    named = os.environ.get(REVISION_VARIABLE)
    if named:
        return {
            "git_revision": named,
            "git_dirty": None,
            "git_revision_source": f"named by {REVISION_VARIABLE}: the tree of that commit",
            "packages": packages,
        }
    revision = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if revision else None
    return {
        "git_revision": revision,
        "git_dirty": None if status is None else bool(status),
        "packages": packages,
    }


def collect_env(
    device: torch.device | str = "cpu", *, command: str | None = None
) -> dict[str, Any]:
    """Describe the machine and software a measurement runs on.

    Args:
        device: the device the measurement uses; its name goes into `device_name`.
        command: the exact command line (see `command_line`); the process's own when None.

    Returns:
        A JSON-ready dict with keys `device`, `device_type`, `device_name`, `cuda_available`,
        `gpu_count`, `cuda` (toolkit version or None), `cudnn`, `torch`, `triton` (None when not
        installed), `python`, `platform`, `cpu`, `date` (UTC ISO), `command`, and the code
        measured: `git_revision`, `git_dirty` and `packages` (see `code_version`).

    Example::

        >>> env = collect_env("cpu")
        >>> env["device_type"], env["torch"] == torch.__version__
        ('cpu', True)
    """
    import torch

    device = torch.device(device)
    cuda = torch.cuda.is_available()
    cudnn = torch.backends.cudnn.version() if cuda and torch.backends.cudnn.is_available() else None
    return {
        "device": str(device),
        "device_type": device.type,
        "device_name": device_name(device),
        "cuda_available": cuda,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "torch": torch.__version__,
        "triton": _triton_version(),
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "cpu": cpu_name(),
        "date": now_iso(),
        "command": command if command is not None else command_line(),
        **code_version(),
    }

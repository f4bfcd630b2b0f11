"""Where a measurement ran: device, versions, date and command line, for every result record.

A number without its hardware and software is not a result. Every tool stores
`collect_env()` beside its rows. No host name or user name is recorded.
"""

from __future__ import annotations

import datetime as _dt
import platform
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = ["collect_env", "command_line", "cpu_name", "device_name", "now_iso"]


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
        installed), `python`, `platform`, `cpu`, `date` (UTC ISO) and `command`.

    Example::

        >>> env = collect_env("cpu")
        >>> env["device_type"], env["torch"] == torch.__version__
        ('cpu', True)
    """
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
    }

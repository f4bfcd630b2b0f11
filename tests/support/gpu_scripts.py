"""The commands of a GPU result script (`packages/bench/scripts/*_gpu.sh`), read without running
anything: the scripts print each command instead of running it under `DRY_RUN=1`.

Example::

    for limit, name, argv in dry_run(SCRIPT, "part1", "results"):
        assert argv[:3] == ["python3", "-m", "bench"]
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

__all__ = ["dry_run"]


def dry_run(
    script: Path, *args: str, env: dict[str, str] | None = None
) -> list[tuple[int, str, list[str]]]:
    """`(time limit in s, name, argv)` of every command `script *args` would run, in order
    (`env`: variables to set besides `DRY_RUN`).

    Raises:
        subprocess.CalledProcessError: the script refused the arguments.
    """
    env = {**os.environ, **(env or {}), "DRY_RUN": "1"}
    out = subprocess.run(
        ["bash", str(script), *args], capture_output=True, text=True, env=env, check=True
    ).stdout
    lines = [line.split("\t") for line in out.splitlines() if line]
    return [(int(limit), name, shlex.split(command)) for limit, name, command in lines]

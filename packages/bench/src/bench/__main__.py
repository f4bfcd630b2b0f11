"""`python -m bench COMMAND [OPTIONS]`: any `bench-*` command, without its console script.

    python -m bench attn --json attn.json                  # = bench-attn --json attn.json
    python -m bench train --data input.txt --out runs/x    # = bench-train ...
    torchrun --nproc-per-node 2 -m bench ddp               # ranks started by torchrun
    python -m bench --help                                 # the commands

The commands are the package's console scripts (`[project.scripts]` in its `pyproject.toml`),
named with or without their `bench-` prefix: adding a tool is adding its line there, and both
forms follow. The table is read from the `pyproject.toml` beside the sources when there is one
(a source checkout, also one used through `PYTHONPATH` alone), else from the installed
package's metadata.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

__all__ = ["commands", "main"]

DISTRIBUTION = "cs336sys-bench"
PREFIX = "bench-"
_PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def commands() -> dict[str, str]:
    """The package's console scripts: command name (`bench-attn`) → `"module:function"`."""
    if _PYPROJECT.is_file():
        project = tomllib.loads(_PYPROJECT.read_text())["project"]
        if project.get("name") == DISTRIBUTION:
            return dict(project["scripts"])
    try:
        entry_points = importlib.metadata.distribution(DISTRIBUTION).entry_points
    except importlib.metadata.PackageNotFoundError:
        return {}
    return {ep.name: ep.value for ep in entry_points if ep.group == "console_scripts"}


def _usage(table: dict[str, str]) -> str:
    names = "\n".join(
        f"  {name.removeprefix(PREFIX):<16} {name}  ({target})" for name, target in table.items()
    )
    return f"usage: python -m bench COMMAND [OPTIONS]\n\ncommands:\n{names}\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command named by the first argument with the rest; its exit status.

    Returns:
        The command's exit status; 2 (and the list of commands on stderr) for an unknown one.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    table = commands()
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage(table), file=sys.stdout if argv else sys.stderr, end="")
        return 0 if argv else 2
    name = argv[0].replace("_", "-")
    prog = name if name.startswith(PREFIX) else PREFIX + name
    if prog not in table:
        print(f"python -m bench: unknown command {argv[0]!r}\n\n{_usage(table)}", file=sys.stderr)
        return 2
    module, _, function = table[prog].partition(":")
    return getattr(importlib.import_module(module), function)(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())

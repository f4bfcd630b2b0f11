"""Rebuild a `bench-step --profile DIR` run's tables from the traces in DIR, on any machine.

`bench-step --profile DIR` writes, per row and rank, the step's Chrome trace
(`<row>_rank<r>.pt.trace.json.gz`) beside the tables read from it: `<DIR name>.json` and `.md`
(the per-phase split and each kernel category's time) and `<row>_rank<r>_kernels.md`. When the
way kernels are categorised or attributed changes, this rewrites those tables from the traces as
the current code reads them (`bench.tools.step.profile.rebuild_step_profile`), keeping the GPU
run's device, versions, date, command and config, with a note that says the tables were rebuilt
and at which revision. No GPU needed; a CUDA run's traces only.

Run from the repository root (seconds)::

    uv run python packages/bench/scripts/rebuild_step_profile.py \
        docs/results/step_profile_h200_2026-11-28
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.tools.step.profile import rebuild_step_profile


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="The run's own files in DIR are rewritten in place; its traces are only read.",
    )
    parser.add_argument("directory", type=Path, metavar="DIR", help="a bench-step --profile DIR")
    args = parser.parse_args(argv)
    try:
        path = rebuild_step_profile(args.directory)
    except (FileNotFoundError, ValueError) as err:
        parser.error(str(err))
    print(path.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

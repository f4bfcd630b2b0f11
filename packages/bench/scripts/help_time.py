"""How long each `bench-*` command's `--help` takes, as a user waits for it: the whole process.

Each command of bench's `[project.scripts]` runs its entry point as its console script does
(`from bench.commands.attn import main; sys.exit(main())`, with `--help`), in a fresh process of
this interpreter, `--runs` times; the time is the wall clock around the process (start-up,
imports, parsing, printing, exit). With `--before DIR` (the `packages/` of an earlier revision,
e.g. from `git archive REV packages | tar -x -C DIR`) the same commands of that tree are timed
too, with that tree's sources first on the path, each run of one beside the same run of the
other, so that a change in the machine's load falls on both alike. Usage, from the repository
root::

    git archive 3c2ada7 packages | tar -x -C /tmp/before
    python packages/bench/scripts/help_time.py --before /tmp/before --before-label 3c2ada7 \\
        --json docs/results/cli_help_cpu_<date>.json --markdown docs/results/cli_help_cpu_<date>.md
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from bench.core.results import Run, save_json

ROOT = Path(__file__).resolve().parents[3]
COLUMNS = ["command", "code", "entry_point", "runs", "min_s", "median_s", "runs_s", "speedup"]


def entry_points(tree: Path) -> dict[str, str]:
    """bench's `[project.scripts]` in the source tree `tree` (a folder holding `packages/`)."""
    pyproject = tree / "packages" / "bench" / "pyproject.toml"
    return dict(tomllib.loads(pyproject.read_text())["project"]["scripts"])


def _python_path(tree: Path) -> str:
    return os.pathsep.join(str(p) for p in sorted((tree / "packages").glob("*/src")))


def time_help(target: str, tree: Path) -> float:
    """Seconds of one process running entry point `target` (`module:function`) with `--help`,
    the sources of `tree` first on the path."""
    module, _, function = target.partition(":")
    code = f"import sys; from {module} import {function}; sys.exit({function}())"
    env = {**os.environ, "PYTHONPATH": _python_path(tree)}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code, "--help"], capture_output=True, env=env, check=False
    )
    seconds = time.perf_counter() - start
    if proc.returncode != 0 or not proc.stdout.startswith(b"usage: "):
        raise SystemExit(f"{target} --help failed:\n{proc.stderr.decode()}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=7, help="processes per command and tree (7)")
    parser.add_argument("--before", type=Path, help="an earlier revision's tree (holds packages/)")
    parser.add_argument("--before-label", default="before", help="its revision, for the table")
    parser.add_argument("--json", type=Path, help="write the run as JSON")
    parser.add_argument("--markdown", type=Path, help="write the table")
    args = parser.parse_args(argv)
    trees = {"this checkout": ROOT}
    if args.before is not None:
        trees = {args.before_label: args.before, **trees}
    tables = {label: entry_points(tree) for label, tree in trees.items()}
    names = [name for name in tables["this checkout"] if all(name in t for t in tables.values())]
    seconds: dict[tuple[str, str], list[float]] = {}
    load = [os.getloadavg()[0]]
    for _ in range(args.runs):
        for name in names:
            for label, tree in trees.items():
                timing = time_help(tables[label][name], tree)
                seconds.setdefault((name, label), []).append(timing)
    load.append(os.getloadavg()[0])
    rows = []
    for (name, label), s in seconds.items():
        rows.append(
            {
                "command": f"{name} --help",
                "code": label,
                "entry_point": tables[label][name],
                "runs": len(s),
                "min_s": min(s),
                "median_s": statistics.median(s),
                "runs_s": " ".join(f"{x:.2f}" for x in s),
            }
        )
    if args.before is not None:
        before = {r["command"]: r["median_s"] for r in rows if r["code"] == args.before_label}
        for row in rows:
            if row["code"] == "this checkout":
                row["speedup"] = before[row["command"]] / row["median_s"]
    run = Run.create(
        "help_time",
        rows,
        device="cpu",
        config={"runs": args.runs, "trees": list(trees)},
        command=shlex.join(["python", sys.argv[0], *(sys.argv[1:] if argv is None else argv)]),
        title="`bench-* --help`: seconds of the whole process, before and after",
        columns=COLUMNS,
        notes=[
            "Each run: a fresh `python -c 'from <entry point> import main; main()' --help`, as the "
            "console script runs it, timed from start to exit; each tree's runs beside the "
            "other's, round after round.",
            f"{os.cpu_count()} CPU cores, shared with other jobs: 1-minute load average "
            f"{load[0]:.1f} at the start and {load[1]:.1f} at the end.",
            "speedup: the earlier revision's median over this checkout's.",
        ],
    )
    print(run.to_markdown())
    if args.markdown is not None:
        args.markdown.write_text(run.to_markdown() + "\n")
    if args.json is not None:
        save_json(run, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

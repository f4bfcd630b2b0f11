"""Result files for what the GPU scripts run besides the bench tools, through bench's results
machinery (`bench.core.results.Run`: rows, device, versions, date, command, git revision):

- `tests`: run pytest (the arguments after `--`) and add its counts as a row of
  `gpu_tests_<device>_<date>.{json,md}` in `--out` (a row per pytest run of the day: the file
  is read back and extended), with the failing tests' names and why tests were skipped;
- `log`: a script's command log (`RUN_LOG` of `gpu_lib.sh`: part, limit, name, seconds, exit
  status, command per line; gpu_plan.py's `commands.tsv` adds the part's GPUs) as a result:
  which commands ran, how long each took, which failed, with the Markdown of the results they
  wrote attached (`--attach DIR`), e.g. a CPU rehearsal of a GPU script.

Usage, from the repository root with `PYTHONPATH` set to every package's `src/`::

    python3 packages/bench/scripts/script_results.py tests --out docs/results --gpus 2 -- \\
        -m gpu packages/fa2 -q -p no:cacheprovider
    python3 packages/bench/scripts/script_results.py log runs.tsv --topic two_gpu_rehearsal \\
        --title "..." --out docs/results --attach rehearsal/
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.core.results import Run, load_json, result_stem, save_json

TEST_COLUMNS = ["run", "command", "revision", "passed", "failed", "errors", "skipped", "seconds"]
LOG_COLUMNS = ["part", "name", "limit_s", "seconds", "status", "command"]
LOG_GPUS = "gpus"  # the column gpu_plan.py's logs add: the GPUs the part's commands saw
_DESELECTED = re.compile(r"(\d+) deselected")
_TIMEOUT_STATUS = (124, 137)  # timeout(1)'s: the limit passed (TERM), or KILL after it


def junit_counts(path: Path) -> dict[str, Any]:
    """Counts of a pytest `--junitxml` report: passed, failed, errors, skipped; the ids of the
    tests that failed or errored; the skip reasons with their counts."""
    counts = Counter()
    not_passed, reasons = [], Counter()
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), None)
        counts[{"failure": "failed", "error": "errors", None: "passed"}.get(outcome, outcome)] += 1
        if outcome in ("failure", "error"):
            not_passed.append(name)
        elif outcome == "skipped":
            skip = next(c for c in case if c.tag == "skipped")
            reasons[skip.get("message", "")] += 1
    return {
        **{key: counts[key] for key in ("passed", "failed", "errors", "skipped")},
        "not_passed": not_passed,
        "skip_reasons": dict(reasons),
    }


def _tests(args: argparse.Namespace) -> int:
    pytest_args = [a for a in args.pytest_args if a != "--"]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        argv = [sys.executable, "-u", "-m", "pytest", *pytest_args, f"--junitxml={report}"]
        start = time.perf_counter()
        # pytest's output passed on as it comes (a run stopped by a time limit still shows
        # how far it got) and kept for the deselected count; its stderr is this script's
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, bufsize=1)
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
        returncode = proc.wait()
        seconds = time.perf_counter() - start
        if not report.is_file():
            print(f"pytest wrote no report (exit {returncode}): nothing recorded", file=sys.stderr)
            return returncode or 1
        counts = junit_counts(report)
    deselected = _DESELECTED.findall("".join(lines))
    command = shlex.join(["python3", "-m", "pytest", *pytest_args])
    run = Run.create(
        "gpu_tests",
        [],
        device=device,
        config={},
        command=command,
        title=f"GPU-marked tests on {args.gpus} x {torch.cuda.get_device_name(0)}"
        if device.type == "cuda"
        else "GPU-marked tests on a machine without a GPU (every one skipped)",
        columns=TEST_COLUMNS,
        notes=[
            "Run from the repository root with PYTHONPATH set to every package's src/ "
            "(packages/bench/scripts/script_results.py tests); each row is one pytest run, "
            "its revision the commit the tree was at (dirty: uncommitted changes)."
        ],
    )
    stem = Path(args.out) / result_stem("gpu_tests", run.env, num_devices=args.gpus)
    earlier = load_json(stem.with_suffix(".json")) if stem.with_suffix(".json").is_file() else None
    rows = earlier.rows if earlier is not None else []
    revision = run.env.get("git_revision")
    rows.append(
        {
            "run": len(rows) + 1,
            "command": command,
            "revision": (revision or "not recorded")[:12],
            "dirty": run.env.get("git_dirty"),
            **{key: counts[key] for key in ("passed", "failed", "errors", "skipped")},
            "deselected": int(deselected[-1]) if deselected else 0,
            "seconds": round(seconds, 1),
            "exit_status": returncode,
            "not_passed": counts["not_passed"],
            "skip_reasons": counts["skip_reasons"],
        }
    )
    run.rows = rows
    for row in rows:
        for reason, n in row["skip_reasons"].items():
            run.notes.append(f"Run {row['run']}: {n} skipped: {reason}")
        if row["not_passed"]:
            run.notes.append(f"Run {row['run']} failed: {', '.join(row['not_passed'])}")
    save_json(run, stem.with_suffix(".json"))
    stem.with_suffix(".md").write_text(run.to_markdown() + "\n")
    print(stem.with_suffix(".md"))
    return returncode


def log_rows(path: Path) -> list[dict[str, Any]]:
    """The lines of a `gpu_lib.sh` command log as rows (`LOG_COLUMNS`, and `LOG_GPUS` where a
    line has a seventh field)."""
    rows = []
    for line in path.read_text().splitlines():
        part, limit, name, seconds, status, command, *gpus = line.split("\t")
        code = int(status)
        if code == 0:
            outcome = "ok"
        elif code in _TIMEOUT_STATUS:
            outcome = f"timed out ({limit} s)"
        else:
            outcome = f"failed (exit {code})"
        rows.append(
            {
                "part": part,
                "name": name,
                "limit_s": int(limit),
                "seconds": int(seconds),
                "status": outcome,
                "command": command,
                **({LOG_GPUS: gpus[0]} if gpus else {}),
            }
        )
    return rows


def _attached(folder: Path | None, within: list[str]) -> list[Path]:
    """The Markdown results under `folder`, or only under its subfolders `within` if any."""
    if folder is None:
        return []
    roots = [folder / name for name in within] if within else [folder]
    return sorted(path for root in roots for path in root.rglob("*.md"))


def _replacements(pairs: list[str]) -> Callable[[str], str]:
    """A function that writes each `OLD=NEW` of `pairs` (in order) into a text: a machine's
    paths as the words a record uses for them (`DIR`, `TEXT_FILE`)."""
    table = [pair.partition("=")[::2] for pair in pairs]

    def replace(text: str) -> str:
        for old, new in table:
            text = text.replace(old, new)
        return text

    return replace


def _log_columns(rows: list[dict[str, Any]]) -> list[str]:
    """`LOG_COLUMNS`, with the GPUs after the name where the log records them."""
    if not any(LOG_GPUS in row for row in rows):
        return LOG_COLUMNS
    return [*LOG_COLUMNS[:2], LOG_GPUS, *LOG_COLUMNS[2:]]


def _log(args: argparse.Namespace) -> int:
    rows = log_rows(args.log)
    replace = _replacements(args.replace)
    for row in rows:
        row["command"] = replace(row["command"])
    attached = _attached(args.attach, args.within)
    run = Run.create(
        args.topic,
        rows,
        device=args.device,
        config={
            "log": args.log.name,
            "attached": [p.relative_to(args.attach).as_posix() for p in attached],
        },
        command=replace(args.command) if args.command else None,
        title=args.title,
        columns=_log_columns(rows),
        notes=args.note,
    )
    stem = Path(args.out) / result_stem(args.topic, run.env, num_devices=args.gpus)
    save_json(run, stem.with_suffix(".json"))
    parts = [run.to_markdown()]
    for path in attached:
        body = replace(path.read_text().strip())
        parts.append(f"#### `{path.relative_to(args.attach).as_posix()}`\n\n{body}")
    stem.with_suffix(".md").write_text("\n\n".join(parts) + "\n")
    print(stem.with_suffix(".md"))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def build_parser() -> argparse.ArgumentParser:
    """The command line: `tests` and `log`, each with its options."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="what", required=True)
    tests = commands.add_parser("tests", help="run pytest and record its counts")
    tests.add_argument("--out", type=Path, required=True, help="results folder")
    tests.add_argument("--gpus", type=int, default=1, help="GPUs the machine lends the tests (1)")
    tests.add_argument("pytest_args", nargs=argparse.REMAINDER, help="-- then pytest's arguments")
    log = commands.add_parser("log", help="a script's command log as a result")
    log.add_argument("log", type=Path, help="the RUN_LOG file")
    log.add_argument("--topic", required=True, help="the result's topic (its file name)")
    log.add_argument("--title", required=True, help="one line saying what ran")
    log.add_argument("--out", type=Path, required=True, help="results folder")
    log.add_argument("--device", default="cpu", help="the device the commands ran on (cpu)")
    log.add_argument("--gpus", type=int, default=1, help="GPUs the commands used, at most (1)")
    log.add_argument("--command", help="the command that ran the script (recorded as given)")
    log.add_argument("--attach", type=Path, help="a folder whose *.md results to append")
    log.add_argument(
        "--within",
        action="append",
        default=[],
        metavar="SUBFOLDER",
        help="only the results in this subfolder of --attach (repeatable)",
    )
    log.add_argument("--note", action="append", default=[], help="a sentence (repeatable)")
    log.add_argument(
        "--replace",
        action="append",
        default=[],
        metavar="OLD=NEW",
        help="write OLD as NEW in the commands and the attached results (repeatable)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Record what `argv` asks for; pytest's exit status (`tests`), or 1 if a logged command
    failed (`log`)."""
    args = build_parser().parse_args(argv)
    return _tests(args) if args.what == "tests" else _log(args)


if __name__ == "__main__":
    raise SystemExit(main())

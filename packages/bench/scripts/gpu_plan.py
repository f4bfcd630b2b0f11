"""Run parts side by side on disjoint GPUs of one machine, then one summary table.

A plan is a list of parts, each with the GPUs it may use. Parts on disjoint GPUs run at the same
time; a part waits until its GPUs are free, and parts that share a GPU run in the order given
(`wait` makes every later part wait for every earlier one). Each part runs in the repository
root with every package's sources on `PYTHONPATH`, sees only its own GPUs
(`CUDA_VISIBLE_DEVICES`), runs with NVLink multicast off (`NCCL_NVLS_ENABLE=0`) and a
`MASTER_PORT` of its own (also as `PET_MASTER_PORT`, which torchrun reads for `--master-port`),
writes into its own folder under `--results` (`OUT` names it; its output goes to `log.txt`
there), and has its own time limit, after which it is stopped with every process it started.
A part that fails or runs out of time costs no other part. No part starts after `--budget`
seconds, and every part still running then is stopped, so that the call ends with its summary.

Entries (arguments, or the lines of `--plan FILE`; `#` starts a comment)::

    GPUS[@LIMIT_S]:PART           a part of multi_gpu.sh, on as many GPUs as GPUS names
    GPUS[@LIMIT_S]:NAME=COMMAND   any command line (run by bash in the repository root)
    wait                          later parts start only once every earlier one has ended

GPUS is a list of indices and ranges (`0`, `2,3`, `0-3`) or `cpu` (no GPU). A multi_gpu.sh
part's limit is the sum of its commands' limits (as its DRY_RUN lists them) and a margin for
the script's own start; a command's is LIMIT_S, else whatever remains of the budget. The
results of every multi_gpu.sh part share `--results`/bulk, so the train parts see each
other's runs and the last table holds every run finished so far.

At the end: `commands.tsv` in `--results` (a line per part, then its commands' lines from
multi_gpu.sh's `RUN_LOG`, each with the part's GPUs), which `--record TOPIC` turns into a result
(`script_results.py log`, this machine's device and versions, the Markdown of every result its
parts wrote attached: an earlier call's folders, carried over for their train runs, are left
out); `summary.md`; with `--pack DIR`, `DIR/results.tgz` (every file up to 2 MiB: results,
logs, run folders) and `DIR/bulk.tgz` (the larger ones: traces), each cut into pieces of at
most `--max-file-mb` (`cat results.tgz.* > results.tgz` joins them), at most `--max-files`
files in all, and `DIR/summary.md`. The summary table (part, GPUs, seconds, status, commands,
result files) is printed last.

Usage, from the repository root (no installation needed)::

    python3 packages/bench/scripts/gpu_plan.py --text TEXT_FILE --pack "$OUT" \\
        0:train-small 1:train-xl-1 2,3:ddp-overlap wait 0-3:allreduce
    python3 packages/bench/scripts/gpu_plan.py --plan packages/bench/scripts/plans/four_gpu.plan \\
        --text TEXT_FILE --pack "$OUT" --record four_gpu
    python3 packages/bench/scripts/gpu_plan.py --dry-run --plan ...   # the schedule by limits

`TINY=1` passes through to multi_gpu.sh (its CPU rehearsal: as many gloo ranks as GPUS names).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parents[2]
PARTS_SCRIPT = SCRIPTS / "multi_gpu.sh"
DEFAULT_BUDGET_S = 540.0  # a ten-minute call, less a minute for start-up, packing and copying
# A multi_gpu.sh part spends time outside its commands' limits: bash's start and a Python start
# (which imports torch) for each result name it computes.
SCRIPT_MARGIN_S = 30.0
MIN_START_S = 20.0  # a part given less than this before the budget ends is not started
STOP_GRACE_S = 10.0  # between SIGTERM and SIGKILL when a part is stopped
POLL_S = 0.2
LARGE_FILE_BYTES = 2 * 2**20  # files above this go to bulk.tgz (traces), the rest to results.tgz
STATUS_TIMED_OUT = 124  # timeout(1)'s, so script_results.py reads the log alike
_ENTRY = re.compile(r"^(?P<gpus>cpu|[0-9][0-9,\-]*)(?:@(?P<limit>[0-9]+))?:(?P<what>.+)$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ALTERNATIVE = "or: "  # a multi_gpu.sh command that runs only in place of the one before it
# Variables that change what the parts do, named in a record's command: multi_gpu.sh's CPU
# rehearsal, and the commit a copy of the sources without their history measures.
PASSED_ON = ("TINY", "BENCH_GIT_REVISION")


@dataclass
class Part:
    """One entry of a plan and, once run, what became of it."""

    index: int
    name: str
    gpus: tuple[int, ...]
    argv: list[str]  # a multi_gpu.sh part's names its folder DIR until it starts
    limit_s: float | None
    group: int  # the number of `wait`s before it: it starts after every part of lower group
    script_part: str | None = None  # the multi_gpu.sh part it runs, if any
    status: str = "pending"  # pending, running, ok, failed (exit N), timed out, not started
    exit_code: int | None = None
    seconds: float = 0.0
    folder: Path | None = None
    process: subprocess.Popen | None = None
    started: float = 0.0
    deadline: float = 0.0  # started + the limit it ran under (its own, or what the budget left)
    notes: list[str] = field(default_factory=list)

    @property
    def gpu_label(self) -> str:
        return ",".join(map(str, self.gpus)) if self.gpus else "cpu"

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


def parse_gpus(text: str) -> tuple[int, ...]:
    """`0`, `2,3`, `0-3`, `0,2-3` → the GPU indices; `cpu` → none."""
    if text == "cpu":
        return ()
    gpus: list[int] = []
    for item in text.split(","):
        first, dash, last = item.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"GPUs '{text}': give indices and ranges, like 0,1 or 2-3, or cpu")
        low, high = int(first), int(last or first)
        if high < low:
            raise ValueError(f"GPUs '{text}': the range {item} runs backwards")
        gpus += range(low, high + 1)
    if len(set(gpus)) != len(gpus):
        raise ValueError(f"GPUs '{text}' names a GPU twice")
    return tuple(gpus)


def script_parts() -> list[str]:
    """The parts multi_gpu.sh knows (`multi_gpu.sh list`)."""
    out = subprocess.run(
        ["bash", str(PARTS_SCRIPT), "list"], capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def script_limit_s(part: str, num_gpus: int) -> float:
    """A multi_gpu.sh part's limit on `num_gpus` GPUs: its commands' limits (DRY_RUN lists them;
    an alternative counts in place of the command before it) and `SCRIPT_MARGIN_S`."""
    env = {**os.environ, "DRY_RUN": "1", "GPUS": str(max(num_gpus, 1))}
    out = subprocess.run(
        ["bash", str(PARTS_SCRIPT), part, "DIR", "TEXT_FILE"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if out.returncode != 0:
        raise ValueError(f"multi_gpu.sh {part} on {num_gpus} GPUs: {out.stderr.strip()}")
    lines = [line.split("\t") for line in out.stdout.splitlines() if line]
    return sum(float(lim) for lim, name, _ in lines if not name.startswith(_ALTERNATIVE)) + (
        SCRIPT_MARGIN_S
    )


def parse_plan(entries: Sequence[str], *, text_file: str) -> list[Part]:
    """The parts of `entries` (see the module docstring), with unique names.

    Raises:
        ValueError: an entry that does not parse, an unknown multi_gpu.sh part, or a name that
            is not letters, digits, `.`, `_` and `-`.
    """
    known: list[str] | None = None
    parts: list[Part] = []
    group, seen = 0, {}
    for entry in entries:
        entry = entry.strip()
        if entry == "wait":
            group += 1
            continue
        match = _ENTRY.match(entry)
        if match is None:
            raise ValueError(
                f"'{entry}': write GPUS[@LIMIT_S]:PART, GPUS[@LIMIT_S]:NAME=COMMAND or wait"
            )
        gpus = parse_gpus(match["gpus"])
        limit = float(match["limit"]) if match["limit"] else None
        what = match["what"].strip()
        name, equals, command = what.partition("=")
        script_part = None
        if equals:
            argv = ["bash", "-c", command.strip()]
        else:
            known = known if known is not None else script_parts()
            if what not in known:
                raise ValueError(f"'{entry}': multi_gpu.sh has no part {what} ({' '.join(known)})")
            script_part = name = what
            argv = ["bash", str(PARTS_SCRIPT.relative_to(ROOT)), what, "DIR", text_file]
            if limit is None:
                limit = script_limit_s(what, len(gpus))
        if not _NAME.match(name):
            raise ValueError(f"'{entry}': a part's name is letters, digits, '.', '_' and '-'")
        seen[name] = seen.get(name, 0) + 1
        unique = name if seen[name] == 1 else f"{name}-{seen[name]}"
        parts.append(Part(len(parts), unique, gpus, argv, limit, group, script_part))
    if not parts:
        raise ValueError("the plan has no parts")
    return parts


def give_fresh_folders(parts: Sequence[Part], results: Path) -> None:
    """Rename the parts whose folder `results` already holds (an earlier call's, carried over
    for its train runs) so that every part writes a folder of its own: `NAME-2`, `NAME-3`, ..."""
    taken = {p.name for p in parts}
    for part in parts:
        if not (results / part.name).exists():
            continue
        n = 2
        while f"{part.name}-{n}" in taken or (results / f"{part.name}-{n}").exists():
            n += 1
        part.name = f"{part.name}-{n}"
        taken.add(part.name)


def read_plan(path: Path) -> list[str]:
    """The entries of a plan file: one a line, `#` to the end of a line is a comment."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def startable(parts: Sequence[Part]) -> list[Part]:
    """The pending parts that may start now: every part of an earlier group has ended, none of
    their GPUs is busy, and no earlier pending part wants one of them (order is kept per GPU)."""
    busy = {g for p in parts if p.status == "running" for g in p.gpus}
    unfinished = [p.group for p in parts if p.status in ("pending", "running")]
    ready, claimed = [], set()
    for part in parts:
        if part.status != "pending":
            continue
        free = not (set(part.gpus) & (busy | claimed))
        if part.group == min(unfinished) and free:
            ready.append(part)
        claimed |= set(part.gpus)  # a later part must not overtake this one on its GPUs
    return ready


def simulate(
    parts: Sequence[Part], *, budget_s: float
) -> list[tuple[Part, float | None, float | None]]:
    """The schedule if every part took its whole limit: (part, start, end) in seconds from the
    start; a part that the budget would not let start has start = end = None."""
    clock, schedule, ends = 0.0, [], {}
    for part in parts:
        part.status = "pending"
    while any(p.status in ("pending", "running") for p in parts):
        for part in startable(parts):
            left = budget_s - clock
            if left < MIN_START_S:
                part.status = "not started"
                schedule.append((part, None, None))
                continue
            part.status = "running"
            ends[part.index] = clock + min(part.limit_s or left, left)
            schedule.append((part, clock, ends[part.index]))
        running = [p for p in parts if p.status == "running"]
        if running:
            clock = min(ends[p.index] for p in running)
            for part in running:
                if ends[part.index] <= clock:
                    part.status = "ok"
    return schedule


def _free_port(taken: set[int]) -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in taken:
            taken.add(port)
            return port


def _session_pids(session: int) -> list[int]:
    """Every process of `session` (Linux's /proc; a part is a session of its own, and it keeps
    its processes even where a tool such as timeout(1) moves them to a process group of theirs)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # ended meanwhile
        if int(fields[3]) == session:
            pids.append(int(stat.parent.name))
    return pids


def _signal_session(session: int, sig: int) -> None:
    if not Path("/proc/self/stat").exists():  # not Linux: the part's process group at least
        with contextlib.suppress(ProcessLookupError):
            os.killpg(session, sig)
        return
    for pid in _session_pids(session):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _stop(part: Part) -> None:
    """Stop a part and everything it started: SIGTERM, then SIGKILL after `STOP_GRACE_S`."""
    session = part.process.pid
    _signal_session(session, signal.SIGTERM)
    end = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < end and (part.process.poll() is None or _session_pids(session)):
        time.sleep(POLL_S)
    _signal_session(session, signal.SIGKILL)
    part.process.wait()


class Runner:
    """Starts the parts as their GPUs free up, stops each at its limit, records what happened."""

    def __init__(self, parts: list[Part], *, results: Path, budget_s: float) -> None:
        self.parts, self.results, self.budget_s = parts, results, budget_s
        self.ports: set[int] = set()
        self.start = time.monotonic()

    def run(self) -> None:
        """Run the plan to its end (or the budget's, or until SIGTERM/SIGINT)."""
        previous = {s: signal.signal(s, self._interrupt) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            while any(p.status in ("pending", "running") for p in self.parts):
                for part in startable(self.parts):
                    self._launch(part)
                for part in self.parts:
                    if part.status == "running":
                        self._check(part)
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            print("== interrupted: stopping every part", flush=True)
            for part in self.parts:
                if part.status == "running":
                    self._end(part, stopped=True)
                elif part.status == "pending":
                    part.status = "not started"
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    @staticmethod
    def _interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    def _launch(self, part: Part) -> None:
        left = self.budget_s - (time.monotonic() - self.start)
        if left < MIN_START_S:
            part.status = "not started"
            part.notes.append(f"not started: {left:.0f} s of the budget left")
            return
        part.folder = self.results / part.name
        part.folder.mkdir(parents=True, exist_ok=True)
        part.argv = [part.folder.as_posix() if a == "DIR" else a for a in part.argv]
        port = _free_port(self.ports)
        env = {
            **os.environ,
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, part.gpus)),
            "GPUS": str(len(part.gpus) or 1),  # multi_gpu.sh counts at least one
            "NCCL_NVLS_ENABLE": "0",
            "MASTER_PORT": str(port),
            "PET_MASTER_PORT": str(port),
            "OUT": part.folder.as_posix(),
            "RUN_LOG": (part.folder / "commands.tsv").as_posix(),
            "MULTI_GPU_BULK": (self.results / "bulk").as_posix(),
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": _python_path(),
        }
        limit = min(part.limit_s or left, left)
        if part.limit_s and limit < part.limit_s:
            part.notes.append(f"limit cut to {limit:.0f} s by the budget")
        log = (part.folder / "log.txt").open("w")
        log.write(f"$ {part.command}\n(GPUs {part.gpu_label}, limit {limit:.0f} s)\n")
        log.flush()
        part.process = subprocess.Popen(
            part.argv,
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        part.status, part.started = "running", time.monotonic()
        part.deadline = part.started + limit
        print(f"== {part.name} started on GPUs {part.gpu_label} (limit {limit:.0f} s)", flush=True)

    def _check(self, part: Part) -> None:
        if part.process.poll() is not None:
            self._end(part, stopped=False)
        elif time.monotonic() > part.deadline:
            self._end(part, stopped=True)

    def _end(self, part: Part, *, stopped: bool) -> None:
        if stopped:
            _stop(part)
        else:  # what the part left behind (ranks whose launcher ended) must free its GPUs
            _signal_session(part.process.pid, signal.SIGKILL)
        part.seconds = time.monotonic() - part.started
        code = STATUS_TIMED_OUT if stopped else part.process.returncode
        part.exit_code = code
        if stopped:
            part.status = f"timed out ({part.deadline - part.started:.0f} s)"
        else:
            part.status = "ok" if code == 0 else f"failed (exit {code})"
        print(f"== {part.name}: {part.status} after {part.seconds:.0f} s", flush=True)


def command_lines(part: Part) -> list[list[str]]:
    """The part's commands as multi_gpu.sh logged them (RUN_LOG: part, limit, name, seconds,
    exit status, command)."""
    log = part.folder / "commands.tsv" if part.folder else None
    if log is None or not log.is_file():
        return []
    return [line.split("\t", 5) for line in log.read_text().splitlines() if line]


def write_command_log(parts: Sequence[Part], path: Path) -> None:
    """Every part's line, then its commands' lines, each with the part's GPUs last (the
    format script_results.py log reads)."""
    lines = []
    for part in parts:
        if part.exit_code is None:
            continue  # never started
        limit = f"{part.deadline - part.started:.0f}"
        whole = [part.name, limit, "whole part", f"{part.seconds:.0f}", str(part.exit_code)]
        lines.append([*whole, part.command, part.gpu_label])
        lines += [[*fields, part.gpu_label] for fields in command_lines(part)]
    path.write_text("".join("\t".join(line) + "\n" for line in lines))


def _result_files(part: Part) -> str:
    """What the part wrote at the top of its folder, files of one stem folded together."""
    if part.folder is None or not part.folder.is_dir():
        return ""
    stems: dict[str, list[str]] = {}
    for path in sorted(part.folder.iterdir()):
        if path.name in ("log.txt", "commands.tsv"):
            continue
        if path.is_dir():
            stems.setdefault(path.name + "/", [])
        else:
            stem, dot, suffix = path.name.partition(".")
            stems.setdefault(stem, []).extend([suffix] if dot else [])
    shown = [
        s if not x else f"{s}.{x[0]}" if len(x) == 1 else f"{s}.{{{','.join(x)}}}"
        for s, x in stems.items()
    ]
    return " ".join(shown) if shown else "—"


def _commands_column(part: Part) -> str:
    codes = [fields[4] for fields in command_lines(part)]
    if not codes:
        return "—"
    failed = sum(code != "0" for code in codes)
    return f"{len(codes) - failed} ok" + (f", {failed} failed" if failed else "")


def summary_table(parts: Sequence[Part]) -> str:
    """The summary as a Markdown table: part, GPUs, seconds, status, commands, result files."""
    head = ["part", "GPUs", "seconds", "status", "commands", "result files"]
    rows = [
        [p.name, p.gpu_label, f"{p.seconds:.0f}", p.status, _commands_column(p), _result_files(p)]
        for p in parts
    ]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
        for r in [head, ["-" * w for w in widths], *rows]
    ]
    return "\n".join(lines)


def _log_tail(part: Part, lines: int = 15) -> str:
    log = part.folder / "log.txt" if part.folder else None
    if log is None or not log.is_file():
        return ""
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def summary_markdown(parts: Sequence[Part], *, title: str, notes: Sequence[str]) -> str:
    """summary.md: the table, the notes, and the end of every log of a part that did not end ok."""
    text = [f"### {title}", "", summary_table(parts), ""]
    text += [f"- {note}" for note in notes]
    text += [f"- {p.name}: {note}" for p in parts for note in p.notes]
    for part in parts:
        if part.status not in ("ok", "not started") and _log_tail(part):
            text += [
                "",
                f"#### {part.name} (end of log.txt)",
                "",
                "```text",
                _log_tail(part),
                "```",
            ]
    return "\n".join(text) + "\n"


def _archive(files: Sequence[Path], base: Path, path: Path, *, piece_bytes: int) -> list[Path]:
    """`files` (paths under `base`, stored under base's name) as a tar.gz at `path`, cut into
    `path.000`, `path.001`, ... when larger than `piece_bytes`; the files written."""
    with tarfile.open(path, "w:gz") as tar:
        for file in files:
            tar.add(file, arcname=(Path(base.name) / file.relative_to(base)).as_posix())
    if path.stat().st_size <= piece_bytes:
        return [path]
    pieces = []
    with path.open("rb") as whole:
        while chunk := whole.read(piece_bytes):
            piece = path.with_name(f"{path.name}.{len(pieces):03d}")
            piece.write_bytes(chunk)
            pieces.append(piece)
    path.unlink()
    return pieces


def pack(results: Path, dest: Path, *, max_file_bytes: int, max_files: int) -> list[str]:
    """results.tgz and bulk.tgz of `results` in `dest` (see the module docstring), leaving room
    for summary.md within `max_files`; notes on what was cut or left out."""
    dest.mkdir(parents=True, exist_ok=True)
    files = sorted(
        p for p in results.rglob("*") if p.is_file() and not p.parent.name.endswith(".running")
    )
    small = [p for p in files if p.stat().st_size <= LARGE_FILE_BYTES]
    large = sorted(
        (p for p in files if p.stat().st_size > LARGE_FILE_BYTES), key=lambda p: p.stat().st_size
    )
    notes = []
    written = _archive(small, results, dest / "results.tgz", piece_bytes=max_file_bytes)
    if large:
        written += _archive(large, results, dest / "bulk.tgz", piece_bytes=max_file_bytes)
    room = max_files - 1  # summary.md
    for extra in written[room:]:
        extra.unlink()
        notes.append(f"{extra.name} left out: more than {max_files} files to bring back")
    if any(not path.name.endswith(".tgz") for path in written):
        notes.append("pieces: join them with `cat NAME.tgz.* > NAME.tgz` before unpacking")
    return notes


def _record(args: argparse.Namespace, parts: Sequence[Part], log: Path) -> None:
    """The command log as result `args.record` (script_results.py log), in `--results`."""
    num_gpus = max((len(p.gpus) for p in parts), default=1)
    argv = [sys.executable, str(SCRIPTS / "script_results.py"), "log", str(log)]
    argv += ["--topic", args.record, "--out", str(args.results), "--attach", str(args.results)]
    argv += [f"--within={p.name}" for p in parts if p.exit_code is not None]  # this call's
    argv += ["--title", args.title, "--device", args.device, "--gpus", str(num_gpus)]
    argv += ["--command", _command_line(args)]
    argv += [f"--note={note}" for note in args.note]
    # the recorded commands and results name no machine's paths (a script that records its
    # interpreter as it ran names it by its path)
    argv += [f"--replace={args.results}=DIR", f"--replace={args.text}=TEXT_FILE"]
    argv += [f"--replace={sys.executable}=python3"]
    subprocess.run(argv, cwd=ROOT, env={**os.environ, "PYTHONPATH": _python_path()}, check=False)


def _command_line(args: argparse.Namespace) -> str:
    """The command that ran the plan, as a record gives it: what ran, not how it was recorded
    (`--record`, `--title`, `--note` and `--pack` left out), after the variables that change
    what the parts do."""
    env = [f"{name}={os.environ[name]}" for name in PASSED_ON if name in os.environ]
    words = ["python3", (SCRIPTS / "gpu_plan.py").relative_to(ROOT).as_posix()]
    words += ["--plan", str(args.plan)] if args.plan else []
    words += [*args.entries, "--text", str(args.text), "--results", str(args.results)]
    words += ["--budget", f"{args.budget:g}"] if args.budget != DEFAULT_BUDGET_S else []
    return " ".join([*env, shlex.join(words)])


def _python_path() -> str:
    """Every package's sources first on the path (the parts need no installation), then the
    caller's own path."""
    sources = [p.as_posix() for p in sorted(ROOT.glob("packages/*/src"))]
    return os.pathsep.join([*sources, *filter(None, [os.environ.get("PYTHONPATH")])])


def _from_root(path: str | Path) -> str:
    """`path` (absolute, or relative to this process's directory) as the parts see it from the
    repository root, where they run: a relative path stays relative."""
    path = Path(path)
    return path.as_posix() if path.is_absolute() else os.path.relpath(path.resolve(), ROOT)


def _default_device() -> str:
    if os.environ.get("TINY") == "1" or shutil.which("nvidia-smi") is None:
        return "cpu"
    return "cuda"


def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("entries", nargs="*", help="GPUS[@LIMIT_S]:PART, ...:NAME=COMMAND, wait")
    parser.add_argument("--plan", type=Path, help="a file of entries, one a line")
    parser.add_argument(
        "--results",
        type=Path,
        default=Path("out/gpu_plan"),
        help="the parts' folders (out/gpu_plan)",
    )
    parser.add_argument("--text", default="TEXT_FILE", help="Tiny Shakespeare, for train parts")
    parser.add_argument(
        "--budget",
        type=float,
        default=DEFAULT_BUDGET_S,
        help=f"seconds for the whole plan ({DEFAULT_BUDGET_S:.0f})",
    )
    parser.add_argument("--pack", type=Path, help="write results.tgz, bulk.tgz, summary.md here")
    parser.add_argument(
        "--max-file-mb",
        type=float,
        default=15.0,
        help="largest piece --pack writes (15: under a 16 MiB copy limit)",
    )
    parser.add_argument("--max-files", type=int, default=8, help="files --pack may write (8)")
    parser.add_argument("--record", metavar="TOPIC", help="record commands.tsv as this result")
    parser.add_argument(
        "--title",
        default="Parts run side by side on disjoint GPUs",
        help="the recorded result's title",
    )
    parser.add_argument("--note", action="append", default=[], help="a note for the record")
    parser.add_argument("--device", default=None, help="the record's device (cuda; cpu: TINY=1)")
    parser.add_argument("--dry-run", action="store_true", help="print the schedule by limits")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the plan; 0 if every part ended ok, else 1 (2: a plan that does not parse)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.device = args.device or _default_device()
    for name in ("plan", "results", "pack"):  # as seen from the root, where the parts run
        if getattr(args, name) is not None:
            setattr(args, name, Path(_from_root(getattr(args, name))))
    if Path(args.text).exists():
        args.text = _from_root(args.text)
    os.chdir(ROOT)
    entries = [*(read_plan(args.plan) if args.plan else []), *args.entries]
    try:
        parts = parse_plan(entries, text_file=args.text)
    except ValueError as error:
        parser.error(str(error))
    if args.dry_run:
        print(f"the schedule if every part took its whole limit (budget {args.budget:.0f} s):")
        for part, start, end in simulate(parts, budget_s=args.budget):
            when = "not started (budget)" if start is None else f"{start:5.0f} - {end:5.0f} s"
            print(f"{when:>22}  GPUs {part.gpu_label:<8} {part.name}: {part.command}")
        return 0
    args.results.mkdir(parents=True, exist_ok=True)
    give_fresh_folders(parts, args.results)
    Runner(parts, results=args.results, budget_s=args.budget).run()
    log = args.results / "commands.tsv"
    write_command_log(parts, log)
    if args.record:
        _record(args, parts, log)
    notes = [f"budget {args.budget:.0f} s; the parts' folders are under {args.results.name}/"]
    title = f"gpu_plan.py: {len(parts)} parts"
    (args.results / "summary.md").write_text(summary_markdown(parts, title=title, notes=notes))
    if args.pack:
        max_bytes = int(args.max_file_mb * 2**20)
        notes += pack(args.results, args.pack, max_file_bytes=max_bytes, max_files=args.max_files)
        (args.pack / "summary.md").write_text(summary_markdown(parts, title=title, notes=notes))
    for part in parts:
        if part.status not in ("ok", "not started") and _log_tail(part):
            print(f"\n== {part.name}, the end of its log:\n{_log_tail(part)}")
    print("\n" + summary_table(parts))
    return 0 if all(p.status == "ok" for p in parts) else 1


if __name__ == "__main__":
    raise SystemExit(main())

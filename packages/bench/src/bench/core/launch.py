"""Run a benchmark on several ranks: the one place the tools start processes for a process group.

`launch(worker, world_size=..., backend=...)` calls `worker(rank, world_size, *args)` on every
rank inside an initialised default process group and returns the ranks' return values, in rank
order, to the caller:

- Started normally, it starts `world_size` processes: gloo ranks on the CPU (threads split
  between them), or NCCL ranks with rank r on `cuda:r` (`torch.cuda.set_device`). They are
  forked from a server process that imported torch and the project's packages once
  (multiprocessing's forkserver, started on the first launch and kept while this process
  lives; `FORKSERVER_PRELOAD`), so a later launch costs a fork per rank rather than a Python
  start and torch's import; the server never computes, so the ranks inherit no thread pools
  and no CUDA state, and each rank takes the launcher's current environment. Rendezvous
  is on a free local port; results come back through files. When ranks fail, the one that
  failed first re-raises here with its traceback (`RankFailed`): a rank that raises takes its
  peers down a moment later in their collectives ("Connection closed by peer"), and those are
  consequences, not the cause. A run is unbounded in time unless `timeout` is given; then one
  that outlasts it is stopped with `TimeoutError`. A rank ended by a signal (the OOM
  killer, `kill -9`) is named with its signal, even where a peer's failure that followed it
  (in a collective it had left) reached the launcher first. An exception in the launcher
  while its ranks run (SIGINT's KeyboardInterrupt; SIGTERM, which `launch` turns into
  `SystemExit(143)` while it waits; either held while the ranks start, so that one arriving
  then finds them known) stops them (SIGTERM, then SIGKILL after
  `STOP_GRACE_S`) and reaps them before it propagates, so nothing the launcher releases on
  its way out (bench-train's lock on its output folder) outlives them. The ranks die with
  the process that launched them (on Linux), so a killed launcher leaves no rank running
  on alone.
- Started under `torchrun` (its environment variables are set), this process already is one
  rank: the worker runs here, on the process group torchrun describes, and every rank receives
  everyone's results (`all_gather_object`). `is_primary()` tells the tool whether to print.

NVLink multicast (NVLS) stays off in NCCL ranks (``NCCL_NVLS_ENABLE=0``) unless the environment
sets it: NCCL's NVLS algorithms allocate multicast memory through the NVSwitch fabric, and on
machines whose GPUs are shared, trouble with that fabric state can take GPUs out of service for
everyone on them. The price is some all-reduce bandwidth on large messages on NVSwitch systems.

Example::

    def _worker(rank: int, world_size: int, numel: int) -> float:
        t = torch.ones(numel)
        dist.all_reduce(t)
        return t[0].item()

    launch(_worker, world_size=4, backend="gloo", args=(10,))  # [4.0, 4.0, 4.0, 4.0]
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing.connection as mp_connection
import os
import select
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench.core.ranks import (
    BACKENDS,
    DEFAULT_TIMEOUT_S,
    DEVICE_TYPES,
    is_primary,
    torchrun_world_size,
    under_torchrun,
)

__all__ = [
    "BACKENDS",
    "DEFAULT_TIMEOUT_S",
    "FORKSERVER_PRELOAD",
    "STOP_GRACE_S",
    "RankFailed",
    "all_ranks_ok",
    "backend_for",
    "is_primary",
    "launch",
    "rank_device",
    "torchrun_world_size",
    "under_torchrun",
]

# What the ranks' server imports before it forks any (a name this environment lacks is
# skipped): torch, the packages the tools' workers use, and torch._dynamo, which a first
# optimizer step or torch.compile imports. Taking effect when the server starts: the first
# launch of a process (or another forkserver user's, whose list then applies).
FORKSERVER_PRELOAD = (
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "lmcore",
    "ddp",
    "zero",
    "bench.train.run",
)
_JOIN_POLL_S = 1.0  # how often the parent checks on its ranks
# Seconds a rank has to end after SIGTERM before it is sent SIGKILL. SIGTERM ends a rank at
# once unless it handles the signal (none of ours does), so this only bounds a rank that
# does; SIGKILL cannot be refused.
STOP_GRACE_S = 5.0
_FAILURE_FILE = "rank{rank}.failed"
_PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies


class RankFailed(mp.ProcessRaisedException):
    """A rank raised: the rank that failed first, with its traceback.

    Attributes:
        rank: the rank whose exception is reported (the earliest to fail).
        later: the ranks that failed after it (usually in a collective, because it had left).
    """

    def __init__(self, msg: str, *, rank: int, pid: int, later: Sequence[int]) -> None:
        super().__init__(msg, rank, pid)
        self.rank = rank
        self.later = tuple(later)


def backend_for(device: torch.device | str) -> str:
    """The backend whose ranks run on `device`'s type: nccl for CUDA, gloo for the CPU.

    Raises:
        ValueError: a device type no backend runs on.
    """
    device_type = torch.device(device).type
    for backend, runs_on in DEVICE_TYPES.items():
        if runs_on == device_type:
            return backend
    raise ValueError(f"no process-group backend runs on {device_type}; use cpu or cuda")


def rank_device(backend: str) -> torch.device:
    """The device this rank measures on: with nccl its GPU (made current by `launch`), else CPU."""
    if DEVICE_TYPES[backend] == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_ranks_ok(ok: bool, *, device: torch.device | str) -> bool:
    """True when `ok` holds on every rank (one all-reduce of a flag, minimum).

    Benchmarks call it after each guarded measurement, so that a rank that ran out of memory
    and the ranks that did not agree on the row's status and move on to the next measurement
    together, rather than one of them starting collectives alone.
    """
    flag = torch.tensor([1 if ok else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prepare_rank(backend: str, local_rank: int, env: Mapping[str, str]) -> None:
    """Per-rank set-up before the process group exists: environment, device."""
    for name, value in env.items():
        os.environ.setdefault(name, value)
    if backend == "nccl":
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # see the module docstring
        torch.cuda.set_device(local_rank)


def _start_method() -> str:
    """forkserver, its server importing FORKSERVER_PRELOAD (spawn where there is none)."""
    if "forkserver" not in mp.get_all_start_methods():
        return "spawn"
    mp.get_context("forkserver").set_forkserver_preload(list(FORKSERVER_PRELOAD))
    return "forkserver"


def _end_with(launcher: int) -> None:
    """Have this rank killed when its launcher (`launcher`) dies, on Linux.

    torch's spawn asks for SIGINT, which a rank blocked in C++ (a collective waiting for a
    peer, a kernel) acts on only when the call returns, maybe never: an orphan that holds its
    memory (a GPU's too) and may write where the next run (a `--resume`) writes. SIGKILL
    cannot be ignored. A spawned rank asks the kernel for it when its parent, the launcher,
    dies; a rank forked by the forkserver (whose server lives on while its children do) has a
    thread that waits for the launcher's end and then sends it.
    """
    if sys.platform != "linux":
        return
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the call above
        os._exit(1)
    if parent != launcher:
        threading.Thread(
            target=_kill_self_after, args=(launcher,), name="launcher-watch", daemon=True
        ).start()


def _kill_self_after(pid: int) -> None:
    """Wait for process `pid` to end (a pidfd; polling where the kernel has none), then
    SIGKILL this process."""
    try:
        select.select([os.pidfd_open(pid)], [], [])
    except ProcessLookupError:
        pass
    except OSError:  # no pidfd_open (a kernel before 5.3)
        while _alive(pid):
            time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _child(
    rank: int,
    worker: Callable[..., Any],
    world_size: int,
    backend: str,
    port: int,
    args: tuple[Any, ...],
    env: Mapping[str, str],
    num_threads: int,
    result_dir: str,
    launcher: int,
    environ: Mapping[str, str],
) -> None:
    # A rank forked while the launcher deferred these (`_deferred`) handles them as a process
    # does; a rank spawned, or forked by a server, already does.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _end_with(launcher)
    os.environ.clear()  # the launcher's environment now, not the server's at its start
    os.environ.update(environ)
    _prepare_rank(backend, rank, env)
    if backend == "gloo":
        torch.set_num_threads(num_threads)
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
        result = worker(rank, world_size, *args)
        torch.save(result, os.path.join(result_dir, f"rank{rank}.pt"))
    except BaseException as error:
        _record_failure(result_dir, rank, error)
        raise
    finally:
        dist.destroy_process_group()
    # End without finalising the interpreter: a gloo thread of a group that something still
    # references (torch's DistributedDataParallel keeps one) may otherwise release a tensor
    # after finalisation began and abort the rank ("terminate called without an active
    # exception"). The result is saved; nothing else is left to run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _record_failure(result_dir: str, rank: int, error: BaseException) -> None:
    """Leave this rank's failure, with the moment it happened, for the parent to rank.

    Written whole or not at all (a temporary file, then renamed): the parent may stop this rank
    while it writes, once another rank's end has told it the run failed."""
    record = {
        "time": time.time(),
        "rank": rank,
        "pid": os.getpid(),
        "error": f"{type(error).__name__}: {error}",
        "traceback": "".join(traceback.format_exception(error)),
    }
    path = os.path.join(result_dir, _FAILURE_FILE.format(rank=rank))
    torch.save(record, path + ".partial")
    os.replace(path + ".partial", path)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _signalled(processes: Sequence[Any]) -> dict[int, int]:
    """The ranks a signal ended, by rank: the signal's number (their exit code, negated).

    Read before the launcher stops any rank itself (torch's join sends SIGTERM to the others
    once one has failed), so every signal here came from elsewhere.
    """
    codes = {rank: process.exitcode for rank, process in enumerate(processes)}
    return {rank: -code for rank, code in codes.items() if code is not None and code < 0}


def _killed(
    world_size: int, signalled: Mapping[int, int], pids: Sequence[int], records: Sequence[dict]
) -> mp.ProcessExitedException:
    """The report of ranks that a signal ended: the lowest such rank, its signal, and the
    ranks that failed after (most likely in a collective it had left)."""
    rank = min(signalled)
    number = signalled[rank]
    name = _signal_name(number)
    why = " (the OOM killer, or kill -9)" if number == signal.SIGKILL else ""
    others = sorted(set(signalled) - {rank})
    also = f"; rank {', '.join(map(str, others))} too" if others else ""
    failed = [r["rank"] for r in records]
    if failed:
        also += (
            f"\n(rank {', '.join(map(str, failed))} failed after it, most likely because rank "
            f"{rank} had left their collectives: {records[0]['error']})"
        )
    message = f"rank {rank} of {world_size} was killed by {name}{why}{also}"
    return mp.ProcessExitedException(
        message, error_index=rank, error_pid=pids[rank], exit_code=-number, signal_name=name
    )


def _first_failure(
    result_dir: str,
    world_size: int,
    raised: mp.ProcessRaisedException | mp.ProcessExitedException,
    *,
    signalled: Mapping[int, int],
    pids: Sequence[int],
) -> BaseException:
    """The failure to report: a rank that a signal ended, else the earliest rank's recorded
    exception, else what torch raised.

    A rank killed by a signal (out of memory, kill -9) records nothing, and its peers then
    fail in their collectives ("Connection closed by peer"), each recording that: those are
    consequences. `signalled` (`_signalled`, read before torch stopped the other ranks) and
    torch's own exception name the killed ranks.
    """
    signalled = dict(signalled)
    if isinstance(raised, mp.ProcessExitedException) and raised.exit_code < 0:
        signalled.setdefault(raised.error_index, -raised.exit_code)
    records = []
    for rank in range(world_size):
        path = os.path.join(result_dir, _FAILURE_FILE.format(rank=rank))
        if os.path.exists(path):
            records.append(torch.load(path, weights_only=False))
    records.sort(key=lambda r: r["time"])
    if signalled:
        return _killed(world_size, signalled, pids, records)
    if not records:
        return raised
    first, later = records[0], [r["rank"] for r in records[1:]]
    also = ""
    if later:
        ranks = ", ".join(map(str, later))
        also = (
            f"\n(rank {ranks} failed after it, most likely because rank {first['rank']} had "
            "left their collectives)"
        )
    message = (
        f"rank {first['rank']} of {world_size} failed first: {first['error']}{also}\n\n"
        f"-- its traceback:\n{first['traceback']}"
    )
    return RankFailed(message, rank=first["rank"], pid=first["pid"], later=later)


def _validate(worker: Callable[..., Any], world_size: int, backend: str) -> None:
    if not callable(worker):
        raise TypeError(f"worker must be callable, got {type(worker).__name__}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if backend == "nccl" and not under_torchrun() and torch.cuda.device_count() < world_size:
        raise ValueError(
            f"nccl with world size {world_size} needs {world_size} GPUs, found "
            f"{torch.cuda.device_count()}; lower the world size or use gloo on the CPU"
        )


def _launch_under_torchrun(
    worker: Callable[..., Any],
    world_size: int,
    backend: str,
    args: tuple[Any, ...],
    env: Mapping[str, str],
) -> list[Any]:
    started = torchrun_world_size()
    if started != world_size:
        raise ValueError(
            f"torchrun started {started} processes but this run needs world size {world_size}: "
            f"use torchrun --nproc-per-node {world_size}, or run without torchrun"
        )
    owns_group = not dist.is_initialized()
    if owns_group:
        _prepare_rank(backend, int(os.environ["LOCAL_RANK"]), env)
        dist.init_process_group(backend)
    try:
        result = worker(dist.get_rank(), world_size, *args)
        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, result)
        return gathered
    finally:
        if owns_group:
            dist.destroy_process_group()


def launch(
    worker: Callable[..., Any],
    *,
    world_size: int,
    backend: str = "gloo",
    args: Sequence[Any] = (),
    env: Mapping[str, str] | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_S,
) -> list[Any]:
    """Run `worker(rank, world_size, *args)` on `world_size` ranks; return their results.

    Args:
        worker: a module-level function (the ranks import it by name). It runs inside
            an initialised default process group of `backend`; with nccl its rank's GPU is the
            current device. Its return value must be picklable.
        world_size: number of ranks.
        backend: `"gloo"` (CPU) or `"nccl"` (one GPU per rank).
        args: extra positional arguments for `worker` (picklable).
        env: environment variables each rank sets before the process group is created, unless
            already set (e.g. ``{"TORCH_NCCL_ENABLE_TIMING": "1"}``).
        timeout: seconds the whole run may take before its processes are killed; None (the
            default) sets no bound.

    Returns:
        The workers' return values, indexed by rank (on every rank, under torchrun).

    Raises:
        TypeError: `worker` is not callable.
        ValueError: unknown backend, world size below 1, too few GPUs for nccl, or a torchrun
            world size other than `world_size`.
        TimeoutError: the ranks did not finish within `timeout` seconds.
        RankFailed: a rank raised; the first rank to fail, with its traceback (a
            `torch.multiprocessing.ProcessRaisedException`).
        torch.multiprocessing.ProcessExitedException: a rank died without raising (e.g. killed
            for memory); one killed by a signal is named with it.
        KeyboardInterrupt, SystemExit: SIGINT (or another exception) reached the launcher
            while its ranks ran, or SIGTERM did (`SystemExit(143)`, in the main thread); the
            ranks are stopped and reaped first.
    """
    _validate(worker, world_size, backend)
    env = dict(env or {})
    if under_torchrun():
        return _launch_under_torchrun(worker, world_size, backend, tuple(args), env)
    # gloo ranks share the host's cores; more threads than cores per rank only thrash.
    num_threads = max(1, (os.cpu_count() or 1) // world_size)
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as result_dir:
        processes: list[Any] = []
        try:
            with _sigterm_raises():
                # SIGINT and SIGTERM wait while the ranks start, so that one arriving then is
                # raised here, in the `try`, with the ranks to stop known (each rank handles
                # them as a process does again as it starts: `_child`).
                with _deferred(signal.SIGINT, signal.SIGTERM):
                    context = _start(worker, world_size, backend, args, env, num_threads,
                                     result_dir)  # fmt: skip
                    processes = context.processes
                _join(context, world_size, result_dir, timeout)
        except BaseException:
            # Before anything the caller holds is released; a second Ctrl-C must not cut
            # it short (multiprocessing would then wait at exit for ranks left running).
            with _deaf_to(signal.SIGINT, signal.SIGTERM):
                _stop(processes)
            raise
        return [
            torch.load(os.path.join(result_dir, f"rank{rank}.pt"), weights_only=False)
            for rank in range(world_size)
        ]


def _start(
    worker: Callable[..., Any],
    world_size: int,
    backend: str,
    args: Sequence[Any],
    env: Mapping[str, str],
    num_threads: int,
    result_dir: str,
) -> Any:
    """Start the ranks (`_child`), not waiting for them: torch's process context."""
    return mp.start_processes(
        _child,
        args=(
            worker,
            world_size,
            backend,
            _free_port(),
            tuple(args),
            env,
            num_threads,
            result_dir,
            os.getpid(),
            dict(os.environ),
        ),
        nprocs=world_size,
        join=False,
        start_method=_start_method(),
    )


def _join(context: Any, world_size: int, result_dir: str, timeout: float | None) -> None:
    """Wait for every rank to end well; raise the failure to report otherwise."""
    processes = context.processes
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        running = [p.sentinel for p in processes if p.exitcode is None]
        mp_connection.wait(running, timeout=_JOIN_POLL_S)
        signalled = _signalled(processes)  # before torch's join stops the others
        try:
            if context.join(timeout=0):
                return
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as raised:
            pids = [p.pid for p in processes]
            failure = _first_failure(result_dir, world_size, raised, signalled=signalled, pids=pids)
            raise failure from None
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(
                f"the {world_size} ranks did not finish within {timeout:.0f} s; raise "
                "--timeout, or leave it out for no bound"
            )


def _stop(processes: Sequence[Any], *, grace: float = STOP_GRACE_S) -> None:
    """End every rank still running (SIGTERM, then SIGKILL after `grace` seconds) and reap
    them all: when this returns, none runs."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + grace
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.kill()
        process.join()


def _raise_terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # the status a shell gives a process SIGTERM ended


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises `SystemExit(143)` in the main thread (where Python
    runs signal handlers) instead of ending the process at once, so that the ranks are
    stopped first; elsewhere, and where the process set a handler of its own, nothing
    changes."""
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def _handled_by(handler: Any, *signals: signal.Signals) -> Iterator[None]:
    """Within the block, `handler` handles `signals` in the main thread; the handlers before it
    are back as it ends. Off the main thread, where Python sets no handlers, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.getsignal(number) for number in signals}
    for number in signals:
        signal.signal(number, handler)
    try:
        yield
    finally:
        for number, before in previous.items():
            if before is not None:  # None: a handler not set from Python, left as it is
                signal.signal(number, before)


@contextlib.contextmanager
def _deferred(*signals: signal.Signals) -> Iterator[None]:
    """Within the block, `signals` are noted instead of handled; as it ends, the handlers before
    it are back and each noted signal is raised again, to be handled by them. (Blocking them
    would not do: the kernel gives a signal sent to the process to any thread not blocking it,
    and Python then handles it in the main thread at once.)"""
    came: list[int] = []
    try:
        with _handled_by(lambda signum, frame: came.append(signum), *signals):
            yield
    finally:
        for number in dict.fromkeys(came):
            signal.raise_signal(number)


def _deaf_to(*signals: signal.Signals) -> contextlib.AbstractContextManager[None]:
    """Within the block, the main thread ignores `signals` (elsewhere nothing changes)."""
    return _handled_by(signal.SIG_IGN, *signals)

"""`launch` reports the rank that failed first (a rank a signal killed by its signal), sets no
time bound unless asked, stops its ranks before a signal ends it, and its ranks end with it."""

from __future__ import annotations

import fcntl
import inspect
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import failing_ranks
import pytest
import torch
from failing_ranks import rank0_fails_and_lingers, rank1_is_killed, sleeps

from bench.core import launch as launch_module
from bench.core.launch import RankFailed, launch
from bench.train.lock import LOCK_FILE


def test_the_first_failure_is_reported_not_the_peer_that_followed_it():
    with pytest.raises(RankFailed) as raised:
        launch(rank0_fails_and_lingers, world_size=2, backend="gloo")
    assert raised.value.rank == 0
    assert "the real cause, on rank 0" in str(raised.value)
    assert "ValueError" in str(raised.value)
    assert "Traceback" in str(raised.value)
    assert isinstance(raised.value, torch.multiprocessing.ProcessRaisedException)


def test_a_rank_killed_by_a_signal_is_named_not_the_peer_that_followed_it():
    with pytest.raises(torch.multiprocessing.ProcessExitedException) as raised:
        launch(rank1_is_killed, world_size=2, backend="gloo")
    assert raised.value.error_index == 1 and raised.value.signal_name == "SIGKILL"
    assert str(raised.value).startswith("rank 1 of 2 was killed by SIGKILL (the OOM killer")


def test_a_killed_rank_is_named_when_its_peers_failure_reached_the_launcher_first(tmp_path):
    # What torch's join raises when the peer's exit is the first it sees: rank 0's failure
    # in the collective rank 1 left, recorded; rank 1's SIGKILL read before torch's join.
    record = {"time": 1.0, "rank": 0, "pid": 10, "error": "RuntimeError: Connection closed by "
              "peer", "traceback": "Traceback ..."}  # fmt: skip
    torch.save(record, tmp_path / "rank0.failed")
    raised = torch.multiprocessing.ProcessRaisedException("rank 0's traceback", 0, 10)
    failure = launch_module._first_failure(
        str(tmp_path), 2, raised, signalled={1: signal.SIGKILL}, pids=[10, 11]
    )
    assert isinstance(failure, torch.multiprocessing.ProcessExitedException)
    assert failure.error_index == 1 and failure.error_pid == 11
    assert "rank 1 of 2 was killed by SIGKILL" in str(failure)
    assert "rank 0 failed after it" in str(failure) and "Connection closed" in str(failure)


def test_a_failure_record_stopped_while_written_leaves_no_record(tmp_path, monkeypatch):
    # The parent stops a failing rank once another rank's end told it the run failed; a record
    # cut off mid-write must not be read as one (it once ended the launcher with an EOFError).
    def stopped(obj, path, *args, **kwargs):
        with open(path, "wb") as f:
            f.write(b"\x80")  # the first byte of a pickle, then nothing
        raise KeyboardInterrupt

    monkeypatch.setattr(launch_module.torch, "save", stopped)
    with pytest.raises(KeyboardInterrupt):
        launch_module._record_failure(str(tmp_path), 0, RuntimeError("peer left"))
    assert not (tmp_path / "rank0.failed").exists()
    raised = torch.multiprocessing.ProcessRaisedException("rank 0's traceback", 0, 10)
    failure = launch_module._first_failure(str(tmp_path), 2, raised, signalled={}, pids=[10, 11])
    assert failure is raised


def test_launch_sets_no_time_bound_by_default():
    default = inspect.signature(launch).parameters["timeout"].default
    assert default is None is launch_module.DEFAULT_TIMEOUT_S


def test_a_given_timeout_still_stops_the_ranks():
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="--timeout"):
        launch(sleeps, world_size=2, backend="gloo", timeout=1.0)
    assert time.monotonic() - started < 25


def _running(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _launcher(code: str, *args: str) -> subprocess.Popen:
    """A Python process running `code` with the failing ranks importable."""
    support = str(Path(failing_ranks.__file__).parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([support, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env)


def _released(lock: Path) -> bool:
    """Whether no process holds the run folder's lock (`bench.train.lock`) any longer."""
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # and with it the lock, if this took it
    return True


def _wait_for(path: Path, launcher: subprocess.Popen, *, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while not path.is_file() or not path.read_text():
        assert launcher.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    return path.read_text()


@pytest.mark.skipif(sys.platform != "linux", reason="the kernel's parent-death signal is Linux's")
def test_ranks_end_with_the_process_that_launched_them(tmp_path):
    """A launcher killed outright (no clean-up runs) takes its ranks with it: none trains on
    alone into a folder that the next run (a `--resume`) writes to."""
    code = (
        "import sys; from failing_ranks import writes_its_pid_and_sleeps as w; "
        "from bench.core.launch import launch; launch(w, world_size=1, args=(sys.argv[1],))"
    )
    launcher = _launcher(code, str(tmp_path))
    try:
        rank = int(_wait_for(tmp_path / "rank0.pid", launcher))
    finally:
        launcher.kill()
        launcher.wait()
    deadline = time.monotonic() + 10
    while _running(rank) and time.monotonic() < deadline:
        time.sleep(0.1)
    orphaned = _running(rank)
    if orphaned:
        os.kill(rank, signal.SIGKILL)
    assert not orphaned


@pytest.mark.skipif(sys.platform != "linux", reason="reads processes from /proc")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_ranks_start_still_stops_them(signum, monkeypatch):
    """A Ctrl-C (or SIGTERM) that reaches the launcher after its ranks were started but before
    it waits on them: it is raised once the launcher knows them, which it stops and reaps, so
    none runs on past `launch`. (Before, it was raised while they started, and they ran on.)"""
    started = []
    start = launch_module._start

    def start_then_signalled(*args):
        context = start(*args)
        started.extend(p.pid for p in context.processes)
        os.kill(os.getpid(), signum)  # as if it came now, with the ranks running
        return context

    monkeypatch.setattr(launch_module, "_start", start_then_signalled)
    monkeypatch.setattr(launch_module, "_start_method", lambda: "fork")  # one torch import
    # A process with a thread besides the main one (a tool's usually has several): the kernel
    # may hand the signal to it, so blocking the signal in the main thread would not hold it.
    threading.Thread(target=time.sleep, args=(10,), daemon=True).start()
    raised = KeyboardInterrupt if signum == signal.SIGINT else SystemExit
    with pytest.raises(raised):
        launch(sleeps, world_size=2)
    assert len(started) == 2 and not [pid for pid in started if _running(pid)]


@pytest.mark.skipif(sys.platform != "linux", reason="reads processes from /proc")
@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, -signal.SIGINT),
                                                (signal.SIGTERM, 128 + signal.SIGTERM)],
                         ids=["SIGINT", "SIGTERM"])  # fmt: skip
def test_a_signal_to_the_launcher_alone_stops_its_ranks_before_the_lock_is_released(
    signum, status, tmp_path
):
    """`kill -INT`, `timeout` and schedulers signal the launcher, not its group: its ranks,
    which keep writing into the run folder, must be gone before the folder's lock is."""
    code = (
        "import sys\n"
        "from failing_ranks import writes_its_pid_and_appends as w\n"
        "from bench.core import launch\n"
        "from bench.train.lock import hold\n"
        "launch._start_method = lambda: 'fork'  # one torch import, not the forkserver's too\n"
        "with hold(sys.argv[1], command='the first run'):\n"
        "    launch.launch(w, world_size=2, args=(sys.argv[1],))\n"
    )
    launcher = _launcher(code, str(tmp_path))
    ranks = []
    try:
        ranks = [int(_wait_for(tmp_path / f"rank{r}.pid", launcher)) for r in range(2)]
        _wait_for(tmp_path / "rank1.log", launcher)
        os.kill(launcher.pid, signum)
        deadline = time.monotonic() + 60
        while not _released(tmp_path / LOCK_FILE) and time.monotonic() < deadline:
            time.sleep(0.01)
        left_running = [pid for pid in ranks if _running(pid)]
        written = [(tmp_path / f"rank{r}.log").stat().st_size for r in range(2)]
        time.sleep(0.3)
        assert [(tmp_path / f"rank{r}.log").stat().st_size for r in range(2)] == written
        assert not left_running
        assert launcher.wait(30) == status and not (tmp_path / LOCK_FILE).exists()
    finally:
        launcher.kill()
        for pid in ranks:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)

"""`launch` reports the rank that failed first, sets no time bound unless asked, and its ranks
end with it."""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import failing_ranks
import pytest
import torch
from failing_ranks import rank0_fails_and_lingers, sleeps

from bench.core import launch as launch_module
from bench.core.launch import RankFailed, launch


def test_the_first_failure_is_reported_not_the_peer_that_followed_it():
    with pytest.raises(RankFailed) as raised:
        launch(rank0_fails_and_lingers, world_size=2, backend="gloo")
    assert raised.value.rank == 0
    assert "the real cause, on rank 0" in str(raised.value)
    assert "ValueError" in str(raised.value)
    assert "Traceback" in str(raised.value)
    assert isinstance(raised.value, torch.multiprocessing.ProcessRaisedException)


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


@pytest.mark.skipif(sys.platform != "linux", reason="the kernel's parent-death signal is Linux's")
def test_ranks_end_with_the_process_that_launched_them(tmp_path):
    """A launcher killed outright (no clean-up runs) takes its ranks with it: none trains on
    alone into a folder that the next run (a `--resume`) writes to."""
    code = (
        "import sys; from failing_ranks import writes_its_pid_and_sleeps as w; "
        "from bench.core.launch import launch; launch(w, world_size=1, args=(sys.argv[1],))"
    )
    support = str(Path(failing_ranks.__file__).parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([support, os.environ.get("PYTHONPATH", "")])}
    launcher = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=env)
    pid_file, deadline = tmp_path / "rank0.pid", time.monotonic() + 120
    try:
        while not pid_file.is_file() or not pid_file.read_text():
            assert launcher.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        launcher.kill()
        launcher.wait()
    rank = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _running(rank) and time.monotonic() < deadline:
        time.sleep(0.1)
    orphaned = _running(rank)
    if orphaned:
        os.kill(rank, signal.SIGKILL)
    assert not orphaned

"""One run at a time in a run folder: `hold(out)` claims `--out` for as long as a run writes there.

The claim is an exclusive `flock` on `run.lock` in the folder, taken before anything is read or
written there and held until the run ends. The operating system releases it when the process
ends in any way, a `kill -9` or a crash included, so a killed run never blocks the `--resume`
that follows it, and a second run started while the first still runs is refused at once, with
the first one's process id, start time and command (written in the file) in the message. A run
that ends, normally or by an exception, removes the file; one that was killed leaves it, unlocked.

The lock holds across machines on the file systems whose `flock` does (local ones and NFS on
Linux); under torchrun only rank 0 takes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

from bench.core.env import now_iso

__all__ = ["LOCK_FILE", "hold"]

LOCK_FILE = "run.lock"
_TRIES = 3  # the file may be removed between our open and our lock by a run that just ended


def _owner(path: Path) -> str:
    """The holder of the lock at `path`, in words, from what it wrote there."""
    try:
        owner = json.loads(path.read_text())
        return f"pid {owner['pid']}, started {owner['started']}: {owner['command']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "it has not written its name yet"


def _acquire(path: Path) -> int:
    """An open descriptor of `path` holding its exclusive lock.

    Raises:
        ValueError: another process holds it.
    """
    for _ in range(_TRIES):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ValueError(
                f"--out {path.parent} is in use by another bench-train run ({_owner(path)}); "
                "wait for it to end, or choose another --out"
            ) from None
        with contextlib.suppress(FileNotFoundError):
            held, named = os.fstat(fd), os.stat(path)
            if (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino):
                return fd
        os.close(fd)  # we locked a file its last holder had just removed: open the new one
    raise ValueError(f"--out {path.parent}: could not take {LOCK_FILE}; try again")


@contextlib.contextmanager
def hold(out: str | Path, *, command: str) -> Iterator[None]:
    """Hold `out`'s lock (creating the folder) for the duration of the `with` block.

    Args:
        out: the run folder.
        command: the run's command line, shown to a run that is refused.

    Raises:
        ValueError: another run holds the folder.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_FILE
    fd = _acquire(path)
    try:
        os.ftruncate(fd, 0)
        owner = {"pid": os.getpid(), "started": now_iso(), "command": command}
        os.write(fd, (json.dumps(owner) + "\n").encode())
        yield
    finally:
        path.unlink(missing_ok=True)  # still held: no other run is between its open and lock
        os.close(fd)

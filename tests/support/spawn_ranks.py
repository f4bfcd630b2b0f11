"""Run a test function on several ranks of a real process group, one process per rank.

The ranks are forked from one server process that imported torch and the project's packages
once (multiprocessing's forkserver, started on the first call, shared with `killed_run`), so a
rank costs a fork, not a Python start and torch's import (seconds each on a small CI machine).
The server imports but never computes, so the forks inherit no thread pools; a rank's worker
and its arguments reach it pickled, as under `spawn`.

Tests of `ddp`, `zero` and the cross-package tests use this; it is on pytest's `pythonpath`, so
both the test process and the processes it spawns can import it.

Example::

    def _worker(rank: int, world_size: int, scale: float) -> float:
        t = torch.full((2,), float(rank + 1)) * scale
        dist.all_reduce(t)
        return t[0].item()

    def test_sum():
        assert run_ranks(_worker, args=(2.0,)) == [6.0, 6.0]

The worker may live in a test module (pytest's importlib mode makes those unimportable by name):
each child loads it from its source file when importing it by module name fails.
"""

from __future__ import annotations

import importlib
import importlib.util
import multiprocessing
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["FORKSERVER_PRELOAD", "forkserver", "free_port", "run_ranks"]

# What the server imports, by name (Python 3.11's forkserver drops the caller's sys.path, so
# nothing of tests/support): bench's own list where bench is installed (one server serves
# both, whichever starts it), else torch and the packages a package's own environment holds.
try:
    from bench.core.launch import FORKSERVER_PRELOAD
except ImportError:
    FORKSERVER_PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "lmcore", "ddp", "zero")


def forkserver() -> multiprocessing.context.BaseContext:
    """The forkserver context, its server (one per test process) importing FORKSERVER_PRELOAD."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    return context


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load_worker(module: str, qualname: str, filename: str) -> Callable[..., Any]:
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        if getattr(getattr(obj, "__code__", None), "co_filename", filename) == filename:
            return obj
    except (ImportError, AttributeError):
        pass
    name = f"_spawned_{Path(filename).stem}_{abs(hash(filename))}"
    spec = importlib.util.spec_from_file_location(name, filename)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load worker {qualname!r} from {filename}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    obj = mod
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _child(
    rank: int,
    ref: tuple[str, str, str],
    world_size: int,
    backend: str,
    port: int,
    args: tuple[Any, ...],
    result_dir: str,
) -> None:
    torch.set_num_threads(1)  # ranks share the machine's cores; keep them from oversubscribing
    if backend == "nccl":
        # NVLink multicast off unless the environment says otherwise, as in bench's ranks
        # (`bench.core.launch`: on shared machines it can take GPUs out of service)
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        torch.cuda.set_device(rank)
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
    )
    try:
        result = _load_worker(*ref)(rank, world_size, *args)
        torch.save(result, os.path.join(result_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
    _exit_without_finalizing()


def _exit_without_finalizing() -> None:
    """End a rank whose result is saved without tearing the interpreter down.

    `destroy_process_group()` does not stop a gloo group's threads while anything else still
    references the group, and torch's `DistributedDataParallel` keeps a reference for the life
    of the process. Such a thread may release the last reference to a tensor that carries Python
    state after the interpreter has begun finalising; taking the GIL then ends the thread with
    a forced unwind through a C++ destructor, and the rank dies with "terminate called without
    an active exception" (SIGABRT), more often the slower the machine. Leaving with `os._exit`
    after flushing skips finalisation, so no such thread can outlive the interpreter.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(
    worker: Callable[..., Any],
    *,
    world_size: int = 2,
    backend: str = "gloo",
    args: Sequence[Any] = (),
    timeout: float = 180.0,
) -> list[Any]:
    """Call `worker(rank, world_size, *args)` on `world_size` ranks; return their results.

    Each rank joins a fresh process group (`backend`, rendezvous on a free local port) before the
    call and leaves it after. Return values travel back through `torch.save`, so tensors and
    plain Python data both work. An exception on any rank is re-raised here with that rank's
    traceback; a run that outlasts `timeout` seconds is killed and raises `TimeoutError`, so a
    collective that never completes fails the test instead of hanging it.
    """
    code = getattr(worker, "__code__", None)
    if code is None or "<locals>" in worker.__qualname__:
        raise TypeError("run_ranks needs a module-level function as the worker")
    ref = (worker.__module__, worker.__qualname__, code.co_filename)
    forkserver()  # the preload, before the server starts
    with tempfile.TemporaryDirectory() as result_dir:
        ctx = mp.start_processes(
            _child,
            args=(ref, world_size, backend, free_port(), tuple(args), result_dir),
            nprocs=world_size,
            join=False,
            start_method="forkserver",
        )
        deadline = time.monotonic() + timeout
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                raise TimeoutError(f"ranks did not finish within {timeout:.0f} s")
        return [
            torch.load(os.path.join(result_dir, f"rank{r}.pt"), weights_only=False)
            for r in range(world_size)
        ]

"""Live tensor memory on the CPU: the bytes of every storage alive, op by op, and its peak.

The CPU keeps no allocator statistics, so `LiveTensors` counts storages itself: a
`TorchDispatchMode` that registers the storage of every tensor an op returns (the local tensors of
a wrapper subclass such as FSDP2's `DTensor`), forgets it when the storage is freed (a weakref
finalizer), and after every op sums the bytes of the storages still alive. A storage is counted
once however many views share it, and at its size when sampled, so a buffer resized in place
(`untyped_storage().resize_()`, how both FSDPs free gathered weights) counts what it holds now.

Each storage remembers the op that created it and the innermost frame of the project or of torch's
FSDP and optimizers that called that op, so the tensors alive at a peak say where they came from.
Peaks are kept per *phase* (a label the caller sets, e.g. "forward+backward", "optimizer step").

Tensors created before the mode (the model's parameters, a module's buffers) are counted only once
`track()` is given them; what C++ allocates without an op (a gloo collective's scratch) is not
counted at all, which is what a GPU allocator would not see either.

Example::

    live = LiveTensors()
    live.track(model.parameters())
    with live:
        live.phase = "forward+backward"
        loss_fn(model(x), y).backward()
        live.phase = "optimizer step"
        optimizer.step()
    print(live.report())
"""

from __future__ import annotations

import contextlib
import functools
import sys
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

__all__ = ["Alive", "LiveTensors", "Peak", "nccl_lifetimes"]

# Frames worth naming as where a tensor was allocated: the project's packages, torch's FSDP
# (FSDP2) and its optimizers; the first of these from the innermost frame out.
_FOCUS = ("/packages/", "torch/distributed/fsdp", "torch/optim")
_SKIP = (__file__, "site-packages/torch/utils/_", "site-packages/torch/_ops.py")


@dataclass(frozen=True)
class Alive:
    """One storage alive at a peak: its bytes then, the op that made it, and from where."""

    nbytes: int
    op: str
    where: str
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass
class Peak:
    """The most bytes alive during one phase, and the storages alive at that moment.

    ``most_large``: the most storages of at least the tracker's ``large`` bytes alive at once
    during the phase (whenever that was), and ``large_alive`` those storages then.
    """

    nbytes: int = 0
    alive: list[Alive] = field(default_factory=list)
    most_large: int = 0
    large_alive: list[Alive] = field(default_factory=list)

    def grouped(self) -> list[tuple[str, str, int, int]]:
        """(op, where, count, bytes) per distinct origin, the most bytes first."""
        total: Counter[tuple[str, str]] = Counter()
        count: Counter[tuple[str, str]] = Counter()
        for a in self.alive:
            total[(a.op, a.where)] += a.nbytes
            count[(a.op, a.where)] += 1
        return [(op, where, count[(op, where)], n) for (op, where), n in total.most_common()]


@dataclass
class _Entry:
    storage: weakref.ref
    op: str
    where: str
    shape: tuple[int, ...]
    dtype: torch.dtype


def _where() -> str:
    """`file:line (function)` of the innermost project / FSDP / optimizer frame calling the op."""
    frame = sys._getframe(2)
    fallback = None
    while frame is not None:
        name = frame.f_code.co_filename
        if not any(s in name for s in _SKIP):
            here = f"{name.rsplit('/', 2)[-1] if '/' in name else name}:{frame.f_lineno} "
            here += f"({frame.f_code.co_name})"
            fallback = fallback or here
            if any(f in name for f in _FOCUS) and "site-packages/torch/nn/" not in name:
                return f"{'/'.join(name.split('/')[-2:])}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return fallback or "?"


class LiveTensors(TorchDispatchMode):
    """Counts the bytes of live tensor storages after every op; keeps each phase's peak.

    Args:
        large: also count, per phase, the most storages of at least this many bytes alive at
            once (`Peak.most_large`): e.g. one unit's full weights, to count full-size buffers.

    Attributes:
        phase: the label peaks are recorded under (set it between steps of the program).
        peaks: each phase's `Peak`.
    """

    def __init__(self, *, large: int | None = None) -> None:
        super().__init__()
        self.large = large
        self._live: dict[int, _Entry] = {}
        self.phase = "start"
        self.peaks: dict[str, Peak] = {}

    # ---- registering storages ------------------------------------------------------------

    def track(self, tensors: Iterable[torch.Tensor | None], *, op: str = "tracked") -> None:
        """Count these tensors' storages (made before the mode, or outside any op)."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._add(t, op, "tracked")

    def _add(self, t: torch.Tensor, op: str, where: str | None) -> None:
        if is_traceable_wrapper_subclass(t):
            for attr in t.__tensor_flatten__()[0]:
                self._add(getattr(t, attr), op, where)
            return
        if t.device.type == "meta":
            return
        storage = t.untyped_storage()
        key = id(storage)
        if key in self._live:
            return
        weakref.finalize(storage, self._live.pop, key, None)
        self._live[key] = _Entry(
            weakref.ref(storage), op, where or _where(), tuple(t.shape), t.dtype
        )

    # ---- measuring ---------------------------------------------------------------------------

    def live_bytes(self) -> int:
        """Bytes of every storage alive now, each counted once, at its current size."""
        total = 0
        for entry in self._live.values():
            storage = entry.storage()
            if storage is not None:
                total += storage.nbytes()
        return total

    def alive(self, *, at_least: int = 1) -> list[Alive]:
        """The storages alive now of at least `at_least` bytes, the largest first."""
        out = []
        for entry in self._live.values():
            storage = entry.storage()
            if storage is not None and storage.nbytes() >= at_least:
                out.append(Alive(storage.nbytes(), entry.op, entry.where, entry.shape, entry.dtype))
        return sorted(out, key=lambda a: -a.nbytes)

    def sample(self) -> int:
        """Record the bytes alive now against the current phase's peak; return them."""
        now = self.live_bytes()
        peak = self.peaks.setdefault(self.phase, Peak())
        if now > peak.nbytes:
            peak.nbytes, peak.alive = now, self.alive()
        if self.large is not None:
            large = self.alive(at_least=self.large)
            if len(large) > peak.most_large:
                peak.most_large, peak.large_alive = len(large), large
        return now

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = str(func.overloadpacket.__name__)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._add(t, name, None)
        self.sample()
        return out

    def report(self, *, top: int = 12, unit: int = 1) -> str:
        """Each phase's peak and its largest origins (bytes divided by `unit`)."""
        lines = []
        for phase, peak in self.peaks.items():
            lines.append(f"{phase}: peak {peak.nbytes / unit:,.1f}")
            for op, where, count, n in peak.grouped()[:top]:
                lines.append(f"    {n / unit:10,.1f}  {count:4d} x {op:<28s} {where}")
        return "\n".join(lines)


class _Stashed:
    """An async collective's work that holds its tensors until `wait()`, as NCCL's does."""

    def __init__(self, work: dist.Work, *tensors: torch.Tensor) -> None:
        self._work, self._tensors = work, tensors

    def wait(self, *args: object) -> bool:
        done = self._work.wait(*args)
        self._tensors = ()
        return done

    def is_completed(self) -> bool:
        return self._work.is_completed()


def _stashing(collective: Callable[..., dist.Work | None]) -> Callable[..., dist.Work | None]:
    @functools.wraps(collective)
    def call(output, input, *args, async_op: bool = False, **kwargs):
        work = collective(output, input, *args, async_op=async_op, **kwargs)
        return _Stashed(work, output, input) if async_op else work

    return call


@contextlib.contextmanager
def nccl_lifetimes() -> Iterator[None]:
    """Give gloo's async `all_gather_into_tensor` and `reduce_scatter_tensor` NCCL's lifetimes.

    ProcessGroupNCCL keeps an async collective's input and output alive until its work is
    waited for (its "stash", which replaced `record_stream`), while gloo may drop them as soon
    as the collective is done. Counted on the CPU, a buffer a wrapper leaves in flight would
    look freed early; under this it lives until `wait()`, as on a GPU.
    """
    names = ("all_gather_into_tensor", "reduce_scatter_tensor")
    originals = {name: getattr(dist, name) for name in names}
    try:
        for name, collective in originals.items():
            setattr(dist, name, _stashing(collective))
        yield
    finally:
        for name, collective in originals.items():
            setattr(dist, name, collective)

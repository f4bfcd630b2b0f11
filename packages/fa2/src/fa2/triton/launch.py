"""Launching the kernels with little host time: launch plans and cached binaries.

`kernel[grid](*args)` binds the arguments, works out how each one specialises the binary
(dtype, 16-byte alignment, integers divisible by 16 or equal to 1), builds a cache key from
that and only then launches: about 30 µs of host time per launch on an H100 host, where the
whole CUDA launch takes 10. A Python autograd Function around three such launches spent more
host time than its kernels took on the GPU below about 16k tokens per head (measured; see
docs/design/fa2.md). Attention is called over and over with the same shapes, so:

- a *plan* (see `plan_cache`) holds everything about a call that follows from its shapes,
  strides and dtype: tiles, grids, integer arguments, which inputs need a contiguous copy;
- `CachedLaunch` launches one kernel of a plan. The first call goes through Triton, which
  compiles if needed; later calls hand the arguments straight to the compiled binary's
  launcher, as the launchers that torch.compile generates for Triton kernels do. The integer
  arguments are fixed by the plan, so the only thing that can still change the binary is the
  alignment of the tensors, which is checked on every call.

Triton's own path is kept for everything else: the CPU interpreter (no binary), a launch hook
set by a profiler (it expects Triton's launch metadata) and tensors not aligned to 16 bytes.
Under torch.compile the plans launch through `torch.library.wrap_triton` instead
(`CachedLaunch.traceable`), so the compiled graph contains the kernels themselves.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable
from typing import Any

import torch
import triton
from triton import knobs

from fa2.layouts import as_bhsd
from fa2.triton.configs import INTERPRET, known_true

__all__ = [
    "INT32_MAX",
    "CachedLaunch",
    "aligned_when_run",
    "contiguous_where",
    "dense_strides",
    "explain_interpreter_error",
    "head_strides",
    "needs_int64",
    "output_strides",
    "plan_cache",
    "read_layouts",
    "tma_capable",
    "tma_layouts",
    "unused_pointers",
]

_MAX_PLANS = 512
# Row offsets past this are computed in int64 in the kernels (`tiles.row_offsets`).
INT32_MAX = 2**31 - 1


def plan_cache(build: Callable[..., Any]) -> Callable[..., Any]:
    """Memoise `build(key, *tensors)` on `key`; the cache is dropped when it grows past 512.

    A call that finds its plan skips whatever was checked when the plan was built, so the key
    must hold everything that check and the plan read from the call, and what it leaves out
    must be checked by the caller on every call. The forward plans' key
    (`fa2.triton.forward.forward_plan`) holds q, k and v's shapes, strides, dtypes and devices
    and the options of `run_forward`; the Triton Function checks the rest on every call: the
    packed sequences' offsets and max_seqlen, an explicit scale, the inputs' alignment (see
    `FlashAttention2Triton`). The backward plans, kept per forward plan, add dO's strides and
    `deterministic`.
    """
    plans: dict[Hashable, Any] = {}

    def get(key: Hashable, *tensors: torch.Tensor) -> Any:
        plan = plans.get(key)
        if plan is None:
            if len(plans) >= _MAX_PLANS:
                plans.clear()
            plan = plans[key] = build(*tensors)
        return plan

    get.cache = plans  # type: ignore[attr-defined]
    return get


def head_strides(t: torch.Tensor) -> tuple[int, int, int] | None:
    """(batch, head, row) strides of `t` seen as `(batch, heads, n, d)` without a copy, or None.

    The heads are dim -3 (one head for a 2-D tensor), the batch is the product of the dims
    before it. None when the feature dim is not contiguous or the batch dims cannot be merged
    into one evenly strided dim; such inputs are copied to a contiguous layout first. Works on
    strides alone (no `view`), so it also runs on the fake tensors torch.compile traces with:
    q, k, v transposed from (batch, seq, heads, d) are read in place."""
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        return None
    head = t.stride(-3) if t.dim() >= 3 else 0
    batch, expected = 0, None
    for size, stride in reversed(list(zip(t.shape[:-3], t.stride()[:-3], strict=True))):
        if size == 1:
            continue
        if expected is None:
            batch = stride
        elif stride != expected:
            return None
        expected = stride * size
    return batch, head, t.stride(-2)


def dense_strides(shape: torch.Size) -> tuple[int, int, int]:
    """`head_strides` of a contiguous tensor of `shape`: how the kernels read the copy that
    `contiguous_where` makes.

    Read off a tensor of that shape, not computed apart: the batch stride must be 0 where no
    dim before the heads exceeds 1, as `head_strides` gives for the inputs read in place.
    Packed sequences ("thd") index the batch dim by sequence and find each one's rows from
    its offsets; a batch stride of heads x n x d sent sequence b that far past its rows (an
    expanded output gradient, which `out.sum()` makes, is copied: NaN or garbage)."""
    strides = head_strides(torch.empty(shape, device="meta"))
    assert strides is not None  # a contiguous tensor's dims always merge
    return strides


def read_layouts(
    tensors: tuple[torch.Tensor, ...],
) -> tuple[tuple[bool, ...] | None, list[tuple[int, int, int]]]:
    """Which of `tensors` need a contiguous copy (None: none does; see `contiguous_where`), and
    the (batch, head, row) strides the kernels read each one with."""
    layouts = [head_strides(t) for t in tensors]
    copies = tuple(layout is None for layout in layouts)
    strides = [
        dense_strides(t.shape) if layout is None else layout
        for layout, t in zip(layouts, tensors, strict=True)
    ]
    return (copies if any(copies) else None), strides


def unused_pointers(like: torch.Tensor, traced: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Tensors for the two cu_seqlens slots of a call over unpacked sequences, which the kernels
    never read. Eager: `like` itself, twice (no allocation). Traced: two empty tensors of their
    own. torch.compile functionalizes a user kernel by cloning the pointers it may write, one
    clone per slot; a tensor passed in several slots then comes back as the clone of the wrong
    slot (an unwritten buffer: the backward read its L from one and produced NaN)."""
    if traced:
        return like.new_empty(0, dtype=torch.int32), like.new_empty(0, dtype=torch.int32)
    return like, like


def needs_int64(shapes: list[torch.Size], strides: list[tuple[int, int, int]]) -> bool:
    """True when a row offset `(n - 1) * row_stride + d` of one of the tensors passes int32."""
    return any(
        (shape[-2] - 1) * stride[2] + shape[-1] > INT32_MAX
        for shape, stride in zip(shapes, strides, strict=True)
    )


def tma_capable(device: torch.device) -> bool:
    """Whether kernels on `device` can use the TMA unit (Hopper or newer, not the interpreter)."""
    return (
        not INTERPRET and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9
    )


def tma_layouts(
    tensors: tuple[torch.Tensor, ...], strides: list[tuple[int, int, int]], *, traced: bool
) -> bool:
    """Whether the kernels may read `tensors` (with these (batch, head, row) strides) through
    TMA descriptors: a capable device; every stride a whole number of 16 bytes, so that each
    head's rows start 16-byte aligned whenever the tensor does; rows that are not repeated
    (an expanded tensor's row stride of 0 is left to plain loads).

    The tensors' own alignment is checked on every call by `CachedLaunch` in eager mode. A
    compiled graph launches without that check, so when `traced` the alignment must be known
    now (see `aligned_when_run`)."""
    if not tma_capable(tensors[0].device):
        return False
    for t, layout in zip(tensors, strides, strict=True):
        if not all(known_true(s * t.element_size() % 16 == 0) for s in layout):
            return False
        if not known_true(layout[2] != 0) or (traced and not aligned_when_run(t)):
            return False
    return True


def aligned_when_run(t: torch.Tensor) -> bool:
    """Whether `t`'s data will start on a 16-byte boundary when the kernels read it.

    A real tensor: read from its pointer. A fake one, which torch.compile traces with: only
    under Inductor, which allocates its buffers aligned and, when the graph runs, copies
    any input that is not aligned although its traced storage offset is; so an offset of
    whole 16 bytes then holds at run time. Other backends promise nothing: False."""
    from torch._subclasses.fake_tensor import is_fake

    if not is_fake(t):
        return t.data_ptr() % 16 == 0
    return known_true(t.storage_offset() * t.element_size() % 16 == 0) and _inductor_tracing()


def _inductor_tracing() -> bool:
    """Whether Inductor is compiling the graph being traced (it sets its fake mode then)."""
    try:
        from torch._inductor.virtualized import V
        from torch._subclasses.fake_tensor import FakeTensorMode

        return isinstance(V.fake_mode, FakeTensorMode)
    except (ImportError, AttributeError):  # a torch that keeps this elsewhere: assume not
        return False


_scratch_buffers: dict[tuple[int, int | None], torch.Tensor] = {}


def _scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Global memory Triton asks for at launch: where a kernel builds its TMA descriptors.

    One buffer per device and stream is kept and handed out again: kernels on one stream run
    one after another, so a launch never finds the buffer still in use. Not while a CUDA graph
    is being captured, whose memory belongs to the graph."""
    device = torch.cuda.current_device()
    if torch.cuda.is_current_stream_capturing():
        return torch.empty(size, dtype=torch.int8, device=device)
    buffer = _scratch_buffers.get((device, stream))
    if buffer is None or buffer.numel() < size:
        buffer = _scratch_buffers[(device, stream)] = torch.empty(
            size, dtype=torch.int8, device=device
        )
    return buffer


def contiguous_where(
    tensors: tuple[torch.Tensor, ...], copies: tuple[bool, ...] | None, layout: str
) -> tuple[torch.Tensor, ...]:
    """`tensors` (in the caller's `layout`) as the kernels read them: where `copies` says the
    layout needs one (see `read_layouts`), a contiguous copy of the `(..., heads, n, d)` view;
    None means none does. Only the data pointers matter to the kernels: their strides come
    from the plan."""
    if copies is None:
        return tensors
    return tuple(
        as_bhsd(t, layout).contiguous() if c else t for t, c in zip(tensors, copies, strict=True)
    )


def output_strides(shape: torch.Size, layout: str) -> tuple[int, int, int]:
    """`head_strides` of the `(..., heads, n, d)` view of a contiguous tensor of `shape` in
    `layout`: how the kernels write an output allocated contiguous in the caller's layout."""
    strides = head_strides(as_bhsd(torch.empty(shape, device="meta"), layout))
    assert strides is not None  # a contiguous tensor's view always merges
    return strides


def _check_constexprs(fn: Callable, constexprs: dict[str, Any]) -> None:
    """Raise KeyError naming the constexpr parameters of kernel function `fn` that `constexprs`
    leaves out, as a compiled kernel's launch does (its `params` list them all): so that a
    launch missing one fails in Triton's interpreter too, not first on a GPU."""
    missing = [
        name
        for name, param in inspect.signature(fn).parameters.items()
        if str(param.annotation).endswith("constexpr") and name not in constexprs
    ]
    if missing:
        raise KeyError(f"{fn.__name__} launched without its constexprs {', '.join(missing)}")


class CachedLaunch:
    """One kernel of a plan: fixed grid, tile and integer arguments; tensors change per call.

    Call as `launch(tensors, scalars)`, the kernel's runtime arguments in signature order split
    into its leading tensor arguments and the rest, or `launch(tensors, scalars, grid)` where
    the grid changes from call to call (packed sequences: it covers the longest one). The
    kernel's constexpr parameters must come after all of its runtime parameters.
    """

    def __init__(
        self,
        kernel: Any,
        grid: tuple[int, ...] | None,
        constexprs: dict[str, Any],
        *,
        num_warps: int,
        num_stages: int,
        scratch: bool = False,
        unaligned: CachedLaunch | None = None,
        checked: tuple[int, ...] | None = None,
        trailing: tuple = (),
    ) -> None:
        """`scratch`: the kernel builds TMA descriptors, in global memory that Triton's launcher
        asks an allocator for. `unaligned`: the launch to use instead when a tensor is not
        16-byte aligned (a kernel reading through TMA descriptors needs that). `checked`: the
        positions of the tensors whose alignment must be checked on each call, those the
        caller passed in (a plan's own allocations come from torch's allocator, aligned to at
        least 16 bytes); None: all of them. `trailing`: runtime scalars of this launch alone,
        after the caller's (which `unaligned` does not take)."""
        self.kernel = kernel
        self.trailing = tuple(trailing)
        self.scratch = scratch
        self.unaligned = unaligned
        self.checked = checked
        self.grid = None if grid is None else _grid3(grid)
        self.options = dict(constexprs, num_warps=num_warps, num_stages=num_stages)
        params = getattr(kernel, "params", None)
        self._tail: tuple | None = None
        if params is None and hasattr(kernel, "fn"):  # Triton's interpreter: no `params`
            _check_constexprs(kernel.fn, constexprs)
        if params is not None:
            kinds = [p.is_constexpr for p in params]
            n_runtime = kinds.index(True) if True in kinds else len(kinds)
            if all(kinds[n_runtime:]):
                self._tail = tuple(constexprs[p.name] for p in params[n_runtime:])
        self._binary: tuple | None = None

    def __call__(
        self, tensors: tuple[torch.Tensor, ...], scalars: tuple, grid: tuple | None = None
    ) -> None:
        grid = self.grid if grid is None else _grid3(grid)
        aligned = True
        for t in tensors if self.checked is None else (tensors[i] for i in self.checked):
            if t.data_ptr() % 16:
                aligned = False
                break
        if not aligned and self.unaligned is not None:
            self.unaligned(tensors, scalars, grid)
            return
        self._set_allocator()
        binary = self._binary
        if binary is not None and aligned and not _hooked():
            run, function, metadata, device = binary
            run(
                *grid, _stream(device), function, metadata, None, None, None,
                *tensors, *scalars, *self.trailing, *self._tail,
            )  # fmt: skip
            return
        try:
            compiled = self.kernel[grid](*tensors, *scalars, *self.trailing, **self.options)
        except Exception as exc:
            if INTERPRET:
                explain_interpreter_error(exc)
            raise
        if binary is None and self._tail is not None:
            self._keep(compiled, tensors)

    def traceable(
        self, tensors: tuple[torch.Tensor, ...], scalars: tuple, grid: tuple | None = None
    ) -> None:
        """The same launch in the form torch.compile traces into (inside a `triton_op`): the
        compiled graph then launches the kernel with its own generated launcher."""
        from torch.library import wrap_triton

        self._set_allocator()  # for where the op runs outside a compiled graph
        wrap_triton(self.kernel)[self.grid if grid is None else _grid3(grid)](
            *tensors, *scalars, *self.trailing, **self.options
        )

    def _set_allocator(self) -> None:
        """Point Triton at the scratch buffers if the kernel builds TMA descriptors. Per call:
        the allocator is per thread, and autograd runs the backward in a thread of its own."""
        if self.scratch:
            triton.set_allocator(_scratch)

    def _keep(self, compiled: Any, tensors: tuple[torch.Tensor, ...]) -> None:
        """Remember the binary Triton just launched, if it is one built for aligned tensors."""
        if any(t.data_ptr() % 16 for t in tensors) or not hasattr(compiled, "packed_metadata"):
            return  # the interpreter returns no binary; misaligned tensors get another one
        try:
            self._binary = (
                compiled.run,
                compiled.function,
                compiled.packed_metadata,
                tensors[0].device.index,
            )
        except (AttributeError, RuntimeError):  # a Triton without this launcher interface
            self._binary = None


def _grid3(grid: tuple) -> tuple:
    """A grid of up to three dims as three."""
    return tuple(grid) + (1,) * (3 - len(grid))


def explain_interpreter_error(exc: BaseException) -> None:
    """Raise a RuntimeError that says what to install when `exc` is the failure of Triton 3.6's
    CPU interpreter on numpy >= 2.4 (a cryptic InterpreterError about 0-dimensional arrays);
    return otherwise, for the caller to re-raise `exc`."""
    import numpy

    if "0-dimensional arrays can be converted" not in str(exc):
        return
    raise RuntimeError(
        f"Triton {triton.__version__}'s CPU interpreter (TRITON_INTERPRET=1) does not run with "
        f"numpy {numpy.__version__}: numpy 2.4 stopped converting 1-element arrays to Python "
        "scalars, which this interpreter relies on. Install numpy<2.4 (pip install 'numpy<2.4') "
        "or a Triton whose interpreter supports it (3.9 does)."
    ) from exc


def _hooked() -> bool:
    """A profiler (e.g. Triton's proton) set a launch hook: it needs Triton's launch path.
    Older Tritons leave an unset hook None; newer ones (3.6) always hold a chain of hooks,
    empty (no `calls`) until a profiler adds one."""
    runtime = knobs.runtime
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    return bool(
        (enter is not None and getattr(enter, "calls", True))
        or (leave is not None and getattr(leave, "calls", True))
    )


def _stream(device: int) -> int:
    """The raw handle of torch's current stream on `device`."""
    return torch._C._cuda_getCurrentRawStream(device)

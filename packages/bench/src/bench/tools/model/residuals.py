"""What a module saves for its backward pass ("residuals"), by operation, with saved-tensor hooks.

The handout's §2.1.6 (f) asks how much memory one TransformerBlock saves for backward, which five
operations contribute most, and how much memory the gradients a block produces in backward
take; §3.1 counts the same residuals with `torch.autograd.graph.saved_tensors_hooks`. Nsight
Systems answers it from its memory timeline; this module answers it on any machine, a CPU
included, from the tensors autograd actually saves:

- `SavedTensorLog(module)` is a context manager that records every tensor autograd saves while
  it is open, with the operation that saved it: the submodule whose forward was running (its
  path inside `module`) and the torch function being called (`linear`, `softmax`, `mul`, ...,
  read through a `TorchFunctionMode`). Weights and buffers (the module's parameters and buffers,
  RoPE tables included) are not residuals (they live anyway) and are left out, as the handout's
  hook leaves out `nn.Parameter`s.
- Bytes are counted two ways: `saved_bytes`, every save (what the handout's hook adds up: a
  tensor saved by two operations counts twice), and `held_bytes`, each storage once (what
  memory holds: a view keeps its whole storage alive, and two saves of one tensor cost nothing
  extra). Operations are ranked by held bytes, each storage charged to the first operation that
  saved it, so the shares add up to 100 %.
- `measure_block(block, x)` runs one forward under the log (optionally through
  `torch.utils.checkpoint`, whose own hooks then save only the block's input) and one backward,
  and reports the gradient bytes the block produced (its weights' and its input's); on CUDA also
  the allocator's view: memory allocated by the forward, and the change over the backward, from
  which the gradient bytes follow as the handout computes them from a profile (change + freed
  residuals).
- `run_residual_study(...)` measures one `lmcore.TransformerBlock` per configuration, with and
  without activation checkpointing, as a `Run` of tool `residuals` (bench-model `--study
  residuals`).

Example::

    with SavedTensorLog(block) as log:
        y = block(x)
    print(log.held_bytes, log.by_operation()[:5])
"""

from __future__ import annotations

import contextlib
import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.checkpoint import checkpoint

from bench.core.memory import free_memory, to_mib
from bench.core.oom import guarded
from bench.core.results import Keys, Run
from bench.core.shapes import Shape
from lmcore import RotaryEmbedding, TransformerBlock

__all__ = [
    "CHECKPOINTING",
    "RESIDUAL_COLUMNS",
    "RESIDUAL_KEYS",
    "BlockResiduals",
    "SavedTensor",
    "SavedTensorLog",
    "measure_block",
    "run_residual_study",
]

CHECKPOINTING = ("none", "block")  # the block as it is, or wrapped in torch.utils.checkpoint
# The precisions of `bench.core.layouts` the study runs: the autocast dtype (None: none).
_DTYPES = {"fp32": None, "bf16-autocast": torch.bfloat16}
TOP_OPERATIONS = 5  # the handout's "5 largest contributing operations"


@dataclass(frozen=True)
class SavedTensor:
    """One tensor autograd saved for backward.

    Attributes:
        module: path of the submodule whose forward was running (`""`: the root module).
        function: the torch function being called (`linear`, `softmax`, `mul`, ...).
        shape: the saved tensor's shape.
        dtype: its dtype, e.g. `torch.float32`.
        nbytes: its own size, `numel × element size`.
        storage_bytes: the size of the storage it keeps alive (a view keeps all of it).
        first: whether this is the first save of that storage (counted in `held_bytes`).
    """

    module: str
    function: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    storage_bytes: int
    first: bool

    @property
    def operation(self) -> str:
        """`<module path> <function>`, e.g. `attn softmax` or `ffn.w1 linear`."""
        return f"{self.module or '(block)'} {self.function}"


def _function_name(func: Callable[..., Any]) -> str:
    name = getattr(func, "__name__", None) or str(func)
    return name.strip("_")


class _CallStack(TorchFunctionMode):
    """Keeps the name of the torch function being called (the outermost one: a mode is
    switched off inside its own handler, so calls made by the function are not seen)."""

    def __init__(self, stack: list[str]) -> None:
        super().__init__()
        self.stack = stack

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.stack.append(_function_name(func))
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.stack.pop()


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    return str(t.device), t.untyped_storage().data_ptr()


class SavedTensorLog(contextlib.AbstractContextManager):
    """Record every tensor autograd saves while open, with the operation that saved it.

    Args:
        module: the module whose operations are named (paths are relative to it); its
            parameters and buffers are not counted.
        exclude: further tensors whose storages are not counted (shared tables, say).

    Attributes:
        records: one `SavedTensor` per save, in order.
    """

    def __init__(self, module: nn.Module, *, exclude: Iterable[torch.Tensor] = ()) -> None:
        self.module = module
        state = itertools.chain(module.parameters(), module.buffers(), exclude)
        self._excluded = {_storage_key(t) for t in state}
        self.records: list[SavedTensor] = []
        self._seen: set[tuple[str, int]] = set()
        self._modules: list[str] = []
        self._functions: list[str] = []
        self._stack = contextlib.ExitStack()

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if isinstance(t, nn.Parameter) or key in self._excluded:
            return t
        first = key not in self._seen
        self._seen.add(key)
        self.records.append(
            SavedTensor(
                module=self._modules[-1] if self._modules else "",
                function=self._functions[-1] if self._functions else "?",
                shape=tuple(t.shape),
                dtype=str(t.dtype),
                nbytes=t.numel() * t.element_size(),
                storage_bytes=t.untyped_storage().nbytes(),
                first=first,
            )
        )
        return t

    def __enter__(self) -> SavedTensorLog:
        def enter(name: str) -> Callable[..., None]:
            def hook(module: nn.Module, args: Any) -> None:
                self._modules.append(name)

            return hook

        def leave(module: nn.Module, args: Any, output: Any) -> None:
            self._modules.pop()  # returns None: a forward hook's result replaces the output

        for name, sub in self.module.named_modules():
            pre = sub.register_forward_pre_hook(enter(name))
            post = sub.register_forward_hook(leave)
            self._stack.callback(pre.remove)
            self._stack.callback(post.remove)
        self._stack.enter_context(_CallStack(self._functions))
        self._stack.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, _same))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
        self._modules.clear()
        self._functions.clear()

    @contextlib.contextmanager
    def calling(self, name: str) -> Iterator[None]:
        """Name the saves made in the block `name` (for calls that are not torch functions,
        such as `torch.utils.checkpoint`)."""
        self._functions.append(name)
        try:
            yield
        finally:
            self._functions.pop()

    @property
    def saved_bytes(self) -> int:
        """Bytes of every save (a tensor saved twice counts twice), as the handout counts."""
        return sum(r.nbytes for r in self.records)

    @property
    def held_bytes(self) -> int:
        """Bytes of the distinct storages saved: the memory kept for backward."""
        return sum(r.storage_bytes for r in self.records if r.first)

    def by_operation(self) -> list[tuple[str, int, int]]:
        """`(operation, held bytes, saves)` per operation, largest first.

        Each storage is charged to the first operation that saved it.
        """
        held: dict[str, int] = defaultdict(int)
        saves: dict[str, int] = defaultdict(int)
        for r in self.records:
            saves[r.operation] += 1
            held[r.operation] += r.storage_bytes if r.first else 0
        return sorted(((op, held[op], saves[op]) for op in held), key=lambda x: -x[1])


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


@dataclass(frozen=True)
class BlockResiduals:
    """What one block saved in its forward and produced in its backward (bytes).

    Attributes:
        log: the saved tensors.
        param_grad_bytes: the gradients of the block's weights.
        input_grad_bytes: the gradient of the block's input (passed to the block below).
        forward_alloc_bytes: CUDA memory allocated by the forward (residuals and output);
            None off CUDA.
        backward_change_bytes: the change of CUDA memory allocated over the backward; None
            off CUDA.
    """

    log: SavedTensorLog
    param_grad_bytes: int
    input_grad_bytes: int
    forward_alloc_bytes: int | None
    backward_change_bytes: int | None

    @property
    def grad_bytes(self) -> int:
        """Every gradient tensor the block produced: its weights' and its input's."""
        return self.param_grad_bytes + self.input_grad_bytes

    @property
    def grad_from_memory_bytes(self) -> int | None:
        """The gradients' bytes as a memory profile shows them: the backward's change of
        allocated memory plus the residuals it freed (CUDA only)."""
        if self.backward_change_bytes is None:
            return None
        return self.backward_change_bytes + self.log.held_bytes


def _allocated(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device)


def measure_block(
    block: nn.Module,
    x: torch.Tensor,
    *,
    checkpointed: bool = False,
    autocast_dtype: torch.dtype | None = None,
    exclude: Iterable[torch.Tensor] = (),
) -> BlockResiduals:
    """One forward of `block` on `x` under a `SavedTensorLog`, then one backward.

    Args:
        block: the module (its gradients are reset first).
        x: its input; must require grad (as an activation inside a model does).
        checkpointed: run it through `torch.utils.checkpoint` (non-reentrant).
        autocast_dtype: run the forward under `torch.autocast` in this dtype (None: no
            autocast).
        exclude: further tensors not to count (see `SavedTensorLog`).

    Raises:
        ValueError: `x` does not require grad.
    """
    if not x.requires_grad:
        raise ValueError("x must require grad, as a block's input does inside a model")
    device = x.device
    block.zero_grad(set_to_none=True)
    x.grad = None
    before = _allocated(device)
    cast = (
        torch.autocast(device_type=device.type, dtype=autocast_dtype)
        if autocast_dtype is not None
        else contextlib.nullcontext()
    )
    with SavedTensorLog(block, exclude=exclude) as log, cast:
        if checkpointed:
            with log.calling("checkpoint"):
                y = checkpoint(block, x, use_reentrant=False)
        else:
            y = block(x)
    dy = torch.randn_like(y)
    after_forward = _allocated(device)
    y.backward(dy)
    after_backward = _allocated(device)
    params = [p for p in block.parameters() if p.grad is not None]
    return BlockResiduals(
        log=log,
        param_grad_bytes=sum(p.grad.numel() * p.grad.element_size() for p in params),
        input_grad_bytes=x.grad.numel() * x.grad.element_size(),
        forward_alloc_bytes=None if before is None else after_forward - before,
        backward_change_bytes=None if after_forward is None else after_backward - after_forward,
    )


RESIDUAL_COLUMNS = [
    "size",
    "ctx",
    "dtype",
    "attention",
    "checkpointing",
    "kind",
    "rank",
    "operation",
    "mib",
    "share",
    "saves",
    "saved_mib",
    "grad_mib",
    "param_grad_mib",
    "input_grad_mib",
    "grad_from_memory_mib",
    "forward_alloc_mib",
    "status",
]
# Every key of a residuals row, for readers (bench-report).
RESIDUAL_KEYS = Keys(
    *RESIDUAL_COLUMNS, "batch", "d_model", "d_ff", "num_heads", "num_layers", "cell"
)


def _block_rows(base: dict[str, Any], result: BlockResiduals) -> list[dict[str, Any]]:
    log = result.log
    held = log.held_bytes
    mib = {
        "grad_mib": to_mib(result.grad_bytes),
        "param_grad_mib": to_mib(result.param_grad_bytes),
        "input_grad_mib": to_mib(result.input_grad_bytes),
        "grad_from_memory_mib": to_mib(result.grad_from_memory_bytes),
        "forward_alloc_mib": to_mib(result.forward_alloc_bytes),
    }
    total = {
        **base,
        "kind": "block",
        "rank": None,
        "operation": "all saved tensors",
        "mib": to_mib(held),
        "share": 1.0 if held else None,
        "saves": len(log.records),
        "saved_mib": to_mib(log.saved_bytes),
        **mib,
    }
    rows = [total]
    for rank, (operation, nbytes, saves) in enumerate(log.by_operation()[:TOP_OPERATIONS], 1):
        rows.append(
            {
                **base,
                "kind": "operation",
                "rank": rank,
                "operation": operation,
                "mib": to_mib(nbytes),
                "share": nbytes / held if held else None,
                "saves": saves,
                **dict.fromkeys(("saved_mib", *mib)),
            }
        )
    return rows


def run_residual_study(
    shapes: Sequence[Shape],
    *,
    context_lengths: Sequence[int],
    batch: int,
    dtypes: Sequence[str] = ("fp32",),
    attention: Sequence[str] = ("naive",),
    device: torch.device | str = "cpu",
    command: str | None = None,
    config: dict[str, Any] | None = None,
) -> Run:
    """What one TransformerBlock of each size saves for backward, with and without checkpointing.

    Per configuration (shape × context × dtype × attention) and checkpointing (`none`, `block`),
    one `block` row (held and saved MiB, the gradients produced: the weights' and the input's,
    and on CUDA the forward's allocation and the gradients read from the allocator) and the
    five largest operations by held bytes with their share (`operation` rows). A configuration
    that runs out of memory is an `OOM` row.

    Args:
        shapes: model shapes (one block of each is built).
        context_lengths: sequence lengths.
        batch: sequences per batch.
        dtypes: `fp32`, or `bf16-autocast` (autocast around the forward).
        attention: lmcore attention backends.
        device: where to run.
        command: the command line to record.
        config: the configuration to record (the arguments when None).

    Returns:
        A `Run` of tool `residuals` (`RESIDUAL_COLUMNS`), one table per configuration.
    """
    device = torch.device(device)
    rows: list[dict[str, Any]] = []
    cells = itertools.product(shapes, context_lengths, dtypes, attention, CHECKPOINTING)
    for (name, size), ctx, dtype, backend, mode in cells:
        base = {
            "size": name,
            "ctx": ctx,
            "batch": batch,
            "d_model": size.d_model,
            "d_ff": size.d_ff,
            "num_heads": size.num_heads,
            "num_layers": size.num_layers,
            "dtype": dtype,
            "attention": backend,
            "checkpointing": mode,
            "cell": f"{name} ctx {ctx} {dtype} {backend}, checkpointing {mode}",
        }

        def measure(
            size: Any = size,
            ctx: int = ctx,
            dtype: str = dtype,
            backend: str = backend,
            mode: str = mode,
        ) -> BlockResiduals:
            config_ = size.config(context_length=ctx, attention=backend)
            with torch.device(device):
                rope = RotaryEmbedding(config_.head_dim, ctx, theta=config_.rope_theta)
                block = TransformerBlock(config_, rope=rope)
                x = torch.randn(batch, ctx, size.d_model, requires_grad=True)
            return measure_block(
                block, x, checkpointed=mode == "block", autocast_dtype=_DTYPES[dtype]
            )

        outcome = guarded(measure, device=device)
        if outcome.ok:
            rows.extend({**r, "status": outcome.status} for r in _block_rows(base, outcome.value))
        else:
            rows.append({**base, "kind": "block", "status": outcome.status})
        free_memory(device)
    arguments = {
        "shapes": [[n, vars(s)] for n, s in shapes],
        "context_lengths": list(context_lengths),
        "batch": batch,
        "dtypes": list(dtypes),
        "attention": list(attention),
    }
    return Run.create(
        "residuals",
        rows,
        device=device,
        config=config if config is not None else arguments,
        command=command,
        title=f"Residuals of one TransformerBlock (tensors saved for backward), batch {batch}",
        columns=RESIDUAL_COLUMNS,
        group_by="cell",
        notes=[
            "mib (block rows): distinct storages saved for backward by one block's forward "
            "(weights and RoPE tables left out); saved_mib: every save, as a saved-tensor hook "
            "adds them up (a tensor saved by two operations counts twice). operation rows: the "
            f"{TOP_OPERATIONS} largest operations (submodule and torch function) by the "
            "storages they saved first, with their share of the block's total. grad_mib: "
            "the gradients the block's backward produced (its weights' and its input's); "
            "grad_from_memory_mib (CUDA): the same read from the allocator, the backward's "
            "change of allocated memory plus the residuals it freed. checkpointing block: "
            "the block under torch.utils.checkpoint, which keeps only its input and recomputes "
            "the rest (one block's worth again, briefly) in backward.",
        ],
    )

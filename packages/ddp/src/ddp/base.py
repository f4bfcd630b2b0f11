"""The contract all four wrappers share: validation, the construction-time checks and broadcast,
`forward`, `no_sync`, the synchronisation template, and the one place collectives are issued.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal, TypedDict

import torch
import torch.distributed as dist
from torch import nn

from ddp.stats import CommRecorder, CommStats, nvtx_range

__all__ = ["DataParallelBase", "DataParallelOptions", "UnusedGrads", "divide_into"]

UnusedGrads = Literal["zeros", "none"]
_UNUSED_GRADS = ("zeros", "none")


class DataParallelOptions(TypedDict, total=False):
    """The keyword options every wrapper takes; `DataParallelBase` documents each one."""

    process_group: dist.ProcessGroup | None
    grad_dtype: torch.dtype | None
    unused_grads: UnusedGrads
    record_comm_stats: bool
    broadcast_buffers: bool


def _validate_arguments(module: object, grad_dtype: object, unused_grads: object) -> None:
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if grad_dtype is not None and not (
        isinstance(grad_dtype, torch.dtype) and grad_dtype.is_floating_point
    ):
        raise ValueError(
            f"grad_dtype must be a floating-point torch.dtype (e.g. torch.bfloat16) or None, "
            f"got {grad_dtype!r}"
        )
    if unused_grads not in _UNUSED_GRADS:
        raise ValueError(f"unused_grads must be one of {_UNUSED_GRADS}, got {unused_grads!r}")


def _require_process_group() -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "the default process group is not initialised: call "
            "torch.distributed.init_process_group(backend=...) on every rank (or launch with "
            "torchrun) before wrapping the module"
        )


def _state_device(module: nn.Module, backend: str) -> torch.device:
    """The one device holding the module's parameters and buffers, checked against `backend`."""
    devices = {t.device for t in (*module.parameters(), *module.buffers())}
    if len(devices) > 1:
        raise ValueError(
            f"the module's parameters and buffers live on several devices "
            f"{sorted(map(str, devices))}; data parallelism needs one device per rank: move the "
            "module with module.to(device)"
        )
    if devices:
        device = devices.pop()
    elif backend == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    if backend == "nccl" and device.type != "cuda":
        raise ValueError(
            f"the nccl backend communicates CUDA tensors but the module is on {device}: "
            "call torch.cuda.set_device(local_rank) and module.to('cuda') before wrapping"
        )
    return device


def _describe(module: nn.Module) -> list[tuple[str, str, tuple[int, ...], str, bool]]:
    """Every parameter and buffer: (kind, name, shape, dtype, requires_grad), in order."""
    params = [
        ("parameter", name, tuple(p.shape), str(p.dtype), p.requires_grad)
        for name, p in module.named_parameters()
    ]
    buffers = [
        ("buffer", name, tuple(b.shape), str(b.dtype), False) for name, b in module.named_buffers()
    ]
    return params + buffers


def _first_difference(rank: int, mine: list[Any], reference: list[Any]) -> str:
    """Where rank `rank`'s model description first departs from rank 0's, in words."""
    for position, (ours, theirs) in enumerate(zip(mine, reference, strict=False)):
        if ours != theirs:
            kind, name, shape, dtype, grad = ours
            _, ref_name, ref_shape, ref_dtype, ref_grad = theirs
            if name != ref_name:
                return f"rank {rank} has {kind} #{position} {name!r} where rank 0 has {ref_name!r}"
            return (
                f"rank {rank} has {kind} {name!r} of shape {shape}, {dtype}, "
                f"requires_grad={grad} where rank 0 has shape {ref_shape}, {ref_dtype}, "
                f"requires_grad={ref_grad}"
            )
    return f"rank {rank} has {len(mine)} parameters and buffers where rank 0 has {len(reference)}"


def _check_same_model(module: nn.Module, group: dist.ProcessGroup, device: torch.device) -> None:
    """Fail on every rank, instead of hanging in a collective, when the ranks' models differ.

    The cheap path all-gathers one 64-bit digest of the model's description; only when the
    digests disagree are the full descriptions gathered to say what differs.
    """
    description = _describe(module)
    digest = hashlib.blake2b(repr(description).encode(), digest_size=8).digest()
    mine = torch.tensor([int.from_bytes(digest, "little", signed=True)], device=device)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    if all(torch.equal(g, gathered[0]) for g in gathered):
        return
    descriptions: list[Any] = [None] * len(gathered)
    dist.all_gather_object(descriptions, description, group=group)
    problems = [
        _first_difference(rank, desc, descriptions[0])
        for rank, desc in enumerate(descriptions)
        if desc != descriptions[0]
    ]
    raise RuntimeError(
        "the ranks disagree about the model (every rank must build the same model before "
        "wrapping it): " + "; ".join(problems)
    )


def divide_into(grad: torch.Tensor, world_size: int, out: torch.Tensor) -> torch.Tensor:
    """Write ``grad / world_size`` into `out` (of the communication dtype), rounding once.

    One kernel: the division happens in `grad`'s dtype and the cast on the store.
    """
    return torch.div(grad, world_size, out=out)


class DataParallelBase(nn.Module):
    """The shared contract of the data-parallel wrappers; not used directly.

    Construction issues one ``all_gather`` of a digest of every rank's parameter and buffer
    shapes (so ranks that built different models fail with an error rather than hang), then one
    ``broadcast`` from rank 0 per parameter and per buffer, so that every rank starts from rank
    0's state. A subclass implements `_reduce_gradients`, which must leave every trainable
    parameter holding the average over ranks of its gradient.

    Args:
        module: the model replica of this rank; all its parameters and buffers on one device
            (CUDA for nccl).
        process_group: the group to average over; the default group if `None`.
        grad_dtype: dtype gradients are communicated in, e.g. ``torch.bfloat16`` to halve the
            bytes on the wire; `None` communicates in each parameter's own dtype. With a
            narrower dtype each rank's gradient is divided by the world size in its own dtype,
            rounded to `grad_dtype`, summed in `grad_dtype` and cast back, so with unit roundoff
            ``u`` of `grad_dtype` (``2**-8`` for bf16, ``2**-11`` for fp16) and ``n`` ranks every
            element of the averaged gradient is within about ``n * u * mean_r |g_r|`` of the
            exact average: the casts contribute at most ``u * mean_r |g_r|`` and the ``n - 1``
            additions at most ``(n - 1) * u * mean_r |g_r|`` (first order in ``u``). Dividing
            first keeps fp16 sums from overflowing.
        unused_grads: what a trainable parameter that no rank computed a gradient for holds
            after synchronisation. ``"zeros"`` (default): a zero gradient, the cheapest choice;
            note that optimizers with momentum or weight decay still move such a parameter.
            ``"none"``: `None`, exactly as in single-process training, at the price of one small
            extra all-reduce and a device-to-host copy per step. Either way a rank without a
            gradient for a parameter that other ranks have contributes zeros to the average.
        record_comm_stats: keep a `CommStats` record of every synchronised step, read from
            `comm_stats`.
        broadcast_buffers: broadcast rank 0's buffers to every rank at the start of every
            `forward` (one ``broadcast`` per buffer), as torch DDP does by default, so that
            buffers a forward updates from local data (BatchNorm's running statistics) stay
            rank 0's everywhere. Off by default: buffers are broadcast once, at construction.
            Most buffers of a Transformer (RoPE tables, masks) are constants, for which the
            per-forward broadcast is a collective per forward with nothing to carry, and a
            collective in `forward` hangs any code that runs a forward on some ranks only (an
            evaluation on rank 0). Turn it on for models with running statistics.

    Raises:
        TypeError: `module` is not an `nn.Module`.
        ValueError: a bad option, or the module's state is spread over several devices or is
            not on CUDA under nccl.
        RuntimeError: the process group is not initialised, or the ranks' models differ.

    .. warning::
        The trainable parameters are fixed at construction: those with ``requires_grad`` then.
        Changing ``requires_grad`` afterwards (unfreezing a layer, freezing one) makes the next
        `finish_gradient_synchronization()` raise ``RuntimeError`` on every rank: wrap the
        module again after such a change. Averaging a different set silently would let ranks
        diverge (a parameter unfrozen later) or hand weight decay zero gradients of a parameter
        frozen later.
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        process_group: dist.ProcessGroup | None = None,
        grad_dtype: torch.dtype | None = None,
        unused_grads: UnusedGrads = "zeros",
        record_comm_stats: bool = False,
        broadcast_buffers: bool = False,
    ) -> None:
        _validate_arguments(module, grad_dtype, unused_grads)
        _require_process_group()
        super().__init__()
        self.module = module
        self.process_group = dist.group.WORLD if process_group is None else process_group
        self.world_size = dist.get_world_size(self.process_group)
        self.rank = dist.get_rank(self.process_group)
        self.grad_dtype = grad_dtype
        self.unused_grads = unused_grads
        self.device = _state_device(module, dist.get_backend(self.process_group))
        # Each trainable parameter once (tied weights are one parameter), in registration order.
        named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
        self._param_names = [name for name, _ in named]
        self._params = [p for _, p in named]
        self._named_params = list(module.named_parameters())
        self._trainable = self._requires_grad_flags()
        self.broadcast_buffers = bool(broadcast_buffers)
        self._require_sync = True
        self._nvtx = self.device.type == "cuda"
        self._recorder = CommRecorder(self.device) if record_comm_stats else None
        _check_same_model(module, self.process_group, self.device)
        self._broadcast_state()

    def _broadcast_state(self) -> None:
        self._broadcast((*self.module.parameters(), *self.module.buffers()))

    def _broadcast(self, tensors: tuple[torch.Tensor, ...]) -> None:
        """Give every rank rank 0's values of `tensors`: asynchronous broadcasts, then one wait."""
        src = dist.get_global_rank(self.process_group, 0)
        with torch.no_grad(), nvtx_range("ddp.broadcast", enabled=self._nvtx):
            works = [
                dist.broadcast(t.detach(), src=src, group=self.process_group, async_op=True)
                for t in tensors
            ]
            for work in works:
                work.wait()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped module; gradient hooks (if any) fire during the backward pass.

        With `broadcast_buffers`, rank 0's buffers are first broadcast to every rank.
        """
        if self.broadcast_buffers:
            self._broadcast(tuple(self.module.buffers()))
        return self.module(*args, **kwargs)

    def _requires_grad_flags(self) -> tuple[bool, ...]:
        return tuple(p.requires_grad for _, p in self._named_params)

    def _check_trainable_unchanged(self) -> None:
        """Raise if ``requires_grad`` changed since wrapping; the wrapper would average the rest."""
        flags = self._requires_grad_flags()
        if flags == self._trainable:
            return
        changed = [
            f"{name!r} ({'unfrozen' if now else 'frozen'})"
            for (name, _), now, then in zip(self._named_params, flags, self._trainable, strict=True)
            if now != then
        ]
        raise RuntimeError(
            "requires_grad changed after wrapping for " + ", ".join(changed) + ": the wrapper "
            "averages the parameters that required a gradient when it was built. Wrap the "
            "module again after changing requires_grad (on every rank), e.g. "
            "model = type(model)(model.module, ...)"
        )

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Skip communication for backward passes run inside the context.

        Gradients accumulate locally in ``.grad``; the first backward after the context
        communicates the accumulated sum, so a loop over micro-batches communicates once::

            with ddp.no_sync():
                for x in micro_batches[:-1]:
                    loss_fn(ddp(x)).backward()
            loss_fn(ddp(micro_batches[-1])).backward()
            ddp.finish_gradient_synchronization()

        Inside the context `finish_gradient_synchronization()` does nothing.
        """
        previous = self._require_sync
        self._require_sync = False
        try:
            yield
        finally:
            self._require_sync = previous

    def on_train_batch_start(self) -> None:
        """Prepare the next step; call before each batch's forward. No-op unless overridden."""

    def finish_gradient_synchronization(self) -> None:
        """Average every trainable parameter's gradient over the ranks.

        Call after ``backward()`` and before ``optimizer.step()``. When it returns (on CUDA:
        once the current stream reaches this point) each gradient equals the average over ranks.

        Raises:
            RuntimeError: a parameter's ``requires_grad`` changed since wrapping (see the class
                warning); raised before this call communicates anything.
        """
        if not self._require_sync:
            return
        self._check_trainable_unchanged()
        if self._recorder is not None:
            self._recorder.begin_wait()
        keep_none = self.unused_grads == "none"
        had_grad = [p.grad is not None for p in self._params] if keep_none else []
        with nvtx_range("ddp.finish_gradient_synchronization", enabled=self._nvtx):
            self._reduce_gradients()
            if keep_none:
                self._drop_globally_unused(had_grad)
        if self._recorder is not None:
            self._recorder.end_step()

    def _reduce_gradients(self) -> None:
        raise NotImplementedError

    @property
    def comm_stats(self) -> CommStats | None:
        """`CommStats` of the last synchronised step; `None` before one or without recording.

        On CUDA, reading it waits for that step's synchronisation to finish on the device.
        """
        return None if self._recorder is None else self._recorder.last

    def _comm_dtype(self, param: torch.Tensor) -> torch.dtype:
        return param.dtype if self.grad_dtype is None else self.grad_dtype

    def _launch_param(self, p: torch.Tensor) -> tuple[dist.Work, torch.Tensor | None]:
        """Start averaging one parameter's gradient (zeros if it has none).

        Returns the work and, when compressed, the packed copy that `_unpack_param` reads back.
        """
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        comm_dtype = self._comm_dtype(p)
        if comm_dtype == p.dtype:
            return self._average(p.grad, compressed=False), None
        packed = divide_into(p.grad, self.world_size, torch.empty_like(p.grad, dtype=comm_dtype))
        return self._average(packed, compressed=True), packed

    @staticmethod
    def _unpack_param(p: torch.Tensor, packed: torch.Tensor | None) -> None:
        """After the wait: copy a compressed average back into the gradient."""
        if packed is not None:
            p.grad.copy_(packed)

    def _average(self, tensor: torch.Tensor, *, compressed: bool) -> dist.Work:
        """Launch the asynchronous all-reduce that averages the gradients in `tensor` in place.

        A compressed tensor was divided by the world size before its cast (see `grad_dtype`),
        so it is summed; anything else is averaged by the backend (``ReduceOp.AVG``: a
        pre-multiplied sum in NCCL, a sum and one division in gloo).
        """
        return self._all_reduce(tensor, dist.ReduceOp.SUM if compressed else dist.ReduceOp.AVG)

    def _all_reduce(self, tensor: torch.Tensor, op: dist.ReduceOp) -> dist.Work:
        """Launch an asynchronous all-reduce of `tensor` in place: counted, and in NVTX."""
        with nvtx_range("ddp.all_reduce", enabled=self._nvtx):
            work = dist.all_reduce(tensor, op=op, group=self.process_group, async_op=True)
        if self._recorder is not None:
            self._recorder.record(tensor, work)
        return work

    def _drop_globally_unused(self, had_grad: list[bool]) -> None:
        """Reset to `None` the gradients that no rank had when synchronisation began."""
        flags = torch.tensor(had_grad, dtype=torch.int32, device=self.device)
        self._all_reduce(flags, dist.ReduceOp.MAX).wait()
        for p, used in zip(self._params, flags.tolist(), strict=True):
            if not used:
                p.grad = None

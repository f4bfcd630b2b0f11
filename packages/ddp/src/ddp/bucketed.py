"""`DDPBucketed`: gradients grouped into buckets whose all-reduces overlap backward."""

from __future__ import annotations

from typing import Unpack

import torch.distributed as dist
from torch import nn

from ddp.base import DataParallelOptions
from ddp.buckets import _BYTES_PER_MB, DEFAULT_BUCKET_SIZE_MB, assign_buckets, bucket_bytes
from ddp.grad_bucket import GradBucket
from ddp.overlap import OverlappedDataParallel

__all__ = ["DDPBucketed"]


class DDPBucketed(OverlappedDataParallel):
    """Overlap communication with backward, one asynchronous all-reduce per bucket of gradients.

    Construction broadcasts rank 0's parameters and buffers (see `DataParallelBase`, whose
    options it takes), assigns the trainable parameters to buckets of at most `bucket_size_mb`
    in reverse registration order (`assign_buckets`: a parameter larger than the limit gets a
    bucket of its own; parameters of different dtypes never share one), and preallocates one
    flat buffer per bucket. During ``backward()`` a post-accumulate-grad hook puts each gradient
    into its bucket's buffer; when a bucket's last gradient is in, its asynchronous
    ``all_reduce`` (average) is launched from that hook, provided every earlier bucket has been
    launched (collectives must be issued in the same order on every rank).
    `finish_gradient_synchronization()` launches the buckets still waiting (a parameter with no
    gradient contributes zeros) and waits for all of them; on CUDA the wait orders the current
    stream after the communication without blocking the host.

    Without `grad_dtype` compression, each ``.grad`` becomes a view of its bucket slot (like
    torch DDP's ``gradient_as_bucket_view``): the first step copies each gradient in once, and
    when gradients are then zeroed in place (``zero_grad(set_to_none=False)``) autograd
    accumulates straight into the buckets, so a step costs no copies at all. With the default
    ``set_to_none=True`` a step costs one copy per gradient (torch DDP's default costs two).

    Small buckets start communicating early but pay a collective's latency many times; large
    ones pay it rarely but leave more communication after backward. The best size depends on
    the model and the interconnect: measure it (``bench-ddp``). `last_bucket_size_mb` takes
    some of both: large buckets for most of backward, shrinking ones at its end, where the
    bucket holding the first blocks and the embedding is ready last and everything reduced
    after it is exposed.

    Two more levers for overlap live outside the bucket plan: `register_reduced_hook` runs work
    (e.g. the optimizer step of a bucket's parameters) as each bucket lands, so the
    communication left after backward overlaps it; and `comm_group` gives the all-reduces a
    communicator that takes fewer SMs from backward's kernels.

    Args:
        module: the model replica of this rank.
        bucket_size_mb: bucket capacity in MiB of communicated bytes (in `grad_dtype` if given);
            `None` puts all gradients in one bucket, `0` each in its own. Default:
            `DEFAULT_BUCKET_SIZE_MB` (25, torch DDP's default `bucket_cap_mb`).
        last_bucket_size_mb: shrink the last buckets of backward down to this many MiB: no
            bucket holds more than the buckets after it together (`assign_buckets`'s
            `last_max_bytes`), so only the last small bucket is reduced after backward as long
            as the network keeps up with backward. `None` (default): every bucket up to
            `bucket_size_mb`.
        **options: `process_group`, `grad_dtype`, `unused_grads`, `record_comm_stats`,
            `broadcast_buffers`.

    Raises:
        TypeError, ValueError: `bucket_size_mb` or `last_bucket_size_mb` is not a number >= 0
            or None, or see `DataParallelBase`.

    .. warning::
        Each parameter may receive its gradient once per synchronised step: accumulate
        micro-batches inside `no_sync()`. After synchronisation ``.grad`` tensors are views of
        bucket buffers that the next step overwrites: clone a gradient you want to keep. The
        set of parameters, their shapes and their ``requires_grad`` must not change after
        wrapping.

    Example::

        >>> model = DDPBucketed(MyModel().to(device), bucket_size_mb=25)
        >>> optimizer = torch.optim.AdamW(model.parameters())
        >>> for x, y in batches:
        ...     model.on_train_batch_start()
        ...     optimizer.zero_grad(set_to_none=False)  # keep .grad as bucket views
        ...     loss_fn(model(x), y).backward()  # bucket all-reduces start here
        ...     model.finish_gradient_synchronization()
        ...     optimizer.step()
    """

    def __init__(
        self,
        module: nn.Module,
        bucket_size_mb: float | None = DEFAULT_BUCKET_SIZE_MB,
        *,
        last_bucket_size_mb: float | None = None,
        **options: Unpack[DataParallelOptions],
    ) -> None:
        max_bytes = bucket_bytes(bucket_size_mb)
        last_max_bytes = bucket_bytes(last_bucket_size_mb, name="last_bucket_size_mb")
        super().__init__(module, **options)
        self.bucket_size_mb = bucket_size_mb
        self.last_bucket_size_mb = last_bucket_size_mb
        comm_dtypes = [self._comm_dtype(p) for p in self._params]
        pairs = list(zip(self._params, comm_dtypes, strict=True))
        units = assign_buckets(
            [p.numel() * dtype.itemsize for p, dtype in pairs],
            max_bytes=max_bytes,
            keys=[(p.dtype, dtype) for p, dtype in pairs],
            last_max_bytes=last_max_bytes,
        )
        self._buckets = [
            GradBucket(
                [self._params[index] for index in unit],
                comm_dtype=comm_dtypes[unit[0]],
                world_size=self.world_size,
            )
            for unit in units
        ]
        self._slot_of = [(0, 0)] * len(self._params)
        for bucket, unit in enumerate(units):
            for slot, index in enumerate(unit):
                self._slot_of[index] = (bucket, slot)
        self._start_overlap(units)

    @property
    def bucket_param_names(self) -> tuple[tuple[str, ...], ...]:
        """The parameter names of each bucket, in launch order."""
        return tuple(tuple(self._param_names[index] for index in unit) for unit in self._units)

    @property
    def bucket_params(self) -> tuple[tuple[nn.Parameter, ...], ...]:
        """The parameters of each bucket, in launch order (the units of `register_reduced_hook`)."""
        return self._unit_params

    def extra_repr(self) -> str:
        sizes = ", ".join(f"{bucket.num_bytes / _BYTES_PER_MB:.2f}" for bucket in self._buckets)
        last = (
            ""
            if self.last_bucket_size_mb is None
            else f", last_bucket_size_mb={self.last_bucket_size_mb}"
        )
        return f"bucket_size_mb={self.bucket_size_mb}{last}, bucket_sizes_mb=[{sizes}]"

    def _on_param_ready(self, index: int) -> None:
        bucket, slot = self._slot_of[index]
        self._buckets[bucket].load(slot)

    def _fill_unit(self, unit: int) -> None:
        bucket = self._buckets[unit]
        for slot, index in enumerate(self._units[unit]):
            if not self._is_ready(index):
                bucket.load(slot)

    def _launch_unit(self, unit: int) -> dist.Work:
        bucket = self._buckets[unit]
        return self._average(bucket.buffer, compressed=bucket.compressed)

    def _unload_unit(self, unit: int) -> None:
        self._buckets[unit].unload()

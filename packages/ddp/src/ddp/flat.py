"""`FlatDDP`: after backward, one all-reduce of all gradients in one flat buffer."""

from __future__ import annotations

from typing import Unpack

import torch
from torch import nn

from ddp.base import DataParallelBase, DataParallelOptions
from ddp.grad_bucket import GradBucket

__all__ = ["FlatDDP"]


class FlatDDP(DataParallelBase):
    """After backward, average all gradients with a single all-reduce of one flat buffer.

    Construction broadcasts rank 0's parameters and buffers (see `DataParallelBase`, whose
    options it takes) and preallocates one contiguous buffer per gradient dtype, with a slot per
    trainable parameter. `finish_gradient_synchronization()` copies each gradient into its slot,
    issues one ``all_reduce`` (average) per buffer (one in total for a model of one dtype), and
    waits for it. Each ``.grad`` then becomes a view of its slot, so no copy back is needed, and
    when gradients are zeroed in place (``zero_grad(set_to_none=False)``) autograd accumulates
    straight into the buffer and the copy in disappears as well.

    Compared with `NaiveDDP` this pays one collective's latency instead of one per parameter,
    but still overlaps nothing with backward.

    .. warning::
        After synchronisation ``.grad`` tensors are views of the flat buffer, which the next
        step overwrites: clone a gradient you want to keep across steps.

    Example::

        >>> model = FlatDDP(MyModel().to(device))
        >>> loss_fn(model(x), y).backward()
        >>> model.finish_gradient_synchronization()  # one all-reduce
        >>> optimizer.step()
    """

    def __init__(self, module: nn.Module, **options: Unpack[DataParallelOptions]) -> None:
        super().__init__(module, **options)
        groups: dict[tuple[torch.dtype, torch.dtype], list[nn.Parameter]] = {}
        for p in self._params:
            groups.setdefault((p.dtype, self._comm_dtype(p)), []).append(p)
        self._buckets = [
            GradBucket(params, comm_dtype=comm_dtype, world_size=self.world_size)
            for (_, comm_dtype), params in groups.items()
        ]

    def _reduce_gradients(self) -> None:
        works = []
        for bucket in self._buckets:
            for slot in range(len(bucket.params)):
                bucket.load(slot)
            works.append(self._average(bucket.buffer, compressed=bucket.compressed))
        for bucket, work in zip(self._buckets, works, strict=True):
            work.wait()
            bucket.unload()

"""`DDPIndividualParameters`: each gradient's all-reduce starts the moment backward produces it."""

from __future__ import annotations

from typing import Unpack

import torch
import torch.distributed as dist
from torch import nn

from ddp.base import DataParallelOptions
from ddp.overlap import OverlappedDataParallel

__all__ = ["DDPIndividualParameters"]


class DDPIndividualParameters(OverlappedDataParallel):
    """Overlap communication with backward, one asynchronous all-reduce per parameter.

    Construction broadcasts rank 0's parameters and buffers (see `DataParallelBase`, whose
    options it takes) and registers a post-accumulate-grad hook on every trainable parameter.
    During ``backward()`` the hook launches an asynchronous ``all_reduce`` (average) of the
    gradient in place as soon as autograd has accumulated it, so communication of the last
    layers overlaps the backward pass of the first ones. `finish_gradient_synchronization()`
    launches the all-reduces of parameters whose hook did not fire (with zeros for a missing
    gradient), then waits for every handle; on CUDA the wait orders the current stream after
    the communication without blocking the host.

    Launch order is reverse registration order on every rank. A hook that fires early waits
    for the parameters before it in that order, so collectives match across ranks even when
    their graphs differ; a parameter that gets no gradient in a step delays everything after it
    in the order to `finish_gradient_synchronization()`.

    .. warning::
        Each parameter may receive its gradient once per synchronised step: accumulate
        micro-batches inside `no_sync()`. The gradient tensor is being communicated between
        its hook and `finish_gradient_synchronization()`; do not modify it in between.

    Example::

        >>> model = DDPIndividualParameters(MyModel().to(device))
        >>> for x, y in batches:
        ...     model.on_train_batch_start()
        ...     optimizer.zero_grad()
        ...     loss_fn(model(x), y).backward()  # all-reduces start here
        ...     model.finish_gradient_synchronization()  # and are waited for here
        ...     optimizer.step()
    """

    def __init__(self, module: nn.Module, **options: Unpack[DataParallelOptions]) -> None:
        super().__init__(module, **options)
        self._packed: list[torch.Tensor | None] = [None] * len(self._params)
        self._start_overlap([[index] for index in reversed(range(len(self._params)))])

    def _launch_unit(self, unit: int) -> dist.Work:
        (index,) = self._units[unit]
        work, self._packed[index] = self._launch_param(self._params[index])
        return work

    def _unload_unit(self, unit: int) -> None:
        (index,) = self._units[unit]
        self._unpack_param(self._params[index], self._packed[index])
        self._packed[index] = None

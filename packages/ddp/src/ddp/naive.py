"""`NaiveDDP`: after backward, one blocking all-reduce per parameter gradient."""

from __future__ import annotations

from ddp.base import DataParallelBase

__all__ = ["NaiveDDP"]


class NaiveDDP(DataParallelBase):
    """Data parallelism in its simplest form: all-reduce each gradient, one at a time.

    Construction broadcasts rank 0's parameters and buffers (see `DataParallelBase`, whose
    options it takes). After ``backward()``, `finish_gradient_synchronization()` walks the
    trainable parameters in registration order and issues one ``all_reduce`` (average) per
    gradient, waiting for each before the next. Nothing overlaps with backward and every
    parameter pays a collective's latency; that is what the other wrappers improve on, and this
    is the reference they are measured against.

    A parameter without a gradient on this rank takes part with zeros (see `unused_grads`), so
    every rank issues the same sequence of collectives whatever its graph did.

    Example::

        >>> dist.init_process_group("gloo")
        >>> model = NaiveDDP(MyModel())
        >>> optimizer = torch.optim.AdamW(model.parameters())
        >>> loss_fn(model(x), y).backward()
        >>> model.finish_gradient_synchronization()
        >>> optimizer.step()
    """

    def _reduce_gradients(self) -> None:
        for p in self._params:
            work, packed = self._launch_param(p)
            work.wait()
            self._unpack_param(p, packed)

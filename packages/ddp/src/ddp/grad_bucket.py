"""One flat gradient buffer shared by a group of parameters: the unit `FlatDDP` and `DDPBucketed`
all-reduce.

Gradients reach the buffer in one of two ways. Without compression, a parameter's `.grad` is made
a view into the buffer the first time it is loaded (the idea behind torch DDP's
``gradient_as_bucket_view``): autograd then accumulates straight into the buffer in later steps
when gradients are zeroed in place, and the all-reduce result needs no copy back. With
compression (a communication dtype other than the parameter's), each gradient is divided by the
world size and cast into the buffer, and the reduced values are cast back after the all-reduce.
"""

from __future__ import annotations

import torch
from torch import nn

from ddp.base import divide_into

__all__ = ["GradBucket"]


class GradBucket:
    """A contiguous buffer of `comm_dtype` holding the gradients of `params`, back to back.

    Args:
        params: parameters of one dtype and device, in the order their slots are laid out.
        comm_dtype: dtype of the buffer, i.e. of the all-reduce.
        world_size: the divisor applied before a compressed all-reduce (see the module docstring).
    """

    def __init__(
        self, params: list[nn.Parameter], *, comm_dtype: torch.dtype, world_size: int
    ) -> None:
        self.params = params
        self.compressed = comm_dtype != params[0].dtype
        self._world_size = world_size
        numels = [p.numel() for p in params]
        self.buffer = torch.zeros(sum(numels), dtype=comm_dtype, device=params[0].device)
        self.views: list[torch.Tensor] = []
        offset = 0
        for p, numel in zip(params, numels, strict=True):
            self.views.append(self.buffer[offset : offset + numel].view(p.shape))
            offset += numel

    @property
    def num_bytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def load(self, slot: int) -> None:
        """Put the current gradient of parameter `slot` into its place in the buffer.

        A missing gradient (`None`) contributes zeros. An uncompressed gradient that is not yet
        the bucket's view is copied in once and replaced by the view.
        """
        p, view = self.params[slot], self.views[slot]
        grad = p.grad
        if grad is view:
            return
        if grad is None:
            view.zero_()
        elif self.compressed:
            divide_into(grad, self._world_size, view)
        else:
            view.copy_(grad)
            p.grad = view

    def unload(self) -> None:
        """After the all-reduce: make every parameter's `.grad` hold its reduced slot."""
        for p, view in zip(self.params, self.views, strict=True):
            if self.compressed:
                if p.grad is None:
                    p.grad = view.to(p.dtype)
                else:
                    p.grad.copy_(view)
            elif p.grad is not view:
                p.grad = view

"""Overlapping communication with backward: gradient hooks that launch all-reduces, in order.

`DDPIndividualParameters` and `DDPBucketed` differ only in their unit of communication (one
parameter, or one bucket of them); the bookkeeping that decides when a unit may be launched
lives here once.
"""

from __future__ import annotations

import weakref
from functools import partial

import torch
import torch.distributed as dist
from torch.utils.hooks import RemovableHandle

from ddp.base import DataParallelBase

__all__ = ["OverlappedDataParallel"]


def _dispatch(wrapper_ref: weakref.ref, index: int, param: torch.Tensor) -> None:
    # The hooks reach their wrapper through a weak reference, so a dropped wrapper is collected
    # (and its hooks removed) instead of being kept alive, and communicating, by its parameters.
    wrapper = wrapper_ref()
    if wrapper is not None:
        wrapper._on_grad_ready(index, param)


def _remove_hooks(handles: list[RemovableHandle]) -> None:
    for handle in handles:
        handle.remove()


class OverlappedDataParallel(DataParallelBase):
    """Base of the wrappers whose all-reduces start during backward.

    The trainable parameters are split into units (lists of parameter indices) in a fixed launch
    order, the same on every rank. Each parameter gets a post-accumulate-grad hook; when the last
    gradient of a unit has been accumulated, the unit's asynchronous ``all_reduce`` is launched
    from the hook, but only once every earlier unit has been launched: collectives are matched
    across ranks by their order, and the order in which hooks fire can differ between ranks
    (a parameter one rank did not use never fires). `finish_gradient_synchronization()` launches
    the units still waiting (a missing gradient contributes zeros), then waits for all of them.

    The hooks live as long as the wrapper: once it is garbage-collected they are removed and
    the module can be wrapped again.

    Subclasses call `_start_overlap(units)` at the end of their constructor and implement
    `_on_param_ready`, `_fill_unit`, `_launch_unit` and `_unload_unit`.
    """

    def _start_overlap(self, units: list[list[int]]) -> None:
        self._units = units
        self._unit_of = [0] * len(self._params)
        for unit, indices in enumerate(units):
            for index in indices:
                self._unit_of[index] = unit
        self_ref = weakref.ref(self)
        handles = [
            p.register_post_accumulate_grad_hook(partial(_dispatch, self_ref, index))
            for index, p in enumerate(self._params)
        ]
        weakref.finalize(self, _remove_hooks, handles)
        self._reset_step()

    def _reset_step(self) -> None:
        self._ready = [False] * len(self._params)
        self._pending = [len(indices) for indices in self._units]
        self._next_unit = 0
        self._works: list[dist.Work] = []

    def _on_grad_ready(self, index: int, param: torch.Tensor) -> None:
        if not self._require_sync:
            return
        if self._ready[index]:
            raise RuntimeError(
                f"parameter {self._param_names[index]!r} received a second gradient in one "
                "synchronised step: run every backward but the last of an accumulation inside "
                "no_sync(), and call finish_gradient_synchronization() after each synchronised "
                "backward"
            )
        self._ready[index] = True
        self._on_param_ready(index)
        unit = self._unit_of[index]
        self._pending[unit] -= 1
        while self._next_unit < len(self._units) and self._pending[self._next_unit] == 0:
            self._works.append(self._launch_unit(self._next_unit))
            self._next_unit += 1

    def _reduce_gradients(self) -> None:
        for unit in range(self._next_unit, len(self._units)):
            self._fill_unit(unit)
            self._works.append(self._launch_unit(unit))
        for unit, work in enumerate(self._works):
            work.wait()
            self._unload_unit(unit)
        self._reset_step()

    def on_train_batch_start(self) -> None:
        """Check that the previous step finished; its bookkeeping was reset when it did.

        Raises:
            RuntimeError: gradients of the previous step were launched but never waited for,
                i.e. `finish_gradient_synchronization()` was not called after its backward.
        """
        if self._next_unit or any(self._ready):
            raise RuntimeError(
                "the previous step's gradient synchronisation is still in flight: call "
                "finish_gradient_synchronization() after backward() and before the next batch"
            )

    def _on_param_ready(self, index: int) -> None:
        """Called from the hook once parameter `index` holds its final local gradient."""

    def _fill_unit(self, unit: int) -> None:
        """Prepare a unit that some hook never completed, just before its launch."""

    def _launch_unit(self, unit: int) -> dist.Work:
        raise NotImplementedError

    def _unload_unit(self, unit: int) -> None:
        """After the unit's all-reduce completed: leave the averages in the parameters' `.grad`."""

"""Overlapping communication with backward: gradient hooks that launch all-reduces, in order.

`DDPIndividualParameters` and `DDPBucketed` differ only in their unit of communication (one
parameter, or one bucket of them); the bookkeeping that decides when a unit may be launched
lives here once.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable
from functools import partial

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.hooks import RemovableHandle

from ddp.base import DataParallelBase

__all__ = ["OverlappedDataParallel", "ReducedHook"]

# A reduced hook: called with a unit's index in launch order and its parameters, whose `.grad`
# hold their averages (see `OverlappedDataParallel.register_reduced_hook`).
ReducedHook = Callable[[int, tuple[nn.Parameter, ...]], None]


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

    A parameter's gradient may be accumulated several times within one backward: a parameter
    shared by two reentrant-checkpointed segments (`torch.utils.checkpoint(...,
    use_reentrant=True)`) receives one accumulation per segment, each firing its hook. The first
    synchronised step therefore learns how many accumulations each parameter receives in one
    backward and launches nothing early (its units all go at
    `finish_gradient_synchronization()`); every later step launches a unit once each of its
    parameters has received that many. More than that in a later step is an error: a backward
    outside `no_sync()` during accumulation, or a graph that changed after the first step.

    The hooks live as long as the wrapper: once it is garbage-collected they are removed and
    the module can be wrapped again.

    `register_reduced_hook` adds work that `finish_gradient_synchronization()` runs unit by
    unit, as soon as each unit's average is in place, while later units may still be
    communicating.

    Subclasses call `_start_overlap(units)` at the end of their constructor and implement
    `_on_param_ready`, `_fill_unit`, `_launch_unit` and `_unload_unit`.
    """

    def _start_overlap(self, units: list[list[int]]) -> None:
        self._units = units
        self._unit_params = tuple(tuple(self._params[i] for i in unit) for unit in units)
        # RemovableHandle keeps a weak reference to it, which a plain dict does not take.
        self._reduced_hooks: OrderedDict[int, ReducedHook] = OrderedDict()
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
        self._expected: list[int] | None = None  # accumulations per backward, from step one
        self._reset_step()

    def _reset_step(self) -> None:
        self._accumulated = [0] * len(self._params)
        self._pending = [len(indices) for indices in self._units]
        self._next_unit = 0
        self._works: list[dist.Work] = []

    def _on_grad_ready(self, index: int, param: torch.Tensor) -> None:
        if not self._require_sync:
            return
        self._accumulated[index] += 1
        if self._expected is None:  # the first step: learn, launch at the end
            return
        if self._accumulated[index] > self._expected[index]:
            raise RuntimeError(
                f"parameter {self._param_names[index]!r} received more gradients in this "
                f"synchronised step ({self._accumulated[index]}) than in the first one "
                f"({self._expected[index]}): run every backward but the last of an accumulation "
                "inside no_sync(), and call finish_gradient_synchronization() after each "
                "synchronised backward; a model whose graph changes after the first step "
                "(e.g. a parameter shared by more checkpointed segments) needs a new wrapper"
            )
        if not self._is_ready(index):
            return
        self._on_param_ready(index)
        unit = self._unit_of[index]
        self._pending[unit] -= 1
        while self._next_unit < len(self._units) and self._pending[self._next_unit] == 0:
            self._works.append(self._launch_unit(self._next_unit))
            self._next_unit += 1

    def _is_ready(self, index: int) -> bool:
        """Parameter `index` holds its whole local gradient of this step (never in step one)."""
        return self._expected is not None and self._accumulated[index] == self._expected[index]

    def _reduce_gradients(self) -> None:
        for unit in range(self._next_unit, len(self._units)):
            self._fill_unit(unit)
            self._works.append(self._launch_unit(unit))
        for unit, work in enumerate(self._works):
            work.wait()
            self._unload_unit(unit)
            for hook in tuple(self._reduced_hooks.values()):
                hook(unit, self._unit_params[unit])
        if self._expected is None:  # a parameter unused in step one may be used once later
            self._expected = [max(count, 1) for count in self._accumulated]
        self._reset_step()

    def register_reduced_hook(self, hook: ReducedHook) -> RemovableHandle:
        """Run ``hook(unit, params)`` for each unit as soon as its gradients hold their average.

        `finish_gradient_synchronization()` waits for the units in launch order; right after
        each wait it calls every registered hook (in registration order) with the unit's index
        and its parameters, whose ``.grad`` then hold the averages. On CUDA the wait does not
        block the host: the hook's kernels are queued on the current stream behind that unit's
        all-reduce only, so they run while later units are still being reduced. Stepping each
        bucket's parameters there overlaps the communication left after backward with the
        optimizer step, which otherwise waits for the last bucket. An elementwise optimizer
        (SGD, Adam, AdamW) stepped per unit computes what one step over every parameter
        does; anything that needs every gradient first (clipping by the global norm) does not
        fit in a hook.

        The work of the hooks counts in `CommStats.wait_ms`, which ends with the call.

        Returns:
            A handle whose ``remove()`` unregisters the hook.

        Raises:
            ValueError: the wrapper was built with ``unused_grads="none"``: which gradients
                become `None` is known only after every unit has been reduced, after the
                hooks would have run.

        Example::

            >>> model = DDPBucketed(MyModel().to(device), bucket_size_mb=100)
            >>> optimizers = [torch.optim.AdamW(params) for params in model.bucket_params]
            >>> model.register_reduced_hook(lambda bucket, params: optimizers[bucket].step())
            >>> for x, y in batches:
            ...     model.on_train_batch_start()
            ...     loss_fn(model(x), y).backward()
            ...     model.finish_gradient_synchronization()  # steps each bucket as it lands
            ...     for optimizer in optimizers:
            ...         optimizer.zero_grad(set_to_none=False)
        """
        if self.unused_grads == "none":
            raise ValueError(
                'register_reduced_hook needs unused_grads="zeros" (the default): with "none", '
                "the gradients that no rank computed become None only after every unit is "
                "reduced, after the hooks ran"
            )
        handle = RemovableHandle(self._reduced_hooks)
        self._reduced_hooks[handle.id] = hook
        return handle

    def on_train_batch_start(self) -> None:
        """Check that the previous step finished; its bookkeeping was reset when it did.

        Raises:
            RuntimeError: gradients of the previous step were launched but never waited for,
                i.e. `finish_gradient_synchronization()` was not called after its backward.
        """
        if self._next_unit or any(self._accumulated):
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

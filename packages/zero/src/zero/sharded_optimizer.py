"""ShardedOptimizer: ZeRO stage 1, optimizer state partitioned across data-parallel ranks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.optim import Optimizer
from torch.optim.optimizer import ParamsT

from zero.broadcast import (
    DEFAULT_BUCKET_SIZE_MB,
    Bucket,
    broadcast_buckets,
    bucket_bytes,
    plan_buckets,
)
from zero.partition import partition_by_numel
from zero.state_dict import PARAM_KEYS, check_state_dict, gather_state, shard_state_dict

__all__ = ["ShardedOptimizer"]


def _options(group: dict[str, Any]) -> dict[str, Any]:
    """A parameter group's optimizer options: everything but the parameters and their names."""
    return {k: v for k, v in group.items() if k not in PARAM_KEYS}


def _mirror(group: dict[str, Any], local: dict[str, Any]) -> None:
    """Give `group` exactly the options of the inner optimizer's group `local` (its parameters
    and their names stay its own)."""
    for key in [k for k in group if k not in PARAM_KEYS and k not in local]:
        del group[key]
    group.update(_options(local))


def _state_size(param: torch.Tensor) -> int:
    """The weight of a parameter in the partition: its elements if trainable, else nothing."""
    return param.numel() if param.requires_grad else 0


class ShardedOptimizer(Optimizer):
    r"""Wrap any ``torch.optim.Optimizer`` so each rank keeps state only for its shard (ZeRO-1).

    The parameters are partitioned across the ranks of ``process_group`` by number of trainable
    elements (greedy largest-first, see :func:`zero.partition_by_numel`; parameters that do not
    require a gradient at construction weigh nothing, since they get no state; parameters stay
    whole, so any
    optimizer works, including ones that need a full matrix). Each rank builds an inner
    ``optimizer_cls(**kwargs)`` over the parameters it owns only, :attr:`local_optimizer`, so
    optimizer state such as AdamW's two moments takes about ``1 / world_size`` of its unsharded
    memory on each rank. Gradients and parameters stay replicated: this is stage 1 of ZeRO
    (Rajbhandari et al., 2020), meant to sit under a data-parallel wrapper that averages
    gradients (``torch.nn.parallel.DistributedDataParallel`` or any ``ddp`` wrapper).

    :meth:`step` runs the inner optimizer on this rank's shard, then every owner broadcasts the
    parameters it updated, coalesced into buckets of at most ``bucket_size_mb`` MiB per owner,
    dtype and device; afterwards all ranks hold identical parameters, equal to what the unsharded
    optimizer computes on one process. Parameters without a gradient are skipped by the inner
    optimizer as usual; parameters that do not require a gradient are not broadcast at all.

    :attr:`param_groups` lists every parameter of the model with the options of the inner
    optimizer (including its defaults), so learning-rate schedulers and per-group changes work as
    with any optimizer: before each step the options of each group are copied to the inner
    optimizer's matching group. :meth:`add_param_group` assigns the new parameters to the lightest
    ranks. :meth:`zero_grad` clears the gradients of all parameters, not only this rank's shard.
    :meth:`state_dict` returns the consolidated state, in the format of the inner optimizer's own
    ``state_dict()`` on one process, on every rank; :meth:`load_state_dict` takes such a dict (from
    any number of ranks, or from an unsharded optimizer) and keeps only this rank's shard.

    Collectives and synchronisation points (every rank of ``process_group`` must make these calls,
    in the same order):

    * construction and :meth:`add_param_group`: one ``all_gather_object`` per parameter group,
      which checks that all ranks pass parameters of the same shapes, dtypes and
      ``requires_grad`` in the same order;
    * :meth:`step`: ``broadcast`` from each bucket's owner, issued asynchronously and waited for
      before returning;
    * :meth:`state_dict`: one ``all_gather_object`` of the state layout, then one ``broadcast``
      per state tensor;
    * :meth:`load_state_dict` and :meth:`zero_grad`: none.

    Invariants:

    * all ranks hold the same parameters (values, order, groups) at construction, e.g. after a
      DDP wrapper broadcast them, and the same averaged gradients before each :meth:`step`;
    * parameters are only added through :meth:`add_param_group`, never by editing
      ``param_groups[i]["params"]`` or the inner optimizer's groups;
    * a parameter appears at most once across all groups (tied weights: pass the shared tensor
      once, as ``module.parameters()`` does).

    Args:
        params: an iterable of tensors or of parameter-group dicts, as for any optimizer.
        optimizer_cls: the optimizer class to run on each shard, a ``torch.optim.Optimizer``
            subclass (``torch.optim.AdamW``, ``lmcore.AdamW``, ...).
        process_group: the group whose ranks share the state; ``None`` for the default group.
        bucket_size_mb: cap in MiB on the parameters one broadcast carries after a step, in the
            bucket vocabulary of ``ddp.DDPBucketed``. ``0`` sends each parameter in its own
            broadcast straight into its storage (no staging copy, most collectives); ``None``
            sends each owner's shard in one broadcast per dtype and device (fewest collectives,
            staging buffers as large as a shard). Default: ``zero.DEFAULT_BUCKET_SIZE_MB`` (25,
            torch DDP's default bucket cap).
        **kwargs: options for ``optimizer_cls`` (``lr``, ``betas``, ``weight_decay``, ...).

    Raises:
        TypeError: if ``optimizer_cls`` is not an ``Optimizer`` subclass, or ``bucket_size_mb``
            is neither a number nor ``None``.
        ValueError: if ``bucket_size_mb`` is negative or not finite, a parameter is repeated in a
            group, parameters are not on a CUDA device under NCCL, or the ranks pass different
            parameters.
        RuntimeError: if ``torch.distributed`` is not initialised.

    Example::

        >>> # on each rank, after dist.init_process_group(...)
        >>> model = DistributedDataParallel(model.to(device))
        >>> optimizer = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=3e-4)
        >>> for batch in loader:
        ...     optimizer.zero_grad()
        ...     loss_fn(model(batch)).backward()  # DDP averages the gradients
        ...     optimizer.step()                  # step this shard, broadcast it to the others
        >>> full = optimizer.state_dict()         # every rank calls it; every rank gets it
        >>> if dist.get_rank() == 0:
        ...     torch.save(full, "optimizer.pt")

    .. warning::
        ``state_dict()`` is a collective: call it on every rank, even if only one saves. Its
        tensors are CPU copies of the whole state, so each calling rank briefly holds the full,
        unsharded optimizer state in host memory.

    .. warning::
        ``step(closure)`` evaluates the closure exactly once on every rank before the inner step;
        optimizers that re-evaluate the closure themselves (``torch.optim.LBFGS``) are not
        supported.

    .. warning::
        This class does not average gradients: without a data-parallel wrapper (or your own
        all-reduce) each rank steps its shard with its own local gradient.
    """

    def __init__(
        self,
        params: ParamsT,
        optimizer_cls: type[Optimizer],
        *,
        process_group: dist.ProcessGroup | None = None,
        bucket_size_mb: float | None = DEFAULT_BUCKET_SIZE_MB,
        **kwargs: Any,
    ) -> None:
        if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, Optimizer)):
            raise TypeError(
                f"optimizer_cls must be a torch.optim.Optimizer subclass such as "
                f"torch.optim.AdamW, got {optimizer_cls!r}"
            )
        if issubclass(optimizer_cls, ShardedOptimizer):
            raise TypeError("optimizer_cls cannot itself be a ShardedOptimizer")
        max_bytes = bucket_bytes(bucket_size_mb)
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                "ShardedOptimizer needs a process group: call torch.distributed.init_process_group "
                "on every rank before building it"
            )
        self._group = process_group
        self._rank = dist.get_rank(process_group)
        if self._rank < 0:
            raise ValueError("this process is not a member of process_group")
        self._world_size = dist.get_world_size(process_group)
        self._backend = dist.get_backend(process_group)
        self._bucket_bytes = max_bytes
        self._owners: list[list[int]] = []  # owner rank of each parameter, per group
        self._loads = [0] * self._world_size  # trainable elements owned by each rank
        self._buckets: list[Bucket] = []
        self._buckets_key: tuple[bool, ...] | None = None  # requires_grad flags the plan is for
        self._local_optimizer: Optimizer | None = None
        self._unsharded_state: Any = None

        super().__init__(params, kwargs)

        local_groups = [self._local_group(i) for i in range(len(self.param_groups))]
        self._local_optimizer = optimizer_cls(local_groups, **kwargs)
        # The inner optimizer filled in its defaults (betas, eps, foreach, ...): show them here too,
        # so param_groups and state_dict() look like the inner optimizer's on one process.
        self.defaults = dict(self._local_optimizer.defaults)
        for group, local in zip(self.param_groups, self._local_optimizer.param_groups, strict=True):
            _mirror(group, local)

    @property
    def local_optimizer(self) -> Optimizer:
        """The inner optimizer of this rank, over the parameters this rank owns only."""
        return cast(Optimizer, self._local_optimizer)  # set at the end of __init__

    @property
    def state(self) -> Any:  # type: ignore[override]
        """This rank's optimizer state, keyed by parameter: only the parameters it owns."""
        if self._local_optimizer is None:
            return self._unsharded_state
        return self._local_optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        if self._local_optimizer is not None:
            raise AttributeError(
                "a ShardedOptimizer's state is its local optimizer's; use load_state_dict()"
            )
        self._unsharded_state = value  # the base constructor's empty dict, until the shard exists

    def _local_group(self, index: int) -> dict[str, Any]:
        """The inner optimizer's view of parameter group ``index``: its options, our parameters."""
        group, owners = self.param_groups[index], self._owners[index]
        mine = [j for j, owner in enumerate(owners) if owner == self._rank]
        local = _options(group)
        local["params"] = [group["params"][j] for j in mine]
        if "param_names" in group:
            local["param_names"] = [group["param_names"][j] for j in mine]
        return local

    def _check_same_on_all_ranks(self, params: list[torch.Tensor]) -> None:
        """Collective: raise ValueError everywhere if a rank's new group differs or is unusable."""
        problem = None
        if self._backend == dist.Backend.NCCL and not all(p.is_cuda for p in params):
            problem = "the NCCL backend needs every parameter on this rank's CUDA device"
        layout = [(tuple(p.shape), p.dtype, p.requires_grad) for p in params]
        gathered: list[Any] = [None] * self._world_size
        dist.all_gather_object(gathered, (layout, problem), group=self._group)
        for rank, (rank_layout, rank_problem) in enumerate(gathered):
            if rank_problem is not None:
                raise ValueError(f"rank {rank}: {rank_problem}")
            if rank_layout != gathered[0][0]:
                raise ValueError(
                    f"parameter group {len(self.param_groups) - 1} differs between rank 0 and rank "
                    f"{rank} (shapes, dtypes or requires_grad); every rank must pass the same "
                    "parameters in the same order"
                )

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group, assigning its parameters to the ranks that own the least so far.

        Collective (one ``all_gather_object``). Options missing from ``param_group`` take the
        inner optimizer's defaults; options it sets (``lr``, ...) apply to this group only.

        Args:
            param_group: ``{"params": tensors, **options}``, as for ``Optimizer.add_param_group``.

        Raises:
            ValueError: if a parameter appears twice in the group or is already in another group,
                or the ranks pass different parameters.
        """
        params = param_group.get("params") if isinstance(param_group, dict) else None
        if params is not None and not isinstance(params, torch.Tensor | set):
            param_group["params"] = list(params)
            tensors = [p[1] if isinstance(p, tuple) else p for p in param_group["params"]]
            if len({id(t) for t in tensors}) != len(tensors):
                raise ValueError(
                    "a parameter appears twice in one parameter group; pass each tensor once "
                    "(for tied weights, module.parameters() already lists the shared one once)"
                )
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            self._check_same_on_all_ranks(group["params"])
        except ValueError:
            self.param_groups.pop()
            raise

        # Balance what costs memory: the state of trainable parameters. A frozen parameter gets
        # no gradient and so no state; counting it would let a large frozen embedding push all
        # the trainable state onto the other ranks.
        sizes = [_state_size(p) for p in group["params"]]
        owners = partition_by_numel(sizes, self._world_size, loads=self._loads)
        for size, owner in zip(sizes, owners, strict=True):
            self._loads[owner] += size
        self._owners.append(owners)
        self._buckets_key = None
        if self._local_optimizer is not None:
            self._local_optimizer.add_param_group(self._local_group(-1))
            _mirror(group, self._local_optimizer.param_groups[-1])

    def _push_options(self) -> None:
        """Copy each group's options (lr set by a scheduler, ...) to the inner optimizer."""
        for group, local in zip(self.param_groups, self.local_optimizer.param_groups, strict=True):
            local.update(_options(group))

    def _sync_plan(self) -> list[Bucket]:
        """Broadcast buckets for the parameters that require grad, re-planned when that changes."""
        flags = tuple(p.requires_grad for g in self.param_groups for p in g["params"])
        if flags != self._buckets_key:
            trainable = [
                (p, owner)
                for g, owners in zip(self.param_groups, self._owners, strict=True)
                for p, owner in zip(g["params"], owners, strict=True)
                if p.requires_grad
            ]
            self._buckets = plan_buckets(
                [p for p, _ in trainable],
                [owner for _, owner in trainable],
                max_bytes=self._bucket_bytes,
            )
            self._buckets_key = flags
        return self._buckets

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        """Step this rank's shard with the inner optimizer, then broadcast it to the other ranks.

        Collective: one broadcast per bucket (see the class docstring); returns once every rank
        holds the updated parameters of all shards.

        Args:
            closure: optional function that recomputes the loss (and gradients); called once, with
                gradients enabled, before the inner step.
            **kwargs: passed on to the inner optimizer's ``step``.

        Returns:
            The closure's loss, or ``None`` without a closure.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._push_options()
        self.local_optimizer.step(**kwargs)
        broadcast_buckets(self._sync_plan(), rank=self._rank, group=self._group)
        return loss

    def _comm_device(self) -> torch.device:
        """Where state tensors travel in :meth:`state_dict`: the backend's device."""
        if self._backend == dist.Backend.NCCL:
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def state_dict(self) -> dict[str, Any]:
        """The full, unsharded optimizer state, on every rank, as one process would return it.

        Collective (see the class docstring): every rank must call it. The result has the format
        of ``optimizer_cls(all_params, **kwargs).state_dict()`` on one process: parameters are
        numbered across all groups in order, and ``param_groups`` carries each group's options.
        Its tensors are CPU copies, so saving it while training continues is safe.

        Returns:
            ``{"state": {index: {name: value}}, "param_groups": [{..., "params": [index]}]}``.
        """
        for pre_hook in self._optimizer_state_dict_pre_hooks.values():
            pre_hook(self)
        indices: list[list[int]] = []  # consolidated index of every parameter, per group
        local_to_global: list[int] = []  # consolidated index of the inner optimizer's i-th param
        for group, owners in zip(self.param_groups, self._owners, strict=True):
            start = sum(len(ix) for ix in indices)
            indices.append(list(range(start, start + len(group["params"]))))
            local_to_global += [start + j for j, o in enumerate(owners) if o == self._rank]

        local = self.local_optimizer.state_dict()
        local_state = {local_to_global[i]: s for i, s in local["state"].items()}
        state = gather_state(local_state, group=self._group, device=self._comm_device())
        param_groups = [
            {**{k: v for k, v in group.items() if k != "params"}, "params": ix}
            for group, ix in zip(self.param_groups, indices, strict=True)
        ]
        state_dict = {"state": state, "param_groups": param_groups}
        for post_hook in self._optimizer_state_dict_post_hooks.values():
            result = post_hook(self, state_dict)
            if result is not None:
                state_dict = result
        return state_dict

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a consolidated state dict, keeping only the state of the parameters this rank owns.

        Accepts what :meth:`state_dict` returns, whatever the world size that saved it, and what an
        unsharded ``optimizer_cls`` returns on one process. Group options (``lr``, ...) are loaded
        by the inner optimizer, as it loads them on one process, and :attr:`param_groups` then
        show the inner optimizer's options (an implementation choice such as ``lmcore.AdamW``'s
        ``fused`` stays the constructor's). No communication: every rank reads the
        same dict (e.g. ``torch.load`` on each rank, ``mmap=True`` to keep host memory low).

        Args:
            state_dict: the consolidated state dict.

        Raises:
            ValueError: if it is not a state dict, or its parameter groups differ in number or
                size from this optimizer's.
        """
        state_dict = dict(state_dict) if isinstance(state_dict, dict) else state_dict
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = pre_hook(self, state_dict)
            if result is not None:
                state_dict = result
        check_state_dict(state_dict, [len(g["params"]) for g in self.param_groups])

        self.local_optimizer.load_state_dict(shard_state_dict(state_dict, self._owners, self._rank))
        # The inner optimizer decides what of the saved options to take (lmcore.AdamW keeps its
        # own implementation, `fused` and `foreach`): these groups show what it took, and so
        # never push a saved option into it at the next step.
        for group, local in zip(self.param_groups, self.local_optimizer.param_groups, strict=True):
            _mirror(group, local)
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)

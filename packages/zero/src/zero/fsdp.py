"""FSDP: fully sharded data parallelism — weights, gradients and optimizer state all sharded.

Read top-down: the unit (the parameters one all-gather carries) and its states; the autograd
Function that ties a unit's gathered weights to its shards; the checks at the front door; the
wrapper, whose hooks drive gathering, freeing and reducing through forward and backward. The
dtypes it keeps, computes and reduces in are a `zero.MixedPrecision` policy.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.graph import register_multi_grad_hook
from torch.nn.modules.module import _IncompatibleKeys
from torch.utils._pytree import tree_map_only

from zero.flat_shard import (
    FlatLayout,
    param_major_to_rank_major,
    rank_chunk,
    rank_major_to_param_major,
)
from zero.mixed_precision import MixedPrecision

__all__ = ["FSDP"]

# Reduce-scatters in flight at once. A unit's reduction overlaps the backward of the unit
# before it and is waited for (its full-size gradient buffer released; NCCL holds an async
# collective's tensors until the wait) before the next unit's gradients are packed, FSDP2's
# order: one full-size buffer at a time beside the gradients being packed. Each more in flight
# would hold one more unit's full-size gradients through the backward.
_MAX_REDUCTIONS_IN_FLIGHT = 1


class _State(enum.Enum):
    FREE = "free"  # the unit's full-weight buffer has no storage
    GATHERING = "gathering"  # an all-gather into it is in flight
    READY = "ready"  # it holds the current full weights


@dataclass(eq=False)
class _Param:
    """One parameter of the wrapped module and every (module, attribute) that holds it."""

    param: nn.Parameter
    owners: list[tuple[nn.Module, str]]


@dataclass(eq=False)
class _Unit:
    """The parameters one all-gather carries, and the buffers that hold them gathered.

    ``flat`` is one param-major buffer in the compute dtype holding every sharded parameter
    (padded); ``full_views`` are the parameters' full-shaped views of it. Its storage is
    allocated while gathered and resized to zero while free, so the views (also the ones
    autograd saved for backward) stay valid objects and see the data again after a re-gather.
    While an all-gather is in flight its rank-major output is ``gather_out`` (``flat`` itself
    when the layouts agree); ``flat``'s storage is then allocated only when the output is
    copied into it, so a prefetched unit holds one full-size buffer, not two.
    """

    index: int
    module: nn.Module
    sharded: list[_Param]
    replicated: list[_Param]
    layout: FlatLayout
    flat: torch.Tensor
    full_views: list[torch.Tensor]
    state: _State = _State.FREE
    # Set once the unit's backward has begun (or its gather for it was prefetched) until its
    # gradients are reduced: an activation-checkpoint recomputation then keeps its weights.
    needed_in_backward: bool = False
    gather_work: dist.Work | None = None
    gather_out: torch.Tensor | None = None
    # (owner's __dict__, attribute, tensor) of every gathered (or cast) tensor the last forward
    # installed over a parameter: put back for the unit's backward, dropped once it is reduced.
    installed: list[tuple[dict[str, Any], str, torch.Tensor]] = field(default_factory=list)

    @cached_property
    def shards(self) -> tuple[nn.Parameter, ...]:
        """The sharded parameters, in the layout's order (fixed once the unit is built)."""
        return tuple(p.param for p in self.sharded)

    @cached_property
    def owners(self) -> tuple[tuple[int, dict[str, Any], str], ...]:
        """(index in the unit's sharded parameters, owner's ``__dict__``, attribute) of every
        place a sharded parameter is held, for installing the gathered weights."""
        return tuple(
            (i, owner.__dict__, attr)
            for i, p in enumerate(self.sharded)
            for owner, attr in p.owners
        )


class _Unshard(torch.autograd.Function):
    """Forward: the unit's gathered full weights. Backward: reduce-scatter their gradients.

    The shards are inputs so that autograd calls :meth:`backward` exactly once every gradient
    of the unit's full weights (all their uses in this forward call) is complete. It returns no
    gradient for the shards: the wrapper writes the reduce-scattered shard gradients itself
    once the collective is done, so backward never waits on the network.
    """

    @staticmethod
    def forward(ctx: Any, fsdp: FSDP, unit: _Unit, *shards: torch.Tensor) -> tuple[torch.Tensor]:
        ctx.fsdp, ctx.unit = fsdp, unit
        outputs = tuple(v.view(v.shape) for v in unit.full_views)  # fresh aliases each call
        ctx.mark_non_differentiable(
            *(o for o, s in zip(outputs, shards, strict=True) if not s.requires_grad)
        )
        return outputs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[None, ...]:
        ctx.fsdp._reduce_scatter(ctx.unit, grads)
        return (None, None, *(None for _ in grads))


def _require_process_group() -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "FSDP needs the default process group: call "
            "torch.distributed.init_process_group(backend=...) on every rank (or launch with "
            "torchrun) before wrapping the module"
        )


def _check_arguments(module: object, units: tuple[Any, ...] | None) -> None:
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if units is not None and not all(
        isinstance(t, type) and issubclass(t, nn.Module) for t in units
    ):
        raise TypeError(
            f"units must be nn.Module subclasses (e.g. (TransformerBlock,)), got {units!r}"
        )
    for m in module.modules():
        # torch.compile(module) (an OptimizedModule) or module.compile() would trace the hooks
        # that gather and free weights, which run collectives and keep state across calls.
        if isinstance(getattr(m, "_orig_mod", None), nn.Module) or getattr(
            m, "_compiled_call_impl", None
        ):
            raise ValueError(
                f"FSDP's hooks run outside compiled code, but {type(m).__name__} is compiled "
                "as a whole (torch.compile(module) or module.compile()): wrap the uncompiled "
                "module and compile each unit's forward, zero.apply_fsdp(module, units=..., "
                "compile=True)"
            )


def _policy(
    module: nn.Module,
    mixed_precision: MixedPrecision | None,
    compute_dtype: torch.dtype | None,
    reduce_dtype: torch.dtype | None,
) -> MixedPrecision:
    """The resolved policy: `mixed_precision`, or the one the two shorthands spell."""
    if mixed_precision is None:
        mixed_precision = MixedPrecision(compute_dtype=compute_dtype, reduce_dtype=reduce_dtype)
    elif compute_dtype is not None or reduce_dtype is not None:
        raise ValueError(
            "pass the dtypes either as mixed_precision=MixedPrecision(...) or as "
            "compute_dtype= / reduce_dtype=, not both"
        )
    elif not isinstance(mixed_precision, MixedPrecision):
        raise TypeError(
            f"mixed_precision must be a zero.MixedPrecision, got {type(mixed_precision).__name__}"
        )
    dtypes = {p.dtype for p in module.parameters()}
    if len(dtypes) > 1 or not all(d.is_floating_point for d in dtypes):
        raise ValueError(
            f"FSDP needs the module's parameters in one floating-point dtype, got "
            f"{sorted(map(str, dtypes))}: cast the module (module.float() or "
            "module.bfloat16()) before wrapping it"
        )
    return mixed_precision.resolve(dtypes.pop() if dtypes else torch.float32)


def _device(module: nn.Module, backend: str) -> torch.device:
    devices = {t.device for t in (*module.parameters(), *module.buffers())}
    if len(devices) > 1:
        raise ValueError(
            f"the module's parameters and buffers live on several devices "
            f"{sorted(map(str, devices))}: move the module to this rank's device first"
        )
    device = devices.pop() if devices else torch.device("cpu")
    if backend == "nccl" and device.type != "cuda":
        raise ValueError(
            f"the nccl backend communicates CUDA tensors but the module is on {device}: call "
            "torch.cuda.set_device(local_rank) and module.to('cuda') before wrapping"
        )
    return device


def _check_same_module(module: nn.Module, group: dist.ProcessGroup) -> None:
    """Raise on every rank (instead of hanging or silently mixing models) if the ranks differ.

    Gathers, from every rank, each parameter's and buffer's name, shape, dtype and
    ``requires_grad``, and a float64 fingerprint of its values (sum and sum of squares).
    """
    with torch.no_grad():
        tensors = [*module.named_parameters(), *module.named_buffers()]
        sums = [(t.double().sum(), t.double().square().sum()) for _, t in tensors]
        values = torch.stack([torch.stack(s) for s in sums]).tolist() if sums else []
    mine = [
        (name, tuple(t.shape), str(t.dtype), t.requires_grad, v)
        for (name, t), v in zip(tensors, values, strict=True)
    ]
    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    for rank, theirs in enumerate(everyone):
        if theirs == everyone[0]:
            continue
        if len(theirs) != len(everyone[0]):
            what = f"{len(theirs)} parameters and buffers where rank 0 has {len(everyone[0])}"
        else:
            ours, ref = next((a, b) for a, b in zip(theirs, everyone[0], strict=True) if a != b)
            what = f"{ours[0]!r} as {ours[1:4]} where rank 0 has {ref[0]!r} as {ref[1:4]}"
            if ours[:4] == ref[:4]:
                what = f"different values of {ours[0]!r} than rank 0"
        raise RuntimeError(
            f"the ranks disagree about the module: rank {rank} has {what}. Every rank must "
            "build the same module with the same initial values (seed every rank alike, or "
            "load one checkpoint on all) before wrapping it"
        )


def _unit_of(module: nn.Module, unit_types: tuple[type, ...] | None) -> bool:
    if unit_types is not None:
        return isinstance(module, unit_types)
    return any(p.dim() >= 2 for p in module.parameters(recurse=False))


class FSDP(nn.Module):
    r"""Fully sharded data parallelism: each rank keeps ``1 / world_size`` of every weight.

    Wraps ``module`` (kept as :attr:`module`, with its parameter names unchanged) so that each
    parameter of two or more dimensions (every Linear and Embedding weight) is *sharded*: it is
    flattened, zero-padded to a multiple of the world size, and rank ``r`` keeps only chunk
    ``r``, a 1-D ``nn.Parameter`` of ``ceil(numel / world_size)`` elements in the storage dtype,
    in place of the original parameter. ``FSDP.parameters()`` and ``module.named_parameters()``
    therefore yield the shards, and any elementwise torch optimizer built on
    ``FSDP.parameters()`` (SGD, Adam, AdamW, ``lmcore.AdamW``, fused or not) keeps state only
    for the shard and steps exactly as it would on the whole tensor; ``lmcore.AdamW(fused=True)``
    updates all of a group's shards in one kernel launch. Parameters of fewer dimensions (norm
    gains, biases) stay *replicated* on every rank and their gradients are averaged like DDP's.

    Precision (a :class:`zero.MixedPrecision` policy, torch FSDP2's ``MixedPrecisionPolicy``
    with the storage dtype added): the shards, their gradients and so the optimizer's state
    are kept in the *storage* dtype, float32 (master weights) or bfloat16 (a model built in
    bf16; by default the module's own dtype); weights are cast to the *compute* dtype before
    the all-gather and the units compute with them; gradients are reduced in the *reduce*
    dtype and rounded to the storage dtype. ``compute_dtype=`` and ``reduce_dtype=`` are
    shorthands for ``mixed_precision=MixedPrecision(compute_dtype=..., reduce_dtype=...)``.

    Parameters are grouped into *units*: by default every module that directly owns a sharded
    weight, or every instance of the classes in ``units`` (``units=(TransformerBlock,)``). The
    wrapped module itself is the *root* unit, holding every parameter not inside a unit and
    every tied parameter shared by several units. A unit is gathered just before its forward
    and freed right after it, gathered again just before its backward and freed right after
    its gradients are reduced; the root unit stays gathered from the start of the forward pass
    to the end of its backward. So at most the root and two other units are ever gathered: the
    one computing and the one prefetched.

    Activation checkpointing (``lmcore.apply_activation_checkpointing``, any non-reentrant
    ``torch.utils.checkpoint``) runs a unit's forward again during backward. A unit whose own
    backward has already begun (or was prefetched for it) keeps its gathered weights through
    the recomputation; any other, such as the earlier blocks of a checkpointed segment of
    several blocks, is gathered for the recomputation and freed right after it, then gathered
    again for its backward. So a segment of any length holds at most the root and three other
    units gathered: the one recomputing, the one whose backward runs, the one prefetched.

    ``torch.compile``: the wrapper's hooks (collectives, Python state) must stay outside
    compiled code, so FSDP refuses a module compiled as a whole; compile each unit's forward
    instead, after wrapping (:func:`zero.apply_fsdp` with ``compile=True``, torchtitan's way:
    units of one class compile once and share the graph).

    Collectives and synchronisation points (every rank of the default process group must make
    them, in the same order; they are issued asynchronously unless said otherwise):

    * construction: one blocking ``all_gather_object`` of every parameter's and buffer's name,
      shape, dtype, ``requires_grad`` and value fingerprint (ranks that built different models
      fail with an error instead of hanging or training a mix);
    * forward, per unit call: one ``all_gather_into_tensor`` of the unit's shards, cast to
      ``compute_dtype`` first (half the bytes in bf16), waited for at the unit's forward
      pre-hook; the next unit's all-gather (in the previous forward's unit order) is issued at
      that pre-hook too, **one unit ahead**, so it travels while this unit computes;
    * backward, per recomputation of a unit not yet claimed by its backward (activation
      checkpointing): one more all-gather, waited for at once, and the unit freed after it;
    * backward, per unit call: the same all-gather again, waited for when the first gradient
      of the unit's output arrives; the next unit in backward order (this forward's order,
      reversed) is gathered one unit ahead from that hook; when all gradients of the unit's
      weights are ready, one ``reduce_scatter_tensor`` (average) of them in the reduce dtype,
      at most ``_MAX_REDUCTIONS_IN_FLIGHT`` (1) in flight — the next unit's waits for the
      older ones and adds them to the shard gradients (in the storage dtype) before packing
      the next unit's gradients;
    * :meth:`finish_gradient_synchronization`: waits for every outstanding reduce-scatter,
      then one blocking ``all_reduce`` (average, in the reduce dtype) of all replicated
      parameters' gradients (with a flag per parameter saying whether any rank had one);
    * :meth:`gather_full_params` and :meth:`state_dict`: one blocking
      ``all_gather_into_tensor`` per unit, in the storage dtype; :meth:`load_state_dict`: none.

    Invariants:

    * every rank builds the same module with the same values, and runs the same units in the
      same order in every forward and backward (a module skipped on one rank must be skipped
      on all: gathers are collectives);
    * parameters are not replaced, added or reshaped after wrapping; the optimizer is built on
      ``FSDP.parameters()`` after wrapping;
    * :meth:`finish_gradient_synchronization` is called after the last backward of a step and
      before ``optimizer.step()``; then every trainable parameter's ``.grad`` has the shape and
      dtype (the storage dtype) of its local ``.data``, and replicated gradients are equal on
      all ranks;
    * padding elements of the shards are zero and stay zero under elementwise optimizers
      (zero weight, zero gradient); an optimizer that moves zero weights with zero gradients
      would make them nonzero, which :meth:`gather_full_params` drops.

    Gradient accumulation: run forward and backward on each micro-batch and call
    :meth:`finish_gradient_synchronization` once after the last (calling it after each is
    also correct). Every backward reduce-scatters its unit gradients and adds them to the
    shard gradients (in the storage dtype), so memory stays sharded; replicated gradients
    accumulate locally and are averaged once. Run each micro-batch's backward before the next
    micro-batch's forward.

    A trainable parameter whose unit ran but that got no gradient gets a zero gradient; one
    whose unit did not run at all keeps ``.grad`` untouched (``None`` after ``zero_grad()``), as
    in one process. A replicated parameter that no rank computed a gradient for stays ``None``.

    Args:
        module: the model of this rank, its parameters of one dtype (float32 or bfloat16, or
            any floating dtype with a ``storage_dtype``) and on one device (CUDA for NCCL), not
            compiled. Its sharded parameters are replaced in place.
        mixed_precision: the storage, compute, reduce and output dtypes and whether inputs are
            cast (:class:`zero.MixedPrecision`); ``None`` (default): the module's dtype for
            all, or what the two shorthands below say.
        compute_dtype: shorthand for ``MixedPrecision(compute_dtype=...)``: the dtype the units
            compute in (``torch.bfloat16``, ``torch.float16``); sharded weights are cast to it
            *before* the all-gather, replicated ones at the unit's forward.
        reduce_dtype: shorthand for ``MixedPrecision(reduce_dtype=...)``: the dtype of the
            gradient reduction; ``None`` reduces in the compute dtype (torch FSDP2's default),
            ``torch.float32`` in full precision at twice the bytes.
        units: module classes that form units; ``None`` (default) makes every module owning a
            parameter of two or more dimensions a unit.
        prefetch: issue the next unit's all-gather one unit ahead (default). ``False`` gathers
            each unit only when it is needed, with nothing to overlap: to measure what
            prefetching buys (``bench-zero --variants fsdp fsdp-no-prefetch``).

    Raises:
        TypeError: ``module`` is not an ``nn.Module``, or ``mixed_precision`` not a policy.
        ValueError: an unsupported dtype (parameters of several dtypes or of one that is not a
            storage dtype, or a policy's dtype out of range: see :class:`zero.MixedPrecision`),
            both a policy and a shorthand, a module compiled as a whole, parameters on several
            devices, or not on CUDA under NCCL.
        RuntimeError: no default process group, or the ranks' modules differ.

    Example::

        >>> dist.init_process_group("nccl")
        >>> torch.cuda.set_device(dist.get_rank())
        >>> torch.manual_seed(0)  # the same initial weights on every rank
        >>> model = FSDP(TransformerLM.from_size("xl", context_length=128).cuda(),
        ...              compute_dtype=torch.bfloat16, units=(TransformerBlock,))
        >>> optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
        >>> loss_fn(model(tokens), targets).backward()
        >>> model.finish_gradient_synchronization()
        >>> optimizer.step()
        >>> full = model.state_dict()  # collective: full fp32 tensors on every rank's CPU

    A model built in bf16, kept, computed and reduced in bf16, with bf16 AdamW moments::

        >>> model = FSDP(TransformerLM.from_size("xl", context_length=128).cuda().bfloat16(),
        ...              units=(TransformerBlock,))
        >>> optimizer = lmcore.AdamW(model.parameters(), fused=True, moment_dtype=torch.bfloat16)
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        mixed_precision: MixedPrecision | None = None,
        compute_dtype: torch.dtype | None = None,
        reduce_dtype: torch.dtype | None = None,
        units: Iterable[type[nn.Module]] | None = None,
        prefetch: bool = True,
    ) -> None:
        unit_types = None if units is None else tuple(units)
        _check_arguments(module, unit_types)
        policy = _policy(module, mixed_precision, compute_dtype, reduce_dtype)
        _require_process_group()
        super().__init__()
        self.module = module
        self.group = dist.group.WORLD
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()
        self.device = _device(module, dist.get_backend())
        self.mixed_precision = policy  # every dtype resolved
        self.storage_dtype: torch.dtype = policy.storage_dtype  # type: ignore[assignment]
        self.compute_dtype: torch.dtype = policy.compute_dtype  # type: ignore[assignment]
        self.reduce_dtype: torch.dtype = policy.reduce_dtype  # type: ignore[assignment]
        self._cast_inputs = policy.cast_forward_inputs and self.compute_dtype != self.storage_dtype
        self.prefetch = prefetch
        _check_same_module(module, self.group)

        self._units = self._build_units(unit_types)
        self._reductions: deque[tuple[_Unit, dist.Work, torch.Tensor]] = deque()
        self._calls: list[_Unit] = []  # units in the order this forward called them
        self._previous_calls: list[_Unit] = []
        self._backward_position = 0
        self._in_backward = False
        for unit in self._units[1:]:
            unit.module.register_forward_pre_hook(self._make_pre_forward(unit), with_kwargs=True)
            unit.module.register_forward_hook(self._make_post_forward(unit))

    @property
    def unit_modules(self) -> tuple[nn.Module, ...]:
        """The modules that are units, in construction order (the root, the wrapped module
        itself, left out): what :func:`zero.apply_fsdp` compiles."""
        return tuple(unit.module for unit in self._units[1:])

    # ---- construction --------------------------------------------------------------------

    def _build_units(self, unit_types: tuple[type, ...] | None) -> list[_Unit]:
        """Assign each parameter to a unit, shard the sharded ones, build the gather buffers."""
        unit_modules = [self.module] + [
            m for m in self.module.modules() if m is not self.module and _unit_of(m, unit_types)
        ]
        index_of = {id(m): i for i, m in enumerate(unit_modules)}
        innermost: dict[int, int] = {}  # id(module) -> index of the innermost unit holding it

        def visit(module: nn.Module, unit: int) -> None:
            unit = index_of.get(id(module), unit)
            innermost[id(module)] = unit
            for child in module.children():
                visit(child, unit)

        visit(self.module, 0)

        params: dict[int, _Param] = {}
        for module in self.module.modules(remove_duplicate=False):
            for attr, p in module._parameters.items():
                if p is not None:
                    params.setdefault(id(p), _Param(p, [])).owners.append((module, attr))
        members: list[list[_Param]] = [[] for _ in unit_modules]
        for entry in params.values():
            homes = {innermost[id(m)] for m, _ in entry.owners}
            members[homes.pop() if len(homes) == 1 else 0].append(entry)
        return [
            self._make_unit(i, m, ps)
            for i, (m, ps) in enumerate(zip(unit_modules, members, strict=True))
        ]

    def _make_unit(self, index: int, module: nn.Module, members: list[_Param]) -> _Unit:
        sharded = [p for p in members if p.param.dim() >= 2]
        replicated = [p for p in members if p.param.dim() < 2]
        layout = FlatLayout(tuple(p.param.shape for p in sharded), self.world_size)
        with torch.no_grad():
            for entry in sharded:
                full = entry.param
                chunk = rank_chunk(full, self.world_size, self.rank).to(self.storage_dtype)
                shard = nn.Parameter(chunk, requires_grad=full.requires_grad)
                for owner, attr in entry.owners:
                    owner._parameters[attr] = shard
                entry.param = shard
            for entry in replicated:  # the same Parameter, its data in the storage dtype
                entry.param.data = entry.param.data.to(self.storage_dtype)
        flat = torch.empty(sum(layout.padded_numels), dtype=self.compute_dtype, device=self.device)
        padded = flat.split(layout.padded_numels)
        views = [
            p[:n].view(s) for p, n, s in zip(padded, layout.numels, layout.shapes, strict=True)
        ]
        unit = _Unit(index, module, sharded, replicated, layout, flat, views)
        self._free(unit)
        return unit

    # ---- gathering and freeing -----------------------------------------------------------

    @staticmethod
    def _free(unit: _Unit) -> None:
        unit.flat.untyped_storage().resize_(0)
        unit.gather_out = None
        unit.state = _State.FREE

    @staticmethod
    def _allocate(unit: _Unit) -> None:
        flat = unit.flat
        flat.untyped_storage().resize_(flat.numel() * flat.element_size())

    def _start_gather(self, unit: _Unit) -> None:
        """Launch the all-gather of the unit's shards into its rank-major output.

        In place, as FSDP2's: this rank's chunks are copied (cast to the compute dtype) into its
        own row of the output, which is the collective's input, so no separate send buffer.
        """
        if not unit.sharded:
            unit.state = _State.READY
            return
        layout = unit.layout
        with torch.no_grad():
            if layout.same_in_both_layouts:
                self._allocate(unit)
                # Written through .data: a fresh version counter, so re-filling the buffer in
                # backward does not count as modifying the weights autograd saved.
                out = unit.flat.data
            else:
                out = torch.empty(
                    layout.world_size * layout.shard_numel,
                    dtype=self.compute_dtype,
                    device=self.device,
                )
                unit.gather_out = out
            send = out.view(layout.world_size, layout.shard_numel)[self.rank]
            torch.cat(unit.shards, out=send)
            unit.gather_work = dist.all_gather_into_tensor(
                out, send, group=self.group, async_op=True
            )
        unit.state = _State.GATHERING

    def _wait_gather(self, unit: _Unit) -> None:
        assert unit.gather_work is not None
        unit.gather_work.wait()
        unit.gather_work = None

    def _finish_gather(self, unit: _Unit) -> None:
        if unit.state is _State.GATHERING:
            self._wait_gather(unit)
            if unit.gather_out is not None:
                self._allocate(unit)
                padded = unit.flat.data.split(unit.layout.padded_numels)
                rank_major_to_param_major(unit.gather_out, unit.layout, padded)
                unit.gather_out = None
            unit.state = _State.READY

    def _unshard(self, unit: _Unit) -> None:
        if unit.state is _State.FREE:
            self._start_gather(unit)
        self._finish_gather(unit)

    def _prefetch(self, unit: _Unit | None) -> None:
        if self.prefetch and unit is not None and unit.state is _State.FREE:
            self._start_gather(unit)

    def _reshard(self, unit: _Unit) -> None:
        if unit.state is _State.GATHERING:  # it must complete on every rank; its data is unused
            self._wait_gather(unit)
        if unit.sharded:
            self._free(unit)
        unit.state = _State.FREE

    # ---- forward ---------------------------------------------------------------------------

    def _install(self, unit: _Unit) -> None:
        """Point the unit's modules at the gathered weights, newly tied to the shards by
        autograd (and at the replicated parameters cast to the compute dtype)."""
        installed = []
        if unit.sharded:
            fulls = _Unshard.apply(self, unit, *unit.shards)
            installed += [(ns, attr, fulls[index]) for index, ns, attr in unit.owners]
        if self.compute_dtype != self.storage_dtype:
            for entry in unit.replicated:
                tensor = entry.param.to(self.compute_dtype)
                installed += [(owner.__dict__, attr, tensor) for owner, attr in entry.owners]
        unit.installed = installed
        self._reinstall(unit)

    @staticmethod
    def _reinstall(unit: _Unit) -> None:
        """Put the tensors of the unit's last install back in place."""
        # An instance attribute shadows the registered shard (nn.Module.__getattr__ only runs
        # when normal lookup fails), so named_parameters() is unchanged.
        for namespace, attr, tensor in unit.installed:
            namespace[attr] = tensor

    @staticmethod
    def _uninstall(unit: _Unit, *, forget: bool = False) -> None:
        """Take the installed tensors out (and, with `forget`, drop them: the unit's backward
        is done with them)."""
        for namespace, attr, _ in unit.installed:
            namespace.pop(attr, None)
        if forget:
            unit.installed = []

    def _pre_forward(self, unit: _Unit) -> None:
        """Gather a (non-root) unit, prefetch the one the previous forward called next.

        In backward this is an activation-checkpoint recomputation: the unit is gathered
        again (if its backward has not claimed it yet) and freed by `_post_forward`.
        """
        self._unshard(unit)
        if not self._in_backward:  # a re-run for activation checkpointing is not a new call
            position = len(self._calls)
            self._calls.append(unit)
            if self._previous_calls[position : position + 1] == [unit]:
                self._prefetch_call(position + 1)
        self._install(unit)

    def _prefetch_call(self, position: int) -> None:
        if position < len(self._previous_calls):
            self._prefetch(self._previous_calls[position])

    def _post_forward(self, unit: _Unit, output: Any) -> Any:
        """Free the unit after its forward and hook its backward; returns the output, cast to
        the policy's output dtype if it names one."""
        self._uninstall(unit)
        output = self._cast_floating(output, self.mixed_precision.output_dtype)
        if self._in_backward:
            # A recomputation: free the weights unless the unit's own backward has begun (or
            # its gather was prefetched for it). A segment of k checkpointed blocks recomputes
            # all k before the backward of the last; keeping them would hold k units gathered.
            if unit.index != 0 and not unit.needed_in_backward:
                self._reshard(unit)
            return output
        needs_grad = [t for t in _tensors(output) if t.requires_grad]
        if unit.index != 0 or not needs_grad:  # the root stays gathered for its backward
            self._reshard(unit)
        if needs_grad:
            register_multi_grad_hook(needs_grad, lambda _: self._pre_backward(unit), mode="any")
        return output

    @staticmethod
    def _cast_floating(tree: Any, dtype: torch.dtype | None) -> Any:
        """`tree` (tensors in tuples, lists, dicts) with its floating tensors cast to `dtype`."""
        if dtype is None:
            return tree
        return tree_map_only(
            torch.Tensor, lambda t: t.to(dtype) if t.is_floating_point() else t, tree
        )

    def _inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A unit's forward arguments, cast to the compute dtype if the policy says so."""
        if not self._cast_inputs:
            return args, kwargs
        return self._cast_floating((args, kwargs), self.compute_dtype)

    def _make_pre_forward(self, unit: _Unit):
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            self._pre_forward(unit)
            return self._inputs(args, kwargs)

        return hook

    def _make_post_forward(self, unit: _Unit):
        def hook(module: nn.Module, args: Any, output: Any) -> Any:
            return self._post_forward(unit, output)

        return hook

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped module, gathering each unit's weights around its forward."""
        for unit in self._units:  # weights gathered earlier may be stale after a step
            unit.needed_in_backward = False
            self._uninstall(unit)  # installed for a backward that did not reach the unit
            if unit.state is not _State.FREE:
                self._reshard(unit)
        self._previous_calls, self._calls = self._calls or self._previous_calls, []
        self._in_backward = False
        root = self._units[0]
        self._unshard(root)
        self._prefetch_call(0)
        self._install(root)
        args, kwargs = self._inputs(args, kwargs)
        try:
            output = self.module(*args, **kwargs)
        finally:
            self._uninstall(root)
        self._backward_position = len(self._calls)
        return self._post_forward(root, output)

    # ---- backward ---------------------------------------------------------------------------

    def _pre_backward(self, unit: _Unit) -> None:
        """The first gradient of a unit's output arrived: gather it, prefetch the next one.

        The root's output is the model's: its hook fires first and prefetches the unit the
        forward called last. Each other unit prefetches the one called before it.
        """
        self._in_backward = True
        unit.needed_in_backward = True
        self._unshard(unit)  # a no-op for the root unless a later forward freed it
        # A checkpoint inside the unit's own forward (lmcore's `selective`) recomputes it within
        # this backward, without the forward hooks: the gathered weights must be installed,
        # requiring gradients as in forward. The forward's own are put back (the same autograd
        # tie, no new one per backward); without them (a second backward through a graph kept
        # with retain_graph) new ones, with grad mode on (backward runs its hooks with it off).
        if unit.installed:
            self._reinstall(unit)
        else:
            with torch.enable_grad():
                self._install(unit)
        position = self._backward_position
        if unit.index != 0:
            position -= 1
            while position >= 0 and self._calls[position] is not unit:
                position -= 1
            if position < 0:
                return
            self._backward_position = position
        if position > 0:
            previous = self._calls[position - 1]
            if self.prefetch:
                previous.needed_in_backward = True
            self._prefetch(previous)

    def _reduce_scatter(self, unit: _Unit, grads: Sequence[torch.Tensor]) -> None:
        """All gradients of the unit's weights are ready: average them into the shards.

        The unit's weights are freed and the reductions in flight completed (their full-size
        buffers released) first, so packing these gradients adds one full-size buffer beside
        them and nothing else of the unit's or its predecessor's is still held.
        """
        unit.needed_in_backward = False
        self._uninstall(unit, forget=True)
        self._reshard(unit)
        while len(self._reductions) >= _MAX_REDUCTIONS_IN_FLIGHT:
            self._complete_oldest_reduction()
        send = param_major_to_rank_major(grads, unit.layout, self.reduce_dtype)
        out = torch.empty(unit.layout.shard_numel, dtype=self.reduce_dtype, device=self.device)
        work = dist.reduce_scatter_tensor(
            out, send, op=dist.ReduceOp.AVG, group=self.group, async_op=True
        )
        self._reductions.append((unit, work, out))

    def _complete_oldest_reduction(self) -> None:
        unit, work, out = self._reductions.popleft()
        work.wait()
        for entry, grad in zip(unit.sharded, out.split(unit.layout.chunks), strict=True):
            shard = entry.param
            if not shard.requires_grad:
                continue
            if shard.grad is None:
                shard.grad = grad.to(shard.dtype)  # a view of `out` when the dtypes agree
            else:
                shard.grad += grad

    def _reduce_replicated(self) -> None:
        """Average the replicated gradients in one all-reduce, with a has-gradient flag each.

        A rank missing a gradient contributes zeros; it reads the flags back (a host sync, only
        then) to keep ``None`` where no rank had one.
        """
        params = [e.param for u in self._units for e in u.replicated if e.param.requires_grad]
        if not params:
            return
        had = [p.grad is not None for p in params]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        # flags of 0 and 1 average exactly in any of the reduce dtypes (to k / world_size)
        flags = torch.tensor(had, dtype=self.reduce_dtype).to(self.device, non_blocking=True)
        flat = torch.cat([*(g.reshape(-1).to(self.reduce_dtype) for g in grads), flags])
        dist.all_reduce(flat, op=dist.ReduceOp.AVG, group=self.group)
        averaged = flat[: -len(params)].split([p.numel() for p in params])
        anyone = flat[-len(params) :].tolist() if not all(had) else [1.0] * len(params)
        for p, avg, used in zip(params, averaged, anyone, strict=True):
            p.grad = avg.view_as(p).to(p.dtype) if used > 0 else None

    def finish_gradient_synchronization(self) -> None:
        """Wait for every gradient reduction; then gradients are ready for ``optimizer.step()``.

        Call after the last ``backward()`` of a step. On return every trainable parameter's
        ``.grad`` has the shape and dtype (the storage dtype) of its local ``.data``: shards
        hold their part of the gradient averaged over ranks, replicated parameters the average
        (the same on every rank). On CUDA the gradients are ready once the current stream
        reaches this point.
        """
        while self._reductions:
            self._complete_oldest_reduction()
        self._reduce_replicated()
        for unit in self._units:
            unit.needed_in_backward = False
            self._uninstall(unit, forget=True)  # the root's, and any a backward did not reach
            if unit.state is not _State.FREE:
                self._reshard(unit)
        self._in_backward = False

    # ---- full weights and checkpoints -------------------------------------------------------

    @torch.no_grad()
    def _gather_full(self, unit: _Unit) -> list[torch.Tensor]:
        """The unit's sharded parameters gathered in the storage dtype, full-shaped (blocking)."""
        layout = unit.layout
        like = {"dtype": self.storage_dtype, "device": self.device}
        send = torch.cat([s.detach() for s in unit.shards])
        out = torch.empty(layout.world_size * layout.shard_numel, **like)
        dist.all_gather_into_tensor(out, send, group=self.group)
        padded = torch.empty(sum(layout.padded_numels), **like)
        parts = padded.split(layout.padded_numels)
        rank_major_to_param_major(out, layout, parts)
        return [p[:n].view(s) for p, n, s in zip(parts, layout.numels, layout.shapes, strict=True)]

    def _full_by_id(self) -> dict[int, torch.Tensor]:
        full: dict[int, torch.Tensor] = {}
        for unit in self._units:
            if unit.sharded:
                for entry, tensor in zip(unit.sharded, self._gather_full(unit), strict=True):
                    full[id(entry.param)] = tensor
        return full

    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """Every parameter of the wrapped module, full, in the storage dtype, under its own name.

        Collective: one blocking all-gather per unit; every rank gets the whole dict. Sharded
        parameters come back as fresh tensors on the module's device with their original
        shapes (padding dropped); replicated ones are the parameters themselves, detached.
        Names are those of ``module.named_parameters()`` (a tied parameter under its first name).
        """
        full = self._full_by_id()
        return {name: full.get(id(p), p.detach()) for name, p in self.module.named_parameters()}

    def state_dict(  # type: ignore[override]
        self,
        *,
        destination: dict[str, Any] | None = None,
        prefix: str = "",
        keep_vars: bool = False,
    ) -> dict[str, Any]:
        """The wrapped module's consolidated state dict: full tensors on the CPU.

        Parameters in the storage dtype (as the plain module's state dict of a module in that
        dtype), buffers as they are.

        Keys are the wrapped module's own (as ``module.state_dict()`` before wrapping, tied
        parameters under every name), so it loads into the plain module, and into an ``FSDP``
        of any world size. Collective (see :meth:`gather_full_params`); every rank gets it.
        ``keep_vars`` is accepted for compatibility and ignored: the tensors are always copies.
        """
        full = self._full_by_id()
        out = {} if destination is None else destination
        for key, value in self.module.state_dict(keep_vars=True).items():
            tensor = full.get(id(value), value)
            out[prefix + key] = tensor.detach().to("cpu", copy=True)
        return out

    @torch.no_grad()
    def load_state_dict(  # type: ignore[override]
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> _IncompatibleKeys:
        """Load a consolidated (or plain module's) state dict, keeping this rank's shards.

        No communication: every rank reads the same dict (``torch.load(..., mmap=True)`` keeps
        host memory low) and copies its chunk of each sharded parameter, and the whole of every
        replicated parameter and buffer.

        Every key and shape is checked before anything is copied, so a dict that does not fit
        leaves the shards as they were.

        Raises:
            RuntimeError: ``strict`` and keys are missing or unexpected, or a shape differs.
        """
        if assign:
            raise ValueError("FSDP.load_state_dict copies into the shards: pass assign=False")
        own = self.module.state_dict(keep_vars=True)
        full_shape = {
            id(e.param): s
            for u in self._units
            for e, s in zip(u.sharded, u.layout.shapes, strict=True)
        }
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            raise RuntimeError(
                f"state dict does not match the wrapped module: missing keys {missing}, "
                f"unexpected keys {unexpected}"
            )
        present = {key: torch.as_tensor(state_dict[key]) for key in own if key in state_dict}
        for key, value in present.items():  # every shape first: a mismatch copies nothing
            expected = full_shape.get(id(own[key]), own[key].shape)
            if value.shape != expected:
                raise RuntimeError(
                    f"{key!r} has shape {tuple(value.shape)} in the state dict but "
                    f"{tuple(expected)} in the module; nothing was loaded"
                )
        for key, value in present.items():
            target = own[key]
            if id(target) in full_shape:
                value = rank_chunk(value, self.world_size, self.rank)
            target.copy_(value)
        return _IncompatibleKeys(missing, unexpected)


def _tensors(obj: Any) -> list[torch.Tensor]:
    """Every tensor in a (nested) tuple, list or dict of forward outputs."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, list | tuple):
        return [t for item in obj for t in _tensors(item)]
    if isinstance(obj, dict):
        return [t for item in obj.values() for t in _tensors(item)]
    return []

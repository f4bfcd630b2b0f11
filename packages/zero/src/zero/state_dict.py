"""Moving optimizer state between its sharded form (per rank) and its consolidated form (one dict).

The consolidated form is exactly what ``torch.optim.Optimizer.state_dict()`` returns on one
process: ``{"state": {index: {name: value}}, "param_groups": [{option: value, "params": [index]}]}``
with indices numbering the parameters of all groups in order. Turning it into one rank's local
state dict is a pure re-indexing (:func:`shard_state_dict`); building it from the ranks' shards is
a collective (:func:`gather_state`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

__all__ = ["TensorSpec", "check_state_dict", "gather_state", "shard_state_dict"]

# Per-group entries that list or name parameters rather than configure the optimizer.
PARAM_KEYS = ("params", "param_names")


class TensorSpec(NamedTuple):
    """Shape and dtype of a state tensor, sent ahead so receivers can allocate for it."""

    shape: tuple[int, ...]
    dtype: torch.dtype


def check_state_dict(state_dict: Any, group_sizes: Sequence[int]) -> None:
    """Raise ``ValueError`` unless ``state_dict`` is a consolidated dict matching these groups.

    Args:
        state_dict: the dict to check.
        group_sizes: the number of parameters in each of the optimizer's groups.
    """
    if not isinstance(state_dict, dict) or not {"state", "param_groups"} <= state_dict.keys():
        raise ValueError(
            "expected an optimizer state dict with 'state' and 'param_groups' entries, "
            "as returned by ShardedOptimizer.state_dict() or Optimizer.state_dict()"
        )
    saved_sizes = [len(g["params"]) for g in state_dict["param_groups"]]
    if saved_sizes != list(group_sizes):
        raise ValueError(
            f"the state dict has parameter groups of sizes {saved_sizes} but this optimizer has "
            f"{list(group_sizes)}; build the optimizer over the same parameter groups first"
        )


def shard_state_dict(
    state_dict: dict[str, Any],
    owners: Sequence[Sequence[int]],
    rank: int,
) -> dict[str, Any]:
    """The part of a consolidated state dict that ``rank`` owns, as its inner optimizer's.

    Args:
        state_dict: a consolidated state dict (checked with :func:`check_state_dict`).
        owners: the owner rank of every parameter, one list per parameter group.
        rank: the rank whose shard to extract.

    Returns:
        A state dict for an optimizer over only the parameters ``rank`` owns (one group per
        consolidated group, possibly empty), re-indexed from 0 in group order. Tensors are the
        consolidated dict's own objects, not copies (as in ``Optimizer.load_state_dict``).
    """
    saved_state = state_dict["state"]
    local_state: dict[int, Any] = {}
    local_groups: list[dict[str, Any]] = []
    next_index = 0
    for saved, group_owners in zip(state_dict["param_groups"], owners, strict=True):
        local = {k: v for k, v in saved.items() if k not in PARAM_KEYS}
        mine = [j for j, owner in enumerate(group_owners) if owner == rank]
        local["params"] = list(range(next_index, next_index + len(mine)))
        if "param_names" in saved:
            local["param_names"] = [saved["param_names"][j] for j in mine]
        for local_index, j in zip(local["params"], mine, strict=True):
            saved_index = saved["params"][j]
            if saved_index in saved_state:
                local_state[local_index] = saved_state[saved_index]
        next_index += len(mine)
        local_groups.append(local)
    return {"state": local_state, "param_groups": local_groups}


def _spec_of(value: Any) -> Any:
    return TensorSpec(tuple(value.shape), value.dtype) if isinstance(value, torch.Tensor) else value


def gather_state(
    local_state: dict[int, dict[str, Any]],
    *,
    group: dist.ProcessGroup | None,
    device: torch.device,
) -> dict[int, dict[str, Any]]:
    """Collect every rank's per-parameter state into one dict, on every rank, on the CPU.

    Collective: one ``all_gather_object`` of the state's layout (shapes, dtypes and the non-tensor
    values), then one ``broadcast`` per state tensor from the rank that owns it, through
    ``device`` (the device the group's backend communicates on: CUDA for NCCL).

    Args:
        local_state: this rank's state, keyed by consolidated parameter index; the ranks' keys
            must be disjoint.
        group: the process group; ``None`` for the default (world) group.
        device: where tensors travel.

    Returns:
        ``{index: {name: value}}`` for all ranks' parameters, sorted by index. Tensors are fresh
        CPU copies, so later optimizer steps never change the returned dict.
    """
    rank = dist.get_rank(group)
    layout = {i: {k: _spec_of(v) for k, v in s.items()} for i, s in local_state.items()}
    layouts: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(layouts, layout, group=group)

    state: dict[int, dict[str, Any]] = {}
    for owner, owner_layout in enumerate(layouts):
        for index, entries in owner_layout.items():
            state[index] = {}
            for name, spec in entries.items():
                if not isinstance(spec, TensorSpec):
                    state[index][name] = spec
                    continue
                if rank == owner:
                    buffer = local_state[index][name].detach().to(device).contiguous()
                else:
                    buffer = torch.empty(spec.shape, dtype=spec.dtype, device=device)
                dist.broadcast(buffer, group=group, group_src=owner)
                state[index][name] = buffer.to("cpu", copy=True)
    return dict(sorted(state.items()))

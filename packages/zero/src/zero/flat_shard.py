"""Where each rank's piece of a parameter lives: the padded, per-parameter sharding FSDP uses.

Every sharded parameter is flattened, padded with zeros to a multiple of the world size and cut
into ``world_size`` equal chunks; rank ``r`` keeps chunk ``r``. A unit (the parameters one
all-gather carries) concatenates its parameters' chunks, so one collective moves all of them::

    rank-major (what all_gather_into_tensor fills, what reduce_scatter_tensor reads)
        [ p0 chunk 0 | p1 chunk 0 ] [ p0 chunk 1 | p1 chunk 1 ] ...      (world_size, shard_numel)
    param-major (what the module computes with: each parameter contiguous)
        [ p0 chunk 0 | p0 chunk 1 | ... | pad ] [ p1 chunk 0 | p1 chunk 1 | ... | pad ]

Converting between the two is one strided copy each way (:func:`rank_major_to_param_major`,
:func:`param_major_to_rank_major`); a unit of one parameter needs none, since both layouts agree.
Everything here is a pure function of shapes and the world size, the same on every rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F

__all__ = [
    "FlatLayout",
    "param_major_to_rank_major",
    "rank_chunk",
    "rank_major_to_param_major",
]


@dataclass(frozen=True)
class FlatLayout:
    """The sharded parameters of one unit: their shapes and the world size that splits them.

    The sizes derived from them are computed once (FSDP reads them on every gather and
    reduction of the unit).

    Attributes:
        shapes: each parameter's full shape, in the unit's order.
        world_size: number of ranks sharing the unit.
    """

    shapes: tuple[torch.Size, ...]
    world_size: int

    @cached_property
    def numels(self) -> tuple[int, ...]:
        """Each parameter's true number of elements."""
        return tuple(s.numel() for s in self.shapes)

    @cached_property
    def chunks(self) -> tuple[int, ...]:
        """Each parameter's chunk per rank: ``ceil(numel / world_size)``."""
        return tuple(-(-n // self.world_size) for n in self.numels)

    @cached_property
    def padded_numels(self) -> tuple[int, ...]:
        """Each parameter's size after padding: ``chunk * world_size``."""
        return tuple(c * self.world_size for c in self.chunks)

    @cached_property
    def shard_numel(self) -> int:
        """Elements one rank holds for the whole unit (the sum of the chunks)."""
        return sum(self.chunks)

    @cached_property
    def same_in_both_layouts(self) -> bool:
        """Whether rank-major and param-major agree (one parameter, or one rank)."""
        return len(self.shapes) == 1 or self.world_size == 1


def rank_chunk(full: torch.Tensor, world_size: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s chunk of ``full``: flattened, zero-padded, a fresh contiguous 1-D tensor.

    Args:
        full: the whole parameter (any shape).
        world_size: number of ranks.
        rank: which chunk, ``0 <= rank < world_size``.

    Returns:
        A tensor of ``ceil(full.numel() / world_size)`` elements, not sharing ``full``'s memory.
    """
    chunk = -(-full.numel() // world_size)
    flat = full.detach().reshape(-1)
    piece = flat[rank * chunk : (rank + 1) * chunk]
    return F.pad(piece, (0, chunk - piece.numel())) if piece.numel() < chunk else piece.clone()


def rank_major_to_param_major(
    gathered: torch.Tensor, layout: FlatLayout, padded_params: Sequence[torch.Tensor]
) -> None:
    """Copy an all-gather's output into each parameter's padded, contiguous buffer.

    Args:
        gathered: ``(world_size * shard_numel,)``, rank-major.
        layout: the unit's layout.
        padded_params: one contiguous ``(padded_numel,)`` tensor per parameter, written in place.
    """
    torch.split_with_sizes_copy(
        gathered.view(layout.world_size, layout.shard_numel),  # (world_size, shard_numel)
        list(layout.chunks),
        dim=1,
        out=[p.view(layout.world_size, -1) for p in padded_params],  # (world_size, chunk)
    )


def param_major_to_rank_major(
    grads: Sequence[torch.Tensor], layout: FlatLayout, dtype: torch.dtype
) -> torch.Tensor:
    """Pack full-shaped gradients, padded, into one rank-major ``dtype`` buffer to reduce-scatter.

    Args:
        grads: one full-shaped gradient per parameter of the unit.
        layout: the unit's layout.
        dtype: the dtype to communicate in.

    Returns:
        ``(world_size * shard_numel,)``, rank-major; ``grads[0]`` itself (flattened) when the
        layouts agree and no padding or cast is needed.
    """
    padded = [
        g.reshape(-1) if n == p else F.pad(g.reshape(-1), (0, p - n))
        for g, n, p in zip(grads, layout.numels, layout.padded_numels, strict=True)
    ]
    if layout.same_in_both_layouts and len(padded) == 1:
        return padded[0].to(dtype)
    rows = [p.view(layout.world_size, -1) for p in padded]  # (world_size, chunk) each
    out = torch.empty(layout.world_size, layout.shard_numel, dtype=dtype, device=grads[0].device)
    return torch.cat(rows, dim=1, out=out).view(-1)

"""Making every rank's parameters equal again after each rank stepped its own shard.

Each owner broadcasts the parameters it updated. Parameters of one owner, dtype and device are
coalesced into buckets of at most ``max_bytes``: a bucket is packed into one flat buffer on the
owner, broadcast once, and unpacked on the other ranks. ``max_bytes=0`` gives one broadcast per
parameter straight into the parameter's storage (no staging copies, many small collectives);
``max_bytes=None`` gives one broadcast per (owner, dtype, device) (few collectives, staging buffers
as large as a whole shard). The cap trades collective count against transient memory and copies.
Sizes speak ``ddp``'s bucket vocabulary (``bucket_size_mb`` in MiB, ``None`` for one bucket, the
same 25 MB default), but the few lines that plan and validate them are zero's own: ``zero`` installs
and runs without ``ddp`` (it needs only torch and numpy), so it cannot import them from there.

Why not one all-gather over a flat buffer: shards are whole parameters, so they differ in size and
an all-gather would need padding to the largest shard plus a gather buffer as large as the whole
model; that transient model-sized buffer, alive while the gradients still are, would eat most of
the memory ZeRO-1 saves. Gathering straight into the parameters instead would require the
parameters to be views of one flat buffer, which fights with DDP's own gradient buckets and with
user code holding parameter references.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["DEFAULT_BUCKET_SIZE_MB", "Bucket", "broadcast_buckets", "bucket_bytes", "plan_buckets"]

# torch DDP's default bucket cap, as ``ddp.DEFAULT_BUCKET_SIZE_MB`` (a test checks they agree). At
# NVLink speeds a 25 MB broadcast takes on the order of 100 µs, several times a collective's
# ~10 µs launch cost.
DEFAULT_BUCKET_SIZE_MB = 25.0
_BYTES_PER_MB = 1024 * 1024

# Buckets staged at once: one on the wire while the next is packed (double buffering); waiting for
# the oldest beyond that bounds the transient memory to a few buckets, negligible at the default
# size next to the optimizer state that sharding saves.
_MAX_IN_FLIGHT = 2


@dataclass(frozen=True)
class Bucket:
    """Parameters that one owner broadcasts together in a single collective.

    All parameters of a bucket share ``owner`` (a rank of the process group), dtype and device.
    """

    owner: int
    params: tuple[torch.Tensor, ...]

    @property
    def numel(self) -> int:
        """Total number of elements of the bucket's parameters."""
        return sum(p.numel() for p in self.params)


def bucket_bytes(bucket_size_mb: float | None) -> int | None:
    """The capacity in bytes of a bucket of ``bucket_size_mb`` MiB (``None``: unbounded).

    Raises:
        TypeError: ``bucket_size_mb`` is neither a number nor None.
        ValueError: ``bucket_size_mb`` is negative, nan or infinite (``None`` is the one bucket).
    """
    if bucket_size_mb is None:
        return None
    if isinstance(bucket_size_mb, bool) or not isinstance(bucket_size_mb, int | float):
        raise TypeError(
            f"bucket_size_mb must be a number of MiB or None, got {type(bucket_size_mb).__name__}"
        )
    if not (bucket_size_mb >= 0 and math.isfinite(bucket_size_mb)):
        raise ValueError(
            f"bucket_size_mb must be a finite number >= 0 (0 gives every parameter its own "
            f"bucket) or None (one bucket), got {bucket_size_mb}"
        )
    return int(bucket_size_mb * _BYTES_PER_MB)


def plan_buckets(
    params: Sequence[torch.Tensor],
    owners: Sequence[int],
    *,
    max_bytes: int | None,
) -> list[Bucket]:
    """Group parameters into broadcast buckets of one owner, dtype and device, capped in size.

    A pure function of the parameters' order, sizes, dtypes and owners, so every rank plans the
    same buckets in the same order (collectives must match across ranks): a greedy walk forwards,
    one open bucket per (owner, dtype, device). A parameter larger than the cap gets a bucket of
    its own.

    Args:
        params: the parameters to keep in sync, in a fixed order shared by all ranks.
        owners: the owner rank of each parameter (see :func:`zero.partition_by_numel`).
        max_bytes: the cap on a bucket's size in bytes (:func:`bucket_bytes` of a size in MiB);
            ``0`` puts every parameter in its own bucket, ``None`` one bucket per (owner, dtype,
            device).

    Returns:
        The buckets, ordered by their first parameter; each bucket's parameters in ``params``
        order.

    Raises:
        ValueError: if ``params`` and ``owners`` differ in length or ``max_bytes`` is negative.
    """
    if len(params) != len(owners):
        raise ValueError(f"got {len(params)} parameters but {len(owners)} owners")
    if max_bytes is not None and max_bytes < 0:
        raise ValueError(f"max_bytes must be non-negative or None, got {max_bytes}")
    cap = math.inf if max_bytes is None else max_bytes
    closed: list[tuple[int, ...]] = []
    open_units: dict[tuple[int, torch.dtype, torch.device], list[int]] = {}
    open_bytes: dict[tuple[int, torch.dtype, torch.device], int] = {}
    for i, (param, owner) in enumerate(zip(params, owners, strict=True)):
        key = (owner, param.dtype, param.device)
        nbytes = param.numel() * param.element_size()
        unit = open_units.setdefault(key, [])
        if unit and open_bytes[key] + nbytes > cap:
            closed.append(tuple(unit))
            unit = open_units[key] = []
        if not unit:
            open_bytes[key] = 0
        unit.append(i)
        open_bytes[key] += nbytes
    closed.extend(tuple(unit) for unit in open_units.values() if unit)
    closed.sort(key=lambda unit: unit[0])
    return [Bucket(owners[unit[0]], tuple(params[i] for i in unit)) for unit in closed]


def _stage(bucket: Bucket, rank: int) -> tuple[torch.Tensor, bool]:
    """The tensor to broadcast, and whether it is a staging buffer rather than the parameter.

    A lone contiguous parameter is broadcast in place; anything else goes through a flat buffer,
    packed on the owner and left empty (to be received into) elsewhere.
    """
    first = bucket.params[0]
    if len(bucket.params) == 1 and first.is_contiguous():
        return first.detach(), False
    if rank == bucket.owner:
        return torch.cat([p.detach().reshape(-1) for p in bucket.params]), True
    return torch.empty(bucket.numel, dtype=first.dtype, device=first.device), True


def _unstage(bucket: Bucket, flat: torch.Tensor) -> None:
    """Copy a received flat buffer back into the bucket's parameters."""
    chunks = flat.split([p.numel() for p in bucket.params])
    for param, chunk in zip(bucket.params, chunks, strict=True):
        param.detach().copy_(chunk.view_as(param))


@torch.no_grad()
def broadcast_buckets(
    buckets: Sequence[Bucket],
    *,
    rank: int,
    group: dist.ProcessGroup | None = None,
) -> None:
    """Broadcast every bucket from its owner so all ranks of ``group`` end with the owner's values.

    Collective: every rank of ``group`` must call it with the same buckets (see
    :func:`plan_buckets`). Broadcasts are issued asynchronously, at most ``_MAX_IN_FLIGHT``
    staged buckets at a time; the function returns once every parameter holds its owner's values.

    Args:
        buckets: the plan from :func:`plan_buckets`.
        rank: this process's rank in ``group``.
        group: the process group; ``None`` for the default (world) group.
    """
    in_flight: deque[tuple[Bucket, torch.Tensor, bool, dist.Work]] = deque()

    def finish_oldest() -> None:
        bucket, flat, staged, work = in_flight.popleft()
        work.wait()
        if staged and rank != bucket.owner:
            _unstage(bucket, flat)

    for bucket in buckets:
        flat, staged = _stage(bucket, rank)
        work = dist.broadcast(flat, group=group, group_src=bucket.owner, async_op=True)
        in_flight.append((bucket, flat, staged, work))
        if len(in_flight) > _MAX_IN_FLIGHT:
            finish_oldest()
    while in_flight:
        finish_oldest()

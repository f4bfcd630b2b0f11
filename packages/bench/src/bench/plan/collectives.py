"""What a collective costs on a ring of devices: bytes each device sends, and its time.

The handout's idealised setting (CS336 spring 2026, §8.1): N devices, every pair linked, each device
sending W bytes per second (its egress bandwidth). A tensor of S bytes in all:

- ring all-gather: N − 1 steps, each device sends a chunk of S/N bytes per step, so
  `(N − 1)/N · S` bytes and `(N − 1)/N · S / W` seconds;
- ring reduce-scatter: the same chunks passed round with a partial sum added, the same cost;
- ring all-reduce: a reduce-scatter then an all-gather, `2 (N − 1)/N · S` bytes;
- broadcast from one owner (pipelined along the ring): every device but the last forwards the
  whole tensor once, `(N − 1)/N · S` bytes per device on average when each of the N devices
  owns 1/N of what is broadcast (ZeRO-1's parameter broadcast), as an all-gather;
- the handout's *alternate* ring all-reduce (each device forwards whole tensors instead of
  chunks): `(N − 1) · S` bytes, N/2 times the ring all-reduce.

`W` is what nccl-tests calls the bus bandwidth: its `busbw` is defined so that an all-reduce of S
bytes takes `2 (N − 1)/N · S / busbw` (and an all-gather `(N − 1)/N · S / busbw`), so a measured
bus bandwidth is this W. The defaults below are such measurements, one per ring size, cited.

Example::

    >>> ring_all_reduce_bytes(8e9, 2)       # 8 GB of gradients on 2 devices
    8000000000.0
    >>> Collective("all-reduce", "gradients", 8e9, 2).seconds() * 1e3  # ms at W measured for N = 2
    24.74...
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BANDWIDTH_RESULT",
    "BANDWIDTH_SOURCE",
    "COLLECTIVES",
    "DEFAULT_BANDWIDTH_GBPS",
    "MEASURED_BANDWIDTH_GBPS",
    "MEASURED_BANDWIDTH_SOURCE",
    "Collective",
    "alternate_ring_all_reduce_bytes",
    "alternate_ring_all_reduce_seconds",
    "measured_bandwidth_gbps",
    "ring_all_gather_bytes",
    "ring_all_gather_seconds",
    "ring_all_reduce_bytes",
    "ring_all_reduce_seconds",
    "ring_reduce_scatter_bytes",
    "ring_reduce_scatter_seconds",
]

# Per-device egress bandwidth W in GB/s (1e9 bytes per second), by ring size N: the bus bandwidth
# of the 1,000 MB NCCL all-reduce (the largest message measured) on 2 and on 4 H200s (NVLink), from
# `bench-allreduce --backend nccl gloo --nproc 2 4 --full` on 2026-11-28; a ring of another size
# takes one of them (`measured_bandwidth_gbps`).
BANDWIDTH_RESULT = "docs/results/allreduce_4xh200_2026-11-28.json"
MEASURED_BANDWIDTH_GBPS = {2: 323.3, 4: 350.7}
DEFAULT_BANDWIDTH_GBPS = MEASURED_BANDWIDTH_GBPS[2]
BANDWIDTH_SOURCE = f"bus bandwidth of the 1,000 MB NCCL all-reduce on 2 H200s ({BANDWIDTH_RESULT})"
MEASURED_BANDWIDTH_SOURCE = (
    "bus bandwidth of the 1,000 MB NCCL all-reduce at the ring's size: "
    + ", ".join(f"{w:g} GB/s on {n} H200s" for n, w in MEASURED_BANDWIDTH_GBPS.items())
    + f"; other sizes the largest measured one below ({BANDWIDTH_RESULT})"
)

# The collectives a step uses and each one's bytes sent per device, as a multiple of the tensor's
# size S on N devices (the ring algorithms above).
_FACTOR_TEXT = {
    "all-reduce": "2(N-1)/N",
    "all-gather": "(N-1)/N",
    "reduce-scatter": "(N-1)/N",
    "broadcast": "(N-1)/N",
}
COLLECTIVES = tuple(_FACTOR_TEXT)


def _check(size_bytes: float, num_devices: int) -> None:
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
        raise ValueError(f"num_devices must be a positive integer, got {num_devices!r}")
    if not size_bytes >= 0:
        raise ValueError(f"size_bytes must be >= 0, got {size_bytes!r}")


def _seconds(sent_bytes: float, bandwidth: float) -> float:
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be positive (bytes per second), got {bandwidth!r}")
    return sent_bytes / bandwidth


def measured_bandwidth_gbps(num_devices: int) -> float:
    """W measured for a ring of `num_devices`: `MEASURED_BANDWIDTH_GBPS` at that size, else at the
    largest measured size below it (the smallest measured for one device, which sends nothing).

    At 1,000 MB the 4-ring measured the higher bus bandwidth of the two, so the size below errs
    toward slower communication for a ring not measured.
    """
    _check(0.0, num_devices)
    below = [n for n in MEASURED_BANDWIDTH_GBPS if n <= num_devices]
    return MEASURED_BANDWIDTH_GBPS[max(below) if below else min(MEASURED_BANDWIDTH_GBPS)]


def ring_all_gather_bytes(size_bytes: float, num_devices: int) -> float:
    """Bytes each device sends in a ring all-gather of `size_bytes` in all: `(N − 1)/N · S`."""
    _check(size_bytes, num_devices)
    return (num_devices - 1) / num_devices * size_bytes


def ring_reduce_scatter_bytes(size_bytes: float, num_devices: int) -> float:
    """Bytes each device sends in a ring reduce-scatter of S bytes: `(N − 1)/N · S`."""
    return ring_all_gather_bytes(size_bytes, num_devices)


def ring_all_reduce_bytes(size_bytes: float, num_devices: int) -> float:
    """Bytes each device sends in a ring all-reduce (a reduce-scatter, an all-gather):
    `2(N − 1)/N · S`."""
    return 2 * ring_all_gather_bytes(size_bytes, num_devices)


def alternate_ring_all_reduce_bytes(size_bytes: float, num_devices: int) -> float:
    """Bytes each device sends in the handout's alternate all-reduce: `(N − 1) · S`.

    In each of its N − 1 steps every device forwards one whole input tensor `x(j)` (S bytes) to
    its neighbour and adds the one it receives, instead of an S/N chunk as the ring does.
    """
    _check(size_bytes, num_devices)
    return (num_devices - 1) * size_bytes


def ring_all_gather_seconds(size_bytes: float, num_devices: int, bandwidth: float) -> float:
    """`(N − 1)/N · S / W`: a ring all-gather of S bytes at W bytes/s egress per device."""
    return _seconds(ring_all_gather_bytes(size_bytes, num_devices), bandwidth)


def ring_reduce_scatter_seconds(size_bytes: float, num_devices: int, bandwidth: float) -> float:
    """`(N − 1)/N · S / W`: a ring reduce-scatter of S bytes at W bytes/s egress per device."""
    return _seconds(ring_reduce_scatter_bytes(size_bytes, num_devices), bandwidth)


def ring_all_reduce_seconds(size_bytes: float, num_devices: int, bandwidth: float) -> float:
    """`2(N − 1)/N · S / W`: a ring all-reduce of S bytes at W bytes/s egress per device."""
    return _seconds(ring_all_reduce_bytes(size_bytes, num_devices), bandwidth)


def alternate_ring_all_reduce_seconds(
    size_bytes: float, num_devices: int, bandwidth: float
) -> float:
    """`(N − 1) · S / W`: the handout's alternate all-reduce (§8.1), N/2 times the ring's time."""
    return _seconds(alternate_ring_all_reduce_bytes(size_bytes, num_devices), bandwidth)


@dataclass(frozen=True)
class Collective:
    """One collective of a training step, as one device sees it.

    Attributes:
        kind: one of `COLLECTIVES`.
        what: what it carries, in words (`"gradients (fp32)"`).
        size_bytes: S, the size of the whole tensor (what an all-gather ends with, what an
            all-reduce or reduce-scatter starts with on each device).
        num_devices: N, the devices on the ring (the size of the mesh axis it runs over).
        count: how many times per step it runs (e.g. two all-reduces per block per pass).
        axis: the mesh axis (`"dp"` or `"tp"`), so that a 2-D layout can overlap the two.

    Raises:
        ValueError: an unknown kind, a negative size, or a device count or count below 1.
    """

    kind: str
    what: str
    size_bytes: float
    num_devices: int
    count: int = 1
    axis: str = "dp"

    def __post_init__(self) -> None:
        if self.kind not in COLLECTIVES:
            raise ValueError(f"kind must be one of {COLLECTIVES}, got {self.kind!r}")
        _check(self.size_bytes, self.num_devices)
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 0:
            raise ValueError(f"count must be a non-negative integer, got {self.count!r}")

    @property
    def sent_bytes(self) -> float:
        """Bytes each device sends, all `count` calls together."""
        per_call = ring_all_gather_bytes(self.size_bytes, self.num_devices)
        return self.count * (2 * per_call if self.kind == "all-reduce" else per_call)

    def seconds(self, bandwidth_gbps: float | None = None) -> float:
        """Time of all `count` calls at `bandwidth_gbps` GB/s egress per device (no latency); None:
        the bandwidth measured for this ring's size (`measured_bandwidth_gbps`)."""
        if bandwidth_gbps is None:
            bandwidth_gbps = measured_bandwidth_gbps(self.num_devices)
        return _seconds(self.sent_bytes, bandwidth_gbps * 1e9)

    @property
    def formula(self) -> str:
        """The cost as text: `count × factor × S` with S in bytes."""
        times = f"{self.count} × " if self.count != 1 else ""
        return (
            f"{times}{_FACTOR_TEXT[self.kind]} × S, S = {self.size_bytes:,.0f} B, "
            f"N = {self.num_devices}"
        )

"""When does parallelism become communication-bound? The handout's §8 analysis of one FFN layer.

The setting of CS336 spring 2026, §8.2–8.5: one feed-forward layer

    x1 = x W1,   x2 = x W2,   z = f(x1) * x2,   y = z W3

with x of shape (B, D), W1 and W2 (D, F), W3 (F, D) (F is D_FF), every weight and activation in
FP16 (2 bytes), devices computing at C FLOP/s and sending W bytes/s, a matmul (a, b)(b, c) costing
2abc FLOPs, non-matmul work ignored. Communication is overlapped with computation, so a strategy
is communication-bound when its communication time exceeds its computation time. Collectives are
the ring algorithms of `bench.plan.collectives`.

Note the names: the handout's W1, W2 are the two input projections and W3 the output one;
`lmcore.SwiGLU` calls them w1, w3 (inputs) and w2 (output).

Each quantity is a `Derivation`: its value for the given numbers, the formula, and a sentence of
justification, so a report can print the answer a student would write beside the number.

Example::

    >>> s = FFNSetting(batch=1024, d_model=4096, d_ff=11008, flops_per_s=800e12,
    ...                bandwidth=320e9)
    >>> calcs = data_parallel(s, num_devices=8)
    >>> calcs.backward_flops.formula
    '12·B·D·F / N'
    >>> data_parallel_max_devices(s).formula
    'N ≤ 1 + B·W/C'
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.plan.collectives import (
    ring_all_gather_seconds,
    ring_all_reduce_seconds,
    ring_reduce_scatter_seconds,
)

__all__ = [
    "Derivation",
    "FFNSetting",
    "ParallelCalcs",
    "data_parallel",
    "data_parallel_max_devices",
    "fsdp",
    "fsdp_max_devices",
    "fsdp_tp",
    "fsdp_tp_max_devices",
    "tensor_parallel",
    "tensor_parallel_backward_equations",
    "tensor_parallel_max_devices",
]


@dataclass(frozen=True)
class Derivation:
    """A derived quantity: its value, the formula that gives it, and why.

    Attributes:
        value: the number for the setting given (FLOPs, seconds or a device count).
        formula: the formula in the handout's symbols (B, D, F, N, C, W).
        why: a one-sentence justification.
    """

    value: float
    formula: str
    why: str


@dataclass(frozen=True)
class FFNSetting:
    """The numbers of the handout's §8 setting.

    Args:
        batch: B, rows of x (tokens) in the whole batch.
        d_model: D.
        d_ff: F (D_FF).
        flops_per_s: C, each device's matmul throughput in FLOP/s.
        bandwidth: W, each device's egress bandwidth in bytes/s.
        bytes_per_value: bytes per weight or activation (the handout's FP16: 2).

    Raises:
        ValueError: a value is not positive.
    """

    batch: int
    d_model: int
    d_ff: int
    flops_per_s: float
    bandwidth: float
    bytes_per_value: int = 2

    def __post_init__(self) -> None:
        for name in ("batch", "d_model", "d_ff", "flops_per_s", "bandwidth", "bytes_per_value"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")

    @property
    def weight_bytes(self) -> float:
        """Bytes of W1, W2 and W3 together: `3·D·F·bytes`."""
        return 3 * self.d_model * self.d_ff * self.bytes_per_value

    @property
    def matmul_flops(self) -> float:
        """FLOPs of one (B, D)·(D, F) matmul: `2·B·D·F`."""
        return 2 * self.batch * self.d_model * self.d_ff


@dataclass(frozen=True)
class ParallelCalcs:
    """Per-device FLOPs and communication time of one strategy on the FFN layer.

    Attributes:
        strategy: `"DP"`, `"FSDP"`, `"TP"` or `"FSDP+TP"`.
        forward_flops, backward_flops: FLOPs per device.
        forward_comm_s, backward_comm_s: communication time per device in seconds.
        flops_per_s: C, to turn FLOPs into compute time.
    """

    strategy: str
    forward_flops: Derivation
    backward_flops: Derivation
    forward_comm_s: Derivation
    backward_comm_s: Derivation
    flops_per_s: float

    def compute_s(self, direction: str) -> float:
        """Compute time in seconds of the `"forward"` or `"backward"` pass."""
        return getattr(self, f"{direction}_flops").value / self.flops_per_s

    def communication_bound(self, direction: str) -> bool:
        """Whether the `"forward"` or `"backward"` pass communicates longer than it computes."""
        return getattr(self, f"{direction}_comm_s").value > self.compute_s(direction)


def _check_devices(**counts: int) -> None:
    for name, n in counts.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a positive integer, got {n!r}")


def _compute(s: FFNSetting, matmuls: int, n: int, what: str) -> Derivation:
    return Derivation(matmuls * s.matmul_flops / n, f"{2 * matmuls}·B·D·F / N", what)


_FORWARD_WHY = "three (B/N, D)·(D, F)-sized matmuls, 2·(B/N)·D·F FLOPs each"
_BACKWARD_WHY = (
    "each of the three matmuls needs two in backward (the input's gradient and the weight's: "
    "dz = dy W3ᵀ, dW3 = zᵀ dy, dx = dx1 W1ᵀ + dx2 W2ᵀ, dW1 = xᵀ dx1, dW2 = xᵀ dx2), twice the "
    "forward"
)


def data_parallel(setting: FFNSetting, num_devices: int) -> ParallelCalcs:
    """§8.2 (data_parallel_calcs (a), (b)): batch split N ways, gradients all-reduced.

    Args:
        setting: the FFN and the hardware.
        num_devices: N_DP.
    """
    _check_devices(num_devices=num_devices)
    s, n = setting, num_devices
    return ParallelCalcs(
        "DP",
        _compute(s, 3, n, _FORWARD_WHY),
        _compute(s, 6, n, _BACKWARD_WHY),
        Derivation(0.0, "0", "the forward pass needs no collective: each device has every weight"),
        Derivation(
            ring_all_reduce_seconds(s.weight_bytes, n, s.bandwidth),
            "2(N-1)/N · 3·D·F·2 / W = 12·D·F·(N-1) / (N·W)",
            "one ring all-reduce of the three weight gradients, 3·D·F values of 2 bytes",
        ),
        s.flops_per_s,
    )


def data_parallel_max_devices(setting: FFNSetting) -> Derivation:
    """§8.2 (c): the largest N_DP before the backward pass is communication-bound.

    `12·B·D·F/(N·C) ≥ 12·D·F·(N−1)/(N·W)` gives `N ≤ 1 + B·W/C`.
    """
    s = setting
    return Derivation(
        1 + s.batch * s.bandwidth / s.flops_per_s,
        "N ≤ 1 + B·W/C",
        "compute 12·B·D·F/(N·C) must cover the all-reduce 12·D·F·(N-1)/(N·W); D·F and N cancel, "
        "leaving (N-1)/W ≤ B/C",
    )


def fsdp(setting: FFNSetting, num_devices: int) -> ParallelCalcs:
    """§8.3 (fsdp_calcs (a), (b)): DP's batch split, with each weight sharded N ways.

    Forward: all-gather the three weights. Backward: all-gather them again, then reduce-scatter
    their gradients (each device keeps only its shard's).
    """
    _check_devices(num_devices=num_devices)
    s, n = setting, num_devices
    gather = ring_all_gather_seconds(s.weight_bytes, n, s.bandwidth)
    scatter = ring_reduce_scatter_seconds(s.weight_bytes, n, s.bandwidth)
    return ParallelCalcs(
        "FSDP",
        _compute(s, 3, n, _FORWARD_WHY + ", exactly as in DP (the weights are gathered first)"),
        _compute(s, 6, n, _BACKWARD_WHY + ", exactly as in DP"),
        Derivation(
            gather,
            "(N-1)/N · 6·D·F / W",
            "one ring all-gather of the three weights (3·D·F values of 2 bytes)",
        ),
        Derivation(
            gather + scatter,
            "2 · (N-1)/N · 6·D·F / W = 12·D·F·(N-1) / (N·W)",
            "the weights are all-gathered again and the gradients reduce-scattered, each "
            "(N-1)/N · 6·D·F bytes",
        ),
        s.flops_per_s,
    )


def fsdp_max_devices(setting: FFNSetting) -> tuple[Derivation, Derivation]:
    """§8.3 (c): the largest N_FSDP for the (backward, forward) pass to stay compute-bound.

    Backward `12·B·D·F/(N·C) ≥ 12·D·F·(N−1)/(N·W)`, forward `6·B·D·F/(N·C) ≥ 6·D·F·(N−1)/(N·W)`:
    both give `N ≤ 1 + B·W/C`, the data-parallel bound, since each pass communicates the weights
    in proportion to its FLOPs.
    """
    s = setting
    value = 1 + s.batch * s.bandwidth / s.flops_per_s
    backward = Derivation(
        value,
        "N ≤ 1 + B·W/C",
        "backward computes 12·B·D·F/N and moves 12·D·F·(N-1)/N bytes (gather + reduce-scatter)",
    )
    forward = Derivation(
        value,
        "N ≤ 1 + B·W/C",
        "forward computes 6·B·D·F/N and moves 6·D·F·(N-1)/N bytes (one all-gather): the same ratio",
    )
    return backward, forward


def tensor_parallel(setting: FFNSetting, num_devices: int) -> ParallelCalcs:
    """§8.4 (tp_calcs (b), (c)): W1, W2 column-parallel, W3 row-parallel, N_TP ways.

    Every device sees the whole batch and a 1/N slice of D_FF; forward ends with an all-reduce of
    y (B, D), backward with an all-reduce of dx (B, D).
    """
    _check_devices(num_devices=num_devices)
    s, n = setting, num_devices
    activation_bytes = s.batch * s.d_model * s.bytes_per_value
    reduce = ring_all_reduce_seconds(activation_bytes, n, s.bandwidth)
    return ParallelCalcs(
        "TP",
        _compute(s, 3, n, "three (B, D)·(D, F/N)-sized matmuls on every device's slice of F"),
        _compute(s, 6, n, "the six backward matmuls, each over the device's slice of F"),
        Derivation(
            reduce,
            "2(N-1)/N · 2·B·D / W = 4·B·D·(N-1) / (N·W)",
            "one all-reduce of the partial outputs y(i), B·D values of 2 bytes",
        ),
        Derivation(
            reduce,
            "2(N-1)/N · 2·B·D / W = 4·B·D·(N-1) / (N·W)",
            "one all-reduce of the partial input gradients dx(i) = dx1(i) W1(i)ᵀ + dx2(i) W2(i)ᵀ",
        ),
        s.flops_per_s,
    )


def tensor_parallel_backward_equations() -> tuple[str, ...]:
    """§8.4 (a): the backward pass of the column/row-parallel FFN on device i, given dy (B, D).

    Every device holds the whole dy (the forward's all-reduce made y the same everywhere), so
    only the input gradient needs a collective.
    """
    return (
        "dz(i) = dy W3(i)ᵀ                      (B, F/N)",
        "dW3(i) = z(i)ᵀ dy                      (F/N, D)",
        "dx2(i) = dz(i) * f(x1(i))              (B, F/N)",
        "dx1(i) = dz(i) * f'(x1(i)) * x2(i)     (B, F/N)",
        "dW2(i) = xᵀ dx2(i)                     (D, F/N)",
        "dW1(i) = xᵀ dx1(i)                     (D, F/N)",
        "dx = all-reduce_i( dx1(i) W1(i)ᵀ + dx2(i) W2(i)ᵀ )   (B, D)",
    )


def tensor_parallel_max_devices(setting: FFNSetting) -> tuple[Derivation, Derivation]:
    """§8.4 (d): the largest N_TP for the (backward, forward) pass to stay compute-bound.

    Backward `12·B·D·F/(N·C) ≥ 4·B·D·(N−1)/(N·W)` gives `N ≤ 1 + 3·F·W/C`; forward
    `6·B·D·F/(N·C) ≥ 4·B·D·(N−1)/(N·W)` gives `N ≤ 1 + 3·F·W/(2·C)`. The batch cancels: TP's
    bound depends on the model's width, not the batch.
    """
    s = setting
    ratio = s.d_ff * s.bandwidth / s.flops_per_s
    return (
        Derivation(
            1 + 3 * ratio,
            "N ≤ 1 + 3·F·W/C",
            "backward computes 12·B·D·F/N against an all-reduce of 4·B·D·(N-1)/N bytes",
        ),
        Derivation(
            1 + 1.5 * ratio,
            "N ≤ 1 + 3·F·W/(2·C)",
            "forward computes 6·B·D·F/N against the same all-reduce, so half the headroom",
        ),
    )


def fsdp_tp(
    setting: FFNSetting, num_fsdp: int, num_tp: int, *, overlap: bool = True
) -> ParallelCalcs:
    """§8.5 (fsdp_tp_calcs (a), (b)): the forward pass on an N_FSDP × N_TP mesh.

    Device (i, j) holds W1, W2 shards (D/N_FSDP, F/N_TP) and W3 (F/N_TP, D/N_FSDP), and the batch
    shard x(j) of B/N_FSDP rows. Forward: all-gather the TP slice of each weight over the FSDP
    axis (6·D·F/N_TP bytes in all), compute, all-reduce y(j) (B/N_FSDP, D) over the TP axis.

    Args:
        setting: the FFN and the hardware.
        num_fsdp, num_tp: the mesh's sides.
        overlap: the two axes' collectives run at the same time (the time is their maximum), or
            share the network (their sum).

    The backward fields hold the forward's mirror image (gather again, reduce-scatter the
    gradients, all-reduce dx over TP), for completeness; the handout asks only about forward.
    """
    _check_devices(num_fsdp=num_fsdp, num_tp=num_tp)
    s, nf, nt = setting, num_fsdp, num_tp
    n = nf * nt
    gather = ring_all_gather_seconds(s.weight_bytes / nt, nf, s.bandwidth)
    reduce = ring_all_reduce_seconds(s.batch / nf * s.d_model * s.bytes_per_value, nt, s.bandwidth)
    combine, word = (max, "max") if overlap else (lambda a, b: a + b, "sum")
    fsdp_term = "(N_FSDP-1)/N_FSDP · 6·D·F/(N_TP·W)"
    tp_term = "4·B·D·(N_TP-1)/(N_TP·N_FSDP·W)"
    scatter = ring_reduce_scatter_seconds(s.weight_bytes / nt, nf, s.bandwidth)
    return ParallelCalcs(
        "FSDP+TP",
        Derivation(
            3 * s.matmul_flops / n,
            "6·B·D·F / (N_FSDP·N_TP)",
            "each device multiplies its B/N_FSDP rows by its F/N_TP columns, three times",
        ),
        Derivation(
            6 * s.matmul_flops / n,
            "12·B·D·F / (N_FSDP·N_TP)",
            "twice the forward, as in every strategy",
        ),
        Derivation(
            combine(gather, reduce),
            f"{word}({fsdp_term}, {tp_term})",
            "an all-gather of the TP slice of the weights over the FSDP axis and an all-reduce "
            "of the batch shard's output over the TP axis"
            + (", overlapped" if overlap else ", one after the other"),
        ),
        Derivation(
            combine(gather + scatter, reduce),
            f"{word}(2 · {fsdp_term}, {tp_term})",
            "gather again and reduce-scatter over FSDP; all-reduce dx over TP",
        ),
        s.flops_per_s,
    )


def fsdp_tp_max_devices(setting: FFNSetting, *, overlap: bool = True) -> Derivation:
    """§8.5 (c) (overlapped axes) and (d) (shared network): the largest N = N_FSDP·N_TP.

    Overlapped: each axis must hide behind the compute on its own. FSDP: `6·D·F/(N_TP·W)·
    (N_FSDP−1)/N_FSDP ≤ 6·B·D·F/(N·C)` gives `N_FSDP ≤ 1 + B·W/C`; TP: `4·B·D/(N_FSDP·W)·
    (N_TP−1)/N_TP ≤ 6·B·D·F/(N·C)` gives `N_TP ≤ 1 + 3·F·W/(2·C)`; so
    `N ≤ (1 + B·W/C)(1 + 3·F·W/(2·C)) ≈ 3·B·F·W²/(2·C²)`.

    Shared network (taking (N−1)/N ≈ 1, as the handout allows): `6·D·F/(N_TP·W) +
    4·B·D/(N_FSDP·W) ≤ 6·B·D·F/(N·C)`, i.e. `3·F·N_FSDP + 2·B·N_TP ≤ 3·B·F·W/C`. The product
    N_FSDP·N_TP under a fixed sum of the two terms is largest when they are equal:
    `N_FSDP = B·W/(2·C)`, `N_TP = 3·F·W/(4·C)`, `N ≤ 3·B·F·W²/(8·C²)`, a quarter of the
    overlapped bound.
    """
    s = setting
    bw_c = s.batch * s.bandwidth / s.flops_per_s
    fw_c = s.d_ff * s.bandwidth / s.flops_per_s
    if overlap:
        return Derivation(
            (1 + bw_c) * (1 + 1.5 * fw_c),
            "N ≤ (1 + B·W/C)·(1 + 3·F·W/(2·C)) ≈ 3·B·F·W²/(2·C²)",
            f"N_FSDP ≤ 1 + B·W/C = {1 + bw_c:,.1f} hides the weight all-gather and "
            f"N_TP ≤ 1 + 3·F·W/(2·C) = {1 + 1.5 * fw_c:,.1f} the activation all-reduce, each on "
            "its own axis",
        )
    return Derivation(
        0.375 * bw_c * fw_c,
        "N ≤ 3·B·F·W²/(8·C²), at N_FSDP = B·W/(2·C), N_TP = 3·F·W/(4·C)",
        f"3·F·N_FSDP + 2·B·N_TP ≤ 3·B·F·W/C; the product is largest with both terms equal: "
        f"N_FSDP = {bw_c / 2:,.1f}, N_TP = {0.75 * fw_c:,.1f}",
    )

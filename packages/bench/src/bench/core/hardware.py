"""Peak arithmetic throughput of known GPUs, for model FLOP utilisation (MFU).

Dense (no structured sparsity) matmul peaks from NVIDIA's data sheets, by the number format the
matmuls run in: `bf16`/`fp16` on tensor cores, `tf32` when fp32 matmuls are allowed to use TF32
(`torch.backends.cuda.matmul.allow_tf32`), plain `fp32` otherwise (PyTorch's default). MFU is
only reported for devices in this table, and the assumed peak travels with the result.
"""

from __future__ import annotations

import torch

__all__ = [
    "MEASURED_MATMUL_TFLOPS",
    "PEAK_TFLOPS",
    "matmul_ceiling",
    "matmul_format",
    "peak_tflops",
]

# (name fragment, {format: dense TFLOP/s}); the first fragment found in the device name wins,
# so the more specific names come first.
PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2}),
    ("H100 NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # SXM5
    ("H200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
)

# Matmul throughput measured on this project's GPUs (not a data sheet's): the best of three runs
# of a bf16 8192³ torch.matmul on an H100 80GB HBM3
# (docs/results/matmul_ceiling_h100_2026-11-23.json).
MEASURED_MATMUL_TFLOPS: dict[str, dict[str, float]] = {"H100": {"bf16": 800.9}}


def matmul_format(dtype: torch.dtype) -> str:
    """The format matmuls in `dtype` (the autocast dtype, or the parameters') run in on CUDA."""
    if dtype == torch.bfloat16:
        return "bf16"
    if dtype == torch.float16:
        return "fp16"
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"


def peak_tflops(device_name: str, fmt: str) -> float | None:
    """The dense peak TFLOP/s of `device_name` for matmuls in `fmt`, or None if unknown."""
    for fragment, peaks in PEAK_TFLOPS:
        if fragment.lower() in device_name.lower():
            return peaks.get(fmt)
    return None


def matmul_ceiling(device_name: str, fmt: str) -> tuple[float, str] | None:
    """The matmul rate MFU is taken against: `(TFLOP/s, where it comes from)`, or None.

    The rate measured on this project's GPUs (`MEASURED_MATMUL_TFLOPS`, matched by name, the
    more specific names first as in `PEAK_TFLOPS`) where there is one for `fmt`, else the data
    sheet's dense peak (`peak_tflops`); None for a device in neither table.
    """
    for fragment, _ in PEAK_TFLOPS:
        if fragment.lower() in device_name.lower():
            measured = MEASURED_MATMUL_TFLOPS.get(fragment, {}).get(fmt)
            if measured is not None:
                return measured, f"measured {fmt} matmul ceiling of the {fragment}"
            break
    peak = peak_tflops(device_name, fmt)
    return None if peak is None else (peak, f"data-sheet dense {fmt} peak")

"""Known GPUs: their memory, compute capability and peak arithmetic throughput, for model FLOP
utilisation (MFU) and for bench-plan's question "what fits on this GPU".

Dense (no structured sparsity) matmul peaks from NVIDIA's data sheets, by the number format the
matmuls run in: `bf16`/`fp16` on tensor cores, `tf32` when fp32 matmuls are allowed to use TF32
(`torch.backends.cuda.matmul.allow_tf32`), plain `fp32` otherwise (PyTorch's default). A format a
GPU lacks (the T4 has no bf16 and no TF32), or one its data sheet does not give, is absent: MFU is
only reported where the peak is known, and the assumed peak travels with the result. Where a data
sheet quotes rates "with sparsity", the dense rate is half of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = [
    "GPU",
    "GPUS",
    "MEASURED_MATMUL_TFLOPS",
    "find_gpu",
    "gpu_named",
    "matmul_format",
    "peak_tflops",
]


@dataclass(frozen=True)
class GPU:
    """One GPU model as its data sheet describes it.

    Attributes:
        name: the short name bench-plan's `--gpu` takes (`T4`, `A100-80GB`).
        match: words that must all appear in a device name (`torch.cuda.get_device_name`, split
            at every non-alphanumeric character, case ignored) for the name to be this GPU.
        memory_gb: device memory in GB (10^9 bytes), as the data sheet states it.
        capability: the CUDA compute capability (major, minor).
        peaks: dense matmul TFLOP/s by format (`bf16`, `fp16`, `tf32`, `fp32`).
        source: where the numbers come from.
    """

    name: str
    match: tuple[str, ...]
    memory_gb: float
    capability: tuple[int, int]
    peaks: dict[str, float] = field(default_factory=dict)
    source: str = ""

    @property
    def memory_bytes(self) -> int:
        """Device memory in bytes."""
        return int(self.memory_gb * 1e9)

    def tflops(self, fmt: str) -> float:
        """The dense peak TFLOP/s for matmuls in `fmt` (`bf16`, `fp16`, `tf32`, `fp32`).

        Raises:
            ValueError: the GPU lacks the format, or its data sheet gives no rate for it.
        """
        if fmt not in self.peaks:
            known = ", ".join(self.peaks) or "none"
            raise ValueError(
                f"no {fmt} matmul rate for the {self.name} (its data sheet's formats: {known}); "
                "choose another precision, or give --tflops"
            )
        return self.peaks[fmt]

    def matches(self, device_name: str) -> bool:
        """Whether `device_name` names this GPU (see `match`)."""
        return set(self.match) <= _words(device_name)


_H100_SXM = {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}
_A100 = {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}
_A100_SHEET = (
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
    "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
)

# The first GPU whose words all appear in a device name wins, so the more specific come first
# (the H100 PCIe and NVL before the SXM's plain "H100"; the A100 80GB before the 40GB).
GPUS: tuple[GPU, ...] = (
    GPU("H100-PCIe", ("h100", "pcie"), 80, (9, 0),
        {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2},
        "https://www.nvidia.com/en-us/data-center/h100/"),
    GPU("H100-NVL", ("h100", "nvl"), 94, (9, 0),
        {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
        "https://www.nvidia.com/en-us/data-center/h100/"),
    GPU("H100", ("h100",), 80, (9, 0), _H100_SXM,  # SXM5
        "https://www.nvidia.com/en-us/data-center/h100/"),
    # The H200's tensor cores and clocks are the H100 SXM's; its memory is larger.
    GPU("H200", ("h200",), 141, (9, 0), _H100_SXM,
        "https://www.nvidia.com/en-us/data-center/h200/"),
    # HGX B200 (8 GPUs): 36 PFLOPS bf16/fp16 and 18 PFLOPS TF32 with sparsity, 1,440 GB in all;
    # the page gives no plain fp32 rate.
    GPU("B200", ("b200",), 180, (10, 0), {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1125.0},
        "https://www.nvidia.com/en-us/data-center/hgx/"),
    GPU("A100-80GB", ("a100", "80gb"), 80, (8, 0), _A100, _A100_SHEET),
    GPU("A100-40GB", ("a100",), 40, (8, 0), _A100, _A100_SHEET),
    # 242 TFLOPS bf16/fp16 and 120 TF32 with sparsity.
    GPU("L4", ("l4",), 24, (8, 9), {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
        "https://www.nvidia.com/en-us/data-center/l4/"),
    # The tensor-core rates with fp32 accumulation (PyTorch's), half of fp16 accumulation's on
    # GeForce cards: Ada whitepaper, appendix table 2.
    GPU("RTX-4090", ("rtx", "4090"), 24, (8, 9),
        {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6},
        "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"),
    # AWS's variant of the A10 (G5 instances). NVIDIA publishes no data sheet for it and its
    # tensor-core rates differ from the A10's, so no peak is assumed (no MFU on an A10G).
    GPU("A10G", ("a10g",), 24, (8, 6), {},
        "https://aws.amazon.com/ec2/instance-types/g5/ (memory); no NVIDIA data sheet"),
    # Turing: fp16 tensor cores ("mixed precision (FP16/FP32)"), no bf16 and no TF32.
    GPU("T4", ("t4",), 16, (7, 5), {"fp16": 65.0, "fp32": 8.1},
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/"
        "t4-tensor-core-datasheet-951643.pdf"),
)  # fmt: skip

# Matmul throughput measured on this project's GPUs (not a data sheet's): the best of three runs
# of a bf16 8192³ torch.matmul on an H100 80GB HBM3
# (docs/results/matmul_ceiling_h100_2026-11-23.json).
MEASURED_MATMUL_TFLOPS: dict[str, dict[str, float]] = {"H100": {"bf16": 800.9}}


def _words(text: str) -> set[str]:
    return {w for w in "".join(c if c.isalnum() else " " for c in text.lower()).split()}


def find_gpu(device_name: str) -> GPU | None:
    """The GPU `device_name` names (`torch.cuda.get_device_name`), or None if unknown."""
    return next((gpu for gpu in GPUS if gpu.matches(device_name)), None)


def gpu_named(name: str) -> GPU:
    """The GPU of a short name (`T4`, `a100-80gb`; case ignored).

    Raises:
        ValueError: an unknown name; the message lists the known ones.
    """
    for gpu in GPUS:
        if gpu.name.lower() == name.lower():
            return gpu
    raise ValueError(f"unknown GPU {name!r}; choose one of {', '.join(g.name for g in GPUS)}")


def matmul_format(dtype: torch.dtype) -> str:
    """The format matmuls in `dtype` (the autocast dtype, or the parameters') run in on CUDA.
    (torch is imported here: the command lines read the table without it.)"""
    import torch

    if dtype == torch.bfloat16:
        return "bf16"
    if dtype == torch.float16:
        return "fp16"
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"


def peak_tflops(device_name: str, fmt: str) -> float | None:
    """The dense peak TFLOP/s of `device_name` for matmuls in `fmt`, or None if unknown."""
    gpu = find_gpu(device_name)
    return None if gpu is None else gpu.peaks.get(fmt)

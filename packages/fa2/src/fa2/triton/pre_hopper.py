"""Tile tables for GPUs before Hopper: compiled, not timed.

`fa2.triton.configs` chooses tiles from its tables, which H100 sweeps chose (sm_90, and what
comes after it); on an older GPU `choose_tile` reads the table of its architecture here
instead, by the device's compute capability (`architecture`). No GPU of these architectures has
timed them: each list's first tile is the one that compiles for the architecture (Triton 3.6 and
its ptxas, on a CPU) without spilling registers, or spilling least, within the shared memory the
architecture's smallest GPU gives a block; the others are candidates for FA2_AUTOTUNE=1 to time
on the GPU itself. What each tile compiles to (registers, spills, shared memory) is
`docs/results/fa2_pre_hopper_compile_cpu_2026-11-28.md`, made by
`packages/fa2/scripts/sm90_screen.py --target 75` and `--target 80`; the CI test
`tests/test_pre_hopper_compile.py` compiles the defaults of the common cases.

- `sm80`: compute capability 8.x (A100: sm_80; A10G, RTX 30xx: sm_86; L4, RTX 4090: sm_89).
  Tensor cores for fp16, bf16 and TF32; no TMA (a `+TMA` tile would read through plain
  loads). Shared memory per block: 163 KB on sm_80, 99 KB on sm_86 and sm_89, so the lists
  keep to 99 KB, but for fp32 at head dims above 128 without determinism (the single pass,
  which only an sm_80 holds: see the result file).
- `sm75`: compute capability 7.x (T4). Turing has fp16 tensor cores (no bf16, no TF32), but
  Triton 3.6 no longer lowers `tl.dot` to them below sm_80: it compiles every dot to FMA on
  the CUDA cores ("Dot op using MMA for compute capability 75 has been deprecated. It falls
  back to the FMA path."). Correct, and slow: on a T4 torch's SDPA is the faster attention.
  Small tiles keep the FMA accumulators in registers; 64 KB of shared memory per block, which
  every kernel keeps to but fp32's dK/dV and single pass at head dims above 128 (a 16-row tile
  of float32 rows of 256 is 65 KB: no tile fits; use fp16, or the PyTorch path).

The families are `configs`'s (`16bit`, `tf32`, `32bit` by head-dim block); head dims up to 32
read the d64 lists, as on Hopper.
"""

from __future__ import annotations

from fa2.triton.configs import Tile

__all__ = ["SHARED_MEMORY", "TABLES", "architecture"]

# Bytes of shared memory one block may take, per architecture class its smallest GPU's (the
# CUDA C++ Programming Guide's "Technical Specifications per Compute Capability": 64 KB on 7.5,
# 163 KB on 8.0, 99 KB on 8.6 and 8.9).
SHARED_MEMORY = {"sm80": 99 * 1024, "sm75": 64 * 1024}


def architecture(capability: tuple[int, int] | None) -> str | None:
    """The table class of a compute capability: `sm80` for 8.x, `sm75` for 7.x; None for
    Hopper and newer (and for no CUDA device), whose tiles are `configs`'s own."""
    if capability is None or capability[0] >= 9:
        return None
    return "sm80" if capability[0] == 8 else "sm75"


# --- sm_8x: tensor cores, 99 KB ------------------------------------------------------------
_T = Tile
_SM80_FP32_D64 = [_T(32, 32, 4, 2)]  # tf32x3 and exact fp32 alike
_SM80_FP32_D128 = [_T(16, 16, 4, 2)]  # 32x32 spills at d128 in tf32x3
_SM80_FP32_D256 = [_T(16, 16, 4, 1)]
_SM80 = {
    "forward": {
        "16bit_d64": [_T(128, 64, 8, 3), _T(64, 64, 4, 3)],
        "16bit_d128": [_T(128, 64, 8, 2), _T(64, 64, 4, 2)],
        "16bit_d256": [_T(32, 32, 4, 2)],
        "tf32_d64": _SM80_FP32_D64,
        "tf32_d128": _SM80_FP32_D128,
        "tf32_d256": _SM80_FP32_D256,
    },
    "dq": {
        "16bit_d64": [_T(64, 64, 4, 3), _T(128, 64, 8, 2)],
        "16bit_d128": [_T(64, 32, 4, 3), _T(64, 64, 4, 2)],
        "16bit_d256": [_T(32, 16, 4, 2)],
        "tf32_d64": _SM80_FP32_D64,
        "tf32_d128": _SM80_FP32_D128,
        "tf32_d256": _SM80_FP32_D256,
    },
    "dkdv": {
        "16bit_d64": [_T(32, 64, 4, 3), _T(64, 64, 4, 2)],
        "16bit_d128": [_T(32, 64, 4, 3), _T(16, 64, 4, 2)],
        "16bit_d256": [_T(16, 32, 4, 2)],
        "tf32_d64": _SM80_FP32_D64,
        "tf32_d128": _SM80_FP32_D128,
        "tf32_d256": _SM80_FP32_D256,
    },
    "single-pass": {
        "16bit_d64": [_T(32, 64, 4, 2), _T(64, 64, 4, 3)],
        "16bit_d128": [_T(16, 64, 4, 2), _T(32, 64, 4, 2)],
        "16bit_d256": [_T(16, 32, 4, 2)],
        "tf32_d64": _SM80_FP32_D64,
        "tf32_d128": _SM80_FP32_D128,
        "tf32_d256": _SM80_FP32_D256,
    },
}

# --- sm_7x: FMA on the CUDA cores, 64 KB --------------------------------------------------
_SM75_D64 = {"forward": [_T(32, 32, 4, 2)], "dq": [_T(32, 16, 4, 2)],
             "dkdv": [_T(16, 32, 4, 2)], "single-pass": [_T(16, 32, 4, 2)]}  # fmt: skip
_SM75_D128 = [_T(16, 16, 4, 2)]  # the backward's fewest spills at d128
_SM75_D256 = [_T(16, 16, 4, 1)]
_SM75 = {
    kernel: {
        "16bit_d64": _SM75_D64[kernel],
        "16bit_d128": [_T(32, 16, 4, 2)] if kernel == "forward" else _SM75_D128,
        "16bit_d256": _SM75_D256,
        "tf32_d64": [_T(32, 16, 4, 2)] if kernel in ("forward", "dq") else _SM75_D64[kernel],
        "tf32_d128": _SM75_D128,
        "tf32_d256": _SM75_D256,
    }
    for kernel in ("forward", "dq", "dkdv", "single-pass")
}


def _with_exact_fp32(lists: dict[str, list[Tile]]) -> dict[str, list[Tile]]:
    """Exact fp32 ("ieee", the `32bit` families) takes the tf32 lists: on sm_8x its FMA tiles
    need no more shared memory than tf32x3's."""
    return lists | {k.replace("tf32", "32bit"): v for k, v in lists.items() if "tf32" in k}


# By architecture class, then kernel (`configs.KERNELS`' names), then family.
TABLES = {
    arch: {kernel: _with_exact_fp32(lists) for kernel, lists in table.items()}
    for arch, table in (("sm80", _SM80), ("sm75", _SM75))
}

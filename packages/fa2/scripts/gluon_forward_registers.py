"""What FA3's intra-warpgroup overlap costs the Gluon forward in registers, without a GPU.

The Gluon forward (`fa2.triton.gluon_forward`) asks `setmaxnreg` for CONSUMER_REGS registers a
thread in its second consumer warpgroup (the default partition, the first consumer, gets what
the others leave). Both consumers run the same code, so compiling for sm_90 with smaller
requests for the second one and reading ptxas's spills finds the least budget each variant
fits in: with the overlap (S(i) and P(i-1) live together while the PV wgmma runs) and in the
plain order. Per (head dim, causal, variant) and budget: ptxas's spill stores in bytes, and
whether it serialised the wgmmas (its "wgmma ... serialized" advisory: registers it could not
keep for an in-flight wgmma).

Run from the repository root, without TRITON_INTERPRET (about a minute on a CPU)::

    uv run python packages/fa2/scripts/gluon_forward_registers.py [--markdown PATH]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from sm90_screen import _revision  # the script folder is on sys.path
from triton.backends.compiler import GPUTarget

from fa2.triton import gluon_forward

PTXAS = Path(triton.__file__).parent / "backends/nvidia/bin/ptxas"
# Budgets to try for the second consumer: the kernel's request (240) down to below the launch
# count (168 = 65,536 registers / 384 threads, rounded down to a multiple of 8).
BUDGETS = (240, 208, 184, 168, 152)


def _signature(kernel) -> dict[str, str]:
    """The kernel's parameters typed as fa2's forward launches them for bf16 inputs."""
    types = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*bf16", "L": "*fp32"}
    types.update(CU_Q="*i32", CU_K="*i32", qk_scale="fp32", cap_scale="fp32")
    return {
        p.name: "constexpr" if p.is_constexpr else types.get(p.name, "i32") for p in kernel.params
    }


def compile_with_budget(head_dim: int, causal: bool, mode: str, budget: int) -> dict:
    """Spill bytes and wgmma serialisation of the kernel with the second consumer at `budget`."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    kernel = gluon_forward.gluon_forward_kernel()
    saved = gluon_forward.regs
    gluon_forward.regs = gl.constexpr([budget, gluon_forward.PRODUCER_REGS])
    kernel.hash = None  # the compile cache's key, memoised, holds the globals' values
    try:
        constexprs = gluon_forward.gluon_constexprs(head_dim, causal, mode=mode)
        source = GluonASTSource(kernel, _signature(kernel), constexprs)
        binary = triton.compile(
            source, target=GPUTarget("cuda", 90, 32), options=gluon_forward.gluon_launch_options()
        )
    finally:
        gluon_forward.regs = saved
        kernel.hash = None
    with tempfile.TemporaryDirectory() as folder:
        ptx = Path(folder) / "kernel.ptx"
        ptx.write_text(binary.asm["ptx"])
        report = subprocess.run(
            [PTXAS, "-arch=sm_90a", "-v", ptx, "-o", Path(folder) / "kernel.cubin"],
            capture_output=True, text=True, check=True,
        ).stderr  # fmt: skip
    spills = int(re.search(r"(\d+) bytes spill stores", report).group(1))
    return dict(spills=spills, serialized="serialized" in report)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", type=Path, help="write a results page here")
    args = parser.parse_args()
    header = "| d | causal | variant | " + " | ".join(f"{b} regs" for b in BUDGETS) + " |"
    lines = [header, "| --- | --- | --- |" + " --- |" * len(BUDGETS)]
    for head_dim in gluon_forward.GLUON_HEAD_DIMS:
        for causal in (True, False):
            for mode in gluon_forward.GLUON_MODES:
                cells = []
                for budget in BUDGETS:
                    r = compile_with_budget(head_dim, causal, mode, budget)
                    cells.append(f"{r['spills']} B" + (" (serialised)" if r["serialized"] else ""))
                lines.append(f"| {head_dim} | {causal} | {mode} | " + " | ".join(cells) + " |")
                print(lines[-1], flush=True)
    if args.markdown:
        page = [
            "# The Gluon forward's consumers: spills by register budget, compiled for sm_90",
            "",
            f"Compile only (no GPU), triton {triton.__version__}; code {_revision()}. Command: "
            f"`python packages/fa2/scripts/gluon_forward_registers.py {' '.join(sys.argv[1:])}`.",
            "",
            "Cells: ptxas's spill stores (bytes per thread) with the second consumer warpgroup "
            "given that many registers a thread by setmaxnreg; (serialised): ptxas serialised "
            "the wgmmas. overlap: FA3's intra-warpgroup overlap (FA2_GLUON_FORWARD=1); pingpong: "
            "that and FA3's inter-warpgroup ping-pong (=pingpong); plain: each wgmma waited for "
            "before the next step (=plain).",
            "",
            *lines,
        ]
        args.markdown.write_text("\n".join(page) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Compile fa2's Gluon backward (`fa2.triton.gluon_backward`) for a Hopper GPU (sm_90) on a
machine without one, and report what each case gets: warp specialisation, warps, the register
caps of its partitions, registers at launch, spills and shared memory.

Per case (head dim, causal or not, dtype), compiled by Triton and its bundled ptxas exactly as
`gluon_backward.launch` would launch the kernel (same constexprs, 8 compute warps):

- ws: the TTGIR holds a `ttg.warp_specialize` region;
- warps: warps launched (8 compute + the worker partitions, padded to whole warpgroups);
- setmaxnreg: the register caps the partitions set themselves (PTX): the compute warpgroups'
  and the workers' (the loader and dQ reducer asked for `LOADER_REGS`, `REDUCER_REGS`);
- regs: registers per thread at launch; stack: bytes of stack per thread, where ptxas spills
  (`cuobjdump -res-usage`), with the number of spill stores (STL) in the SASS;
- smem: shared memory in bytes;
- bulk_reduce, bulk_commit, bulk_wait_read, proxy_fence: how many TMA bulk reductions
  (`cp.reduce.async.bulk`, how dQ is added), bulk-group commits,
  `cp.async.bulk.wait_group.read` and `fence.proxy.async` the PTX holds;
- bulk_wait_all, acquire, release: the ordered (deterministic) form's completion waits
  (`cp.async.bulk.wait_group` without `.read`), semaphore loads (`ld.acquire.gpu`) and
  counts (`atom.global.gpu.release`); none in the unordered form.

Run from the repository root, with Triton 3.6 and without TRITON_INTERPRET::

    uv run python packages/fa2/scripts/gluon_sm90_screen.py [--cases d128-causal ...] [--json PATH]

Cases are named `d{64,128}-{causal,full}[-fp16][-ordered][-m128]` (`-ordered`: DQ_ORDERED,
dQ's additions in a fixed order, `launch(deterministic=True)`; `-m128`: 128 queries per step,
`launch(block_m=128)`, else `BLOCK_M`); the eight unordered ones by default.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget

from fa2.triton import gluon_backward as gb

sys.path.insert(0, str(Path(__file__).parent))
from sm90_screen import _revision, cubin_usage  # a sibling script, not a package

TARGET = GPUTarget("cuda", 90, 32)
CASES = [
    f"d{d}-{mask}{suffix}"
    for suffix in ("", "-fp16")
    for d in gb.HEAD_DIMS
    for mask in ("causal", "full")
]
_INTS = [f"stride_{t}{s}" for t in ("q", "k", "v", "do", "dk") for s in ("b", "h", "n")] + [
    "HEADS",
    "N_Q",
    "N_K",
    "REVERSED",
]


def _parse(case: str) -> tuple[int, bool, str, bool, int]:
    match = re.fullmatch(r"d(\d+)-(causal|full)(-fp16)?(-ordered)?(-m(\d+))?", case)
    if not match:
        raise ValueError(
            "a case is named like d128-causal, d64-full-fp16, d128-causal-ordered or "
            f"d64-causal-ordered-m128, got {case!r}"
        )
    head_dim, causal = int(match.group(1)), match.group(2) == "causal"
    block_m = int(match.group(6)) if match.group(5) else gb.BLOCK_M
    return head_dim, causal, "fp16" if match.group(3) else "bf16", bool(match.group(4)), block_m


def compile_case(case: str) -> dict:
    """Compile one case for sm_90 and read its resources."""
    from triton.experimental.gluon._runtime import GluonASTSource

    head_dim, causal, dtype, ordered, block_m = _parse(case)
    signature = {name: f"*{dtype}" for name in ("Q", "K", "V", "DO", "DK", "DV")}
    signature.update(
        L="*fp32", Delta="*fp32", DQ="*fp32", DQ_SEM="*i32", qk_scale="fp32", sm_scale="fp32"
    )
    signature.update(dict.fromkeys(_INTS, "i32"))
    constexprs = dict(
        HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=gb.BLOCK_N, STAGES=gb.STAGES,
        IS_CAUSAL=causal, LOADER_WARPS=gb.LOADER_WARPS, LOADER_REGS=gb.LOADER_REGS,
        REDUCER_WARPS=gb.REDUCER_WARPS, REDUCER_REGS=gb.REDUCER_REGS, DQ_ORDERED=ordered,
        DQ_DROP=False, DQ_SLOTS=gb.DQ_SLOTS, HIGHEST_FIRST=ordered,
    )  # fmt: skip
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    kernel = gb._gluon_bwd_kernel
    params = [p.name for p in kernel.params]  # the kernel's order, which the source needs
    signature = {name: signature[name] for name in params}
    # As Triton specialises a launch on 16-byte-aligned tensors whose strides are multiples of
    # 16 elements (the usual case; the lengths are left unspecialised): what lets it vectorise.
    aligned = {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(params)
        if signature[name].startswith("*") or name.startswith("stride_")
    }
    source = GluonASTSource(kernel, signature, constexprs, aligned)
    binary = triton.compile(source, target=TARGET, options={"num_warps": gb.COMPUTE_WARPS})
    registers, stack, sass = cubin_usage(binary, "-sass")
    ptx = binary.asm["ptx"]
    caps = re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)
    return dict(
        case=case,
        ws=binary.asm["ttgir"].count("ttg.warp_specialize(") > 0,
        warps=binary.metadata.num_warps,
        setmaxnreg=sorted({int(c) for c in caps}),
        worker_regs=dict(loader=gb.LOADER_REGS, reducer=gb.REDUCER_REGS),
        regs=registers,
        stack=stack,
        spill_stores=len(re.findall(r"\bSTL\b", sass)),
        smem=binary.metadata.shared,
        bulk_reduce=len(re.findall(r"\bcp\.reduce\.async\.bulk\S*\.add\S*", ptx)),
        bulk_commit=len(re.findall(r"\bcp\.async\.bulk\.commit_group\b", ptx)),
        bulk_wait_read=len(re.findall(r"\bcp\.async\.bulk\.wait_group\.read\b", ptx)),
        bulk_wait_all=len(re.findall(r"\bcp\.async\.bulk\.wait_group\s", ptx)),
        acquire=len(re.findall(r"\bld\.acquire\.gpu\b", ptx)),
        release=len(re.findall(r"\b(?:red|atom)\.global\.gpu\.release\b", ptx)),
        proxy_fence=len(re.findall(r"\bfence\.proxy\.async\b", ptx)),
    )


def _line(row: dict) -> str:
    caps = "/".join(map(str, row["setmaxnreg"]))
    return (
        f"| {row['case']} | {'yes' if row['ws'] else 'no'} | {row['warps']} | {caps} | "
        f"{row['regs']} | {row['stack']} | {row['spill_stores']} | {row['smem']} | "
        f"{row['bulk_reduce']} | {row['bulk_commit']} | {row['bulk_wait_read']} | "
        f"{row['bulk_wait_all']} | {row['acquire']} | {row['release']} | {row['proxy_fence']} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=CASES, help="cases to compile")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("unset TRITON_INTERPRET: the interpreter cannot compile")
    if not gb.HAVE_GLUON:
        sys.exit("this Triton has no Gluon (triton.experimental.gluon)")
    rows = [compile_case(case) for case in args.cases]
    print(f"triton {triton.__version__}, target sm_90")
    print(
        "| case | ws | warps | setmaxnreg | regs | stack B | STL | smem B | bulk reduce | "
        "commit | wait.read | wait.all | acquire | release | proxy fence |"
    )
    print("|" + "---|" * 15)
    for row in rows:
        print(_line(row))
    if args.json:
        meta = dict(
            target="sm_90", triton=triton.__version__, revision=_revision(),
            date=datetime.date.today().isoformat(),
            command="python packages/fa2/scripts/gluon_sm90_screen.py " + " ".join(sys.argv[1:]),
        )  # fmt: skip
        args.json.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

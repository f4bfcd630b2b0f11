"""Compile fa2's kernels for a Hopper GPU (sm_90) on a machine without one, and report what each
candidate tile would get: warp specialisation, warps, registers, spills, shared memory.

The launch plans are built by fa2's own host code, on meta tensors (no memory), with the device
taken to have a TMA unit, so each plan chooses what it would choose on a Hopper GPU; every
launch the plan makes is then compiled by Triton for sm_90 (the wheel's ptxas) instead of run,
with the arguments and constexprs it would be launched with. Per launch:

- ws: the TTGIR holds a `ttg.warp_specialize` region (Triton's Hopper pass split the loop);
- warps: warps launched (a specialised kernel adds its producer and second consumer);
- setmaxnreg: the register counts the partitions set themselves (PTX);
- regs, stack: registers per thread at launch and stack bytes per thread, where spills go
  (`cuobjdump -res-usage`);
- smem: shared memory in bytes;
- ptx: a digest of the PTX code without its debug information (source lines, file paths,
  inlined helpers' names), to check that a change leaves a kernel's code as it was.

`--target 75`, `80` or `86` compiles for a GPU before Hopper instead: the plans then see a
device of that compute capability (no TMA unit), so they choose from its own tables
(`fa2.triton.pre_hopper`), and the cases are `PRE_HOPPER_CASES` (fp16, bf16 and fp32, each head
dim); `fits` says whether a kernel's shared memory fits a block of that architecture's smallest
GPU (`tests/test_pre_hopper_compile.py` runs `--target 75` and `--target 80` in CI).

Run from the repository root, with Triton 3.6 and without TRITON_INTERPRET::

    uv run python packages/fa2/scripts/sm90_screen.py [--target 90|86|80|75] \\
        [--tiles default|listed] [--extra dkdv=64x128/4w/2s+TMA+WS] [--cases d128 ...] \\
        [--json PATH] [--markdown PATH]

With FA2_GLUON_FORWARD=1 the forward plans take the Gluon forward (`fa2.triton.gluon_forward`)
where a call allows it, and its rows say `gluon` for the tile: e.g.
`FA2_GLUON_FORWARD=1 ... sm90_screen.py --tiles default --kernels forward`.

`--tiles listed` (the default) compiles every candidate the tables list for the main cases and,
for the option cases (grouped heads, windows, packed sequences, softcap...), the defaults and
the warp-specialised candidates; `--tiles default` only what runs by default. `--extra` adds
tiles the tables do not list (a failed compile is reported as such, not raised).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import torch
import triton
from triton._C.libtriton import ir
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

from fa2.checks import Call
from fa2.masks import make_band
from fa2.triton import backward, configs, forward, launch
from fa2.triton.configs import Tile
from fa2.triton.pre_hopper import SHARED_MEMORY, TABLES, architecture

TARGET = GPUTarget("cuda", 90, 32)
TARGETS = (90, 86, 80, 75)
# Shared memory a block may take on sm_90 (the CUDA programming guide's 227 KB).
HOPPER_SHARED_MEMORY = 227 * 1024
CUOBJDUMP = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"


class Case(NamedTuple):
    """One call whose launches are compiled: (batch, heads, n_q, d), kv heads, n_k, options."""

    name: str
    shape: tuple[int, int, int, int]
    kv_heads: int | None = None
    n_k: int | None = None
    window: tuple[int, int] = (-1, -1)
    causal: bool = True
    softcap: float = 0.0
    bottom_right: bool = False
    packed: int = 0  # > 0: that many equal packed sequences of n_q tokens (layout "thd")
    main: bool = True  # every listed tile; else the defaults and the warp-specialised ones
    dtype: torch.dtype = torch.bfloat16
    precision: str = "tf32"  # fp32's dot precision ("tf32x3" by default; 16-bit ignores it)


CASES = [
    Case("bf16 d128 (16, 1, 16384)", (16, 1, 16384, 128)),
    Case("bf16 d128 short (4, 32, 2048)", (4, 32, 2048, 128)),
    Case("bf16 d64 (16, 1, 16384)", (16, 1, 16384, 64)),
    Case("d128 gqa 32/8 (2, 32, 4096)", (2, 32, 4096, 128), kv_heads=8, main=False),
    Case("d128 window 1024 (1, 16, 8192)", (1, 16, 8192, 128), window=(1024, 0), main=False),
    Case("d128 packed 8 x 2048", (1, 16, 2048, 128), packed=8, main=False),
    Case("d64 softcap 30 (1, 16, 4096)", (1, 16, 4096, 64), softcap=30.0, main=False),
    Case("d128 non-causal ragged (1, 16, 4000)", (1, 16, 4000, 128), causal=False, main=False),
    Case("d64 non-causal ragged (1, 16, 4000)", (1, 16, 4000, 64), causal=False, main=False),
    Case("d128 bottom-right 3000/4096", (1, 16, 3000, 128), n_k=4096, bottom_right=True,
         main=False),
]  # fmt: skip


# Smaller shapes than the Hopper cases (the tables before Hopper hold no `_short` lists): each
# dtype the architectures run, at each head dim the tables list.
PRE_HOPPER_CASES = [
    Case(f"{name} d{d} (2, 4, 1024)", (2, 4, 1024, d), dtype=dtype, precision=precision)
    for name, dtype, precision in (
        ("fp16", torch.float16, "tf32"),
        ("bf16", torch.bfloat16, "tf32"),
        ("fp32 tf32x3", torch.float32, "tf32x3"),
        ("fp32 ieee", torch.float32, "ieee"),
    )
    for d in (64, 128, 256)
]


@contextmanager
def compiling_for(compiled: list, capability: tuple[int, int] = (9, 0)) -> Iterator[None]:
    """Plans built inside see a device of `capability` (with a TMA unit from Hopper on), and
    their launches append `(launch, tensors, scalars)` to `compiled` instead of running."""
    saved = launch.tma_capable, backward.tma_capable, launch.CachedLaunch.__call__
    saved_capability = configs.device_capability
    launch.tma_capable = backward.tma_capable = lambda device: capability >= (9, 0)
    configs.device_capability = lambda device: capability

    def record(self, tensors, scalars, grid=None):
        compiled.append((self, tensors, scalars))

    launch.CachedLaunch.__call__ = record
    try:
        yield
    finally:
        launch.tma_capable, backward.tma_capable, launch.CachedLaunch.__call__ = saved
        configs.device_capability = saved_capability


def _source(
    cached: launch.CachedLaunch, tensors: tuple, scalars: tuple, target: GPUTarget = TARGET
) -> tuple:
    """(source, options) of one launch as Triton would compile it for its arguments on `target`
    (the same specialisation: dtypes, 16-byte alignment, integers divisible by 16 or equal to 1)."""
    kernel = cached.kernel
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    options = dict(cached.options, debug=False)
    bound, specialization, rest = binder(*tensors, *scalars, *cached.trailing, **options)
    parsed, signature, constexprs, attrs = kernel._pack_args(
        backend, options, bound, specialization, rest
    )
    # A Gluon kernel's source lowers through Gluon's own front end.
    if getattr(kernel, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource

        return GluonASTSource(kernel, signature, constexprs, attrs), parsed.__dict__
    return ASTSource(kernel, signature, constexprs, attrs), parsed.__dict__


def ttgir(source: ASTSource, options: dict) -> str:
    """The TTGIR `source` compiles to for sm_90: Triton's passes up to the GPU dialect (where
    the Hopper warp specialisation runs), without LLVM and ptxas, so a fraction of a second."""
    backend = make_backend(TARGET)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    parsed = backend.parse_options(options)
    module = source.make_ir(
        TARGET, parsed, backend.get_codegen_implementation(parsed), backend.get_module_map(),
        context,
    )  # fmt: skip
    module = backend.make_ttir(module, {}, parsed, TARGET.arch)
    return str(backend.make_ttgir(module, {}, parsed, TARGET.arch))


def launch_ttgir(cached: launch.CachedLaunch, tensors: tuple, scalars: tuple) -> str:
    """`ttgir` of one launch of a plan (as `launches` records them)."""
    return ttgir(*_source(cached, tensors, scalars))


def cubin_usage(binary, *more: str) -> tuple:
    """(registers per thread, stack bytes per thread) of a compiled kernel, read by `cuobjdump
    -res-usage`, then cuobjdump's output for each further option in `more` (e.g. "-sass")."""
    with tempfile.TemporaryDirectory() as folder:
        cubin = Path(folder) / "kernel.cubin"
        cubin.write_bytes(binary.asm["cubin"])
        outputs = [
            subprocess.run(
                [CUOBJDUMP, option, cubin], capture_output=True, text=True, check=True
            ).stdout
            for option in ("-res-usage", *more)
        ]
    registers, stack = re.search(r"REG:(\d+).*?STACK:(\d+)", outputs[0], re.S).groups()
    return int(registers), int(stack), *outputs[1:]


def _compile(
    cached: launch.CachedLaunch, tensors: tuple, scalars: tuple, target: GPUTarget = TARGET
) -> dict:
    """Compile one launch for `target` as Triton would launch it and read its resources."""
    source, options = _source(cached, tensors, scalars, target)
    binary = triton.compile(source, target=target, options=options)
    registers, stack = cubin_usage(binary)
    ptx = binary.asm["ptx"]
    code = "\n".join(
        line
        for line in ptx.split("\t.section\t.debug", 1)[0].splitlines()
        if not re.match(r"\s*(\.loc|\.file|//|\$L__tmp\d+:)", line)
    )
    counts = re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)
    return dict(
        ws=binary.asm["ttgir"].count("ttg.warp_specialize(") > 0,
        warps=binary.metadata.num_warps,
        setmaxnreg=sorted({int(c) for c in counts}),
        regs=registers,
        stack=stack,
        smem=binary.metadata.shared,
        ptx=hashlib.sha256(code.encode()).hexdigest()[:12],
    )


def _call(case: Case) -> tuple[tuple, Call, bool, tuple | None]:
    """Meta tensors q, k, v of a case, its validated options, same_lengths, packed bounds."""
    b, h, n_q, d = case.shape
    n_k = case.n_k or n_q
    kv = case.kv_heads or h
    if case.packed:
        q = torch.empty(case.packed * n_q, h, d, device="meta", dtype=case.dtype)
        k = torch.empty(case.packed * n_k, kv, d, device="meta", dtype=case.dtype)
        cu = torch.empty(case.packed + 1, device="meta", dtype=torch.int32)
        packed = ((cu, cu), (n_q, n_k))
    else:
        q = torch.empty(b, h, n_q, d, device="meta", dtype=case.dtype)
        k = torch.empty(b, kv, n_k, d, device="meta", dtype=case.dtype)
        packed = None
    band = make_band(causal=case.causal, window_size=case.window, bottom_right=case.bottom_right)
    call = Call(band, case.softcap, d**-0.5, "thd" if case.packed else "bhsd")
    v = torch.empty(k.shape, device="meta", dtype=k.dtype)  # empty_like of meta imports sympy
    return (q, k, v), call, n_q == n_k, packed


def launches(
    case: Case, capability: tuple[int, int] = (9, 0)
) -> Iterator[tuple[str, object, object, str, tuple]]:
    """(kernel, plan, the launch's `which` or None, default tile, recorded arguments) of each
    launch a case's forward and backward plans make: two-pass backward, and the single pass
    (which a bf16 call takes only where FA2_TILES names a single-pass tile)."""
    (q, k, v), call, same_lengths, packed = _call(case)
    cu, longest = packed or (None, None)
    seq_len = max(longest) if packed else None
    recorded: list = []
    with compiling_for(recorded, capability):
        fwd = forward.ForwardPlan(q, k, v, call, case.precision, same_lengths, False, seq_len)
        o, lse = fwd(q, k, v, call.scale, cu, longest, False)
        yield "forward", fwd, None, fwd.tile, recorded.pop()[1:]
        chosen = configs.single_pass_backward
        for deterministic in (True, False):
            configs.single_pass_backward = lambda dtype: True
            try:
                bwd = backward.BackwardPlan(fwd, q, k, v, o, lse, q, deterministic, False)
            finally:
                configs.single_pass_backward = chosen
            bwd(q, k, v, o, lse, q, call.scale, cu, longest, False)
            for which, args in zip(bwd.launches, recorded, strict=True):
                if which != "delta":
                    name = "single-pass" if which == "fused" else which
                    yield name, bwd, which, bwd.tiles[which], args[1:]
            recorded.clear()


def listed_tiles(kernel: str, case: Case, capability: tuple[int, int] = (9, 0)) -> list[Tile]:
    """The tiles the tables list for a case's kernel (both lists of its family), in the tables
    of the architecture of `capability`."""
    d_block = configs.block_d(case.shape[-1])
    arch = architecture(capability)
    table = TABLES[arch][kernel] if arch else configs.KERNELS[kernel]
    families = configs._families(d_block, case.dtype.itemsize, case.precision)
    return [t for f in families for key in (f, f"{f}_short") for t in table.get(key, ())]


def shared_memory_limit(capability: tuple[int, int]) -> int:
    """Bytes of shared memory a block may take on the smallest GPU of `capability`'s tables."""
    arch = architecture(capability)
    return SHARED_MEMORY[arch] if arch else HOPPER_SHARED_MEMORY


def screen(
    cases: list[Case],
    *,
    tiles: str,
    extra: dict[str, list[Tile]],
    capability: tuple[int, int] = (9, 0),
    kernels: tuple[str, ...] = tuple(configs.KERNELS),
) -> list[dict]:
    """One row per (case, kernel, tile) compiled for `capability`, of the `kernels` named."""
    rows = []
    target = GPUTarget("cuda", capability[0] * 10 + capability[1], 32)
    limit = shared_memory_limit(capability)
    for case in cases:
        for kernel, plan, which, default, (tensors, scalars) in launches(case, capability):
            if kernel not in kernels:
                continue
            candidates = [default]
            if tiles == "listed":
                listed = listed_tiles(kernel, case, capability)
                candidates += [t for t in listed if case.main or t.ws]
            candidates += extra.get(kernel, [])
            for tile in dict.fromkeys(candidates):  # in order, once each
                built = plan._launch(tile) if which is None else plan._launch(which, tile)
                label = "gluon" if getattr(plan, "gluon", False) else str(tile)
                row = dict(case=case.name, kernel=kernel, tile=label, default=tile == default)
                try:
                    row.update(_compile(built, tensors, scalars, target))
                    row["fits"] = row["smem"] <= limit
                except Exception as exc:  # the pass fails with a bare RuntimeError
                    row["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1]}"
                rows.append(row)
                print(_line(row), flush=True)
    return rows


def _line(row: dict) -> str:
    mark = "*" if row["default"] else " "
    head = f"{row['case']:38s} {row['kernel']:11s} {mark}{row['tile']:22s}"
    if "error" in row:
        return f"{head} compile FAILED ({row['error'][:60]})"
    return (
        f"{head} ws={'yes' if row['ws'] else 'no ':3s} warps={row['warps']:2d} "
        f"regs={row['regs']:3d} stack={row['stack']:3d} smem={row['smem'] // 1024:3d}K"
        f"{'' if row['fits'] else ' (too much)'} "
        f"setmaxnreg={row['setmaxnreg']} ptx={row['ptx']}"
    )


def _settings() -> list[str]:
    """The environment variables that choose tiles and kernels, as NAME=value, where set."""
    values = zip(configs._SETTINGS, configs.tile_settings(), strict=True)
    return [f"{name}={value}" for name, value in values if value is not None]


def _revision() -> str:
    """The git revision of the working tree, "+dirty" where it has uncommitted changes; or
    BENCH_GIT_REVISION where the sources are a copy of that commit's tree (bench's convention)."""
    if os.environ.get("BENCH_GIT_REVISION"):
        return os.environ["BENCH_GIT_REVISION"]
    run = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()  # noqa: E731
    return run("rev-parse", "--short", "HEAD") + ("+dirty" if run("status", "--porcelain") else "")


def markdown(rows: list[dict], meta: dict) -> str:
    """The rows as a results page."""
    target, limit = meta["target"], meta["shared_memory"] / 1024
    lines = [
        f"# fa2 kernels compiled for {target} on a CPU: registers, spills, shared memory",
        "",
        f"Target {target} (compile only, no GPU); triton {meta['triton']}, torch "
        f"{meta['torch']}; {meta['date']}; code {meta['revision']}. Command: "
        f"`{meta['command']}`.",
        "",
        "ws: Triton's Hopper pass split the loop into a TMA producer and consumer warpgroups; "
        "warps: launched; regs: per thread at launch; stack: bytes per thread (spills); smem: "
        f"KiB of shared memory (a block may take {limit:.0f} on the smallest GPU of the "
        "target's tables; `too much`: more); setmaxnreg: the partitions' own register counts; "
        "ptx: digest of the PTX code. `*`: the tile that runs by default.",
        "",
        "| case | kernel | tile | ws | warps | regs | stack | smem KiB | setmaxnreg | ptx |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        tile = ("*" if r["default"] else "") + r["tile"]
        if "error" in r:
            lines.append(f"| {r['case']} | {r['kernel']} | {tile} | compile failed: "
                         f"{r['error']} | | | | | | |")  # fmt: skip
            continue
        lines.append(
            f"| {r['case']} | {r['kernel']} | {tile} | {'yes' if r['ws'] else 'no'} | "
            f"{r['warps']} | {r['regs']} | {r['stack']} | {r['smem'] / 1024:.0f}"
            f"{'' if r['fits'] else ' (too much)'} | "
            f"{' '.join(map(str, r['setmaxnreg']))} | {r['ptx']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=int, choices=TARGETS, default=90,
                        help="compute capability x 10 (default 90)")  # fmt: skip
    parser.add_argument("--tiles", choices=("default", "listed"), default="listed")
    parser.add_argument("--extra", action="append", default=[], help="kernel=tile, repeatable")
    parser.add_argument("--cases", nargs="+", default=[""],
                        help="only cases whose name has one of these texts")  # fmt: skip
    parser.add_argument("--kernels", nargs="+", choices=list(configs.KERNELS),
                        default=list(configs.KERNELS), help="only these kernels")  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the rows and metadata here")
    parser.add_argument("--markdown", type=Path, help="write a results page here")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        parser.error("unset TRITON_INTERPRET: this compiles for the GPU")
    extra: dict[str, list[Tile]] = {}
    for item in args.extra:
        kernel, _, tile = item.partition("=")
        extra.setdefault(kernel, []).append(Tile.parse(tile))
    capability = divmod(args.target, 10)
    meta = dict(
        target=f"sm_{args.target}", shared_memory=shared_memory_limit(capability),
        triton=triton.__version__, torch=torch.__version__,
        date=datetime.date.today().isoformat(), revision=_revision(),
        command=" ".join(
            [*_settings(), "python packages/fa2/scripts/sm90_screen.py", *sys.argv[1:]]
        ),
    )  # fmt: skip
    known = CASES if architecture(capability) is None else PRE_HOPPER_CASES
    cases = [c for c in known if any(text in c.name for text in args.cases)]
    rows = screen(
        cases, tiles=args.tiles, extra=extra, capability=capability, kernels=tuple(args.kernels)
    )
    if args.json:
        args.json.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(rows, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Warp specialisation on Hopper: is Triton's pass wrong, or are fa2's kernels wrong under it?

The GPU screen found every warp-specialised candidate wrong on an H200 (NaN, run-to-run
differences; docs/results/fa2_hopper_screen_h200_2026-11-28.md) although Triton's interpreter,
which ignores the hint, runs the same kernels right. This script separates the two causes, on one
GPU in under a minute:

1. Stand-ins (`_standin`): a minimal forward loop, one program per 128 query rows of one head,
   keys and values through TMA descriptors, nothing of fa2 in it, built up one feature at a time:
   the plain loop (no mask, no softmax: o = (q kᵀ · scale) v), then the causal mask in the loop,
   the running row max and sum the loop carries (online softmax), both (fa2's forward loop),
   3 pipeline stages, 128-key tiles, q by plain loads; each without and with `own coordinate`,
   the workaround fa2 now uses (`fa2.triton.tiles.load_rows`: the TMA coordinate of the
   program's rows a value of its own, not the start of its row indices). Each runs twice on the
   same inputs into an output filled with NaN: error against float64 over plain PyTorch's in
   bf16 (fa2's test rule: at most 2), whether the runs give the same bits, rows left unwritten.
   A stand-in wrong with warp specialisation and right without it is Triton's doing.
2. fa2's own kernels, the defaults and the warp-specialised forward and dK/dV tiles forced
   through FA2_TILES (with the workaround): the same checks on o, dq, dk, dv (memory about to
   be allocated is filled with NaN first, so rows a kernel does not write show as NaN).
3. `--ir` (no GPU): the stand-ins and fa2's specialised launches compiled for sm_90 up to TTGIR
   (`sm90_screen.ttgir`): whether the pass split the loop, and each place where a consumer
   warpgroup's row indices carry its offset twice (`double_offsets`), the defect behind the
   screen's failures.

GPU (one Hopper GPU, about a minute with compilation), from the repository root, no install::

    export PYTHONPATH=$(ls -d $PWD/packages/*/src | paste -sd:)
    BENCH_GIT_REVISION=<commit> python3 packages/fa2/scripts/ws_diagnose.py --out $OUT

Rehearsal on a CPU (Triton's interpreter, tiny sizes; it ignores warp specialisation)::

    uv run python packages/fa2/scripts/ws_diagnose.py --tiny --out ws_tiny

Compile-only check for sm_90 on a CPU (Triton 3.6's passes; no TRITON_INTERPRET)::

    uv run python packages/fa2/scripts/ws_diagnose.py --ir --out ws_ir

Rows go to `OUT/ws_diagnose.json` and a page to `OUT/ws_diagnose.md` (`--ir`: `OUT/ws_ir.*`);
the table is printed last.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and "--tiny" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when triton is first imported

import argparse
import datetime
import json
import math
import platform
import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from fa2 import FlashAttention2Triton, attention_reference
from fa2.triton import configs, forward, launch
from fa2.triton.tiles import LOG2E

HEADS, N, D = 8, 1024, 128  # the stand-ins' problem on a GPU: 8 heads x 8 query tiles
TINY_HEADS, TINY_N, TINY_D = 2, 64, 32
FA2_SHAPE, TINY_FA2_SHAPE = (2, 4, 1024, 128), (1, 2, 70, 64)  # (batch, heads, seq, head dim)
BUDGET_S = 45.0  # parts not started by then are skipped: with start-up the run stays under a minute


@triton.jit
def _standin(
    Q,
    K,
    V,
    O,
    N_CTX,
    scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WS: tl.constexpr,
    CAUSAL: tl.constexpr,
    STATS: tl.constexpr,
    Q_TMA: tl.constexpr,
    OWN_COORD: tl.constexpr,
):
    """o of BLOCK_M query rows of head program_id(1) of contiguous (heads, N_CTX, HEAD_DIM)
    tensors, N_CTX a multiple of BLOCK_M: softmax(q kᵀ · scale) v with STATS (the loop carries
    each row's running max and sum), else (q kᵀ · scale) v; CAUSAL hides keys after the query,
    masked inside the loop. Q_TMA: q through a descriptor (else plain loads), at row coordinate
    max(m0, 0) with OWN_COORD, else m0, the start of the row indices themselves."""
    m0 = tl.program_id(0) * BLOCK_M
    base = tl.program_id(1).to(tl.int64) * N_CTX * HEAD_DIM
    rows = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    if Q_TMA:
        q_desc = tl.make_tensor_descriptor(
            Q + base, [N_CTX, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_M, HEAD_DIM]
        )
        if OWN_COORD:
            q = q_desc.load([tl.maximum(m0, 0), 0])
        else:
            q = q_desc.load([m0, 0])
    else:
        q = tl.load(Q + base + rows[:, None] * HEAD_DIM + offs_d[None, :])
    k_desc = tl.make_tensor_descriptor(
        K + base, [N_CTX, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_N, HEAD_DIM]
    )
    v_desc = tl.make_tensor_descriptor(
        V + base, [N_CTX, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_N, HEAD_DIM]
    )
    qk_scale = scale * LOG2E
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if CAUSAL:
        end = m0 + BLOCK_M
    else:
        end = N_CTX
    for start_n in tl.range(0, end, BLOCK_N, warp_specialize=WS):
        k = k_desc.load([start_n, 0])
        v = v_desc.load([start_n, 0])
        s = tl.dot(q, tl.trans(k))
        if CAUSAL:
            cols = start_n + tl.arange(0, BLOCK_N)
            s = tl.where(cols[None, :] <= rows[:, None], s, float("-inf") if STATS else 0.0)
        if STATS:
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            p = tl.math.exp2(s * qk_scale - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
            m_i = m_new
        else:
            acc = tl.dot((s * scale).to(v.dtype), v, acc)
    if STATS:
        acc = acc / l_i[:, None]
    tl.store(O + base + rows[:, None] * HEAD_DIM + offs_d[None, :], acc.to(O.dtype.element_ty))


class Variant(NamedTuple):
    """One stand-in: its switches (see `_standin`) and launch options."""

    name: str
    ws: bool = True
    causal: bool = False
    stats: bool = False
    q_tma: bool = True
    own_coord: bool = False
    block_n: int = 64
    stages: int = 2


VARIANTS = [
    Variant("plain loop, no WS", ws=False),
    Variant("plain loop"),
    Variant("plain loop, own coordinate", own_coord=True),
    Variant("+ causal mask", causal=True),
    Variant("+ causal mask, own coordinate", causal=True, own_coord=True),
    Variant("+ row statistics", stats=True),
    Variant("+ row statistics, own coordinate", stats=True, own_coord=True),
    Variant("causal + statistics, no WS", ws=False, causal=True, stats=True),
    Variant("causal + statistics", causal=True, stats=True),
    Variant("causal + statistics, own coordinate", causal=True, stats=True, own_coord=True),
    Variant("... own coordinate, 3 stages", causal=True, stats=True, own_coord=True, stages=3),
    Variant("... own coordinate, BLOCK_N 128", causal=True, stats=True, own_coord=True,
            block_n=128),
    Variant("causal + statistics, q by plain loads", causal=True, stats=True, q_tma=False),
]  # fmt: skip


def standin_math(q, k, v, *, causal: bool, stats: bool) -> torch.Tensor:
    """The stand-in's o in the inputs' dtype (float64 inputs: the oracle)."""
    if stats:
        return attention_reference(q, k, v, causal=causal)[0]
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(~torch.ones_like(s, dtype=torch.bool).tril(), 0.0)
    return s @ v


def relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """‖x - ref‖ / ‖ref‖ in float64; NaN where x holds a NaN."""
    return ((x.double() - ref).norm() / ref.norm()).item()


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality, NaN included (torch.equal calls two NaNs different)."""
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def nan_rows(x: torch.Tensor) -> int:
    """Rows (the last dim) holding a NaN: in an output filled with NaN, rows left unwritten."""
    return int(torch.isnan(x).any(dim=-1).sum())


def run_standin(variant: Variant, *, tiny: bool, device: str) -> dict:
    """One stand-in, run twice: error over plain PyTorch's in the same dtype (bf16; fp32 in the
    interpreter, whose 16-bit dots are wrong: `configs.upcast`), same bits, rows unwritten."""
    heads, n, d = (TINY_HEADS, TINY_N, TINY_D) if tiny else (HEADS, N, D)
    block_m, block_n = (32, variant.block_n // 4) if tiny else (128, variant.block_n)
    dtype = torch.float32 if tiny else torch.bfloat16  # the interpreter's 16-bit dots are wrong
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(heads, n, d, generator=gen).to(device, dtype) for _ in "qkv")
    outs = []
    for _ in range(2):
        o = torch.full_like(q, math.nan)
        _standin[(n // block_m, heads)](
            q, k, v, o, n, d**-0.5, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n,
            WS=variant.ws, CAUSAL=variant.causal, STATS=variant.stats, Q_TMA=variant.q_tma,
            OWN_COORD=variant.own_coord, num_warps=4, num_stages=variant.stages,
        )  # fmt: skip
        outs.append(o)
    options = dict(causal=variant.causal, stats=variant.stats)
    oracle = standin_math(q.double(), k.double(), v.double(), **options)
    plain = relative_error(standin_math(q, k, v, **options), oracle)
    return dict(
        error_vs_plain=relative_error(outs[0], oracle) / plain,
        same_bits=same_bits(*outs),
        unwritten_rows=nan_rows(outs[0]),
        rows=heads * n,
    )


@contextmanager
def fa2_tiles(text: str):
    """FA2_TILES set to `text` (unset where empty), with plans built afresh."""
    saved = os.environ.pop("FA2_TILES", None)
    if text:
        os.environ["FA2_TILES"] = text
    forward._plans.cache.clear()
    try:
        yield
    finally:
        os.environ.pop("FA2_TILES", None)
        if saved is not None:
            os.environ["FA2_TILES"] = saved
        forward._plans.cache.clear()


def _poison(like: torch.Tensor, count: int) -> None:
    """Fill `count` blocks of `like`'s size with NaN and free them: the caching allocator hands
    them to the next allocations of that size, so rows a kernel leaves unwritten read NaN."""
    blocks = [torch.full_like(like, math.nan) for _ in range(count)]
    del blocks


def fa2_candidates(*, tiny: bool) -> dict[str, str]:
    """FA2_TILES of each fa2 row: the defaults, then the warp-specialised forward and dK/dV."""
    if tiny:
        return {"fa2 defaults": "", "fa2 ws-fwd": "forward=32x16/1w/1s+TMA+WS",
                "fa2 ws-dkdv": "dkdv=16x32/1w/1s+TMA+WS"}  # fmt: skip
    return {"fa2 defaults": "", "fa2 ws-fwd": "forward=128x64/4w/2s+TMA+WS",
            "fa2 ws-dkdv": "dkdv=32x128/4w/2s+TMA+WS"}  # fmt: skip


def run_fa2(tiles: str, *, tiny: bool, device: str) -> dict:
    """fa2 causal bf16 forward+backward twice: o, dq, dk, dv errors over plain bf16's, same
    bits, rows holding NaN (after `_poison`), and whether the forced tiles compiled in WS."""
    shape = TINY_FA2_SHAPE if tiny else FA2_SHAPE
    gen = torch.Generator(device="cpu").manual_seed(1)
    q, k, v, do = (torch.randn(shape, generator=gen).to(device, torch.bfloat16) for _ in range(4))
    with fa2_tiles(tiles):
        runs = []
        for _ in range(2):
            _poison(q, 5)  # o, dq, dk, dv and one spare
            ins = [t.clone().requires_grad_() for t in (q, k, v)]
            o = FlashAttention2Triton.apply(*ins, True)
            runs.append([o.detach(), *torch.autograd.grad(o, ins, do)])
        (fwd,) = forward._plans.cache.values()
        (bwd,) = fwd.backward_plans.values()
        ws = dict(forward=bool(fwd.launch.options["WS"]),
                  dkdv=bool(bwd.launches["dkdv"].options["WS"]))  # fmt: skip
    ref, plain = ([], [])
    for dtype, out in ((torch.float64, ref), (torch.bfloat16, plain)):
        ins = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        o = attention_reference(*ins, causal=True)[0]
        out += [o.detach(), *torch.autograd.grad(o, ins, do.to(dtype))]
    ratios = [
        relative_error(x, r) / relative_error(p, r)
        for x, r, p in zip(runs[0], ref, plain, strict=True)
    ]
    return dict(
        error_vs_plain=math.nan if any(map(math.isnan, ratios)) else max(ratios),
        errors=dict(zip(("o", "dq", "dk", "dv"), ratios, strict=True)),
        same_bits=all(same_bits(a, b) for a, b in zip(*runs, strict=True)),
        unwritten_rows=sum(nan_rows(x) for x in runs[0]),
        rows=4 * math.prod(shape[:-1]),
        ws_compiled=ws,
    )


def ok(row: dict) -> bool:
    """Right: within twice plain bf16's error, the same bits twice, every row written."""
    return row["error_vs_plain"] <= 2 and row["same_bits"] and row["unwritten_rows"] == 0


def diagnose(*, tiny: bool, budget: float) -> list[dict]:
    """The stand-ins, then fa2's rows, each a dict; parts past `budget` seconds are skipped."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":  # where the kernels build their TMA descriptors
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                     device=device))  # fmt: skip
    else:  # the interpreter emulates TMA descriptors
        launch.tma_capable = lambda device: True
    deadline, rows = time.monotonic() + budget, []
    parts = [(v.name, "stand-in", lambda v=v: run_standin(v, tiny=tiny, device=device))
             for v in VARIANTS]  # fmt: skip
    parts += [(name, "fa2", lambda t=tiles: run_fa2(t, tiny=tiny, device=device))
              for name, tiles in fa2_candidates(tiny=tiny).items()]  # fmt: skip
    for name, kind, run in parts:
        row = dict(name=name, kind=kind)
        if time.monotonic() > deadline:
            row["skipped"] = "time budget"
        else:
            started = time.monotonic()
            try:
                row.update(run())
                row["ok"] = ok(row)
            except Exception as exc:  # a variant the pass cannot compile, say
                row["failed"] = f"{type(exc).__name__}: {_last_line(exc)}"
            row["seconds"] = round(time.monotonic() - started, 2)
        rows.append(row)
        print(_progress(row), flush=True)
    return rows


def _last_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[-1][:200] if lines else ""


def _progress(row: dict) -> str:
    if "skipped" in row or "failed" in row:
        return f"{row['name']}: {row.get('skipped') or row.get('failed')}"
    return (f"{row['name']}: error/plain {row['error_vs_plain']:.3g}, same bits "
            f"{row['same_bits']}, unwritten {row['unwritten_rows']}/{row['rows']} "
            f"({row['seconds']} s)")  # fmt: skip


def table(rows: list[dict]) -> str:
    """The rows as Markdown: error over plain bf16's, same bits, unwritten rows, verdict."""
    lines = ["| kind | case | error / plain PyTorch's | same bits twice | rows unwritten | ok |",
             "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        if "error_vs_plain" not in r:
            lines.append(f"| {r['kind']} | {r['name']} | {r.get('skipped') or r['failed']} | | | |")
            continue
        lines.append(f"| {r['kind']} | {r['name']} | {r['error_vs_plain']:.3g} | "
                     f"{'yes' if r['same_bits'] else 'NO'} | {r['unwritten_rows']} of {r['rows']} "
                     f"| {'yes' if r['ok'] else '**NO**'} |")  # fmt: skip
    return "\n".join(lines)


# -- the compile-only check (--ir) ------------------------------------------------------------

_DEFINITION = re.compile(r"^\s*(%[\w.]+)(?::\d+)? = (.*)$")


def double_offsets(ttgir: str) -> list[str]:
    """Places where a warp-specialised partition's row indices carry its offset twice: a tensor
    `splat(x) + make_range(s, ...)` with s > 0 (the partition's slice of the rows) where x is
    itself `... + s` (the partition's rows start). Triton 3.6's Hopper pass writes this when
    the TMA coordinate it offsets for a partition is the same value as the rows' start."""
    found = []
    for region in re.split(r"\n\s*partition\d+\(", ttgir)[1:]:
        defs = {}
        for line in region.splitlines():
            match = _DEFINITION.match(line)
            if match:
                defs[match.group(1)] = match.group(2)
        for name, rhs in defs.items():
            add = re.match(r"arith\.addi (%[\w.]+), (%[\w.]+) .*: tensor<\d+xi32", rhs)
            if not add:
                continue
            a, b = (defs.get(x, "") for x in add.groups())
            for span, splat in ((a, b), (b, a)):
                first = re.match(r"tt\.make_range .*start = (\d+)", span)
                scalar = re.match(r"tt\.splat (%[\w.]+)", splat)
                if not first or not scalar or int(first.group(1)) == 0:
                    continue
                start = first.group(1)
                shifted = re.match(r"arith\.addi %[\w.]+, (%[\w.]+)", defs.get(scalar.group(1), ""))
                constant = shifted and defs.get(shifted.group(1), "")
                if constant and re.search(rf"arith\.constant .*\b{start} : i32", constant):
                    found.append(f"{name} = splat({scalar.group(1)}, already + {start}) + "
                                 f"range({start}, ...)")  # fmt: skip
    return found


def _standin_ttgir(variant: Variant) -> str:
    from sm90_screen import ttgir
    from triton.compiler import ASTSource

    constexprs = dict(HEAD_DIM=D, BLOCK_M=128, BLOCK_N=variant.block_n, WS=variant.ws,
                      CAUSAL=variant.causal, STATS=variant.stats, Q_TMA=variant.q_tma,
                      OWN_COORD=variant.own_coord)  # fmt: skip
    signature = dict(Q="*bf16", K="*bf16", V="*bf16", O="*bf16", N_CTX="i32", scale="fp32")
    signature.update({name: "constexpr" for name in constexprs})
    options = dict(num_warps=4, num_stages=variant.stages)
    return ttgir(ASTSource(_standin, signature, constexprs), options)


def _ir_row(kind: str, name: str, text_of) -> dict:
    """One `--ir` row: compile with `text_of()`, then whether the loop was split and where a
    partition's rows are offset twice."""
    row = dict(kind=kind, name=name)
    try:
        text = text_of()
        row.update(ws="ttg.warp_specialize(" in text, double_offsets=double_offsets(text))
    except Exception as exc:  # the pass fails on some loops
        row["failed"] = f"{type(exc).__name__}: {_last_line(exc)}"
    print(_ir_line(row), flush=True)
    return row


def fa2_ir_rows(cases, *, first_only: bool = False) -> list[dict]:
    """`_ir_row` of each warp-specialised tile listed for the forward and dK/dV launches of
    `cases` (`sm90_screen.Case`s), built by fa2's own plans (`first_only`: the first such
    tile of each kernel, which the screen forced)."""
    import sm90_screen

    rows = []
    for case in cases:
        for kernel, plan, which, _default, (tensors, scalars) in sm90_screen.launches(case):
            tiles = [t for t in dict.fromkeys(sm90_screen.listed_tiles(kernel, case)) if t.ws]
            for tile in tiles[:1] if first_only else tiles:
                built = plan._launch(tile) if which is None else plan._launch(which, tile)
                args = (built, tensors, scalars)
                rows.append(_ir_row("fa2", f"{case.name} {kernel} {tile}",
                                    lambda a=args: sm90_screen.launch_ttgir(*a)))  # fmt: skip
    return rows


def ir_rows() -> list[dict]:
    """`--ir`: each stand-in, then each warp-specialised launch of fa2's plans at sm90_screen's
    main cases (d = 128 long and short, d = 64), compiled for sm_90 up to TTGIR."""
    import sm90_screen

    rows = [_ir_row("stand-in", v.name, lambda v=v: _standin_ttgir(v)) for v in VARIANTS]
    return rows + fa2_ir_rows(sm90_screen.CASES[:3])


def _ir_line(row: dict) -> str:
    if "failed" in row:
        return f"{row['kind']} {row['name']}: compile failed ({row['failed'][:80]})"
    return (f"{row['kind']} {row['name']}: ws={row['ws']} double offsets: "
            f"{len(row['double_offsets'])} {row['double_offsets'][:1]}")  # fmt: skip


def ir_table(rows: list[dict]) -> str:
    lines = [
        "| kind | case | loop specialised | double offsets (first) |",
        "| --- | --- | --- | --- |",
    ]
    for r in rows:
        if "failed" in r:
            lines.append(f"| {r['kind']} | {r['name']} | compile failed | |")
            continue
        first = r["double_offsets"][0] if r["double_offsets"] else ""
        lines.append(f"| {r['kind']} | {r['name']} | {'yes' if r['ws'] else 'no'} | "
                     f"{len(r['double_offsets'])} {first} |")  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--tiny", action="store_true",
                        help="rehearse on a CPU: Triton's interpreter, tiny sizes")  # fmt: skip
    parser.add_argument("--ir", action="store_true",
                        help="no GPU: compile for sm_90 to TTGIR, look for the defect")  # fmt: skip
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for the parts")
    args = parser.parse_args()
    if args.ir and configs.INTERPRET:
        parser.error("--ir compiles for the GPU: unset TRITON_INTERPRET")
    if not (args.ir or args.tiny or torch.cuda.is_available()):
        parser.error("needs a CUDA GPU (or --tiny, or --ir, on a CPU)")
    from hopper_screen import git_revision

    args.out.mkdir(parents=True, exist_ok=True)
    meta = dict(
        device="sm_90 compile only" if args.ir else (
            torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (interpreter)"),
        torch=torch.__version__, triton=triton.__version__, python=platform.python_version(),
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        command="python3 packages/fa2/scripts/ws_diagnose.py " + " ".join(sys.argv[1:]),
        **git_revision(),
    )  # fmt: skip
    started = time.monotonic()
    rows = ir_rows() if args.ir else diagnose(tiny=args.tiny, budget=args.budget)
    stem = args.out / ("ws_ir" if args.ir else "ws_diagnose")
    stem.with_suffix(".json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")
    header = (f"{meta['device']}; torch {meta['torch']}, triton {meta['triton']}, python "
              f"{meta['python']}; {meta['date']}; code {meta['git_revision']}. Command: "
              f"`{meta['command']}`. {time.monotonic() - started:.0f} s.")  # fmt: skip
    body = ir_table(rows) if args.ir else table(rows)
    title = "Warp specialisation on Hopper: stand-ins and fa2's kernels"
    if args.ir:
        title = "Warp-specialised loops compiled for sm_90: split, and rows offset twice"
    stem.with_suffix(".md").write_text(f"# {title}\n\n{header}\n\n{body}\n")
    print(f"\n{header}\n{body}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

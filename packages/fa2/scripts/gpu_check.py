"""One GPU session's checks for fa2: accuracy against float64, tile sweeps, timings vs SDPA.

Run from the repository root on a CUDA machine (no install needed)::

    export PYTHONPATH=$(ls -d $PWD/packages/*/src | paste -sd:)
    python3 packages/fa2/scripts/gpu_check.py --out results/ [--sweep] [--skip-bench]

1. Accuracy: every variant (bf16, fp16, fp32 with each dot precision, grouped-query heads,
   transposed layouts; fp32 also with `deterministic=False`) against a float64 oracle, beside
   SDPA's error on the same inputs; the ratio ours / SDPA's is what the tests bound (<= 2).
2. `--sweep`: FA2_AUTOTUNE's per-tile timings for the kernels at the issue's shapes, the data
   that chooses the default tiles in `fa2/triton/configs.py`.
3. Timings: `triton.testing.do_bench` medians of forward and forward+backward (random output
   gradient) for fa2, SDPA's cuDNN and FlashAttention-2 backends (bf16) and SDPA's default
   (fp32; fa2 also with `deterministic=False` and with "ieee" dots), plus the leaderboard
   harness (3-D (16, 16384, 64) bf16 causal, `torch.compile(FlashAttention2Triton.apply)`,
   `o.sum().backward()`, do_bench mean).

Writes `gpu_check.json` (rows with device, versions, date) under `--out` and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from fa2 import FlashAttention2Triton, attention_reference

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
CASE_FILTER = [""]  # --cases
SWEEP_KERNELS = ["forward", "dq", "dkdv", "single-pass"]  # --sweep-kernels


def _error(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm()).item()


def _sdpa(q, k, v, causal, backend=None):
    grouped = k.shape[-3] != q.shape[-3]
    if backend is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=grouped)
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=grouped)


def _outputs(fn, q, k, v, do):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    o = fn(q, k, v)
    return (o, *torch.autograd.grad(o, (q, k, v), do))


def accuracy(rows: list[dict]) -> None:
    """Error vs float64 of fa2 and SDPA (default backend) on the same random inputs."""
    cases = [
        # (name, q shape, kv heads, dtype, causal, precision, transposed)
        ("bf16 d64", (2, 4, 1000, 64), 4, "bf16", True, None, False),
        ("bf16 d128 odd", (1, 4, 777, 128), 4, "bf16", True, None, False),
        ("fp16 d64 noncausal", (2, 4, 1500, 64), 4, "fp16", False, None, False),
        ("bf16 gqa 8/2", (2, 8, 1024, 64), 2, "bf16", True, None, False),
        ("bf16 transposed", (2, 12, 512, 64), 12, "bf16", True, None, True),
        ("fp32 tf32x3 d64", (2, 4, 1024, 64), 4, "fp32", True, "tf32x3", False),
        ("fp32 tf32x3 d128", (2, 4, 1000, 128), 4, "fp32", True, "tf32x3", False),
        ("fp32 ieee d64", (2, 4, 1024, 64), 4, "fp32", True, "ieee", False),
        ("fp32 tf32 d64", (2, 4, 1024, 64), 4, "fp32", True, "tf32", False),
        ("fp32 gqa tf32x3", (2, 8, 600, 64), 1, "fp32", False, "tf32x3", False),
    ]
    torch.backends.cuda.matmul.allow_tf32 = False
    for name, shape, kv_heads, dt, causal, precision, transposed in cases:
        torch.manual_seed(0)
        dtype = DTYPES[dt]
        b, h, n, d = shape
        if transposed:  # (batch, seq, heads, d) viewed as (batch, heads, seq, d)
            q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=dtype).transpose(1, 2)
                       for _ in range(3))  # fmt: skip
        else:
            q = torch.randn(shape, device="cuda", dtype=dtype)
            k, v = (torch.randn(b, kv_heads, n, d, device="cuda", dtype=dtype) for _ in range(2))
        do = torch.randn_like(q)
        variants = {}  # deterministic=False changes the backward of fp32 inputs only
        for impl, det in (("fa2", True), ("fa2-nondet", False))[: 2 if dt == "fp32" else 1]:
            fn = lambda q, k, v, c=causal, p=precision, det=det: FlashAttention2Triton.apply(  # noqa: E731
                q, k, v, c, None, False, p, det
            )
            variants[impl] = _outputs(fn, q, k, v, do)
        sdpa = _outputs(lambda q, k, v, c=causal: _sdpa(q, k, v, c), q, k, v, do)
        group = h // kv_heads
        k64, v64 = (t.double().repeat_interleave(group, 1) for t in (k, v))
        exact = _outputs(
            lambda q, k, v, c=causal: attention_reference(q, k, v, causal=c)[0],
            q.double(), k64, v64, do.double(),
        )  # fmt: skip
        exact = (*exact[:2], *(g.unflatten(1, (kv_heads, group)).sum(2) for g in exact[2:]))
        for impl, ours in variants.items():
            for part, x, s, e in zip(("o", "dq", "dk", "dv"), ours, sdpa, exact, strict=True):
                err, sdpa_err = _error(x, e), _error(s, e)
                rows.append(
                    dict(section="accuracy", case=name, impl=impl, part=part, fa2_err=err,
                         sdpa_err=sdpa_err, ratio=err / sdpa_err if sdpa_err else math.inf)
                )  # fmt: skip
            worst = max(r["ratio"] for r in rows if r.get("case") == name and r["impl"] == impl)
            print(f"accuracy {name:22s} {impl:10s} worst ratio vs sdpa {worst:.2f}", flush=True)


def _bench(fn, *, mean=False):
    from triton.testing import do_bench

    return do_bench(fn, return_mode="mean" if mean else "median")


def _time_impl(fn, q, k, v, do):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    fwd = _bench(lambda: fn(q, k, v))

    def fwd_bwd():
        o = fn(q, k, v)
        torch.autograd.grad(o, (q, k, v), do)

    return fwd, _bench(fwd_bwd)


def timings(rows: list[dict]) -> None:
    """fa2 vs SDPA at the issue's shapes (forward, forward+backward; random dO)."""
    cases = [
        # (name, (batch, heads, seq, d), kv heads, dtype, causal)
        ("(16, 16384, 64) causal", (16, 1, 16384, 64), 1, "bf16", True),
        ("(16, 16384, 128) causal", (16, 1, 16384, 128), 1, "bf16", True),
        ("(4, 32, 2048, 128) causal", (4, 32, 2048, 128), 32, "bf16", True),
        ("(16, 4096, 64) full", (16, 1, 4096, 64), 1, "bf16", False),
        ("gqa (4, 32/8, 2048, 128) causal", (4, 32, 2048, 128), 8, "bf16", True),
        ("fp32 (8, 1, 4096, 64) causal", (8, 1, 4096, 64), 1, "fp32", True),
        ("fp32 (4, 8192, 64) causal", (4, 1, 8192, 64), 1, "fp32", True),
        ("fp32 (4, 8192, 128) causal", (4, 1, 8192, 128), 1, "fp32", True),
    ]
    torch.backends.cuda.matmul.allow_tf32 = False
    for name, (b, h, n, d), kv_heads, dt, causal in cases:
        if not any(part in name for part in CASE_FILTER[0].split("|")):
            continue
        dtype = DTYPES[dt]
        q = torch.randn(b, h, n, d, device="cuda", dtype=dtype)
        k, v = (torch.randn(b, kv_heads, n, d, device="cuda", dtype=dtype) for _ in range(2))
        do = torch.randn_like(q)
        impls = {"fa2": lambda q, k, v, c=causal: FlashAttention2Triton.apply(q, k, v, c)}
        if dtype == torch.float32:  # deterministic=False: the single-pass backward
            impls["fa2-nondet"] = lambda q, k, v, c=causal: FlashAttention2Triton.apply(
                q, k, v, c, None, False, None, False
            )
            impls["fa2-ieee"] = lambda q, k, v, c=causal: FlashAttention2Triton.apply(
                q, k, v, c, None, False, "ieee"
            )
            impls["sdpa"] = lambda q, k, v, c=causal: _sdpa(q, k, v, c)
        else:
            impls["sdpa-cudnn"] = lambda q, k, v, c=causal: _sdpa(
                q, k, v, c, SDPBackend.CUDNN_ATTENTION
            )
            impls["sdpa-flash"] = lambda q, k, v, c=causal: _sdpa(
                q, k, v, c, SDPBackend.FLASH_ATTENTION
            )
        for impl, fn in impls.items():
            try:
                fwd, total = _time_impl(fn, q, k, v, do)
            except RuntimeError as exc:  # a forced SDPA backend that does not take the case
                print(f"  {name} {impl}: {str(exc).splitlines()[0][:100]}", flush=True)
                continue
            rows.append(dict(section="timing", case=name, impl=impl, dtype=dt, fwd_ms=fwd,
                             bwd_ms=total - fwd, fwd_bwd_ms=total))  # fmt: skip
            print(f"timing {name:34s} {impl:11s} fwd {fwd:7.3f}  fwd+bwd {total:7.3f}", flush=True)
        del q, k, v, do
        torch.cuda.empty_cache()


def leaderboard(rows: list[dict]) -> None:
    """The leaderboard harness: compiled Function, 3-D bf16 inputs, o.sum().backward()."""
    fn = torch.compile(FlashAttention2Triton.apply)
    q, k, v = (
        torch.randn(16, 16384, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )

    def step():
        fn(q, k, v, True).sum().backward()

    step()
    ms = _bench(step, mean=True)
    rows.append(dict(section="leaderboard", case="(16, 16384, 64) causal compiled", mean_ms=ms))
    print(f"leaderboard compiled fwd+bwd mean {ms:.3f} ms", flush=True)


@contextlib.contextmanager
def _single_pass_for_every_dtype():
    """Let `deterministic=False` take the single-pass backward for any dtype, for timing it."""
    from fa2.triton import configs

    chosen = configs.single_pass_backward
    configs.single_pass_backward = lambda dtype: True
    try:
        yield
    finally:
        configs.single_pass_backward = chosen


def sweep(rows: list[dict]) -> None:
    """FA2_AUTOTUNE's timing of every listed tile at the shapes that choose the defaults, for
    the kernels named by --sweep-kernels (forward, dq, dkdv, single-pass: the fused backward
    of `deterministic=False`, timed for 16-bit inputs too, which do not use it by default)."""
    from fa2.triton import configs
    from fa2.triton.configs import dot_precision
    from fa2.triton.function import run_backward, run_forward

    tuned = os.environ.get("FA2_AUTOTUNE", "0")
    shapes = [
        ((16, 1, 16384, 64), torch.bfloat16, None),
        ((16, 1, 16384, 128), torch.bfloat16, None),
        ((4, 32, 2048, 128), torch.bfloat16, None),
        ((2, 32, 4096, 128), torch.bfloat16, None),  # where short sequences' tiles stop paying
        ((1, 32, 8192, 128), torch.bfloat16, None),
        ((8, 1, 4096, 64), torch.float32, "tf32x3"),
        ((4, 1, 8192, 128), torch.float32, "tf32x3"),
    ]
    names = {id(configs.FORWARD): "forward", id(configs.DQ): "dq", id(configs.DKDV): "dkdv",
             id(configs.DKDV_ATOMIC): "single-pass"}  # fmt: skip
    reported: set[tuple] = set()
    for shape, dtype, precision in shapes:
        name = f"{'bf16' if dtype == torch.bfloat16 else 'fp32'} {shape}"
        if not any(part in name for part in CASE_FILTER[0].split("|")):
            continue
        q, k, v = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(3))
        precision = dot_precision(dtype, precision)
        scale = shape[-1] ** -0.5
        os.environ["FA2_AUTOTUNE"] = "1" if "forward" in SWEEP_KERNELS else "0"
        o, lse = run_forward(q, k, v, True, scale, precision)
        do = torch.randn_like(o)
        os.environ["FA2_AUTOTUNE"] = "1" if {"dq", "dkdv"} & set(SWEEP_KERNELS) else "0"
        run_backward(q, k, v, o, lse, do, True, scale, precision, True)
        if "single-pass" in SWEEP_KERNELS:
            with _single_pass_for_every_dtype():
                run_backward(q, k, v, o, lse, do, True, scale, precision, False)
        os.environ["FA2_AUTOTUNE"] = tuned
        for key, times in configs.timings.items():  # this shape's, as they come
            if key in reported:
                continue
            reported.add(key)
            table, d_block, tuned_dtype, tuned_precision, _causal, bucket = key
            for tile, ms in sorted(times.items(), key=lambda item: item[1]):
                rows.append(dict(section="sweep", case=name, kernel=names[table],
                                 d_block=d_block, dtype=str(tuned_dtype),
                                 precision=tuned_precision,
                                 seq_bucket=bucket, tile=list(tile), ms=ms))  # fmt: skip
            best = min(times, key=times.get)
            print(f"sweep {name} {names[table]:7s}: best {tuple(best)} {times[best]:.3f} ms; "
                  + ", ".join(f"{tuple(t)} {m:.3f}" for t, m in
                              sorted(times.items(), key=lambda item: item[1])),
                  flush=True)  # fmt: skip


class _SavedRows(list):
    """The result rows, written out after each one: a run stopped at a time limit keeps them."""

    def __init__(self, path: Path, meta: dict) -> None:
        super().__init__()
        self.path, self.meta = path, meta

    def append(self, row: dict) -> None:
        super().append(row)
        self.path.write_text(json.dumps(dict(meta=self.meta, rows=list(self)), indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--sweep", action="store_true", help="time every listed tile")
    parser.add_argument("--skip-bench", action="store_true", help="accuracy only")
    parser.add_argument("--sections", default="", help="comma-separated subset to run")
    parser.add_argument(
        "--cases",
        default="",
        help="time (and sweep) only cases whose name has one of these, |-separated; a sweep "
        "case is named like 'bf16 (4, 32, 2048, 128)'",
    )
    parser.add_argument("--tuned", action="store_true", help="time with FA2_AUTOTUNE=1")
    parser.add_argument(
        "--sweep-kernels", default=",".join(SWEEP_KERNELS), help="kernels the sweep times"
    )
    args = parser.parse_args()
    if args.tuned:
        os.environ["FA2_AUTOTUNE"] = "1"
    CASE_FILTER[0] = args.cases
    SWEEP_KERNELS[:] = args.sweep_kernels.split(",")
    import triton

    meta = dict(
        device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
        python=platform.python_version(), date=datetime.date.today().isoformat(),
        command=" ".join(sys.argv),
    )  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    rows = _SavedRows(args.out / "gpu_check.json", meta)
    sections = [accuracy] + ([sweep] if args.sweep else [])
    sections += [] if args.skip_bench else [timings, leaderboard]
    if args.sections:
        sections = [f for f in (accuracy, sweep, timings, leaderboard)
                    if f.__name__ in args.sections.split(",")]  # fmt: skip
    for section in sections:
        try:
            section(rows)
        except Exception as exc:  # keep what the other sections measure
            print(f"{section.__name__} failed: {type(exc).__name__}: {exc}", flush=True)
            rows.append(dict(section=section.__name__, error=f"{type(exc).__name__}: {exc}"))

    print(f"\n{meta['device']}, torch {meta['torch']}, triton {meta['triton']}")
    print("| case | impl | fwd ms | bwd ms | fwd+bwd ms | vs cuDNN / SDPA |")
    print("| --- | --- | --- | --- | --- | --- |")
    timed = [r for r in rows if r.get("section") == "timing"]
    for r in timed:
        base = next((b for b in timed if b["case"] == r["case"] and b["impl"] in
                     ("sdpa-cudnn", "sdpa")), None)  # fmt: skip
        ratio = f"{r['fwd_bwd_ms'] / base['fwd_bwd_ms']:.2f}x" if base else ""
        print(f"| {r['case']} | {r['impl']} | {r['fwd_ms']:.3f} | {r['bwd_ms']:.3f} | "
              f"{r['fwd_bwd_ms']:.3f} | {ratio} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

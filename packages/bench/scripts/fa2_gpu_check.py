"""One GPU session's checks for fa2: accuracy against float64, tile sweeps, timings vs SDPA.

Run from the repository root on a CUDA machine (no install needed)::

    export PYTHONPATH=$(ls -d $PWD/packages/*/src | paste -sd:)
    python3 packages/bench/scripts/fa2_gpu_check.py --out results/ [--sweep] [--skip-bench]

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

4. The drop-in round (`--sections varlen,window,overhead`, not run by default): packed
   sequences (64 documents, 32768 tokens) beside padded batches and one long causal sequence;
   a sliding window of 4096 at 32768 tokens against full causal; the launch path at (32, 16,
   512, 64) beside the passes alone and cuDNN, and the host time of a tiny call (bench-flash's
   `host_ms`, with the GPU held busy: bench on the path, as every run of this script has). With
   `--results docs/results` these rows also become fa2_dropin_<device>_<date>.md/.json/.png
   (needs the bench package on the path, as below).
5. `--sections entry_points` (not run by default, about 15 s): `FlashAttention2Triton.apply`
   beside the front doors and cuDNN at (32, 16, 512, 64), and the host time of each path
   (with `--results`, in the same result file).

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
        o, lse, plan = run_forward(q, k, v, True, scale, precision)
        do = torch.randn_like(o)
        os.environ["FA2_AUTOTUNE"] = "1" if {"dq", "dkdv"} & set(SWEEP_KERNELS) else "0"
        run_backward(plan, q, k, v, o, lse, do, scale, True)
        if "single-pass" in SWEEP_KERNELS:
            with _single_pass_for_every_dtype():
                run_backward(plan, q, k, v, o, lse, do, scale, False)
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


# The drop-in round's cases (the issue's): packed documents, a sliding window at 32k tokens, the
# launch path at a training shape and at a size where only host time counts.
VARLEN_CASE = dict(n_docs=64, total=32768, heads=16, d=64)
WINDOW_CASE = dict(n=32768, heads=16, d=64, window=4096)
OVERHEAD_SHAPE = (32, 16, 512, 64)
TINY_SHAPE = (1, 2, 128, 64)
DEVICE = "cuda"


def _random_lengths(n_docs: int, total: int, seed: int = 0) -> list[int]:
    """`n_docs` document lengths of at least 1 summing to `total`: cuts at distinct random
    positions (a fixed seed, so every run measures the same documents)."""
    g = torch.Generator().manual_seed(seed)
    cuts = torch.randperm(total - 1, generator=g)[: n_docs - 1].add(1).sort().values
    return torch.cat([cuts, torch.tensor([total])]).diff(prepend=torch.tensor([0])).tolist()


def _record(rows, section, case, impl, fwd, total, **extra):
    rows.append(dict(section=section, case=case, impl=impl, fwd_ms=fwd, bwd_ms=total - fwd,
                     fwd_bwd_ms=total, **extra))  # fmt: skip
    print(f"{section:9s} {case:34s} {impl:30s} fwd {fwd:7.3f}  fwd+bwd {total:7.3f}", flush=True)


def varlen(rows: list[dict]) -> None:
    """64 documents of random lengths, 32768 tokens, 16 heads of 64, bf16, causal: fa2's packed
    sequences beside the same documents padded to the longest (fa2 and SDPA's default, whose
    causal mask keeps right padding out of the real tokens' results) and beside one causal
    sequence of all the tokens (attention across documents: what packing without boundaries
    costs)."""
    from fa2 import flash_attn_func, flash_attn_varlen_func

    heads, d, total, n_docs = (VARLEN_CASE[key] for key in ("heads", "d", "total", "n_docs"))
    lengths = _random_lengths(n_docs, total)
    longest = max(lengths)
    case = f"{n_docs} docs, {total} tokens, longest {longest}"
    dtype = torch.bfloat16
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                      device=DEVICE)  # fmt: skip
    packed = [torch.randn(total, heads, d, device=DEVICE, dtype=dtype) for _ in range(3)]
    fn = lambda q, k, v: flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=True)  # noqa: E731
    _record(rows, "varlen", case, "fa2 packed (flash_attn_varlen_func)",
            *_time_impl(fn, *packed, torch.randn_like(packed[0])), tokens=total)  # fmt: skip
    padded = [torch.zeros(n_docs, longest, heads, d, device=DEVICE, dtype=dtype) for _ in range(3)]
    for t, src in zip(padded, packed, strict=True):
        for b, (start, n) in enumerate(zip(cu.tolist(), lengths, strict=False)):
            t[b, :n] = src[start : start + n]
    do = torch.randn_like(padded[0])
    _record(rows, "varlen", case, "fa2 padded batch (flash_attn_func)",
            *_time_impl(lambda q, k, v: flash_attn_func(q, k, v, causal=True), *padded, do),
            tokens=n_docs * longest)  # fmt: skip
    bhsd = [t.transpose(1, 2) for t in padded]
    _record(rows, "varlen", case, "SDPA padded batch (default backend)",
            *_time_impl(lambda q, k, v: _sdpa(q, k, v, True), *bhsd, do.transpose(1, 2)),
            tokens=n_docs * longest)  # fmt: skip
    del padded, bhsd, do
    one = [t.unsqueeze(0) for t in packed]  # (1, total, heads, d)
    _record(rows, "varlen", case, "fa2 one causal sequence",
            *_time_impl(lambda q, k, v: flash_attn_func(q, k, v, causal=True), *one,
                        torch.randn_like(one[0])), tokens=total)  # fmt: skip
    one = [t.transpose(1, 2) for t in one]
    _record(rows, "varlen", case, "SDPA cuDNN one causal sequence",
            *_time_impl(lambda q, k, v: _sdpa(q, k, v, True, SDPBackend.CUDNN_ATTENTION), *one,
                        torch.randn_like(one[0])), tokens=total)  # fmt: skip
    torch.cuda.empty_cache()


def window(rows: list[dict]) -> None:
    """A sliding window of 4096 keys over 32768 tokens (1 x 16 heads of 64, bf16, causal)
    against full causal attention, fa2 beside SDPA's cuDNN backend (which has no window);
    `visible_pairs` is the share of (query, key) pairs each mask keeps, the work it needs."""
    from fa2 import flash_attn_func

    n, heads, d, w = (WINDOW_CASE[key] for key in ("n", "heads", "d", "window"))
    q, k, v = (torch.randn(1, n, heads, d, device=DEVICE, dtype=torch.bfloat16) for _ in range(3))
    do = torch.randn_like(q)
    causal_pairs = n * (n + 1) / 2
    window_pairs = w * (w + 1) / 2 + (n - w) * w
    case = f"(1, {n}, {heads}, {d}) causal"
    for impl, options, pairs in (
        ("fa2 full causal", {}, causal_pairs),
        (f"fa2 window {w}", dict(window_size=(w - 1, 0)), window_pairs),
        (f"fa2 window {w} + softcap 50", dict(window_size=(w - 1, 0), softcap=50.0), window_pairs),
    ):
        fn = lambda q, k, v, o=options: flash_attn_func(q, k, v, causal=True, **o)  # noqa: E731
        _record(rows, "window", case, impl, *_time_impl(fn, q, k, v, do),
                visible_pairs=pairs / causal_pairs)  # fmt: skip
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    cudnn = lambda q, k, v: _sdpa(q, k, v, True, SDPBackend.CUDNN_ATTENTION)  # noqa: E731
    _record(rows, "window", case, "SDPA cuDNN full causal",
            *_time_impl(cudnn, qt, kt, vt, do.transpose(1, 2)), visible_pairs=1.0)  # fmt: skip
    torch.cuda.empty_cache()


def _host_us(fn, calls: int = 300) -> float:
    """Host time of one call in µs: `fn` issued `calls` times while the GPU is held busy
    (bench-flash's `host_ms`), so the loop runs at the host's pace."""
    from bench.tools.flash import host_ms

    return host_ms(fn, device="cuda", calls=calls) * 1e3


@contextlib.contextmanager
def _dq_without_tma():
    """The 16-bit d = 64 dQ tiles with plain loads (by default the first reads through TMA
    descriptors, chosen at 16k tokens), with fresh launch plans, for an A/B at short lengths."""
    from fa2.triton import configs, forward

    chosen = configs.DQ["16bit_d64"]
    configs.DQ["16bit_d64"] = [tile._replace(tma=False) for tile in chosen]
    forward._plans.cache.clear()  # backward plans hang on forward plans
    try:
        yield
    finally:
        configs.DQ["16bit_d64"] = chosen
        forward._plans.cache.clear()


def overhead(rows: list[dict]) -> None:
    """The launch path at a training shape, (32, 16, 512, 64) bf16 causal: eager forward and
    backward through fa2's front door (and through flash_attn_func on the same data in flash-
    attn's layout) beside the two passes alone (the kernels without autograd, from
    `run_forward`/`run_backward`) and SDPA's cuDNN backend, and with the dQ pass reading through
    plain loads instead of its default TMA descriptors (an A/B); then the host time of one
    forward+backward at a tiny size, (1, 2, 128, 64), for fa2 and cuDNN."""
    from fa2 import flash_attention, flash_attn_func
    from fa2.triton.function import run_backward, run_forward

    q, k, v = (torch.randn(OVERHEAD_SHAPE, device=DEVICE, dtype=torch.bfloat16) for _ in range(3))
    do = torch.randn_like(q)
    case = f"{OVERHEAD_SHAPE} causal"
    front = lambda q, k, v: flash_attention(q, k, v, causal=True)  # noqa: E731
    _record(rows, "overhead", case, "fa2 flash_attention", *_time_impl(front, q, k, v, do))
    bshd = [t.transpose(1, 2).contiguous() for t in (q, k, v, do)]
    dropin = lambda q, k, v: flash_attn_func(q, k, v, causal=True)  # noqa: E731
    _record(rows, "overhead", case, "fa2 flash_attn_func (bshd)", *_time_impl(dropin, *bshd))
    scale = OVERHEAD_SHAPE[-1] ** -0.5
    o, lse, plan = run_forward(q, k, v, True)
    fwd = _bench(lambda: run_forward(q, k, v, True))
    bwd = _bench(lambda: run_backward(plan, q, k, v, o, lse, do, scale))
    _record(rows, "overhead", case, "fa2 passes alone (no autograd)", fwd, fwd + bwd)
    cudnn = lambda q, k, v: _sdpa(q, k, v, True, SDPBackend.CUDNN_ATTENTION)  # noqa: E731
    _record(rows, "overhead", case, "SDPA cuDNN", *_time_impl(cudnn, q, k, v, do))
    with _dq_without_tma():  # an A/B of the dQ pass's default TMA loads at this short length
        _record(rows, "overhead", case, "fa2 flash_attention, dQ without TMA",
                *_time_impl(front, q, k, v, do))  # fmt: skip
        o, lse, plan = run_forward(q, k, v, True)
        bwd = _bench(lambda: run_backward(plan, q, k, v, o, lse, do, scale))
        _record(rows, "overhead", case, "fa2 passes alone, dQ without TMA", fwd, fwd + bwd)
    tiny = [torch.randn(TINY_SHAPE, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
            for _ in range(3)]  # fmt: skip
    tiny_do = torch.randn_like(tiny[0])
    for impl, fn in (("fa2 flash_attention", front), ("SDPA cuDNN", cudnn)):
        us = _host_us(lambda fn=fn: torch.autograd.grad(fn(*tiny), tiny, tiny_do))
        rows.append(dict(section="host", case=f"{TINY_SHAPE} causal", impl=impl, host_us=us))
        print(f"host      fwd+bwd {TINY_SHAPE}  {impl:30s} {us:7.1f} µs", flush=True)
    torch.cuda.empty_cache()


def entry_points(rows: list[dict]) -> None:
    """`FlashAttention2Triton.apply` beside the front doors at (32, 16, 512, 64) bf16 causal (the
    Hopper issue found `.apply` slower than `flash_attn_func` there, in a run that committed no
    result): `.apply` with a random output gradient and with the gradient of `o.sum()`, as the
    2025 leaderboard harness takes it (an expanded tensor, which the backward copies),
    `flash_attention`, `flash_attn_func` on the same data in (batch, seq, heads, d), cuDNN;
    then the host time of a tiny forward+backward through `.apply` and the front door. About
    15 s with compilation."""
    from fa2 import flash_attention, flash_attn_func

    q, k, v = (torch.randn(OVERHEAD_SHAPE, device=DEVICE, dtype=torch.bfloat16) for _ in range(3))
    do = torch.randn_like(q)
    case = f"{OVERHEAD_SHAPE} causal"
    apply = lambda q, k, v: FlashAttention2Triton.apply(q, k, v, True)  # noqa: E731
    _record(rows, "entry", case, "FlashAttention2Triton.apply", *_time_impl(apply, q, k, v, do))
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    total = _bench(lambda: torch.autograd.grad(apply(*leaves).sum(), leaves))
    _record(rows, "entry", case, ".apply, gradient of o.sum()", _bench(lambda: apply(*leaves)),
            total)  # fmt: skip
    front = lambda q, k, v: flash_attention(q, k, v, causal=True)  # noqa: E731
    _record(rows, "entry", case, "flash_attention", *_time_impl(front, q, k, v, do))
    bshd = [t.transpose(1, 2).contiguous() for t in (q, k, v, do)]
    dropin = lambda q, k, v: flash_attn_func(q, k, v, causal=True)  # noqa: E731
    _record(rows, "entry", case, "flash_attn_func (bshd)", *_time_impl(dropin, *bshd))
    cudnn = lambda q, k, v: _sdpa(q, k, v, True, SDPBackend.CUDNN_ATTENTION)  # noqa: E731
    _record(rows, "entry", case, "SDPA cuDNN", *_time_impl(cudnn, q, k, v, do))
    tiny = [torch.randn(TINY_SHAPE, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
            for _ in range(3)]  # fmt: skip
    tiny_do = torch.randn_like(tiny[0])
    for impl, fn in (("FlashAttention2Triton.apply", apply), ("flash_attention", front)):
        us = _host_us(lambda fn=fn: torch.autograd.grad(fn(*tiny), tiny, tiny_do))
        rows.append(dict(section="entry host", case=f"{TINY_SHAPE} causal", impl=impl,
                         host_us=us))  # fmt: skip
        print(f"host      fwd+bwd {TINY_SHAPE}  {impl:30s} {us:7.1f} µs", flush=True)


def save_results(rows: list[dict], folder: Path, command: str) -> None:
    """The drop-in sections' rows as a result of the project's bench machinery: Markdown, JSON
    (with device, versions, date, command, git revision) and a PNG, named
    `fa2_dropin_<device>_<date>`."""
    from bench.core.plots import hbar_plot
    from bench.core.results import Run, result_stem, save_json

    sections = ("varlen", "window", "overhead", "host", "entry", "entry host")
    dropin = [r for r in rows if r.get("section") in sections and "impl" in r]
    for r in dropin:  # each row's time over its section's first row's (the one to beat)
        first = next(b for b in dropin if b["section"] == r["section"])
        key = "host_us" if r["section"].endswith("host") else "fwd_bwd_ms"
        r["vs_first"] = r[key] / first[key]
    run = Run.create(
        "fa2-dropin", dropin, device=DEVICE, command=command, group_by="section",
        title="fa2: packed sequences, sliding windows and the launch path (do_bench medians, ms)",
        columns=["section", "case", "impl", "fwd_ms", "bwd_ms", "fwd_bwd_ms", "host_us",
                 "vs_first", "visible_pairs", "tokens"],
        config={"sections": sorted({r["section"] for r in dropin})},
        notes=[
            "Medians of triton.testing.do_bench (L2 flushed), a random output gradient through "
            "torch.autograd.grad; bwd = fwd+bwd - fwd. vs_first: this row's fwd+bwd (host: "
            "host time) over its section's first row's.",
            "varlen: the same documents packed (no padding, attention within documents), "
            "padded to the longest (attention on padding), and as one causal sequence "
            "(attention across documents). window: visible_pairs is the share of the causal "
            "(query, key) pairs the mask keeps. host: wall time per forward+backward issued "
            "back to back at a size where the GPU waits for the host. entry: the entry points "
            "on the same data (flash_attn_func's in (batch, seq, heads, d)); the gradient of "
            "o.sum() is an expanded tensor, as the 2025 leaderboard harness takes it.",
        ],
    )  # fmt: skip
    stem = folder / result_stem("fa2_dropin", run.env)
    timed = [dict(r, label=f"{r['section']}: {r['impl']}") for r in dropin if "fwd_bwd_ms" in r]
    plot = hbar_plot(timed, label="label", values=[("fwd_ms", "forward"),
                     ("fwd_bwd_ms", "forward+backward")], path=stem.with_suffix(".png"),
                     title=run.plot_title, xlabel="ms")  # fmt: skip
    run.plots = [plot.name]
    save_json(run, stem.with_suffix(".json"))
    stem.with_suffix(".md").write_text(run.to_markdown() + f"\n\n![plot]({plot.name})\n")
    print(f"wrote {stem}.md, .json, .png", flush=True)


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
    parser.add_argument(
        "--sections",
        default="",
        help="comma-separated subset to run: accuracy, sweep, timings, leaderboard, the "
        "drop-in round's varlen, window, overhead, and entry_points (not run by default)",
    )
    parser.add_argument(
        "--results",
        type=Path,
        help="also write the varlen/window/overhead/entry_points rows as "
        "fa2_dropin_<device>_<date>.md, "
        ".json and .png in this folder (through the bench package's results machinery)",
    )
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
        known = (accuracy, sweep, timings, leaderboard, varlen, window, overhead, entry_points)
        sections = [f for f in known if f.__name__ in args.sections.split(",")]
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
    if args.results is not None:
        save_results(list(rows), args.results, "python3 " + meta["command"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The Hopper screen: fa2's candidate kernels beside today's defaults and cuDNN, on one GPU.

For each shape (causal, bf16, a random output gradient) and each implementation: cuDNN (SDPA's
cuDNN backend), fa2 as it runs by default (on Hopper: the Gluon forward for sequences longer
than `SHORT_SEQ`, the Gluon backward at head dim 128, deterministic), fa2 with the Triton
forward at every length ("fa2 triton-fwd": FA2_GLUON_FORWARD=0) or the Triton backward ("fa2
triton-bwd": FA2_BACKWARD=triton, two passes), and fa2 with each candidate forced through
FA2_TILES / FA2_L2_GROUP / FA2_BACKWARD (`fa2.triton.configs`): the warp-specialised forward and
dK/dV tiles, dQ on 128x128 tiles, the L2-grouped backward launch order, all of them together
(tiles named for a backward kernel keep the Triton backward), the Gluon single-pass backward
at every head dim it takes ("fa2 gluon-bwd": FA2_BACKWARD=gluon, deterministic; "fa2
gluon-bwd-nondet": the same called with `deterministic=False`, dQ's additions in whatever
order; where it cannot run, e.g. on a CPU, a row says "unavailable" and why), and the Gluon
forward at every length ("fa2 gluon-fwd": FA2_GLUON_FORWARD=1, `fa2.triton.gluon_forward`;
"-pingpong": with FA3's inter-warpgroup ping-pong too; "-plain": without FA3's
intra-warpgroup overlap; "fa2 gluon-fwd+bwd": both Gluon kernels forced). `--impls` keeps only
the named fa2 rows (cuDNN always runs). Measured:

- forward, forward+backward (do_bench medians, L2 flushed between calls), backward = their
  difference; every implementation at a shape is compiled and checked first, then timed in
  `--rounds` interleaved rounds (forwards, then backwards), each time the median of its
  rounds, so that a drift over the run does not favour whichever runs last (two launches
  timed one after the other swapped their order of merit when they swapped places:
  docs/results/fa2_gluon_bwd_variants_h200_2026-11-29_sleep_a.md, _sleep_b.md); inputs
  under 1 GiB rotate among up to 4 copies, so that no call starts on data the one before
  left in caches (do_bench's own flush covers L2 only); TFLOP/s by the usual
  convention (forward 4·B·H·S²·D halved for causal, backward 2.5x);
- the error of o, dq, dk, dv against float64 (`fa2.attention_reference`) on a slice: batch 0,
  head 0, the first min(S, 8192) positions (a causal prefix is a problem of its own; 8192 keeps
  the tiles of the long sequences), beside SDPA cuDNN's error on the same slice;
- whether two backward passes over the full shape give the same bits (expected of every fa2
  row but "fa2 gluon-bwd-nondet");
- the tiles the plans launched, and whether the warp-specialised loop was compiled in;
- the host's time to issue one forward+backward while the GPU is held busy (bench's
  `host_ms`): where it is half the fwd+bwd or more, the row may time the host, not the kernels.

Every part runs under a time budget (`--budget` seconds in all, Triton's compilation included):
the time left is shared among the shapes not yet run, each weighing 1 plus its FLOPs over
`FLOPS_PER_WEIGHT` (the long shapes' timing runs take seconds where the short ones' take less
than their compilation); what does not fit is recorded as skipped. Rows are
written to `OUT/hopper_screen.json` as they come, so a run stopped early keeps them; a compact
table is printed last. From bench it imports only the host timer, where bench is installed.

GPU (one H100 or H200), from the repository root, with no install::

    export PYTHONPATH=$(ls -d $PWD/packages/*/src | paste -sd:)
    BENCH_GIT_REVISION=<commit> python3 packages/fa2/scripts/hopper_screen.py --out $OUT

The default beside the Triton backward and the Gluon backward's two orders only, at every shape
(within the same budget)::

    python3 packages/fa2/scripts/hopper_screen.py --out $OUT \
        --impls fa2 "fa2 triton-bwd" "fa2 gluon-bwd" "fa2 gluon-bwd-nondet"

The same with q, k, v and dO laid out as a model's projections give them, (batch, seq, heads, d)
tensors viewed (batch, heads, seq, d) (the leaderboard step's layout), for cuDNN too::

    python3 packages/fa2/scripts/hopper_screen.py --out $OUT --layout bshd --impls fa2

Rehearsal on a CPU (Triton's interpreter, tiny shapes and the interpreter's tiles)::

    uv run python packages/fa2/scripts/hopper_screen.py --tiny --out screen_tiny

A results page and its plot from a screen's JSON (beside it, .md and .png; no GPU)::

    uv run python packages/fa2/scripts/hopper_screen.py --report OUT/hopper_screen.json
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and "--tiny" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when triton is first imported

import argparse
import ast
import datetime
import json
import math
import platform
import shlex
import statistics
import subprocess
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from fa2 import FlashAttention2Triton, attention_reference
from fa2.triton import configs, forward, gluon_backward, gluon_forward, launch

try:  # the host timer is bench's; with fa2 installed alone the rows have no host time
    from bench.tools.flash import host_calls, host_ms
except ImportError:
    host_ms = None

SHAPES = [  # (batch, heads, seq, head dim), in the order they run
    (2, 32, 32768, 128),  # the 2026 leaderboard's
    (1, 16, 16384, 128),
    (4, 32, 2048, 128),
    (1, 16, 16384, 64),
    (4, 16, 4096, 64),
    (32, 16, 512, 64),
    # the same FLOPs at 16k and 32k tokens: does the backward lose efficiency with length?
    (64, 1, 16384, 128),
    (16, 1, 32768, 128),
]
TINY_SHAPES = [(1, 2, 70, 64), (2, 2, 45, 128)]
FLOPS_PER_WEIGHT = 2e13  # forward+backward FLOPs that weigh as much as one shape's compilation
ACCURACY_PREFIX = 8192  # longer than configs.SHORT_SEQ: the slice takes the long tiles
ROUNDS = 2  # timings of each implementation at a shape, interleaved (`serpentine`)
ROTATE_BYTES = 2**30  # inputs (q, k, v, dO) rotate among up to 4 copies until they span this
# A row whose host time is at least this share of its fwd+bwd may time the host, not the
# kernels: the same calls took the host 0.23 to 0.42 ms in four processes on one machine, and
# the slow ones timed up to 0.61 ms where the kernels take 0.33
# (docs/results/fa2_hopper_screen_h200_2026-11-29_512_host.md).
HOST_BOUND = 0.5


def candidates(d: int, *, tiny: bool) -> dict[str, dict[str, str]]:
    """The environment of each fa2 implementation at head dim `d` (tiles from the tables)."""
    if tiny:  # the interpreter's candidates
        fwd, dkdv, dq = "32x16/1w/1s+TMA+WS", "16x32/1w/1s+TMA+WS", "32x32/1w/1s"
    else:
        fwd = "128x64/4w/2s+TMA+WS"
        dkdv = {64: "64x128/4w/2s+TMA+WS", 128: "32x128/4w/2s+TMA+WS"}[d]
        dq = "128x128/8w/2s+TMA"
    every = f"forward={fwd},dkdv={dkdv},dq={dq}"
    return {
        # the defaults: on Hopper the Gluon forward for sequences past SHORT_SEQ and the Gluon
        # backward (deterministic) at head dim 128
        "fa2": {},
        "fa2 triton-fwd": {"FA2_GLUON_FORWARD": "0"},  # the Triton forward at every length
        "fa2 triton-bwd": {"FA2_BACKWARD": "triton"},  # the Triton backward (two passes)
        "fa2 ws-fwd": {"FA2_TILES": f"forward={fwd}"},
        "fa2 ws-dkdv": {"FA2_TILES": f"dkdv={dkdv}"},
        "fa2 dq-128x128": {"FA2_TILES": f"dq={dq}"},
        "fa2 l2-auto": {"FA2_L2_GROUP": "auto"},
        "fa2 all": {"FA2_TILES": every},
        "fa2 all+l2": {"FA2_TILES": every, "FA2_L2_GROUP": "auto"},
        GLUON: {"FA2_BACKWARD": "gluon"},  # at every head dim it takes, deterministic
        NONDETERMINISTIC: {"FA2_BACKWARD": "gluon"},  # dQ's additions as they come
        "fa2 gluon-fwd": {"FA2_GLUON_FORWARD": "1"},
        "fa2 gluon-fwd-pingpong": {"FA2_GLUON_FORWARD": "pingpong"},
        "fa2 gluon-fwd-plain": {"FA2_GLUON_FORWARD": "plain"},
        "fa2 gluon-fwd-persistent": {"FA2_GLUON_FORWARD": "persistent"},
        "fa2 gluon-fwd+bwd": {"FA2_GLUON_FORWARD": "1", "FA2_BACKWARD": "gluon"},
    }


GLUON = "fa2 gluon-bwd"  # the Gluon single-pass backward (`fa2.triton.gluon_backward`)
NONDETERMINISTIC = "fa2 gluon-bwd-nondet"  # the same, called with deterministic=False
_SETTINGS = ("FA2_TILES", "FA2_L2_GROUP", "FA2_BACKWARD", "FA2_GLUON_FORWARD")


@contextmanager
def environment(settings: dict[str, str]):
    """The variables of `_SETTINGS` (FA2_TILES, FA2_L2_GROUP, FA2_BACKWARD, FA2_GLUON_FORWARD) as
    `settings` says (unset where it does not name them)."""
    saved = {name: os.environ.pop(name, None) for name in _SETTINGS}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value


def fa2_attention(q, k, v):
    return FlashAttention2Triton.apply(q, k, v, True)


def fa2_nondeterministic(q, k, v):
    """fa2 with `deterministic=False`: the Gluon backward adds dQ in whatever order."""
    return FlashAttention2Triton.apply(q, k, v, True, None, False, None, False)


def gluon_bwd(env: dict[str, str]) -> bool:
    """Whether a candidate's environment forces the Gluon backward."""
    return env.get("FA2_BACKWARD") == "gluon"


def fa2_function(name: str) -> Callable:
    """The call an fa2 candidate is timed with."""
    return fa2_nondeterministic if name == NONDETERMINISTIC else fa2_attention


def baseline_name() -> str:
    return "cudnn" if torch.cuda.is_available() else "sdpa-cpu"


def cudnn_attention(q, k, v):
    if q.device.type != "cuda":  # the rehearsal: SDPA's CPU kernel stands in
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _median_ms(fn: Callable[[], object], *, rep_ms: float) -> float:
    """do_bench's median on a GPU; on a CPU the median of a few timed calls."""
    if torch.cuda.is_available():
        from triton.testing import do_bench

        return do_bench(fn, warmup=max(25, rep_ms // 4), rep=rep_ms, return_mode="median")
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


# How q, k, v and dO are laid out (`--layout`): contiguous (batch, heads, seq, d); as a model's
# projections give them, (batch, seq, heads, d) tensors viewed (batch, heads, seq, d); or as fa2
# received them inside the compiled leaderboard step, q and k contiguous (batch, heads, seq, d)
# (the compiled RoPE writes them so) and v and dO viewed from (batch, seq, heads, d).
LAYOUTS = ("bhsd", "bshd", "step")
_VIEWED = {"bhsd": (False,) * 4, "bshd": (True,) * 4, "step": (False, False, True, True)}


def _inputs(shape, device, copies, layout="bhsd"):
    """`copies` sets of fresh q, k, v (requiring grad, or views of leaves that do) and dO, all
    (batch, heads, seq, d) in shape, stored as `layout` says."""
    b, h, s, d = shape

    def make(viewed, grad=False):
        stored = (b, s, h, d) if viewed else shape
        x = torch.randn(stored, device=device, dtype=torch.bfloat16, requires_grad=grad)
        return x.transpose(1, 2) if viewed else x

    viewed = _VIEWED[layout]
    return [tuple(make(view, grad=i < 3) for i, view in enumerate(viewed)) for _ in range(copies)]


def _both(fn, sets):
    """A forward+backward call of `fn` that takes the next input set each time."""
    turn = iter(range(10**9))

    def run_both():
        q, k, v, do = sets[next(turn) % len(sets)]
        torch.autograd.grad(fn(q, k, v), (q, k, v), do)

    return run_both


def time_impl(fn, sets, *, rep_ms):
    """(forward ms, forward+backward ms), cycling through the input sets call by call."""
    turn = iter(range(10**9))

    def run_forward():
        q, k, v, _ = sets[next(turn) % len(sets)]
        return fn(q, k, v)

    return _median_ms(run_forward, rep_ms=rep_ms), _median_ms(_both(fn, sets), rep_ms=rep_ms)


def issue_ms(fn, sets, *, fwd_bwd_ms: float) -> float | None:
    """The host's time to issue one forward+backward (bench's `host_ms`, over `host_calls`
    calls; None on a CPU or without bench)."""
    if host_ms is None:
        return None
    return host_ms(_both(fn, sets), device="cuda" if torch.cuda.is_available() else "cpu",
                   calls=host_calls(fwd_bwd_ms))  # fmt: skip


def _errors(outputs, reference) -> list[float]:
    pairs = zip(outputs, reference, strict=True)
    return [((x.double() - r).norm() / r.norm()).item() for x, r in pairs]


def slice_reference(q, k, v, do):
    """The accuracy slice (batch 0, head 0, a causal prefix) and its float64 o, dq, dk, dv."""
    n = min(q.shape[-2], ACCURACY_PREFIX)
    part = [t.detach()[:1, :1, :n].contiguous() for t in (q, k, v, do)]
    ins = [t.double().requires_grad_() for t in part[:3]]
    o, _ = attention_reference(*ins, causal=True)
    return part, [o.detach(), *torch.autograd.grad(o, ins, part[3].double())]


def worst_ratio(ratios) -> float:
    """The largest of `ratios`, NaN if any is NaN (Python's `max` keeps or drops a NaN
    depending on where it stands)."""
    ratios = list(ratios)
    return math.nan if any(math.isnan(r) for r in ratios) else max(ratios)


def slice_errors(fn, part, reference) -> list[float]:
    q, k, v = (t.clone().requires_grad_() for t in part[:3])
    o = fn(q, k, v)
    return _errors([o, *torch.autograd.grad(o, (q, k, v), part[3])], reference)


def deterministic(fn, q, k, v, do) -> bool:
    """Whether two backward passes over the same inputs give the same bits."""
    first = torch.autograd.grad(fn(q, k, v), (q, k, v), do)
    second = torch.autograd.grad(fn(q, k, v), (q, k, v), do)
    return all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def launched(shape) -> dict[str, str]:
    """The tiles the forward and backward plans of `shape` launched under the current settings
    ("+WS" only where the warp-specialised loop was compiled in), and the L2 groups."""
    settings = configs.tile_settings()
    cache = forward._plans.cache
    plans = [p for key, p in cache.items() if key[0] == shape and key[-1] == settings]
    if not plans:
        return {}
    fwd = plans[-1]
    out = {"forward": "gluon" if fwd.gluon else _tile(fwd.tile, fwd.launch.options)}
    for bwd in fwd.backward_plans.values():
        if bwd.gluon:
            out["backward"] = "gluon single pass" + (", ordered" if bwd.deterministic else "")
            continue
        for which, tile in bwd.tiles.items():
            if which != "delta":
                out[which] = _tile(tile, bwd.launches[which].options)
        out["l2_groups"] = str(bwd.l2_groups)
    return out


def _tile(tile, options) -> str:
    active = tile._replace(ws=bool(options.get("WS")), tma=bool(options.get("TMA")))
    return str(active)


def flops(shape) -> tuple[float, float]:
    """(forward, backward) FLOPs by the usual convention, causal."""
    b, h, s, d = shape
    fwd = 4 * b * h * s * s * d / 2
    return fwd, 2.5 * fwd


class Results(list):
    """The rows, written to the JSON file after each one."""

    def __init__(self, path: Path, meta: dict) -> None:
        super().__init__()
        self.path, self.meta = path, meta

    def append(self, row: dict) -> None:
        super().append(row)
        self.save()

    def save(self) -> None:
        """Write the rows as they stand (after a row was filled in)."""
        self.path.write_text(json.dumps(dict(meta=self.meta, rows=list(self)), indent=1) + "\n")


def serpentine(items: list, rounds: int) -> list:
    """The order of the timings: every item once a round, the rounds alternately forwards and
    backwards, so that a drift over the run (clocks, temperature) weighs on every item alike
    rather than on the ones timed last or first."""
    # The twin of bench-flash's `bench.tools.flash.serpentine`, kept on purpose: this script
    # runs with fa2 installed alone, and the order must not depend on whether bench is there.
    return [x for r in range(rounds) for x in (items if r % 2 == 0 else items[::-1])]


def screen_shape(
    shape,
    rows: Results,
    deadline: float,
    *,
    tiny: bool,
    rep_ms: float,
    only=None,
    layout: str = "bhsd",
    rounds: int = ROUNDS,
) -> None:
    """Every implementation at one shape (the fa2 ones named in `only`, if given), until
    `deadline` (time.monotonic()): each is compiled and checked (accuracy, determinism) first,
    then all of them are timed in `rounds` interleaved rounds (`serpentine`, do_bench over
    `rep_ms / rounds` a timing), each time the median of its rounds."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    name = str(shape)
    size = 4 * math.prod(shape) * 2
    copies = 1 if tiny else max(1, min(4, -(-ROTATE_BYTES // size)))
    sets = _inputs(shape, device, copies, layout)
    q, k, v, do = sets[0]
    part, reference = slice_reference(q, k, v, do)
    sdpa_errors = slice_errors(cudnn_attention, part, reference)
    fwd_flops, bwd_flops = flops(shape)
    impls = [(baseline_name(), cudnn_attention, {})]
    impls += [
        (n, fa2_function(n), env)
        for n, env in candidates(shape[-1], tiny=tiny).items()
        if only is None or n in only
    ]
    checked = []  # (row, fn, env) of the implementations to time
    for impl, fn, env in impls:
        row = dict(shape=name, impl=impl, env=env, input_copies=copies)
        unavailable = (gluon_bwd(env) and gluon_backward.unsupported_reason(q, k, v, do)) or (
            env.get("FA2_GLUON_FORWARD", "0") != "0"
            and gluon_forward.gluon_forward_refusal(q, k, v)
        )
        if unavailable:  # the plan would fall back to the Triton kernels: nothing to time
            rows.append(dict(row, skipped=f"unavailable: {unavailable}"))
            print(f"{name} {impl}: unavailable ({unavailable})", flush=True)
            continue
        if time.monotonic() > deadline:
            rows.append(dict(row, skipped="time budget"))
            print(f"{name} {impl}: skipped (time budget)", flush=True)
            continue
        started = time.monotonic()
        try:
            with environment(env):
                forward._plans.cache.clear()
                torch.autograd.grad(fn(q, k, v), (q, k, v), do)  # compiles Triton's kernels
                row["first_call_s"] = time.monotonic() - started
                errors = slice_errors(fn, part, reference)
                row.update(errors=dict(zip(("o", "dq", "dk", "dv"), errors, strict=True)))
                ratios = zip(errors, sdpa_errors, strict=True)
                row["error_vs_sdpa"] = worst_ratio(e / s for e, s in ratios)
                row["deterministic"] = deterministic(fn, q, k, v, do)
                if impl.startswith("fa2"):
                    row["launched"] = launched(q.shape)
            checked.append((row, fn, env))
        except Exception as exc:  # e.g. a tile needing more shared memory than this GPU has
            row["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]}"
        row["seconds"] = time.monotonic() - started
        rows.append(row)
    taken: dict[int, list[tuple[float, float]]] = {id(row): [] for row, _, _ in checked}
    for row, fn, env in serpentine(checked, rounds):
        if "error" in row:
            continue
        started = time.monotonic()
        try:
            with environment(env):
                forward._plans.cache.clear()
                taken[id(row)].append(time_impl(fn, sets, rep_ms=rep_ms / rounds))
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]}"
        row["seconds"] += time.monotonic() - started
    for row, _, _ in checked:
        if "error" not in row:
            fwd_ms = statistics.median(f for f, _ in taken[id(row)])
            total_ms = statistics.median(t for _, t in taken[id(row)])
            row.update(fwd_ms=fwd_ms, bwd_ms=total_ms - fwd_ms, fwd_bwd_ms=total_ms)
            row.update(fwd_tflops=fwd_flops / fwd_ms / 1e9,
                       bwd_tflops=bwd_flops / (total_ms - fwd_ms) / 1e9)  # fmt: skip
            row["rounds"] = [dict(fwd_ms=f, fwd_bwd_ms=t) for f, t in taken[id(row)]]
            try:
                with environment(env):
                    row["host_ms"] = issue_ms(fn, sets, fwd_bwd_ms=total_ms)
            except torch.OutOfMemoryError:  # its calls' memory is held until the hold ends
                row["host_ms"] = None
        print(_progress(row), flush=True)
    rows.save()
    del sets, q, k, v, do
    if device == "cuda":
        torch.cuda.empty_cache()


def _progress(row: dict) -> str:
    head = f"{row['shape']} {row['impl']}:"
    if "error" in row:
        return f"{head} failed: {row['error']}"
    extra = f" err/sdpa {row['error_vs_sdpa']:.2f} det {row['deterministic']}" if (
        "error_vs_sdpa" in row) else ""  # fmt: skip
    host = f" host {row['host_ms']:.3f}" if row.get("host_ms") is not None else ""
    return (f"{head} fwd {row['fwd_ms']:.3f} bwd {row['bwd_ms']:.3f} fwd+bwd "
            f"{row['fwd_bwd_ms']:.3f} ms{host}{extra} ({row['seconds']:.0f} s) "
            f"{row.get('launched', '')}")  # fmt: skip


def _baseline(rows: list[dict]) -> str:
    """The baseline's name in `rows`: "cudnn" on a GPU, "sdpa-cpu" in the rehearsal."""
    return next((r["impl"] for r in rows if not r["impl"].startswith(("fa2", "("))), "cudnn")


def _ratio_to_baseline(row: dict, rows: list[dict]) -> float | None:
    """`row`'s fwd+bwd time over the baseline's at the same shape, if both were timed."""
    base = next((b for b in rows if b["shape"] == row["shape"] and b["impl"] == _baseline(rows)
                 and "fwd_bwd_ms" in b), None)  # fmt: skip
    return row["fwd_bwd_ms"] / base["fwd_bwd_ms"] if base and "fwd_bwd_ms" in row else None


def _output_ratios(row: dict, rows: list[dict]) -> list[float] | None:
    """The errors of o, dq, dk, dv against float64 over the baseline's on the same slice."""
    base = next((b for b in rows if b["shape"] == row["shape"] and b["impl"] == _baseline(rows)
                 and "errors" in b), None)  # fmt: skip
    if base is None or "errors" not in row:
        return None
    return [row["errors"][n] / base["errors"][n] for n in ("o", "dq", "dk", "dv")]


def _correct(row: dict, rows: list[dict]) -> bool | None:
    """Within twice SDPA's error in every output and, for fa2's deterministic calls (all but
    NONDETERMINISTIC's), bitwise deterministic (the GPU tests' rules); None where the row has
    no accuracy check."""
    ratios = _output_ratios(row, rows)
    if ratios is None:
        return None
    within = worst_ratio(ratios) <= 2  # NaN compares False
    exempt = not row["impl"].startswith("fa2") or row["impl"] == NONDETERMINISTIC
    return within and (row["deterministic"] or exempt)


def table(rows: list[dict]) -> str:
    """fwd, bwd, fwd+bwd ms, fwd+bwd over the baseline's (cuDNN; the rehearsal: SDPA on the
    CPU), the largest error of o, dq, dk, dv over SDPA's, determinism."""
    lines = [f"| shape | impl | fwd ms | bwd ms | fwd+bwd ms | host ms | vs {_baseline(rows)} "
             "| err vs SDPA | det |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        if "fwd_bwd_ms" not in r:
            lines.append(f"| {r['shape']} | {r['impl']} | {r.get('error', r.get('skipped'))} "
                         "| | | | | | |")  # fmt: skip
            continue
        ratio = _ratio_to_baseline(r, rows)
        ratio = "" if ratio is None else f"{ratio:.3f}"
        err = f"{r['error_vs_sdpa']:.2f}" if "error_vs_sdpa" in r else ""
        det = {True: "yes", False: "NO", None: ""}[r.get("deterministic")]
        lines.append(f"| {r['shape']} | {r['impl']} | {r['fwd_ms']:.3f} | {r['bwd_ms']:.3f} | "
                     f"{r['fwd_bwd_ms']:.3f} | {_host(r)} | {ratio} | {err} | {det} |")  # fmt: skip
    return "\n".join(lines)


def _host(row: dict) -> str:
    """The row's host time per forward+backward as text, bold where it is at least half the
    row's fwd+bwd (`HOST_BOUND`); empty where not measured."""
    host = row.get("host_ms")
    if host is None:
        return ""
    return f"**{host:.3f}**" if host >= HOST_BOUND * row["fwd_bwd_ms"] else f"{host:.3f}"


def _error_ratios(row: dict, rows: list[dict]) -> str:
    """`_output_ratios` as text, "o / dq / dk / dv"."""
    ratios = _output_ratios(row, rows)
    return "" if ratios is None else " / ".join(f"{r:.3g}" for r in ratios)


def report(path: Path) -> tuple[Path, Path]:
    """A results page (`path` with .md) and a plot (.png) drawn from a screen's JSON file: every
    row with its tiles, times, ratio to the baseline, errors and determinism; the plot shows
    fwd+bwd over the baseline per shape and implementation, rows that failed the accuracy or
    determinism check hatched."""
    data = json.loads(path.read_text())
    meta, rows = data["meta"], data["rows"]
    base = _baseline(rows)
    lines = [
        f"# fa2's Hopper candidates beside the defaults and {base}: the GPU screen",
        "",
        f"Device: {meta['device']}; torch {meta['torch']}, triton {meta['triton']}, cuDNN "
        f"{meta['cudnn']}, python {meta['python']}; {meta['date']}; code {meta['git_revision']} "
        f"({meta.get('git_revision_source', 'checkout')}). Command: `{meta['command']}` "
        f"(time budget {meta['budget_s']:.0f} s, do_bench rep {meta['rep_ms']:.0f} ms).",
        "",
        {
            "bshd": "q, k, v and dO stored (batch, seq, heads, d), viewed (batch, heads, seq, "
            "d), as a model's projections give them. ",
            "step": "q and k contiguous (batch, heads, seq, d), v and dO stored (batch, seq, "
            "heads, d) and viewed so, as fa2 receives them inside the compiled leaderboard "
            "step. ",
        }.get(meta.get("layout"), "")
        + "Causal, bf16, a random output gradient. fwd and fwd+bwd: do_bench medians (L2 flushed)"
        + (
            f", each the median of {meta['rounds']} interleaved rounds (forwards, then "
            "backwards) at its shape; "
            if meta.get("rounds")
            else ", each implementation timed once, after the ones above it at its shape; "
        )
        + "bwd = their difference. host: the host's time to issue one forward+backward while "
        "the GPU is held busy (empty where not measured), bold where it is at least half the "
        "fwd+bwd: there the row may time the host, not the kernels (a host's time for the same "
        "call varied 0.23-0.42 ms between processes: fa2_hopper_screen_h200_2026-11-29_512_host). "
        "vs: fwd+bwd over the baseline's at the same shape. err/SDPA: "
        "the error of o / dq / dk / dv against float64 on a slice (batch 0, head 0, the first "
        "min(S, 8192) positions) over SDPA cuDNN's error on the same slice (recomputed here "
        "from each row's errors: the `error_vs_sdpa` field of screens run at 8d5630b took "
        "Python's `max`, which drops a NaN that does not come first). det: two backward "
        "passes over the full shape give the same bits. ok: every err/SDPA at most 2 and, for "
        "fa2, deterministic. tiles: what the plans launched (+WS: the warp-specialised loop "
        "was compiled in; gluon: the Gluon kernels, the backward's single pass ordered where "
        "deterministic), and the Triton backward's L2 groups (dq, dkdv).",
        "",
        "| shape | impl | tiles (forward; backward or dq; dkdv; L2 groups) | fwd ms | bwd ms "
        "| fwd+bwd ms | host ms "
        f"| vs {base} | err/SDPA o / dq / dk / dv | det | ok |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if "fwd_bwd_ms" not in r:
            lines.append(f"| {r['shape']} | {r['impl']} | {r.get('error', r.get('skipped'))} "
                         "| | | | | | | | |")  # fmt: skip
            continue
        t = r.get("launched", {})
        groups = ast.literal_eval(t["l2_groups"]) if "l2_groups" in t else {}
        tiles = "; ".join([*(t[k] for k in ("forward", "backward", "dq", "dkdv") if k in t),
                           *([f"{groups['dq']}, {groups['dkdv']}"] if groups else [])])  # fmt: skip
        ratio = _ratio_to_baseline(r, rows)
        ok = {True: "yes", False: "**NO**", None: ""}[_correct(r, rows)]
        det = {True: "yes", False: "no", None: ""}[r.get("deterministic")]
        lines.append(
            f"| {r['shape']} | {r['impl']} | {tiles} | {r['fwd_ms']:.3f} | {r['bwd_ms']:.3f} | "
            f"{r['fwd_bwd_ms']:.3f} | {_host(r)} | {'' if ratio is None else f'{ratio:.3f}'} | "
            f"{_error_ratios(r, rows)} | {det} | {ok} |"
        )
    png = path.with_suffix(".png")
    lines += ["", f"![fwd+bwd over {base}]({png.name})", ""]
    md = path.with_suffix(".md")
    md.write_text("\n".join(lines))
    _plot(rows, png, title=f"{meta['device']}, code {meta['git_revision']}")
    return md, png


def _plot(rows: list[dict], path: Path, *, title: str) -> None:
    """Grouped bars: fwd+bwd over the baseline per shape (groups) and fa2 implementation
    (bars), hatched where the row failed the accuracy or determinism check."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    impls = list(dict.fromkeys(r["impl"] for r in rows if r["impl"].startswith("fa2")))
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    fig = Figure(figsize=(1.6 * len(shapes) + 2, 4.5), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    width = 0.8 / len(impls)  # the bars of a shape fill 80% of its slot
    for i, impl in enumerate(impls):
        label = impl
        for j, shape in enumerate(shapes):
            row = next((r for r in rows if r["impl"] == impl and r["shape"] == shape), None)
            ratio = row and _ratio_to_baseline(row, rows)
            if ratio is None:
                continue
            wrong = _correct(row, rows) is False
            ax.bar(j - 0.4 + (i + 0.5) * width, ratio, width, color=f"C{i}",
                   hatch="xx" if wrong else None, edgecolor="black" if wrong else None,
                   label=label)  # fmt: skip
            label = None  # one legend entry per implementation
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(shapes)), shapes, rotation=20, ha="right", fontsize="small")
    ax.set_ylim(bottom=0.8)
    ax.set_ylabel(f"fwd+bwd over {_baseline(rows)} (lower is faster)")
    ax.set_title(f"{title}; hatched: wrong (error or determinism)", fontsize="medium")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path)


def git_revision() -> dict:
    """The code's git revision: BENCH_GIT_REVISION where the sources are a copy of a commit's
    tree (bench's convention), else the checkout's HEAD and whether it has changes."""
    named = os.environ.get("BENCH_GIT_REVISION")
    if named:
        return dict(git_revision=named, git_revision_source="named by BENCH_GIT_REVISION")
    git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()  # noqa: E731
    try:
        revision = git("rev-parse", "HEAD") or None
        dirty = bool(git("status", "--porcelain", "--untracked-files=no")) if revision else None
    except OSError:  # no git on this machine
        revision = dirty = None
    return dict(git_revision=revision, git_dirty=dirty)


def _shape(text: str) -> tuple[int, int, int, int]:
    """`--shape`'s B,H,S,D."""
    try:
        batch, heads, seq, d = (int(x) for x in text.split(","))
    except ValueError:
        message = f"a shape is B,H,S,D, e.g. 1,32,32768,128; got {text!r}"
        raise argparse.ArgumentTypeError(message) from None
    if min(batch, heads, seq, d) < 1:
        raise argparse.ArgumentTypeError(f"a shape's sizes are positive; got {text!r}")
    return batch, heads, seq, d


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument(
        "--budget",
        type=float,
        default=360.0,
        help="seconds for the shapes; the last part started may run over it "
        "by its own length, and start-up takes some more: 7 minutes in all",
    )
    parser.add_argument("--rep-ms", type=float, default=300.0,
                        help="do_bench's rep per implementation, over all rounds")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="timings of each implementation at a shape, interleaved")  # fmt: skip
    parser.add_argument("--shapes", default="", help="only shapes whose text has this")
    parser.add_argument("--shape", nargs="+", type=_shape, metavar="B,H,S,D",
                        help="screen these shapes instead of the list (e.g. 1,32,32768,128: "
                        "one rank's attention in the 2026 leaderboard step)")  # fmt: skip
    parser.add_argument("--impls", nargs="+", metavar="NAME",
                        help='only these fa2 rows, e.g. fa2 "fa2 gluon-bwd" (cuDNN always '
                        "runs)")  # fmt: skip
    parser.add_argument("--layout", choices=LAYOUTS, default="bhsd",
                        help="q, k, v, dO contiguous (batch, heads, seq, d) (bhsd); "
                        "(batch, seq, heads, d) tensors viewed so, as a model's projections "
                        "give them (bshd); or q, k contiguous and v, dO viewed, as inside "
                        "the compiled leaderboard step (step)")  # fmt: skip
    parser.add_argument("--tiny", action="store_true",
                        help="rehearse on a CPU: Triton's interpreter, tiny shapes")  # fmt: skip
    parser.add_argument("--report", type=Path, metavar="JSON",
                        help="only write a results page (.md) and plot (.png) beside this "
                        "screen's JSON file, and exit")  # fmt: skip
    args = parser.parse_args()
    if args.report:
        print(*report(args.report), sep="\n")
        return 0
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    started = time.monotonic()
    if args.tiny:  # the interpreter emulates the TMA descriptors the candidates read through
        launch.tma_capable = lambda device: True
    elif not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (or --tiny on a CPU)")
    args.out.mkdir(parents=True, exist_ok=True)
    meta = dict(
        device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (interpreter)",
        torch=torch.__version__, triton=triton.__version__, python=platform.python_version(),
        cudnn=torch.backends.cudnn.version(),
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        command=shlex.join(["python3", "packages/fa2/scripts/hopper_screen.py", *sys.argv[1:]]),
        budget_s=args.budget, rep_ms=args.rep_ms, rounds=args.rounds, layout=args.layout,
        **git_revision(),
    )  # fmt: skip
    rows = Results(args.out / "hopper_screen.json", meta)
    listed = args.shape or (TINY_SHAPES if args.tiny else SHAPES)
    shapes = [s for s in listed if args.shapes in str(s)]
    deadline = started + args.budget
    weights = [1 + sum(flops(shape)) / FLOPS_PER_WEIGHT for shape in shapes]
    for i, shape in enumerate(shapes):
        now = time.monotonic()
        share = now + (deadline - now) * weights[i] / sum(weights[i:])
        try:
            screen_shape(
                shape, rows, share, tiny=args.tiny, rep_ms=args.rep_ms, only=args.impls,
                layout=args.layout, rounds=args.rounds,
            )  # fmt: skip
        except Exception as exc:  # e.g. out of memory: keep the other shapes
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            rows.append(dict(shape=str(shape), impl="(setup)", error=error))
    elapsed = time.monotonic() - started
    print(f"\n{meta['device']}, torch {meta['torch']}, triton {meta['triton']}, cuDNN "
          f"{meta['cudnn']}, code {meta['git_revision']}, {elapsed:.0f} s")  # fmt: skip
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Time the Gluon single-pass backward's variants kernel by kernel on one Hopper GPU, beside
fa2's default (deterministic, two-pass) backward and cuDNN's, to choose its form by measurement.

Per shape (causal, bf16, fresh random inputs and output gradient; o and the logsumexp from fa2's
forward): the backward alone, as do_bench medians with L2 flushed, and its TFLOP/s by the usual
convention (2.5 x the causal forward's 2·B·H·S²·D). Every variant is compiled first, then timed
in `--rounds` interleaved rounds (forwards, then backwards: `serpentine`), its time the median
of its rounds: timed one after another, two launches swapped their order of merit when they
swapped places (docs/results/fa2_gluon_bwd_variants_h200_2026-11-29_sleep_a.md, _sleep_b.md): a
drift of 1-3% over a run, which way it goes differing from run to run. The rows:

- "fa2 two-pass": fa2's default backward (`run_backward`, deterministic);
- "cudnn": SDPA's cuDNN backend, forward+backward less its forward (cuDNN's backward cannot be
  launched alone through torch's public API);
- one row per Gluon variant (`gluon_backward.launch` keywords): dQ's additions as they come, in
  a fixed order (`deterministic`), each also with two dQ partial buffers (`dq_slots=2`), and
  a timing probe that drops them (`drop_dq`: the reducer releases each partial unread, so the
  row is the time without dQ's additions; its dQ is wrong by design and never checked), and
  both orders at 128 queries a step (`block_m=128`), at the shapes whose head dim takes it
  (`gluon_backward.BLOCK_MS`: 64).

Each variant's dk and dv (and dQ, where added) are compared with fa2's two-pass backward's on
the same inputs, so a variant that is fast because it is wrong shows it, and each dQ with a
second call's (same bits or not). Rows go to `OUT/gluon_bwd_variants.json` as they come; a
table is printed last.

GPU (one H100 or H200), from the repository root, with no install::

    export PYTHONPATH=$(ls -d $PWD/packages/*/src | paste -sd:)
    BENCH_GIT_REVISION=<commit> python3 packages/fa2/scripts/gluon_bwd_variants.py --out $OUT

A results page and its plot from a run's JSON (no GPU)::

    uv run python packages/fa2/scripts/gluon_bwd_variants.py --report RUN/gluon_bwd_variants.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import triton

from fa2.triton import gluon_backward
from fa2.triton.function import run_backward, run_forward

sys.path.insert(0, str(Path(__file__).parent))
from hopper_screen import _median_ms, cudnn_attention, flops, serpentine  # a sibling script

ROUNDS = 4  # timings of each variant, interleaved (`serpentine`)
SHAPES = [(2, 32, 32768, 128), (1, 16, 16384, 128), (1, 16, 16384, 64), (4, 32, 2048, 128)]
VARIANTS = {  # row name: gluon_backward.launch keywords
    "gluon": {},
    "gluon ordered": dict(deterministic=True),
    # the same launch as "gluon ordered" in a row of its own: how far apart two rows of one
    # kernel come out (the method's own spread)
    "gluon ordered, again": dict(deterministic=True),
    "gluon, 2 dQ slots": dict(dq_slots=2),
    "gluon ordered, 2 dQ slots": dict(deterministic=True, dq_slots=2),
    "probe: no dQ adds": dict(drop_dq=True),
    "gluon, highest first": dict(highest_first=True),
    "gluon m128, highest first": dict(block_m=128, highest_first=True),
    "ordered, no reversed tail": dict(deterministic=True, reversed_heads=0),
    "ordered m128, no reversed tail": dict(deterministic=True, block_m=128, reversed_heads=0),
    "ordered m128, 2 heads reversed": dict(deterministic=True, block_m=128, reversed_heads=2),
    "ordered m128, 4 heads reversed": dict(deterministic=True, block_m=128, reversed_heads=4),
    "ordered, 2 heads reversed": dict(deterministic=True, reversed_heads=2),
    "ordered, 4 heads reversed": dict(deterministic=True, reversed_heads=4),
    "ordered, 8 heads reversed": dict(deterministic=True, reversed_heads=8),
    "ordered, 16 heads reversed": dict(deterministic=True, reversed_heads=16),
    "gluon d64 m128": dict(block_m=128),
    "gluon ordered m128": dict(deterministic=True, block_m=128),
    "ordered, 4 heads interleaved": dict(deterministic=True, group_heads=4),
    "ordered, 16 heads interleaved": dict(deterministic=True, group_heads=16),
    "ordered, 64 heads interleaved": dict(deterministic=True, group_heads=64),
    "ordered m128, 4 heads interleaved": dict(deterministic=True, block_m=128, group_heads=4),
    "ordered m128, 16 heads interleaved": dict(deterministic=True, block_m=128, group_heads=16),
    "ordered m128, 2 dQ slots": dict(deterministic=True, block_m=128, dq_slots=2),
}


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.float() - ref.float()).norm() / ref.float().norm()).item()


def screen_shape(shape, variants, rep_ms: float, rounds: int = ROUNDS) -> list[dict]:
    """The rows of one shape: the two-pass backward, cuDNN, then each Gluon variant. Every
    variant is compiled and checked first; then each is timed `rounds` times (do_bench over
    `rep_ms / rounds` each) in the `serpentine` order, and a row's time is the median of its
    rounds (`bwd_ms_rounds` keeps them)."""
    q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    scale = shape[-1] ** -0.5
    o, lse, plan = run_forward(q, k, v, True)
    _, bwd_flops = flops(shape)
    reference = run_backward(plan, q, k, v, o, lse, do, scale)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    step_ms = rep_ms / rounds

    def cudnn_backward_ms() -> tuple[float, float]:  # (backward, forward)
        fwd = _median_ms(lambda: cudnn_attention(*leaves), rep_ms=step_ms)
        both = _median_ms(
            lambda: torch.autograd.grad(cudnn_attention(*leaves), leaves, do), rep_ms=step_ms
        )
        return both - fwd, fwd

    timers = {
        "fa2 two-pass": lambda: (
            _median_ms(lambda: run_backward(plan, q, k, v, o, lse, do, scale), rep_ms=step_ms),
        ),
        "cudnn": cudnn_backward_ms,
    }
    extras: dict[str, dict] = {name: {} for name in timers}
    failed = []
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    strides = tuple(tuple(t.stride()[:3]) for t in (q, k, v, o, do, dk))
    for name, options in variants.items():
        if options.get("block_m", gluon_backward.BLOCK_M) not in gluon_backward.BLOCK_MS[shape[-1]]:
            continue  # a query tile this head dim does not take: no row

        def call(options=options):
            return gluon_backward.launch(
                q, k, v, o, lse, do, dk, dv, strides, scale=scale, causal=True, **options
            )

        try:
            dq = call()
        except Exception as exc:  # a variant the compiler fails on: recorded, the others run
            failed.append(dict(shape=list(shape), impl=name, error=f"{type(exc).__name__}: {exc}"))
            print(f"  {name}: failed ({type(exc).__name__})", flush=True)
            continue
        errors = dict(dk=_rel(dk, reference[1]), dv=_rel(dv, reference[2]))
        same_bits = None
        if not options.get("drop_dq"):
            errors["dq"] = _rel(dq, reference[0])
            first = dq.clone()
            same_bits = bool(torch.equal(call(), first))  # dQ's bits: run to run
        timers[name] = lambda call=call: (_median_ms(call, rep_ms=step_ms),)
        extras[name] = dict(rel_diff_to_two_pass=errors, same_bits_twice=same_bits)
    samples: dict[str, list[tuple[float, ...]]] = {name: [] for name in timers}
    for name in serpentine(list(timers), rounds):
        samples[name].append(timers[name]())
    rows = []
    for name, taken in samples.items():
        ms = statistics.median(t[0] for t in taken)
        rows.append(
            dict(
                shape=list(shape), impl=name, bwd_ms=ms, tflops=bwd_flops / ms / 1e9,
                bwd_ms_rounds=[t[0] for t in taken], **extras[name],
            )
        )  # fmt: skip
        if name == "cudnn":
            rows[-1]["fwd_ms"] = statistics.median(t[1] for t in taken)
        spread = ", ".join(f"{t[0]:.3f}" for t in taken)
        print(f"  {name}: {ms:.3f} ms (rounds: {spread})", flush=True)
    return rows + failed


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table, each backward's time beside cuDNN's at its shape."""
    lines = [
        "| shape | impl | bwd ms | rounds, ms | TFLOP/s | x cuDNN | rel. diff dk/dv/dq to "
        "two-pass | dQ bits twice |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {tuple(r['shape'])} | {r['impl']} | failed | | | | | |")
            continue
        taken = r.get("bwd_ms_rounds")  # older runs timed each variant once
        spread = f"{min(taken):.3f}-{max(taken):.3f}" if taken else ""
        base = next(x for x in rows if x["shape"] == r["shape"] and x["impl"] == "cudnn")
        diff = "/".join(f"{v:.1e}" for v in r.get("rel_diff_to_two_pass", {}).values())
        same = {True: "yes", False: "no", None: ""}[r.get("same_bits_twice")]
        lines.append(
            f"| {tuple(r['shape'])} | {r['impl']} | {r['bwd_ms']:.3f} | {spread} | "
            f"{r['tflops']:.0f} | "
            f"{r['bwd_ms'] / base['bwd_ms']:.3f} | {diff} | {same} |"
        )
    return "\n".join(lines)


def _timing_note(rows: list[dict]) -> str:
    """How the run timed its rows: in interleaved rounds, or each row once after another."""
    rounds = max((len(r.get("bwd_ms_rounds", ())) for r in rows), default=0)
    if rounds:
        return (
            f"Every row was timed in {rounds} interleaved rounds (forwards, then backwards); "
            "its time is their median, 'rounds' their range."
        )
    return (
        "Each row was timed once, after the ones above it: in runs of this script on an "
        "H200 two launches swapped their order of merit when they swapped places, a drift of "
        "1-3% over a run (fa2_gluon_bwd_variants_h200_2026-11-29_sleep_a.md, _sleep_b.md), so "
        "differences of that size here need not be the variants'."
    )


def report(path: Path) -> tuple[Path, Path]:
    """A results page (.md) and a plot (.png: each backward's time over cuDNN's, per shape)
    beside a run's JSON."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(path.read_text())
    meta, rows = data["meta"], [r for r in data["rows"] if "error" not in r]
    md, png = path.with_suffix(".md"), path.with_suffix(".png")
    shapes = list(dict.fromkeys(tuple(r["shape"]) for r in rows))
    impls = [i for i in dict.fromkeys(r["impl"] for r in rows) if i != "cudnn"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(impls)
    for j, impl in enumerate(impls):
        ratios = []
        for shape in shapes:
            row = next((r for r in rows if tuple(r["shape"]) == shape and r["impl"] == impl), None)
            base = next(r for r in rows if tuple(r["shape"]) == shape and r["impl"] == "cudnn")
            ratios.append(row["bwd_ms"] / base["bwd_ms"] if row else float("nan"))
        ax.bar([i + j * width for i in range(len(shapes))], ratios, width, label=impl)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(shapes))], [str(s) for s in shapes])
    ax.set_ylabel("backward time / cuDNN's")
    ax.set_title(f"fa2 backward variants, causal bf16, {meta['device']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    md.write_text(
        f"# fa2 backward variants on {meta['device']} ({meta['date']})\n\n"
        f"Command: `{meta['command']}` at revision `{meta['revision']}`; torch {meta['torch']}, "
        f"Triton {meta['triton']}.\n\n"
        "Causal, bf16, fresh random inputs; the backward alone (do_bench medians, L2 flushed); "
        "cuDNN's backward is its forward+backward less its forward. TFLOP/s: 2.5x the causal "
        "forward's 2·B·H·S²·D. Relative differences are to fa2's two-pass backward on the same "
        "inputs; 'dQ bits twice': whether a second call gave the same dQ bits. 'probe: no dQ "
        "adds' leaves dQ at zero by design (a timing probe). "
        f"{_timing_note(data['rows'])}\n\n"
        f"{table(data['rows'])}\n\n![backward over cuDNN's]({png.name})\n"
    )
    return md, png


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder for the JSON (a GPU run)")
    parser.add_argument("--report", type=Path, help="a run's JSON: write its .md and .png beside")
    parser.add_argument("--shapes", nargs="+", type=_shape, default=SHAPES, help="B,H,S,D each")
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--rep-ms", type=float, default=400.0,
                        help="do_bench rep per variant, split over the rounds")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="timings of each variant, interleaved")  # fmt: skip
    args = parser.parse_args()
    if args.report:
        for written in report(args.report):
            print(written)
        return 0
    if args.out is None:
        parser.error("give --out (a GPU run) or --report (a page from a run's JSON)")
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if not torch.cuda.is_available() or not gluon_backward.HAVE_GLUON:
        sys.exit("needs an sm_90 GPU and the Triton whose Gluon fa2's kernels are written for")
    args.out.mkdir(parents=True, exist_ok=True)
    meta = dict(
        device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
        date=datetime.date.today().isoformat(), revision=os.environ.get("BENCH_GIT_REVISION"),
        command="python3 packages/fa2/scripts/gluon_bwd_variants.py " + " ".join(sys.argv[1:]),
    )  # fmt: skip
    variants = {name: VARIANTS[name] for name in args.variants}
    rows = []
    for shape in args.shapes:
        print(shape, flush=True)
        rows += screen_shape(shape, variants, args.rep_ms, args.rounds)
        path = args.out / "gluon_bwd_variants.json"
        path.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

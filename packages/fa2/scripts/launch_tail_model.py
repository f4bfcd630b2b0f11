"""Model how evenly the Gluon backward's launch orders fill a GPU, on a CPU: no waits, no L2.

Each program of the grid (one key tile of one (batch x head), `gluon_backward.launch_order`)
takes as many equal steps as the query tiles it visits (causal: from its diagonal on), each
step's time drawn within ±`--jitter` of one; the programs go, in launch order, to whichever of
`--sms` multiprocessors frees first (one program per multiprocessor at a time, as the kernel's
shared memory allows). Reported: the last program's end over the balanced end (all steps over
the multiprocessors), the mean over `--seeds` draws, per shape and order:

- "unordered": dQ's additions as they come, each head's lowest (longest) key tile first;
- "ordered, no tail": the fixed order's launch, each head's highest key tile first, so each
  head's longest program comes last;
- "ordered": the default, with the reversed tail (`gluon_backward.reversed_groups`);
- "ordered, tail x2": a tail twice the default's heads.

What it leaves out: the waits of the ordered additions, L2 traffic and the programs' fixed
costs, so it bounds what a launch order can change, not what a run will measure
(`gluon_bwd_variants.py` measures that on a GPU). No GPU needed::

    BENCH_GIT_REVISION=<commit> uv run python packages/fa2/scripts/launch_tail_model.py \
        --out docs/results/NAME
"""

from __future__ import annotations

import argparse
import datetime
import heapq
import json
import os
import random
import sys
from pathlib import Path

from fa2.triton import gluon_backward
from fa2.triton.configs import cdiv

SHAPES = ["2,32,32768,128", "1,16,16384,128", "4,32,2048,128", "1,16,16384,64", "1,32,8192,64"]
H200_SMS = 132


def _orders(batch_heads: int, n: int, head_dim: int) -> dict[str, list[tuple[int, int, bool]]]:
    key_tiles = cdiv(n, gluon_backward.BLOCK_N)
    group = gluon_backward.interleaved_heads(batch_heads, n, n, head_dim, 2)
    tail = gluon_backward.reversed_groups(batch_heads, n, group)
    twice = gluon_backward.reversed_groups(batch_heads, n, group, 2 * tail * group)
    order = lambda reversed, first: gluon_backward.launch_order(  # noqa: E731
        batch_heads, key_tiles, group=group, reversed=reversed, highest_first=first
    )
    return {
        "unordered": order(0, False),
        "ordered, no tail": order(0, True),
        "ordered": order(tail, True),
        "ordered, tail x2": order(twice, True),
    }


def end_over_balance(steps: list[int], *, sms: int, jitter: float, seed: int) -> float:
    """The greedy list schedule's end over the balanced end, for programs of `steps` steps in
    launch order."""
    draw = random.Random(seed)
    free = [0.0] * sms
    end = total = 0.0
    for count in steps:
        t = count * (1 + draw.uniform(-jitter, jitter))
        start = heapq.heappop(free)
        heapq.heappush(free, start + t)
        end, total = max(end, start + t), total + t
    return end / (total / sms)


def model(shape: tuple[int, ...], *, sms: int, jitter: float, seeds: int) -> list[dict]:
    batch, heads, n, head_dim = shape
    block_m = gluon_backward.BLOCK_MS[head_dim][-1]  # the default's query tile (configs)
    rows = []
    for name, order in _orders(batch * heads, n, head_dim).items():
        steps = [cdiv(n - key_tile * gluon_backward.BLOCK_N, block_m) for _, key_tile, _ in order]
        ratios = [end_over_balance(steps, sms=sms, jitter=jitter, seed=s) for s in range(seeds)]
        tail_heads = len({bh for bh, _, descend in order if descend})
        rows.append(
            dict(
                shape=list(shape),
                order=name,
                tail_heads=tail_heads,
                over_balance=sum(ratios) / seeds,
            )
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write OUT.json, OUT.md and OUT.png")
    parser.add_argument("--shapes", nargs="+", default=SHAPES, help="B,H,S,D (causal)")
    parser.add_argument(
        "--sms", type=int, default=H200_SMS, help="multiprocessors (H100 SXM, H200: 132)"
    )
    parser.add_argument("--jitter", type=float, default=0.1, help="a step's time within ±this")
    parser.add_argument("--seeds", type=int, default=20, help="draws averaged")
    args = parser.parse_args()
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes]
    if any(s[-1] not in gluon_backward.BLOCK_MS for s in shapes):
        sys.exit(f"head dims the Gluon backward takes: {gluon_backward.HEAD_DIMS}")
    rows = [r for s in shapes for r in model(s, sms=args.sms, jitter=args.jitter, seeds=args.seeds)]
    lines = ["| shape | order | tail heads | end over balance |", "|---|---|---|---|"]
    lines += [
        f"| {tuple(r['shape'])} | {r['order']} | {r['tail_heads']} | {r['over_balance']:.3f} |"
        for r in rows
    ]
    table = "\n".join(lines)
    if args.out:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            sys.exit(
                "--out draws a plot with matplotlib (bench's dependency): install it, or "
                "leave out --out"
            )
        settings = vars(args) | dict(
            out=str(args.out), command=sys.argv[1:], date=datetime.date.today().isoformat(),
            revision=os.environ.get("BENCH_GIT_REVISION"),
        )  # fmt: skip
        _write(args.out, rows, table, settings)
    print(table)
    return 0


def _write(out: Path, rows: list[dict], table: str, settings: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.with_suffix(".json").write_text(
        json.dumps(dict(settings=settings, rows=rows), indent=1) + "\n"
    )
    shapes = list(dict.fromkeys(tuple(r["shape"]) for r in rows))
    orders = list(dict.fromkeys(r["order"] for r in rows))
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(orders)
    for j, name in enumerate(orders):
        values = [
            next(r["over_balance"] for r in rows if tuple(r["shape"]) == s and r["order"] == name)
            for s in shapes
        ]
        ax.bar([i + j * width for i in range(len(shapes))], values, width, label=name)
    ax.set_xticks(
        [i + 0.4 - width / 2 for i in range(len(shapes))], [str(s) for s in shapes], fontsize=8
    )
    ax.set_ylim(0.95, None)
    ax.set_ylabel("modelled end / balanced end")
    ax.set_title(f"Gluon backward launch orders, list-scheduler model, {settings['sms']} SMs")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    plt.close(fig)
    command = "uv run python packages/fa2/scripts/launch_tail_model.py " + " ".join(
        settings["command"]
    )
    out.with_suffix(".md").write_text(
        "# The Gluon backward's launch orders in a list-scheduler model (no GPU)\n\n"
        f"Command: `{command}` at revision `{settings['revision']}`, {settings['date']}; "
        f"model settings: {settings['sms']} multiprocessors, step times "
        f"within ±{settings['jitter']:.0%}, the mean of {settings['seeds']} draws. The model and "
        "what it leaves out (the ordered additions' waits, L2, fixed costs): "
        "`packages/fa2/scripts/launch_tail_model.py`. Causal; the default query tile per "
        "head dim.\n\n"
        f"{table}\n\n![end over balance]({out.with_suffix('.png').name})\n"
    )


if __name__ == "__main__":
    sys.exit(main())

"""What the seed projects had (issue 38), answered from results like the handout's problems: seed
003's question of what trains on two T4s in fp16 (bench-plan's `--preset t4x2`), seed 002's
matrix of attention kernels and parallel modes (bench-matrix), and fp16 with loss scaling against
bf16 (bench-train-results' precision table). Every sentence is made from the rows it cites, by
the rules below.
"""

from __future__ import annotations

from collections.abc import Callable

from bench.report.document import Block
from bench.report.problem import Problem
from bench.report.results import Record, Results, Rows, fmt
from bench.report.single_gpu import said
from bench.tools.plan import GPU_FIT_BATCH, GPU_FIT_CONTEXTS

__all__ = ["SEEDS_HEADING", "SEEDS_TEXT", "SEED_PROBLEMS"]

SEEDS_HEADING = "What the seed projects had"
SEEDS_TEXT = (
    "The projects this one grew from had these too; each is answered from the results, or "
    "says what makes them."
)
# The context the T4 answer quotes batches at: the middle one bench-plan's table predicts.
_CONTEXT = GPU_FIT_CONTEXTS[len(GPU_FIT_CONTEXTS) // 2]
_BATCH_KEY = f"max_batch_ctx{_CONTEXT}"
_LONGEST_KEY = f"max_ctx_b{GPU_FIT_BATCH}"


def _tool(tool: str) -> Callable[[Record], bool]:
    return lambda record: record.run.tool == tool


def _t4_size(name: str, rows: Rows) -> str:
    """One size's verdict: the layouts its seed batch fits under, with the least recomputation,
    the most sequences per GPU at `_CONTEXT` and the longest context at the seed's batch."""
    for ckpt in ("none", "blocks"):
        fitting = [r for r in rows if r["checkpointing"] == ckpt and (r[_BATCH_KEY] or 0) >= 1]
        seed = [r for r in fitting if r[_BATCH_KEY] >= GPU_FIT_BATCH]
        if seed:
            best = max(seed, key=lambda r: r[_BATCH_KEY])
            how = "without checkpointing" if ckpt == "none" else "with every block checkpointed"
            return (
                f"{name} trains {how} under {', '.join(r['layout'] for r in seed)}: at most "
                f"{best[_BATCH_KEY]} sequences per GPU at context {_CONTEXT} "
                f"({best['layout']}), and {GPU_FIT_BATCH} sequences up to context "
                f"{fmt(best[_LONGEST_KEY])}"
            )
    return f"{name} does not fit {GPU_FIT_BATCH} sequences of {_CONTEXT} under any layout"


def answer_t4(res: Results) -> list[Block]:
    """Seed 003: which sizes train on two T4s in fp16, at which batch and context."""
    rows = res.rows("plan_gpu_fit", latest=True)
    if not rows:
        return []
    sizes = {}
    for row in rows:
        sizes.setdefault(row["size"].split(" ")[0], []).append(row)
    verdicts = [_t4_size(name, mine) for name, mine in sizes.items()]
    text = (
        f"Predicted by bench-plan (no T4 ran it) for two 16 GB T4s in fp16, "
        f"{GPU_FIT_BATCH} sequences per GPU as the seed ran: " + "; ".join(verdicts) + "."
    )
    return [said(res, text, rows)]


def answer_matrix(res: Results) -> list[Block]:
    """Seed 002: the fastest cell, and whether every mode's loss agrees with its one-rank cell."""
    rows = res.rows("matrix", latest=True)
    done = [r for r in rows if r.get("tokens_per_s")]
    if not done:
        return []
    fastest = max(done, key=lambda r: r["tokens_per_s"])
    checked = [r for r in done if r.get("loss_diff") is not None]
    disagree = [r for r in checked if r.get("loss_agrees") is False]
    widest = max(checked, key=lambda r: abs(r["loss_diff"]))
    text = (
        f"{len(done)} of {len(rows)} cells finished. The most tokens/s: "
        f"{fmt(fastest['tokens_per_s'])} ({fastest['size']}, {fastest['attention']}, "
        f"{fastest['parallel']} on {fastest['ranks']} rank(s)). "
        + (
            f"{len(disagree)} cell(s) end at a loss beyond the tolerance from their one-rank "
            "cell's: " + ", ".join(f"{r['attention']} {r['parallel']}" for r in disagree) + "."
            if disagree
            else f"Every mode's final loss agrees with its one-rank cell's; the widest gap is "
            f"{widest['loss_diff']:+.2e} relative ({widest['attention']} {widest['parallel']})."
        )
    )
    return [said(res, text, rows)]


def answer_fp16(res: Results) -> list[Block]:
    """Seed 003: fp16 with loss scaling against the reference precision, from the rows."""
    rows = res.rows("train_precision", latest=True)
    if len(rows) < 2:
        return []
    ref, *others = rows
    parts = []
    for row in others:
        relative = row["val_diff"] / ref["final_val_loss"]
        skipped = row.get("skipped_steps")
        parts.append(
            f"{row['precision']} ends at validation loss {fmt(row['final_val_loss'])}, "
            f"{relative:+.2%} from {ref['precision']}'s {fmt(ref['final_val_loss'])}, after "
            f"{row['steps']} steps"
            + (
                ""
                if skipped is None
                else f" of which {skipped} {'was' if skipped == 1 else 'were'} skipped for overflow"
            )
        )
    return [said(res, "; ".join(parts) + ".", rows)]


SEED_PROBLEMS: tuple[Problem, ...] = (
    Problem(
        "t4x2", "Two T4s in fp16", "seed 003",
        "What trains on two 16 GB T4s in fp16 (Kaggle's free GPUs), at which batch and context.",
        answer_t4, _tool("plan_gpu_fit"),
        "bench-plan --preset t4x2 (no GPU, seconds)",
    ),
    Problem(
        "lm_matrix", "Attention kernels x parallel modes", "seed 002",
        "Short training runs over every attention kernel and parallel mode: tokens/s, step "
        "time, memory, and losses that agree.", answer_matrix, _tool("matrix"),
        "two GPUs: `packages/bench/scripts/seeds_gpu.sh matrix TEXT` (3 minutes)",
    ),
    Problem(
        "fp16", "fp16 with loss scaling", "seed 003",
        "fp16 training with a dynamic loss scale reaching bf16's loss.", answer_fp16,
        _tool("train_precision"),
        "one GPU: `packages/bench/scripts/seeds_gpu.sh fp16 TEXT` (2 minutes)",
    ),
)  # fmt: skip

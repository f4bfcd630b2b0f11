"""§5.2–§5.3 of the 2026 handout: naive, flat and overlapped DDP, from bench-ddp's results.

A bench-ddp result is one world size. Each answer reads every current one, fewest ranks first
(the handout asks for one node of two GPUs; runs on more ranks follow), and says each run's
numbers apart: a sentence never mixes the rows of two world sizes. Every comparison takes its
words from `bench.report.claims`, fed the rows it cites.
"""

from __future__ import annotations

from typing import Any

from bench.commands.data_parallel import ALL_REDUCE
from bench.report.claims import SAME, ratio_word, relation, speed_against
from bench.report.document import Block, Paragraph
from bench.report.parallel import run_dims, run_shape, run_world
from bench.report.results import SOURCE, Record, Results, Rows, fmt, grouped, num, ok
from bench.report.runs import DDP_TRACES
from bench.report.single_gpu import said
from bench.report.trace_timeline import NO_NSIGHT, trace_images
from bench.tools import data_parallel
from lmcore import MODEL_SIZES

__all__ = ["answer_ddp", "ddp_runs"]

ddp_keys = data_parallel.KEYS

# bench-ddp's rows an answer sets beside its own: the plain wrappers and torch's.
_COMPARED = ("ddp:naive", "ddp:flat", "ddp:individual", "ddp:torch")
# The wrappers that all-reduce only after the backward, in the handout's order.
_AFTER_BACKWARD = ("ddp:naive", "ddp:flat")


def ddp_runs(res: Results) -> list[tuple[Record, Rows]]:
    """Each current bench-ddp result with its completed rows, fewest ranks first."""
    runs = [
        (res.record_of(rows[0]), rows)
        for (_,), rows in grouped(ok(res.rows("ddp")), SOURCE).items()
        if rows
    ]
    return sorted(runs, key=lambda run: run_world(run[0]))


def _variant(rows: Rows, variant: str) -> dict[str, Any] | None:
    return next(
        (r for r in rows if r.get(ddp_keys.variant) == variant and num(r, ddp_keys.step_ms)),
        None,
    )


def _where(record: Record) -> str:
    env = record.run.env
    return f"{run_shape(record)}, on {run_world(record)}× {env.get('device_name')}"


def answer_ddp(variant: str, label: str):
    """An answer quoting one DDP variant's step and communication time against the others, run
    by run; the flat and overlapped variants add their comparison, the overlapped one the traced
    timelines (§5.3.2 (b))."""

    def answer(res: Results) -> list[Block]:
        runs = ddp_runs(res)
        out: list[Block] = []
        for record, rows in runs:
            mine = _variant(rows, variant)
            if mine is None:
                continue
            out.append(_variant_sentence(res, record, rows, mine, label))
            if variant == "ddp:flat":
                out += _flat_against_naive(res, record, rows)
            if variant == "ddp:individual":
                out += _individual_against_flat(res, record, rows)
        if not out:
            return []
        if variant == "ddp:naive":
            out += _size_note(runs)
        if variant == "ddp:individual":
            out += _ddp_traces(res, runs)
        return out

    return answer


def _variant_sentence(
    res: Results, record: Record, rows: Rows, mine: dict[str, Any], label: str
) -> Paragraph:
    """One run's numbers for one variant: step, communication and its share, overhead beyond one
    GPU, the other wrappers' steps, and how much of a standalone all-reduce it hides."""
    k = ddp_keys
    step = mine[k.step_ms]
    text = f"{label} ({_where(record)}): {fmt(step)} ms per step"
    comm, wait = num(mine, k.comm_ms), num(mine, k.wait_ms)
    if comm is not None:
        text += f", {fmt(comm)} ms of it communicating ({comm / step:.0%} of the step"
        if wait is not None and relation(wait, comm) == "below":
            text += f"; all but {fmt(wait)} ms of it beside the backward"
        text += ")"
    single = _variant(rows, "single")
    if num(mine, k.overhead_ms) is not None and single is not None:
        text += (
            f", {fmt(mine[k.overhead_ms])} ms beyond one GPU's {fmt(single[k.step_ms])} ms "
            "(the same model and batch per rank, alone)"
        )
    others = [r for v in _COMPARED if v != mine[k.variant] for r in rows if r[k.variant] == v]
    if others:
        text += "; beside " + ", ".join(f"{o[k.case]} {fmt(o[k.step_ms])} ms" for o in others)
    alone = _variant(rows, ALL_REDUCE)
    cited = [mine, *others, *([single] if single else [])]
    if alone is not None and num(mine, k.overhead_ms) is not None:
        over, ar = mine[k.overhead_ms], alone[k.step_ms]
        text += f". The {fmt(over)} ms it adds are " + ratio_word(
            over / ar,
            more=f"more than a standalone all-reduce of every gradient takes ({fmt(ar)} ms): "
            "none of that all-reduce is hidden",
            less=f"{1 - over / ar:.0%} less than a standalone all-reduce of every gradient "
            f"({fmt(ar)} ms): that share is hidden behind the backward",
            same=f"about what a standalone all-reduce of every gradient takes ({fmt(ar)} ms): "
            "none of it is hidden",
        )
        cited.append(alone)
    return said(res, text + ".", cited)


def _flat_against_naive(res: Results, record: Record, rows: Rows) -> list[Block]:
    """§5.3.1's comparison: one all-reduce of the flattened gradients against one per gradient."""
    k = ddp_keys
    flat, naive = _variant(rows, "ddp:flat"), _variant(rows, "ddp:naive")
    if flat is None or naive is None:
        return []
    text = (
        f"On {run_world(record)} ranks, batching the gradients into one all-reduce makes the step "
        f"{speed_against(naive[k.step_ms] / flat[k.step_ms], 'one all-reduce per gradient')}: "
        f"{fmt(flat[k.step_ms])} against {fmt(naive[k.step_ms])} ms"
    )
    if num(flat, k.comm_ms) is not None and num(naive, k.comm_ms) is not None:
        text += (
            f", communicating {fmt(flat[k.comm_ms])} against {fmt(naive[k.comm_ms])} ms"
            + ratio_word(
                naive[k.comm_ms] / flat[k.comm_ms],
                more=f": one call pays the per-call cost once instead of "
                f"{naive.get(k.collectives) or 'once per gradient'} times, and a large message "
                "runs at the link's bandwidth",
                less=": here the many small calls took less time than the one large one",
                same=": the call count does not change the communication time here",
            )
        )
    return [said(res, text + ".", [flat, naive])]


def _individual_against_flat(res: Results, record: Record, rows: Rows) -> list[Block]:
    """§5.3.2 (a)'s comparison: overlapping each gradient's all-reduce with the backward against
    flat (and naive) DDP, and why, from what the rows measured: the communication left after
    the backward, the backward's own slow-down, and flat DDP's exposed all-reduce."""
    k = ddp_keys
    ind, flat, naive = (_variant(rows, v) for v in ("ddp:individual", "ddp:flat", "ddp:naive"))
    if ind is None or flat is None:
        return []
    versus = f"flat DDP's {fmt(flat[k.step_ms])} ms"
    if naive is not None:
        versus += f" and naive DDP's {fmt(naive[k.step_ms])} ms"
    side = relation(ind[k.step_ms], flat[k.step_ms])
    text = (
        f"(a) On {run_world(record)} ranks, overlapping each gradient's all-reduce with the "
        f"backward makes the step "
        f"{speed_against(flat[k.step_ms] / ind[k.step_ms], 'flat DDP')}: "
        f"{fmt(ind[k.step_ms])} ms against {versus}"
    )
    wait, overhead = num(ind, k.wait_ms), num(ind, k.overhead_ms)
    flat_over = num(flat, k.overhead_ms)
    if None not in (wait, overhead, flat_over, num(ind, k.comm_ms)):
        flat_comm = f"{fmt(flat[k.comm_ms])} ms" if num(flat, k.comm_ms) else "not measured"
        text += (
            f". Its {ind.get(k.collectives)} all-reduces take {fmt(ind[k.comm_ms])} ms of NCCL "
            f"time in all (flat's one: {flat_comm}), and only {fmt(wait)} ms of them are left "
            f"when the backward ends; yet the step is {fmt(overhead)} ms longer than one GPU's, "
            f"so the backward itself ran {fmt(overhead - wait)} ms longer, its kernels sharing "
            "the GPU with the many small, latency-bound collectives. "
        )
        text += {
            "below": f"That costs less than the {fmt(flat_over)} ms flat DDP adds by "
            "all-reducing after the backward, where nothing overlaps it: overlapping wins",
            "above": f"That costs more than the {fmt(flat_over)} ms flat DDP adds by "
            "all-reducing after the backward: the slower backward gives back more than the "
            "overlap hides",
            "level with": f"Against the {fmt(flat_over)} ms flat DDP adds by all-reducing "
            f"after the backward, that leaves a difference of "
            f"{fmt(abs(flat[k.step_ms] - ind[k.step_ms]))} ms a step, within the {SAME:.0%} by "
            "which step times vary, so the two are level at this precision",
        }[side]
    return [said(res, text + ".", [r for r in (ind, flat, naive) if r is not None])]


def _size_note(runs: list[tuple[Record, Rows]]) -> list[Block]:
    """What is missing where no run trained the 2026 handout's xl on two ranks."""
    xl = MODEL_SIZES["xl"]
    want = {"d_model": xl.d_model, "d_ff": xl.d_ff, "num_layers": xl.num_layers}
    for record, _ in runs:
        dims = run_dims(record) or {}
        if run_world(record) == 2 and all(dims.get(k) == v for k, v in want.items()):
            return []
    return [
        Paragraph(
            f"No run here trained the 2026 handout's xl ({xl.d_model}/{xl.d_ff}/"
            f"{xl.num_layers}L/{xl.num_heads}H) on two GPUs: `bench-ddp --size xl --nproc 2` "
            "on two GPUs of one node makes it."
        )
    ]


def _ddp_traces(res: Results, runs: list[tuple[Record, Rows]]) -> list[Block]:
    """§5.3.2 (b): each run's traced step per wrapper, its share of all-reduce time beside
    compute, and the timelines drawn from the traces, in place of Nsight Systems screenshots;
    or the command that makes them."""
    k = ddp_keys
    out: list[Block] = []
    for record, rows in runs:
        traced = [r for r in rows if num(r, k.comm_overlap) is not None]
        images = trace_images(res, record, variants=[r[k.variant] for r in rows])
        if not traced and not images:
            continue
        text = (
            f"On {run_world(record)} ranks one more step of each wrapper ran under torch.profiler"
        )
        if traced:
            shares = ", ".join(f"{r[k.case]} {r[k.comm_overlap]:.0%}" for r in traced)
            text += (
                "; the share of its all-reduce time during which compute ran too (rank 0): "
                + shares
            )
            for group, where in (
                ([r for r in traced if r[k.comm_overlap] <= SAME], "only after the backward, "
                 f"with no compute beside them (at most {SAME:.0%} of their time)"),
                ([r for r in traced if r[k.comm_overlap] > SAME], "while the backward computes"),
            ):  # fmt: skip
                if group:
                    verb = "all-reduces" if len(group) == 1 else "all-reduce"
                    text += f"; {_names(group)} {verb} {where}"
        text += (
            ". The timelines below draw rank 0's compute and communication lanes of that step."
            if images
            else ". Its traces were not kept beside it (they stay out of the repository), so "
            "no timeline is drawn for it."
        )
        out += [said(res, text, traced or rows), *images]
    if not out:
        return [Paragraph(f"(b) {NO_NSIGHT} Not run: {DDP_TRACES.sentence()}.")]
    intro = Paragraph(
        f"(b) {NO_NSIGHT} A torch.profiler trace of one training step per wrapper stands in "
        "for them: the step's GPU kernels (on a CPU, its operators and gloo's threads) on one "
        "time axis, drawn as a compute lane and a communication lane."
    )
    return [intro, *out]


def _names(rows: Rows) -> str:
    names = [str(r[ddp_keys.case]) for r in rows]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]

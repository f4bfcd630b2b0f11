"""bench-report: one Markdown report from the JSON results in a folder, in the handout's order.

Every `*.json` written by a `bench-*` tool (`--json`) in the folder (default `docs/results/`) is
read back; each lands in its section with its table, notes and plots, and each section answers
the handout's questions from the measured rows where a number answers them (backward vs forward
time, the effect of warm-up, the bf16 speed-up, peak memory per size, the longest sequence naive
attention fits, compiled vs eager, fa2 vs SDPA, bandwidth per size, bucket size vs step time,
memory saved by sharding). Nothing in the answers is typed in: a section without results says
"Not measured."
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.core.env import now_iso
from bench.core.oom import OK, OOM
from bench.core.results import Run, load_json, to_markdown

__all__ = ["SECTIONS", "Section", "build_report", "collect_runs", "main"]

Rows = list[dict[str, Any]]

NOT_MEASURED = "Not measured."


def _ok(rows: Iterable[dict[str, Any]]) -> Rows:
    return [r for r in rows if r.get("status", OK) == OK]


def _rows(runs: Sequence[Run], tool: str) -> Rows:
    return [r for run in runs if run.tool == tool for r in run.rows]


def _num(row: dict[str, Any], key: str) -> float | None:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _best(rows: Rows, key: str) -> dict[str, Any] | None:
    """The row with the largest non-zero number under `key`; None when no row has one."""
    measured = [r for r in rows if _num(r, key)]
    return max(measured, key=lambda r: r[key]) if measured else None


def _grouped(rows: Rows, *keys: str) -> dict[tuple, Rows]:
    """`rows` grouped by their values of `keys`, groups and rows in first-seen order."""
    groups: dict[tuple, Rows] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    return groups


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _span(values: Sequence[float], unit: str = "×") -> str:
    """`median (min–max over n)` of `values`, e.g. `2.1× (1.9–2.4× over 5)`."""
    med = statistics.median(values)
    if len(values) == 1:
        return f"{_fmt(med)}{unit}"
    low, high = _fmt(min(values)), _fmt(max(values))
    return f"{_fmt(med)}{unit} (median; {low}–{high}{unit} over {len(values)})"


def _pairs(
    rows: Rows, *, vary: str, a: Any, b: Any, ignore: Sequence[str] = ()
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Rows that differ only in `vary` (value `a` vs `b`), matched on every non-metric key."""
    skip = {vary, "status", *ignore}

    def key(r: dict[str, Any]) -> tuple:
        return tuple(sorted((k, v) for k, v in r.items() if k not in skip and not _is_metric(k, v)))

    left = {key(r): r for r in rows if r.get(vary) == a}
    return [(left[key(r)], r) for r in rows if r.get(vary) == b and key(r) in left]


def _is_metric(key: str, value: Any) -> bool:
    """Measured values (floats, counts of timed steps) are not part of a row's identity."""
    return isinstance(value, float) or value is None or key in ("n", "first_step_ms")


# ----------------------------------------------------------------------------- answers


def _model_answers(runs: Sequence[Run]) -> list[str]:
    rows = _ok(_rows(runs, "model"))
    out = []
    ratios = [
        r["bwd_ms"] / r["fwd_ms"]
        for r in rows
        if r.get("mode") != "forward" and _num(r, "bwd_ms") and _num(r, "fwd_ms")
    ]
    if ratios:
        out.append(f"Backward time / forward time: {_span(ratios)}.")
    for mode in ("forward", "forward-backward", "train-step"):
        per = [r for r in rows if r.get("mode") == mode and _num(r, "step_ms")]
        if per:
            items = ", ".join(
                f"{r['size']} ctx {r['ctx']} {r['dtype']}: {_fmt(r['step_ms'])} ± "
                f"{_fmt(r['step_std'])} ms"
                for r in per
            )
            out.append(f"{mode} step (mean ± std): {items}.")
    spread = [
        r["step_std"] / r["step_ms"]
        for r in rows
        if _num(r, "step_ms") and _num(r, "step_std") is not None
    ]
    if spread:
        out.append(f"Run-to-run spread (std / mean) is at most {max(spread):.1%} after warm-up.")
    best = _best(rows, "mfu")
    if best:
        out.append(
            f"Highest MFU {best['mfu']:.1%} ({best['size']}, {best['mode']}, {best['dtype']}, "
            f"peak assumed {_fmt(best['mfu_peak_tflops'])} TFLOP/s)."
        )
    return out


def _warmup_answers(runs: Sequence[Run]) -> list[str]:
    groups = _grouped(_ok(_rows(runs, "warmup")), "size", "ctx", "mode", "dtype")
    out = []
    for (size, ctx, mode, dtype), group in groups.items():
        group.sort(key=lambda r: r["warmup"])
        parts = [
            f"{r['warmup']} warm-up: {_fmt(r['step_ms'])} ± {_fmt(r['step_std'])} ms, "
            f"first step {_fmt(r['first_step_ms'])} ms"
            for r in group
        ]
        cold, warm = group[0], group[-1]
        out.append(
            f"{size} ctx {ctx} {mode} {dtype}: " + "; ".join(parts) + ". "
            f"Without enough warm-up the mean is {cold['step_ms'] / warm['step_ms']:.2f}× and "
            f"the std {_ratio(cold['step_std'], warm['step_std'])} those after "
            f"{warm['warmup']} warm-up steps."
        )
    return out


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}×" if b else "(no spread to compare)"


def _precision_answers(runs: Sequence[Run]) -> list[str]:
    rows = _rows(runs, "precision")
    out = []
    acc = {r["case"]: r for r in rows if r.get("part") == "accumulation"}
    if acc:
        out.append(
            "Accumulating 0.01 a thousand times: "
            + "; ".join(f"{c}: {r['printed']} (error {r['abs_error']:.2g})" for c, r in acc.items())
            + "."
        )
        fp16, fp32 = acc.get("fp16 += fp16"), acc.get("fp32 += fp32")
        if fp16 and fp32 and fp32["abs_error"]:
            out.append(
                f"An fp16 accumulator is {fp16['abs_error'] / fp32['abs_error']:,.0f}× further "
                "off than an fp32 one; adding fp16 values into fp32 keeps only the rounding of "
                f"0.01 to fp16 (error {acc.get('fp32 += fp16', fp16)['abs_error']:.2g})."
            )
    dtypes: dict[str, list[str]] = {}
    for r in rows:
        if r.get("part") == "autocast":
            dtypes.setdefault(r["autocast"], []).append(f"{r['tensor']} {r['dtype']}")
    out.extend(f"Under autocast ({label}): {', '.join(seen)}." for label, seen in dtypes.items())
    model = _ok(_rows(runs, "model"))
    speedups = [
        f"{a['size']} {a['mode']}: {a['step_ms'] / b['step_ms']:.2f}×"
        for a, b in _pairs(model, vary="dtype", a="fp32", b="bf16")
        if _num(a, "step_ms") and _num(b, "step_ms")
    ]
    if speedups:
        out.append(f"bf16 autocast speed-up (fp32 step / bf16 step): {', '.join(speedups)}.")
    return out


def _memory_answers(runs: Sequence[Run]) -> list[str]:
    rows = [r for r in _rows(runs, "model") if r.get("status") in (OK, OOM)]
    measured = [r for r in rows if _num(r, "peak_mib") or r.get("status") == OOM]
    out = []
    if measured:
        table = [
            {
                "size": r["size"],
                "ctx": r["ctx"],
                "dtype": r["dtype"],
                "mode": r["mode"],
                "peak_mib": r.get("peak_mib"),
                "status": r["status"],
            }
            for r in measured
        ]
        out.append("Peak memory (MiB) over the timed steps:\n\n" + to_markdown(table))
        ratios = [
            b["peak_mib"] / a["peak_mib"]
            for a, b in _pairs(_ok(measured), vary="dtype", a="fp32", b="bf16")
            if _num(a, "peak_mib") and _num(b, "peak_mib")
        ]
        if ratios:
            out.append(f"bf16 autocast peak / fp32 peak: {_span(ratios)}.")
    seen = {}
    for r in rows:
        if all(k in r for k in ("batch", "ctx", "d_model")):
            seen[(r["size"], r["batch"], r["ctx"], r["d_model"])] = r
    for size, batch, ctx, d_model in seen:
        mib = batch * ctx * d_model * 4 / 2**20  # fp32 bytes
        out.append(
            f"One residual-stream activation of {size} (batch {batch} × ctx {ctx} × d_model "
            f"{d_model}, fp32) is {mib:,.2f} MiB."
        )
    return out


def _attention_answers(runs: Sequence[Run]) -> list[str]:
    rows = _rows(runs, "attn")
    out = []
    for d in sorted({r["d"] for r in rows if r["impl"] == "naive"}):
        naive = [r for r in rows if r["impl"] == "naive" and r["d"] == d]
        fits = [r["seq"] for r in naive if r["status"] == OK]
        ooms = [r["seq"] for r in naive if r["status"] == OOM]
        if fits or ooms:
            text = f"d={d}: naive attention fits up to seq {max(fits)}" if fits else f"d={d}:"
            out.append(text + (f", out of memory from seq {min(ooms)}." if ooms else " (no OOM)."))
    mem = [r for r in _ok(rows) if r["impl"] == "naive" and _num(r, "mem_before_bwd_mib")]
    if mem:
        big = max(mem, key=lambda r: (r["seq"], r["d"]))
        itemsize = 4 if big["dtype"] == "fp32" else 2
        scores = big["batch"] * big["seq"] ** 2 * itemsize / 2**20
        out.append(
            f"Naive attention at seq {big['seq']}, d={big['d']} holds "
            f"{_fmt(big['mem_before_bwd_mib'])} MiB before backward; the score matrix alone "
            f"(batch × seq²) is {_fmt(scores)} MiB, and softmax saves another of that size."
        )
    for impl in ("fa2-triton", "fa2-pytorch", "compiled"):
        for key, name in (("fwd_vs_sdpa", "forward"), ("bwd_vs_sdpa", "backward")):
            vals = [r[key] for r in _ok(rows) if r["impl"] == impl and _num(r, key)]
            if vals:
                out.append(f"{impl} {name} speed vs SDPA: {_span(vals)}.")
    return out


def _compile_answers(runs: Sequence[Run]) -> list[str]:
    out = []
    attn = _ok(_rows(runs, "attn"))
    for key, name in (("fwd_ms", "forward"), ("bwd_ms", "backward")):
        vals = [
            a[key] / b[key]
            for a, b in _pairs(attn, vary="impl", a="naive", b="compiled")
            if _num(a, key) and _num(b, key)
        ]
        if vals:
            out.append(f"torch.compile'd attention {name} speed-up over eager: {_span(vals)}.")
    model = _ok(_rows(runs, "model"))
    vals = [
        f"{a['size']} {a['mode']} {a['dtype']}: {a['step_ms'] / b['step_ms']:.2f}×"
        for a, b in _pairs(model, vary="compiled", a=False, b=True)
        if _num(a, "step_ms") and _num(b, "step_ms")
    ]
    if vals:
        out.append(
            f"torch.compile'd model speed-up (eager step / compiled step): {', '.join(vals)}."
        )
    return out


def _flash_answers(runs: Sequence[Run]) -> list[str]:
    rows = _ok(_rows(runs, "flash"))
    out = []
    cases = dict.fromkeys(r["case"] for r in rows)
    for case in cases:
        crows = [r for r in rows if r["case"] == case]
        if len({r["seq"] for r in crows}) == 1:
            for r in crows:
                if r["impl"] == r["baseline"]:
                    continue
                sp = [
                    f"{p} {r[f'{p}_speedup']:.2f}×"
                    for p in ("fwd", "bwd", "fwd_bwd")
                    if _num(r, f"{p}_speedup")
                ]
                out.append(
                    f"{case} ({r['batch']}×{r['seq']}×{r['d']} {r['dtype']}): {r['impl']} "
                    f"forward+backward {_fmt(r['fwd_bwd_ms'])} ms"
                    + (f"; vs {r['baseline']}: {', '.join(sp)}" if sp else "")
                    + "."
                )
            continue
        baseline = crows[0]["baseline"]
        for impl in dict.fromkeys(r["impl"] for r in crows if r["impl"] != baseline):
            mine = [r for r in crows if r["impl"] == impl]
            vals = [r["fwd_bwd_speedup"] for r in mine if _num(r, "fwd_bwd_speedup")]
            if vals:
                out.append(f"{case}: {impl} forward+backward vs {baseline}: {_span(vals)}.")
            best = _best(mine, "fwd_bwd_tflops")
            if best:
                out.append(
                    f"{case}: {impl} peaks at {_fmt(best['fwd_bwd_tflops'])} TFLOP/s "
                    f"forward+backward (seq {best['seq']}, d {best['d']}, {best['dtype']})."
                )
    return out


def _allreduce_answers(runs: Sequence[Run]) -> list[str]:
    rows = [r for r in _ok(_rows(runs, "allreduce")) if _num(r, "ms")]
    out = []
    for (backend, world), group in _grouped(rows, "backend", "world_size").items():
        group.sort(key=lambda r: r["size_mb"])
        items = ", ".join(
            f"{_fmt(r['size_mb'])} MB {_fmt(r['ms'])} ms"
            + (f" ({_fmt(r['busbw_gbps'])} GB/s bus)" if _num(r, "busbw_gbps") else "")
            for r in group
        )
        out.append(f"{backend}, {world} ranks (median): {items}.")
    return out


def _bucket(row: dict[str, Any]) -> str:
    return f" {_fmt(row['bucket_mb'])} MB" if _num(row, "bucket_mb") else ""


def _ddp_answers(runs: Sequence[Run]) -> list[str]:
    rows = [r for r in _ok(_rows(runs, "ddp")) if _num(r, "step_ms")]
    if not rows:
        return []
    items = ", ".join(
        f"{r['case']}: {_fmt(r['step_ms'])} ms"
        + (f" ({_fmt(r['comm_ms'])} ms communicating)" if _num(r, "comm_ms") else "")
        for r in rows
    )
    parallel = [r for r in rows if r.get("variant") != "single"]
    out = [f"Time per step: {items}."]
    if parallel:
        out.append(
            f"Fastest data-parallel variant: {min(parallel, key=lambda r: r['step_ms'])['case']}."
        )
    bucketed = sorted(
        (r for r in rows if r.get("variant") == "bucketed" and _num(r, "bucket_mb")),
        key=lambda r: r["bucket_mb"],
    )
    if len(bucketed) > 1:
        out.append(
            "Bucket size vs step time: "
            + ", ".join(f"{_fmt(r['bucket_mb'])} MB → {_fmt(r['step_ms'])} ms" for r in bucketed)
            + "."
        )
    return out


def _zero_answers(runs: Sequence[Run]) -> list[str]:
    out = []
    for r in _ok(_rows(runs, "zero")):
        memory = [
            f"{k.removesuffix('_mib')} {_fmt(v)} MiB"
            for k, v in r.items()
            if k.endswith("_mib") and _num(r, k)
        ]
        versus = [
            f"{k.removesuffix('_vs_ddp')} {r[k]:.2f}×"
            for k in ("state_vs_ddp", "peak_vs_ddp", "time_vs_ddp")
            if _num(r, k)
        ]
        label = f"{r.get('variant')}{_bucket(r)}"
        text = f"{label}: {', '.join(memory)}"
        if _num(r, "step_ms"):
            text += f"; step {_fmt(r['step_ms'])} ms"
        if versus and r.get("variant") != "ddp":
            text += f"; relative to ddp: {', '.join(versus)}"
        out.append(text + ".")
    return out


# ----------------------------------------------------------------------------- sections


@dataclass(frozen=True)
class Section:
    """A report section: which tools' tables it shows and how it answers its questions."""

    title: str
    handout: str
    tables: tuple[str, ...]
    answers: Callable[[Sequence[Run]], list[str]]


SECTIONS: tuple[Section, ...] = (
    Section("End-to-end model timing", "§1.1.3 (a, b)", ("model",), _model_answers),
    Section("Warm-up", "§1.1.3 (c)", ("warmup",), _warmup_answers),
    Section("Mixed precision", "§1.1.5", ("precision",), _precision_answers),
    Section("Memory", "§1.1.6", (), _memory_answers),
    Section("Attention", "§1.2.1", ("attn",), _attention_answers),
    Section("torch.compile", "§1.3.1", (), _compile_answers),
    Section("FlashAttention-2", "§1.3.2", ("flash",), _flash_answers),
    Section("Communication: all-reduce", "§2.1", ("allreduce",), _allreduce_answers),
    Section("Data-parallel training", "§2.2–2.3", ("ddp",), _ddp_answers),
    Section("Optimizer-state sharding", "§2.4", ("zero",), _zero_answers),
)


def collect_runs(folder: str | os.PathLike[str]) -> tuple[list[tuple[Path, Run]], list[str]]:
    """Every bench result in `folder` (not recursive), oldest first, and the files skipped.

    Returns:
        `(runs, skipped)`: `(json path, Run)` pairs sorted by date, and `"name: reason"` for
        each JSON file that is not a bench result.

    Raises:
        FileNotFoundError: `folder` does not exist.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no results folder {folder}; write results there with --json")
    runs, skipped = [], []
    for path in sorted(folder.glob("*.json")):
        try:
            runs.append((path, load_json(path)))
        except (ValueError, TypeError, KeyError) as exc:
            skipped.append(f"{path.name}: {exc}")
    runs.sort(key=lambda item: item[1].date)
    return runs, skipped


def _run_block(path: Path, run: Run, report_dir: Path) -> str:
    parts = [run.to_markdown(), f"Source: `{path.name}`."]
    for plot in run.plots:
        image = Path(os.path.relpath((path.parent / plot).resolve(), report_dir.resolve()))
        parts.append(f"![{run.tool}]({image.as_posix()})")
    return "\n\n".join(parts)


def build_report(
    folder: str | os.PathLike[str] = "docs/results",
    *,
    output: str | os.PathLike[str] | None = None,
    title: str = "Benchmark report",
) -> str:
    """The report of every result in `folder`, as Markdown (written to `output` when given).

    Args:
        folder: where the `--json` results are.
        output: the Markdown file to write; image links are made relative to its folder (to
            `folder` when None).
        title: the report's top heading.

    Raises:
        FileNotFoundError: `folder` does not exist.
    """
    runs, skipped = collect_runs(folder)
    report_dir = Path(output).parent if output is not None else Path(folder)
    all_runs = [run for _, run in runs]
    devices = sorted({f"{r.env.get('device_name')} ({r.env.get('device_type')})" for r in all_runs})
    lines = [
        f"# {title}",
        f"Built {now_iso()} from {len(runs)} result file(s) in `{Path(folder).as_posix()}`"
        + (f" measured on {', '.join(devices)}." if devices else "."),
    ]
    known = {tool for s in SECTIONS for tool in s.tables}
    for number, section in enumerate(SECTIONS, start=1):
        lines.append(f"## {number}. {section.title} ({section.handout})")
        blocks = [_run_block(p, r, report_dir) for p, r in runs if r.tool in section.tables]
        try:
            answers = section.answers(all_runs)
        except KeyError as exc:  # a result file written by an older or foreign tool version
            answers = [f"(No answers: a result file lacks the key {exc}; re-run its tool.)"]
        lines.extend(blocks)
        if answers:
            lines.append("**From the numbers**\n\n" + "\n".join(f"- {a}" for a in answers))
        if not blocks and not answers:
            lines.append(NOT_MEASURED)
    others = [(p, r) for p, r in runs if r.tool not in known]
    if others:
        lines.append("## Other results")
        lines.extend(_run_block(p, r, report_dir) for p, r in others)
    if skipped:
        lines.append("Skipped files: " + "; ".join(skipped))
    text = "\n\n".join(lines) + "\n"
    if output is not None:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(text)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `bench-report` (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="bench-report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("folder", nargs="?", default="docs/results", help="results folder")
    parser.add_argument("-o", "--output", type=Path, help="write the report here (else print)")
    parser.add_argument("--title", default="Benchmark report", help="top heading")
    args = parser.parse_args(argv)
    try:
        text = build_report(args.folder, output=args.output, title=args.title)
    except FileNotFoundError as exc:
        parser.error(str(exc))
    if args.output is None:
        print(text, end="")
    else:
        print(f"wrote {args.output}")
    return 0

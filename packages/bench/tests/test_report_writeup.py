"""The write-up bench-report makes to hand in: Typst that compiles to pages whose tables fit the
text width (measured by Typst itself) and whose ink stays inside the margins (read off a
rendered page), LaTeX that pdflatex reads (ASCII), and the trace timelines that stand in for
Nsight Systems screenshots."""

import json
from pathlib import Path

import pytest

from bench.core.results import save_json
from bench.report.document import Heading, Paragraph, Table, render
from bench.report.tool import WRITEUP_PAGE_BUDGET, build_report, compile_typst, pdf_pages
from bench.report.trace_timeline import render_trace_timeline, trace_lanes

typst = pytest.importorskip("typst")
Image = pytest.importorskip("PIL.Image")

# The page's side margin in the preamble (1.6 cm of A4's 21 cm), as a share of the page width.
_MARGIN_SHARE = 1.6 / 21.0
_PPI = 40  # enough to see a glyph in the margin, cheap to rasterise
_INK = 200  # a grey level below paper white: antialiased 6 pt type at 40 ppi reaches ~150


def _fits(source: Path, folder: Path) -> list[dict]:
    """Every table's `<table-fit>` metadata: what it needed and had (points), its parts."""
    root = str(Path(folder).resolve().anchor)
    found = json.loads(
        typst.query(str(source), "<table-fit>", field="value", root=root, format="json")
    )
    return [{**m, "need": _points(m["need"]), "avail": _points(m["avail"])} for m in found]


def _points(length: str) -> float:
    return float(str(length).removesuffix("pt"))


def _ink_in_margins(pages: list[bytes]) -> list[int]:
    """The pages (1-based) with dark pixels in the left or right margin."""
    import io

    inked = []
    for number, png in enumerate(pages, start=1):
        page = Image.open(io.BytesIO(png)).convert("L")
        width, height = page.size
        margin = int(_MARGIN_SHARE * width) - 2  # a pixel's rounding inside the margin
        strips = [
            page.crop((1, 0, margin, height)),
            page.crop((width - margin, 0, width - 1, height)),
        ]
        if any(min(strip.getextrema()) < _INK for strip in strips):
            inked.append(number)
    return inked


def _wide_table(cells: int) -> Table:
    """A results table wider than a page: `cells` measurement columns of long numbers."""
    columns = ["size", "ctx", *[f"metric_number_{i}_ms" for i in range(cells)]]
    rows = [
        {"size": f"size {r}", "ctx": 512, **{c: 123456.789 * (r + 1) for c in columns[2:]}}
        for r in range(3)
    ]
    return Table(rows, columns)


def test_a_wide_table_is_split_to_fit_and_nothing_crosses_the_margins(tmp_path):
    doc = [
        Heading(1, "Write-up"),
        Paragraph(
            "A long command: `bench-model --memory-snapshot " + "a_very_long/path_" * 12 + "`"
        ),
        _wide_table(18),
        Table([{"part": "(a)", "why": "a sentence long enough to wrap " * 6}], ["part", "why"]),
    ]
    source = tmp_path / "w.typ"
    source.write_text(render(doc, "typst"))
    fits = _fits(source, tmp_path)
    assert fits and all(f["need"] <= f["avail"] for f in fits)
    assert max(f["parts"] for f in fits) > 1  # the wide table was split, not squeezed
    pages = compile_typst(source, None, folder=tmp_path, fmt="png", ppi=_PPI)
    assert _ink_in_margins(pages) == []


def test_the_checks_catch_a_table_that_cannot_fit(tmp_path):
    unbreakable = "x" * 400  # one cell wider than any page, at any size
    doc = [Table([{"name": unbreakable}], ["name"])]
    source = tmp_path / "bad.typ"
    source.write_text(render(doc, "typst"))
    (fit,) = _fits(source, tmp_path)
    assert fit["need"] > fit["avail"]
    pages = compile_typst(source, None, folder=tmp_path, fmt="png", ppi=_PPI)
    assert _ink_in_margins(pages) == [1]


def test_the_writeup_of_real_results_compiles_to_a_pdf_that_fits(tool_results, tmp_path):
    out = tmp_path / "writeup.pdf"
    build_report(tool_results, output=out, fmt="pdf")
    assert out.read_bytes().startswith(b"%PDF")
    pages = compile_typst(out.with_suffix(".typ"), None, folder=tool_results, fmt="png", ppi=10)
    assert pdf_pages(out.read_bytes()) == len(pages) <= WRITEUP_PAGE_BUDGET
    fits = _fits(out.with_suffix(".typ"), tool_results)
    assert fits and all(f["need"] <= f["avail"] for f in fits)
    text = out.with_suffix(".typ").read_text()
    assert "== 1. Benchmarking Script" in text and "Other results" not in text


def test_the_writeup_of_the_committed_results_fits_its_budget(tmp_path):
    """The write-up one would hand in, of `docs/results` as committed: within its page budget,
    every table within the text width (new results add columns and kernel names)."""
    committed = Path(__file__).resolve().parents[3] / "docs" / "results"
    out = tmp_path / "writeup.pdf"
    build_report(committed, output=out, fmt="pdf")
    assert pdf_pages(out.read_bytes()) <= WRITEUP_PAGE_BUDGET
    fits = _fits(out.with_suffix(".typ"), committed)
    assert fits and all(f["need"] <= f["avail"] for f in fits)


def test_latex_is_ascii_for_pdflatex(tool_results):
    doc = [Paragraph("Naïve DDP, §5.2: Wᵀ ∈ R, 1–2 × 3 ≤ 4 — √x"), *[]]
    latex = render(doc, "latex")
    assert latex.isascii()
    assert r"Na\"{\i}ve" in latex and r"\S{}" in latex and r"$^{T}$" in latex
    assert build_report(tool_results, fmt="latex").isascii()


# ---------------------------------------------------------------- trace timelines


def _kernel(name: str, start: float, dur: float) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": start, "dur": dur, "tid": 7}


def test_a_cuda_trace_splits_compute_and_nccl_and_measures_their_overlap(tmp_path):
    trace = {
        "traceEvents": [
            _kernel("ampere_sgemm_128x64", 0.0, 100.0),
            _kernel("Memcpy DtoD", 100.0, 50.0),  # a copy: neither lane
            _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 50.0, 100.0),
            _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 200.0, 50.0),
        ]
    }
    lanes = trace_lanes(trace)
    assert lanes.source == "cuda" and lanes.num_collectives == 2
    assert lanes.compute == [(0.0, 100.0)]
    assert lanes.overlap == pytest.approx(
        50.0 / 150.0
    )  # half of the first call, none of the second
    summary = render_trace_timeline(trace, tmp_path / "t.png", title="synthetic")
    assert (tmp_path / "t.png").stat().st_size > 0 and summary.communication_ms == 0.15


def test_a_gloo_trace_of_real_ranks_is_drawn_and_shown_in_the_report(ddp_run, zero_run, tmp_path):
    ddp_traces = sorted(Path(ddp_run.config["trace_dir"]).glob("*.pt.trace.json"))
    assert {"ddp-naive.pt.trace.json", "ddp-individual.pt.trace.json"} <= {
        t.name for t in ddp_traces
    }
    lanes = trace_lanes(next(t for t in ddp_traces if t.name.startswith("ddp-individual")))
    assert lanes.source == "cpu" and lanes.num_collectives > 0
    assert lanes.compute and 0.0 <= lanes.overlap <= 1.0
    save_json(ddp_run, tmp_path / "ddp_cpu_2026-11-28.json")
    save_json(zero_run, tmp_path / "zero_cpu_2026-11-28.json")
    text = build_report(tmp_path)
    assert "![timeline_ddp_cpu_2026-11-28_ddp-individual]" in text
    assert "stands in for them" in text and "Nsight Systems was not available" in text
    assert (tmp_path / "timeline_zero_cpu_2026-11-28_fsdp_fp32.png").is_file()


def test_text_after_inline_code_is_kept(tmp_path):
    doc = [Paragraph("(source: `a.json` at `1a2b`; `b.json`.json and **c**; *d*.x)")]
    source = tmp_path / "t.typ"
    source.write_text(render(doc, "typst"))
    pdf = typst.compile(str(source), root=str(tmp_path.anchor), format="pdf")
    assert pdf.startswith(b"%PDF")
    text = source.read_text()
    assert '#raw("1a2b");; #raw("b.json");.json' in text.replace("\u200b", "")

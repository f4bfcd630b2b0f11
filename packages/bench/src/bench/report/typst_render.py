"""The report as a Typst document that prints: tables fitted to the text width, never
overlapping.

A wide results table (bench-model's has 19 columns) cannot be set at the body's size on a
portrait page. Typst measures, so the fitting happens in the document itself (`PREAMBLE`'s
`fit-table`), with the fonts that will print:

1. every cell is measured at each of `TABLE_SIZES`, largest first: a short column (numbers,
   names) needs its widest cell, a prose column (`Table` cells over `PROSE_CHARS` characters)
   only its widest word, since it wraps;
2. the first size at which all columns fit the text width sets the table;
3. when none does, the columns are split into tables that each fit at the smallest size, the
   table's leading key columns (`keep`: names, not measurements) repeated in each.

Every table records what it needed and what it had as `metadata` labelled `<table-fit>`, so a
test (or anyone) can query a compiled document and fail on a table that does not fit; one that
cannot fit even alone (a single unbreakable cell wider than the page) is still set, and the
metadata says so.

Inline text is Typst markup with every markup character escaped; code becomes `#raw` with
zero-width break opportunities after `/`, `_` and `=`, so long commands and paths wrap instead
of running into the margin. Every embedded expression ends with `;`, Typst's explicit end, so
the text after it (a `;`, or `.json`) is never read as part of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["PREAMBLE", "PROSE_CHARS", "TABLE_SIZES", "render_typst"]

# Font sizes a table may take, largest first: the body's 9 pt, then smaller; 6 pt is the
# smallest still read comfortably in print.
TABLE_SIZES = ("8pt", "7pt", "6pt")
# A column with a cell longer than this is prose and wraps (an analytic answer's "why").
PROSE_CHARS = 40
# Leading columns repeated in every part of a split table: at most this many of the table's
# first columns whose values are names or whole numbers (its keys), not measurements.
_MAX_KEYS = 4

PREAMBLE = """#set page(paper: "a4", margin: (x: 1.6cm, y: 1.8cm), numbering: "1")
#set text(size: 9pt)
#set par(justify: false)
#set heading(numbering: none)
#show heading.where(level: 2): it => block(above: 1.4em, below: 0.7em, it)

#let table-sizes = (TABLE_SIZES)
#let cell-inset = 2.5pt
#let width-of(s, size, bold) = measure(text(size: size, if bold { strong(s) } else { s })).width
#let word-width(s, size, bold) = calc.max(0pt, ..s.split(" ").map(w => width-of(w, size, bold)))
#let cell-width(s, size, wrap, bold) = if wrap { word-width(s, size, bold) } else {
  width-of(s, size, bold)
}
#let column-width(header, rows, i, wrap, size) = {
  let widths = rows.map(r => cell-width(r.at(i), size, wrap.at(i), false))
  calc.max(cell-width(header.at(i), size, wrap.at(i), true), ..widths) + 2 * cell-inset
}
#let set-table(header, rows, cols, wrap, widths, size) = text(size: size, table(
  columns: cols.map(i => if wrap.at(i) { 1fr } else { widths.at(i) }),
  stroke: 0.4pt, inset: cell-inset, align: left,
  table.header(..cols.map(i => strong(header.at(i)))),
  ..rows.map(r => cols.map(i => r.at(i))).flatten(),
))
#let fit-table(header, rows, keep: 1, wrap: ()) = layout(region => {
  let avail = region.width
  let all = range(header.len())
  let wrap = if wrap.len() == 0 { all.map(i => false) } else { wrap }
  for size in table-sizes {
    let widths = all.map(i => column-width(header, rows, i, wrap, size))
    let need = widths.sum()
    if need <= avail or size == table-sizes.last() {
      if need <= avail {
        [#metadata((need: need, avail: avail, parts: 1, size: size)) <table-fit>]
        set-table(header, rows, all, wrap, widths, size)
        return
      }
      let keys = range(calc.min(keep, header.len()))
      let key-width = keys.map(i => widths.at(i)).sum(default: 0pt)
      let parts = ()
      let current = ()
      let used = key-width
      for i in all.slice(keys.len()) {
        if current.len() > 0 and used + widths.at(i) > avail {
          parts.push(current)
          current = ()
          used = key-width
        }
        current.push(i)
        used += widths.at(i)
      }
      parts.push(current)
      for part in parts {
        let cols = keys + part
        let part-need = cols.map(i => widths.at(i)).sum()
        [#metadata((need: part-need, avail: avail, parts: parts.len(), size: size)) <table-fit>]
        set-table(header, rows, cols, wrap, widths, size)
        v(4pt)
      }
    }
  }
})
""".replace("(TABLE_SIZES)", "(" + ", ".join(TABLE_SIZES) + ")")

# Typst markup characters escaped in running text (`\\` first: the others add backslashes).
_MARKUP = "\\#$@<>_*[]`~/=+-"
# Characters that Typst's fonts may lack, spelled with its own markup instead.
_SPELLED = {"ᵀ": "#super[T];", "∈": "#sym.in;"}
_BREAK_AFTER = "/_=,"
_ZWSP = "\u200b"


def _string(text: str) -> str:
    """`text` as a Typst string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _escape(text: str) -> str:
    out = []
    for c in text:
        if c in _SPELLED:
            out.append(_SPELLED[c])
        elif c in _MARKUP:
            out.append("\\" + c)
        else:
            out.append(c)
    return "".join(out)


def _code(text: str) -> str:
    breakable = "".join(c + _ZWSP if c in _BREAK_AFTER else c for c in text)
    return f"#raw({_string(breakable)});"


def _inline(text: str) -> str:
    """Markdown inline marks (`code`, *emphasis*, **strong**, [text](url)) as Typst markup."""
    import re

    out = []
    for part in re.split(r"(`[^`]*`)", text):
        if part.startswith("`") and part.endswith("`") and len(part) >= 2:
            out.append(_code(part[1:-1]))
            continue
        pieces = re.split(r"(\*\*.+?\*\*|\*[^*\s][^*]*?\*|\[[^\]]*\]\([^)\s]+\))", part)
        for piece in pieces:
            if piece.startswith("**") and piece.endswith("**") and len(piece) > 4:
                out.append(f"#strong[{_escape(piece[2:-2])}];")
            elif piece.startswith("*") and piece.endswith("*") and len(piece) > 2:
                out.append(f"#emph[{_escape(piece[1:-1])}];")
            elif (m := re.fullmatch(r"\[([^\]]*)\]\(([^)\s]+)\)", piece)) is not None:
                out.append(f"#link({_string(m[2])})[{_escape(m[1])}];")
            else:
                out.append(_escape(piece))
    return "".join(out)


def _keys(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> int:
    """How many leading columns name a row rather than measure it (no float among them)."""
    count = 0
    for column in columns[:_MAX_KEYS]:
        if any(isinstance(r.get(column), float) for r in rows):
            break
        count += 1
    return max(count, 1)


def _table(header: Sequence[str], cells: Sequence[Sequence[str]], keep: int, caption: str) -> str:
    wrap = [
        any(len(row[i]) > PROSE_CHARS for row in cells) or len(header[i]) > PROSE_CHARS
        for i in range(len(header))
    ]
    rows = ", ".join("(" + ", ".join(_string(c) for c in row) + ",)" for row in cells)
    call = (
        f"#fit-table(({', '.join(_string(h) for h in header)},), ({rows}{',' if cells else ''}), "
        f"keep: {keep}, wrap: ({', '.join('true' if w else 'false' for w in wrap)},))"
    )
    return f"#emph[{_escape(caption)}]\n\n{call}" if caption else call


def render_typst(blocks: Sequence[Any], cell: Any) -> str:
    """`blocks` (`bench.report.document`'s) as a Typst document; `cell(row, column)` formats a
    table cell."""
    from bench.report.document import Heading, Image, Paragraph, Table

    out = [PREAMBLE]
    for b in blocks:
        if isinstance(b, Heading):
            out.append(f"{'=' * b.level} {_inline(b.text)}")
        elif isinstance(b, Paragraph):
            if b.text.startswith("```"):
                body = b.text.strip("`").partition("\n")[2]
                out.append(f'#raw(block: true, lang: "python", {_string(body)})')
            else:
                out.append(_inline(b.text))
        elif isinstance(b, Table):
            cells = [[cell(r, c) for c in b.columns] for r in b.rows]
            out.append(_table(list(b.columns), cells, _keys(b.rows, b.columns), b.caption))
        elif isinstance(b, Image):
            out.append(f"#align(center, image({_string(b.path)}, width: 80%))")
    return "\n\n".join(out) + "\n"

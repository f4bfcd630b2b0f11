"""A small document model, rendered as Markdown, LaTeX or Typst: for reports whose tables must
also go into a write-up typeset in LaTeX or Typst (the handout recommends generating them).

A document is a list of blocks: `Heading`, `Paragraph` (Markdown inline syntax: `` `code` ``,
`*emphasis*`, `**strong**`), `Table` (rows and columns, values formatted as the results' tables
format them) and `Image` (a path relative to the document). `render(blocks, fmt)` writes the
whole document; LaTeX gets a compilable article (booktabs tables, graphicx images), Typst a
`.typ` file of the same content.

Example::

    doc = [Heading(1, "Report"), Paragraph("Forward takes `12.3` ms."),
           Table([{"size": "small", "ms": 12.3}], ["size", "ms"])]
    print(render(doc, "latex"))
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.commands.report import FORMATS
from bench.core.results import format_value, to_markdown

__all__ = ["FORMATS", "Block", "Heading", "Image", "Paragraph", "Table", "render"]


@dataclass(frozen=True)
class Heading:
    """A heading of `level` 1 (title) to 4."""

    level: int
    text: str


@dataclass(frozen=True)
class Paragraph:
    """Running text with Markdown inline marks (code, emphasis, strong, links)."""

    text: str


@dataclass(frozen=True)
class Table:
    """Rows as a table; `caption` is shown above it. A table `beyond_handout` answers more than
    the handout asks (the write-up leaves it out; the full report keeps it)."""

    rows: Sequence[Mapping[str, Any]]
    columns: Sequence[str]
    caption: str = ""
    beyond_handout: bool = False


@dataclass(frozen=True)
class Image:
    """An image file, `path` relative to the document."""

    path: str
    caption: str = ""


Block = Heading | Paragraph | Table | Image


@dataclass
class _Inline:
    """Markdown inline marks translated by one target's rules."""

    code: str
    emphasis: str
    strong: str
    link: str
    escape: dict[str, str] = field(default_factory=dict)

    def __call__(self, text: str) -> str:
        parts = re.split(r"(`[^`]*`)", text)
        out = []
        for part in parts:
            if part.startswith("`") and part.endswith("`") and len(part) >= 2:
                out.append(self.code.format(self._escape(part[1:-1])))
                continue
            part = self._escape(part)
            part = re.sub(r"\\?\*\\?\*(.+?)\\?\*\\?\*", lambda m: self.strong.format(m[1]), part)
            part = re.sub(r"\\?\*(.+?)\\?\*", lambda m: self.emphasis.format(m[1]), part)
            part = re.sub(
                r"\\?\[([^\]]*?)\\?\]\(([^)\s]+)\)", lambda m: self.link.format(m[2], m[1]), part
            )
            out.append(part)
        return "".join(out)

    def _escape(self, text: str) -> str:
        return "".join(self.escape.get(c, c) if c in self.escape else self.other(c) for c in text)

    @staticmethod
    def other(c: str) -> str:
        """A character the target has no rule for: itself."""
        return c


_LATEX_ESCAPES = {c: "\\" + c for c in "&%$#_{}"} | {
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "\\": r"\textbackslash{}",
    "×": r"$\times$",
    "±": r"$\pm$",
    "≤": r"$\leq$",
    "≥": r"$\geq$",
    "√": r"$\surd$",
    "²": r"$^2$",
    "·": r"$\cdot$",
    "→": r"$\rightarrow$",
    "≈": r"$\approx$",
    "−": "-",
}
# More characters the results write, in LaTeX that pdflatex reads (plain ASCII out).
_LATEX_ESCAPES |= {
    "§": r"\S{}",
    "ᵀ": r"$^{T}$",
    "∈": r"$\in$",
    "∝": r"$\propto$",
    "≠": r"$\neq$",
    "∞": r"$\infty$",
    "⌈": r"$\lceil$",
    "⌉": r"$\rceil$",
    "³": r"$^3$",
    "½": r"$\frac{1}{2}$",
    "µ": r"$\mu$",
    "…": r"\ldots{}",
    "–": "--",
    "—": "---",
    "‘": "`",
    "’": "'",
    "“": "``",
    "”": "''",
    "\u00a0": "~",
    "\u200b": "",
}
# Accents LaTeX spells with a command over the base letter (after Unicode decomposition).
_LATEX_ACCENTS = {"\u0301": "'", "\u0300": "`", "\u0308": '"', "\u0302": "^", "\u0303": "~"}


def _latex_other(c: str) -> str:
    """A character without a rule, as ASCII LaTeX: an accented letter as its accent command
    (`ï` → `\\"{\\i}`), anything else as its code point in brackets, which prints instead of
    stopping pdflatex."""
    base, *marks = unicodedata.normalize("NFD", c)
    if c.isascii():
        return c
    if base.isascii() and marks and all(m in _LATEX_ACCENTS for m in marks):
        letter = {"i": "\\i", "j": "\\j"}.get(base, base)
        for m in marks:
            letter = f"\\{_LATEX_ACCENTS[m]}{{{letter}}}"
        return letter
    return f"[U+{ord(c):04X}]"


_LATEX = _Inline(r"\texttt{{{}}}", r"\emph{{{}}}", r"\textbf{{{}}}", r"\href{{{}}}{{{}}}")
_LATEX.escape = _LATEX_ESCAPES
_LATEX.other = _latex_other  # type: ignore[method-assign]


def _cell(row: Mapping[str, Any], column: str) -> str:
    value = row.get(column)
    if value is None and row.get("status") == "OOM":
        return "OOM"
    return format_value(value)


def _markdown(blocks: Sequence[Block]) -> str:
    out = []
    for b in blocks:
        if isinstance(b, Heading):
            out.append(f"{'#' * b.level} {b.text}")
        elif isinstance(b, Paragraph):
            out.append(b.text)
        elif isinstance(b, Table):
            caption = [f"*{b.caption}*"] if b.caption else []
            out.append("\n\n".join([*caption, to_markdown(b.rows, columns=b.columns)]))
        else:
            out.append(f"![{b.caption}]({b.path})")
    return "\n\n".join(out) + "\n"


def _latex(blocks: Sequence[Block]) -> str:
    out = [
        r"\documentclass{article}",
        r"\usepackage[margin=2cm]{geometry}",
        r"\usepackage{booktabs,graphicx,hyperref,longtable}",
        r"\begin{document}",
    ]
    names = {1: "title", 2: "section*", 3: "subsection*", 4: "paragraph"}
    for b in blocks:
        if isinstance(b, Heading):
            text = _LATEX(b.text)
            if b.level == 1:
                out += [rf"\title{{{text}}}", r"\date{}", r"\maketitle"]
            else:
                out.append(rf"\{names.get(b.level, 'paragraph')}{{{text}}}")
        elif isinstance(b, Paragraph):
            out.append(_LATEX(b.text) + "\n")
        elif isinstance(b, Table):
            spec = "l" * len(b.columns)
            head = " & ".join(_LATEX(c) for c in b.columns) + r" \\"
            body = [" & ".join(_LATEX(_cell(r, c)) for c in b.columns) + r" \\" for r in b.rows]
            caption = [rf"\textit{{{_LATEX(b.caption)}}}", ""] if b.caption else []
            out += [
                *caption,
                r"{\scriptsize",
                rf"\begin{{longtable}}{{{spec}}}",
                r"\toprule",
                head,
                r"\midrule",
                *body,
                r"\bottomrule",
                r"\end{longtable}}",
            ]
        else:
            out += [
                r"\begin{center}",
                rf"\includegraphics[width=\linewidth]{{{b.path}}}",
                r"\end{center}",
            ]
    return "\n".join([*out, r"\end{document}"]) + "\n"


def _typst(blocks: Sequence[Block]) -> str:
    from bench.report.typst_render import render_typst  # it reads this module's blocks

    return render_typst(blocks, _cell)


def render(blocks: Sequence[Block], fmt: str = "markdown") -> str:
    """The document as text in `fmt`: `markdown`, `latex` or `typst`.

    Raises:
        ValueError: an unknown format.
    """
    renderers = {"markdown": _markdown, "latex": _latex, "typst": _typst}
    if fmt not in renderers:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(renderers)}")
    return renderers[fmt](blocks)

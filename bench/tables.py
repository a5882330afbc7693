"""Tables: markdown for RESULTS.md and reports, plain text for the terminal. Cells are
strings, formatted by the caller; a column whose cells all read as numbers is right-aligned."""

from __future__ import annotations

import re
from collections.abc import Sequence

Rows = Sequence[Sequence[str]]
_NUMBER = re.compile(r"[-+x<]?[\d.,]+( \+ [\d.,]+)?|")  # "1,234", "x7.2", "3.8 + 2.1", ""


def md_table(head: Sequence[str], rows: Rows) -> str:
    def clean(cell: str) -> str:
        return cell.replace("|", "\\|")

    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(clean(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def text_table(head: Sequence[str], rows: Rows) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(head, *rows, strict=True)]
    right = [all(_NUMBER.fullmatch(row[i]) for row in rows) for i in range(len(head))]

    def line(cells: Sequence[str]) -> str:
        parts = (
            c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)
        )
        return "  ".join(parts).rstrip()

    return "\n".join([line(head), *(line(row) for row in rows)])


def print_table(head: Sequence[str], rows: Rows, title: str = "") -> None:
    """``text_table`` on stdout, under ``title`` when given."""
    print(f"{title}\n{text_table(head, rows)}" if title else text_table(head, rows))

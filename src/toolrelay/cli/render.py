"""How the CLI shows rows: rich tables for lists, JSON for one object."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

from toolrelay.cli.context import console
from toolrelay.registry.service import dumps


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str], title: str | None = None) -> None:
    out = Table(title=title)
    for column in columns:
        out.add_column(column)
    for row in rows:
        out.add_row(*("" if row.get(c) is None else str(row.get(c)) for c in columns))
    console.print(out)


def show(value: Any) -> None:
    console.print_json(dumps(value))

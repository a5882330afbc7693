"""Named SQL queries loaded from ``queries/*.sql`` (``-- name: NAME`` starts each one)."""

from __future__ import annotations

from functools import cache
from importlib import resources

QUERIES_PACKAGE = "toolrelay.db.sql"


@cache
def load(group: str) -> dict[str, str]:
    return parse(resources.files(QUERIES_PACKAGE).joinpath(f"{group}.sql").read_text("utf-8"))


def parse(text: str) -> dict[str, str]:
    """``-- name: NAME`` starts a query; it runs to the next one."""
    queries: dict[str, str] = {}
    name: str | None = None
    for line in text.splitlines():
        if line.startswith("-- name:"):
            name = line.removeprefix("-- name:").strip()
            queries[name] = ""
        elif name is not None:
            queries[name] += line + "\n"
    return {k: v.strip().rstrip(";") for k, v in queries.items()}

"""`toolrelay audit`: who changed your configuration, when, and what changed (docs/audit.md)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

import typer

from toolrelay.cli.agents import parse_since
from toolrelay.cli.context import fail, registry
from toolrelay.cli.render import Output, listing, output_option, shape
from toolrelay.errors import ToolrelayError
from toolrelay.registry.audit import AUDIT_KINDS, AUDIT_PAGE_MOST, DEFAULT_AUDIT_LIMIT, audit_page

_AUDIT_FIELDS = """
    id integer
    at time
    actor uuid?
    actor_member uuid?
    actor_role string
    session_role string
    xact_id integer
    kind string
    object_id uuid?
    object_label string?
    action string
    changes object
"""
# The JSON (the HTTP API's AuditEntry); the table adds a summary of the changes.
AUDIT = shape("audit", _AUDIT_FIELDS)
AUDIT_TABLE = shape("audit_table", _AUDIT_FIELDS + "summary text")
TABLE_COLUMNS = ["at", "actor", "actor_role:role", "kind", "action", "object_label:object",
                 "object_id", "summary:changes"]  # fmt: skip
VALUE_CHARS = 60  # a value longer than this is cut in the table (the JSON has it whole)

AuditKind = StrEnum("AuditKind", {kind: kind for kind in AUDIT_KINDS})  # type: ignore[misc]


def audit(
    since: str | None = typer.Option(
        None, help="Only changes since: a time (ISO 8601, UTC) or a duration (15m, 7d)."
    ),
    kind: AuditKind | None = typer.Option(None, help="Only this kind of object."),
    object: str | None = typer.Option(
        None, "--object", help="Only this object: its id, or its key or name as it was then."
    ),
    limit: int = typer.Option(
        DEFAULT_AUDIT_LIMIT, min=1, max=AUDIT_PAGE_MOST, help="At most this many (a page)."
    ),
    cursor: str | None = typer.Option(None, help="The next page: the cursor the last one gave."),
    output: Output = output_option(),
    as_json: bool = typer.Option(False, "--json", help="The same as --output json."),
) -> None:
    """Who created, changed or deleted your tools, credentials (metadata only), assignments,
    agents and tokens, newest first, a page at a time (the next page's --cursor goes to
    stderr, or next_cursor in --output json)."""
    try:
        after = parse_since(since) if since is not None else None
        rows, next_cursor = audit_page(
            registry(),
            limit,
            cursor=cursor,
            since=after,
            kind=kind.value if kind is not None else None,
            object=object,
        )
    except ToolrelayError as exc:
        raise fail(exc) from None
    if as_json:
        output = Output.json
    if output is Output.table:
        rows = [{**row, "summary": summarize(row["action"], row["changes"])} for row in rows]
        listing(AUDIT_TABLE, rows, TABLE_COLUMNS, output, paged=True, next_cursor=next_cursor)
    else:
        listing(AUDIT, rows, [], output, paged=True, next_cursor=next_cursor)


def summarize(action: str, changes: Mapping[str, Any]) -> str:
    """One line for people: ``column: old → new`` for an update, ``column=value`` for what an
    insert set or a delete removed (but nulls and created_at); columns in name order, long
    values cut. The JSON has every value whole."""
    parts = []
    for column in sorted(changes):
        change = changes[column]
        if action == "update":
            parts.append(f"{column}: {_short(change.get('old'))} → {_short(change.get('new'))}")
            continue
        value = change.get("new", change.get("old"))
        if value is not None and column != "created_at":
            parts.append(f"{column}={_short(value)}")
    return "; ".join(parts)


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= VALUE_CHARS else text[: VALUE_CHARS - 1] + "…"

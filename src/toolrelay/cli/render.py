"""How every CLI command shows what it lists or shows: tables for people, JSON for scripts.

The one place the CLI's output is decided (docs/cli.md is its contract):

* A *shape* names the fields a command outputs, with their types. It is an allow-list: a
  column that is not named (a ciphertext, a token hash) never reaches the output. The field
  names are the HTTP API's (``toolrelay.api.schemas``), so both doors give the same JSON.
* ``--output table`` never cuts or wraps an id, at any width, piped or not. Piped, each row
  is one line at its natural width. On a terminal, free-text columns (and times, at their
  space) wrap to make the table fit; when even that cannot fit, each row becomes a block of
  ``field  value`` lines (psql's expanded display), and lines longer than the terminal are
  left long rather than cut.
* ``--output json`` prints one document (``{"items": [...]}`` for a list), ``--output jsonl``
  one object per line; ids are strings, times ISO 8601 in UTC.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from enum import StrEnum
from pathlib import PurePath
from typing import Any
from uuid import UUID

import typer
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from toolrelay.cli.context import console, err_console


class Output(StrEnum):
    table = "table"
    json = "json"
    jsonl = "jsonl"


def output_option(default: Output = Output.table) -> Any:
    """The ``--output`` / ``-o`` option every list and show command takes."""
    return typer.Option(
        default,
        "--output",
        "-o",
        case_sensitive=False,
        help="table, json or jsonl (the fields: docs/cli.md).",
    )


# --- shapes --------------------------------------------------------------------------------

# The types a field may have, as docs/cli.md names them. "text" is a string that may wrap in
# a table (free text); every other string (a key, a name, a status) never wraps.
TYPES = frozenset(
    {"uuid", "string", "text", "integer", "number", "boolean", "time", "object", "any", "bytes"}
)
_NEVER_WRAP = frozenset({"uuid", "string", "integer", "number", "boolean", "bytes"})


@dataclass(frozen=True)
class Field:
    name: str
    type: str  # one of TYPES, "string[]", or a nested shape's name followed by "[]"
    nullable: bool = False
    items: Shape | None = None  # the shape of each element of a list of objects

    @property
    def doc_type(self) -> str:
        """The type as docs/cli.md writes it."""
        base = {"text": "string", "bytes": "integer"}.get(self.type, self.type)
        if base.endswith("[]"):
            base = f"array of {base[:-2]}"
        return f"{base} or null" if self.nullable else base


@dataclass(frozen=True)
class Shape:
    name: str
    fields: tuple[Field, ...]

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"shape {self.name} has no field {name!r}")


def shape(name: str, spec: str, *nested: Shape) -> Shape:
    """A shape from lines of ``field type`` (``type?`` when it may be null)."""
    by_name = {s.name: s for s in nested}
    fields = []
    for line in spec.strip().splitlines():
        field_name, kind = line.split()
        nullable = kind.endswith("?")
        kind = kind.removesuffix("?")
        items = by_name[kind[:-2]] if kind.endswith("[]") and kind != "string[]" else None
        if kind not in TYPES and kind != "string[]" and items is None:
            raise ValueError(f"shape {name}: field {field_name} has an unknown type {kind}")
        fields.append(Field(field_name, kind, nullable, items))
    return Shape(name, tuple(fields))


TOOL = shape(
    "tool",
    """
    id uuid
    key string
    name text
    description text?
    category string
    status string
    schema_input object
    schema_output object
    auth_method string
    requires_approval boolean
    is_dangerous boolean
    egress_class string
    endpoint_url text?
    http_method string
    request_template object
    auth_placement string
    auth_param_name string
    auth_param_prefix string
    credential_ref uuid?
    response_pointer string?
    connect_timeout_seconds number
    timeout_seconds number
    max_response_bytes integer
    max_attempts integer
    max_concurrency integer?
    idempotency_header string?
    approval_ttl_seconds integer
    approvals_required integer?
    created_at time
    updated_at time
    """,
)

AGENT = shape(
    "agent",
    """
    id uuid
    name string
    status string
    created_at time
    """,
)

CREDENTIAL = shape(
    "credential",
    """
    id uuid
    name string
    kind string
    allowed_hosts string[]
    status string
    created_at time
    rotated_at time?
    last_used_at time?
    expires_at time?
    reconnect string?
    """,
)

TOKEN = shape(
    "token",
    """
    id uuid
    kind string
    agent_id uuid?
    agent_name string?
    member_id uuid?
    name string?
    created_at time
    last_used_at time?
    expires_at time?
    revoked_at time?
    """,
)

MEMBER = shape(
    "member",
    """
    id uuid
    name string
    email string?
    role string
    created_at time
    removed_at time?
    """,
)

KEY_STATUS = shape(
    "key_status",
    """
    key_id string
    configured boolean
    newest boolean
    credentials integer
    webhook_secrets integer
    opens boolean?
    """,
)

POLICY = shape(
    "policy",
    """
    id uuid
    tool_id uuid
    tool_key string
    name string
    action string
    input_schema object
    created_at time
    current boolean
    confirmations integer
    confirmations_needed integer
    in_force boolean
    """,
)

_INVOCATION_FIELDS = """
    id uuid
    tool_id uuid?
    tool_key string?
    agent_id uuid?
    agent_name string?
    run_id uuid?
    input object
    output any?
    status string
    approval_status string
    approval_expires_at time?
    decided_at time?
    reject_reason text?
    error text?
    error_code string?
    http_status integer?
    output_mismatch text?
    request_digest string?
    attempt integer
    created_at time
    updated_at time
    finished_at time?
    retry_of uuid?
    reason text?
"""

INVOCATION = shape("invocation", _INVOCATION_FIELDS)

ATTEMPT = shape(
    "attempt",
    """
    attempt integer
    started_at time
    finished_at time?
    status_code integer?
    duration_ms number?
    error_code string?
    error text?
    request_method string?
    request_url text?
    request_headers object?
    request_body_bytes integer?
    request_body_sha256 string?
    """,
)

INVOCATION_DETAIL = shape(
    "invocation_detail",
    _INVOCATION_FIELDS + "attempts attempt[]\nretried_by uuid?\ndecided_by uuid?\n"
    "decided_by_policy uuid?\napprovals any\napprovals_needed integer?",
    ATTEMPT,
)

OWNER = shape(
    "owner",
    """
    owner uuid
    tools integer
    agents integer
    credentials integer
    """,
)

DB_STATUS = shape(
    "db_status",
    """
    kind string
    running boolean
    url string?
    data_dir string?
    version string?
    size_bytes bytes?
    pid integer?
    started_at time?
    error text?
    """,
)

SHAPES = (TOOL, AGENT, CREDENTIAL, TOKEN, MEMBER, POLICY, INVOCATION, INVOCATION_DETAIL, ATTEMPT,
          OWNER, DB_STATUS)  # fmt: skip


# --- values --------------------------------------------------------------------------------


def _get(row: Any, name: str) -> Any:
    return row[name] if isinstance(row, Mapping) else getattr(row, name)


def iso_utc(value: datetime) -> str:
    """ISO 8601 in UTC with microseconds: 2026-12-01T09:16:17.288861Z."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _plain(value: Any) -> Any:
    """A value as JSON has it: ids and paths as strings, times ISO 8601 UTC."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime):
        return iso_utc(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, UUID | PurePath):
        return str(value)
    return str(value)


def record(s: Shape, row: Any) -> dict[str, Any]:
    """The JSON object ``row`` (a mapping or an object with attributes) shows as: exactly the
    shape's fields, in its order."""
    out: dict[str, Any] = {}
    for f in s.fields:
        value = _get(row, f.name)
        if f.items is not None and value is not None:
            out[f.name] = [record(f.items, item) for item in value]
        else:
            out[f.name] = _plain(value)
    return out


def _clean(text: str) -> str:
    """One line with nothing a terminal would act on (controls, bidi overrides)."""
    out = []
    for ch in text:
        if ch in "\t\n\r" or unicodedata.category(ch) in ("Zl", "Zp"):
            out.append(" ")
        elif unicodedata.category(ch) in ("Cc", "Cf"):
            out.append("\N{REPLACEMENT CHARACTER}")
        else:
            out.append(ch)
    return "".join(out)


# What a terminal acts on or reorders: controls (DEL and C1, which JSON leaves raw: U+009B is
# CSI, U+009D OSC), bidi and other format characters, line and paragraph separators.
_ACTS_ON_A_TERMINAL = frozenset({"Cc", "Cf", "Zl", "Zp"})


def _json(value: Any, **options: Any) -> str:
    """JSON as ``--output json|jsonl`` prints it: text as it is, but what a terminal would act
    on as a ``\\uXXXX`` escape (an agent's input and reason reach ``invocations show``): the
    same JSON values for a script, nothing that drives the terminal of a person reading."""
    return _NOT_PRINTABLE_ASCII.sub(_escaped, json.dumps(value, ensure_ascii=False, **options))


_NOT_PRINTABLE_ASCII = re.compile("[^\x00-\x7e]")  # JSON has escaped \x00-\x1f already


def _escaped(match: re.Match[str]) -> str:
    ch = match[0]
    return json.dumps(ch)[1:-1] if unicodedata.category(ch) in _ACTS_ON_A_TERMINAL else ch


def _size(n: int) -> str:
    """Bytes for people, in powers of 1000: 950 B, 47.6 MB."""
    if n < 1000:
        return f"{n} B"
    value, unit = n / 1000, "kB"
    for bigger in ("MB", "GB", "TB"):
        if value < 1000:
            break
        value, unit = value / 1000, bigger
    return f"{value:.1f} {unit}"


def cell(f: Field, value: Any) -> str:
    """What a table shows for one value (times in UTC, to the second)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        utc = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        return f"{utc:%Y-%m-%d %H:%M:%S}"
    if f.type == "bytes" and isinstance(value, int):
        return _size(value)
    if f.type == "string[]":
        return ", ".join(_clean(str(v)) for v in value) or "-"
    if isinstance(value, Mapping | list | tuple):
        return _clean(json.dumps(_plain(value), ensure_ascii=False))
    if isinstance(value, float):
        return f"{value:g}"
    text = _clean(str(value))
    return text if text else '""'


# --- output --------------------------------------------------------------------------------


def listing(
    s: Shape,
    rows: Iterable[Any],
    columns: Sequence[str],
    output: Output,
    *,
    paged: bool = False,
    next_cursor: str | None = None,
) -> None:
    """Print a list. ``columns`` are the table's, each ``field`` or ``field:header``; JSON
    always carries every field. A paged list (``paged``) adds ``next_cursor`` to the JSON
    document, and for table and jsonl says on stderr how to get the next page."""
    rows = list(rows)
    if output is Output.table:
        _table(s, rows, columns)
    elif output is Output.jsonl:
        for row in rows:
            typer.echo(_line(record(s, row)))
    else:
        doc: dict[str, Any] = {"items": [record(s, row) for row in rows]}
        if paged:
            doc["next_cursor"] = next_cursor
        typer.echo(_json(doc, indent=2))
    if paged and next_cursor is not None and output is not Output.json:
        err_console.print(  # never wrapped: the cursor is copied
            f"next page: --cursor {next_cursor}", markup=False, highlight=False, soft_wrap=True
        )


def detail(s: Shape, row: Any, output: Output) -> None:
    """Print one object: JSON, or a ``field  value`` table (lists of objects follow it, each
    as a table of its own)."""
    if output is Output.json:
        typer.echo(_json(record(s, row), indent=2))
        return
    if output is Output.jsonl:
        typer.echo(_line(record(s, row)))
        return
    flat = [f for f in s.fields if f.items is None]
    _vertical([[(f, _get(row, f.name)) for f in flat]])
    for f in s.fields:
        if f.items is not None:
            items = _get(row, f.name) or []
            typer.echo(f"\n{f.name}:" if items else f"\n{f.name}: none")
            if items:
                _table(f.items, items, [g.name for g in f.items.fields])


def _line(obj: dict[str, Any]) -> str:
    return _json(obj, separators=(",", ":"))


GAP = 2  # spaces between columns
TEXT_MIN = 20  # the narrowest a free-text column is wrapped to (else: one block per row)


@dataclass(frozen=True)
class _Column:
    field: Field
    header: str
    cells: list[str]

    @property
    def wraps(self) -> bool:
        return self.field.type not in _NEVER_WRAP

    @property
    def natural(self) -> int:
        return max(cell_len(t) for t in [self.header, *self.cells])

    @property
    def minimum(self) -> int:
        """The narrowest the column can be without cutting a word; ids never wrap."""
        if not self.wraps:
            return self.natural
        words = [cell_len(w) for t in [self.header, *self.cells] for w in t.split()] or [1]
        if self.field.type == "time":
            return max(words)
        return min(self.natural, max([TEXT_MIN, *(cell_len(w) for w in self.header.split())]))


def _table(s: Shape, rows: list[Any], columns: Sequence[str]) -> None:
    cols = []
    for spec in columns:
        name, _, header = spec.partition(":")
        f = s.field(name)
        cols.append(_Column(f, header or name, [cell(f, _get(row, name)) for row in rows]))
    natural = [c.natural for c in cols]
    headers = [c.header for c in cols]
    lines = [[c.cells[i] for c in cols] for i in range(len(rows))]
    if not console.is_terminal:
        _plain_lines(headers, lines, natural)
        return
    widths = _fit(natural, [c.minimum for c in cols], console.width - GAP * (len(cols) - 1))
    if widths is None:  # one block per row (none for no rows)
        _vertical([[(c.field, _get(row, c.field.name)) for c in cols] for row in rows], headers)
        return
    out = Table(box=None, padding=(0, GAP // 2), pad_edge=False, header_style="bold")
    for c, width in zip(cols, widths, strict=True):
        out.add_column(c.header, width=width, no_wrap=not c.wraps, overflow="fold")
    for i in range(len(rows)):
        out.add_row(*(Text(c.cells[i]) for c in cols))
    console.print(out)


def _fit(natural: list[int], minimum: list[int], available: int) -> list[int] | None:
    """Column widths that fit ``available``: the natural ones, else the wrapping columns
    lowered to a common ceiling (never below their minimum); None when nothing fits."""
    if sum(natural) <= available:
        return natural
    if sum(minimum) > available:
        return None
    lo, hi = 0, max(natural)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(max(m, min(n, mid)) for n, m in zip(natural, minimum, strict=True)) <= available:
            lo = mid
        else:
            hi = mid - 1
    return [max(m, min(n, lo)) for n, m in zip(natural, minimum, strict=True)]


def _plain_lines(headers: list[str], rows: list[list[str]], widths: list[int]) -> None:
    for line in [headers, *rows]:
        padded = [t + " " * (w - cell_len(t)) for t, w in zip(line, widths, strict=True)]
        typer.echo((" " * GAP).join(padded).rstrip())


def _vertical(records: list[list[tuple[Field, Any]]], labels: list[str] | None = None) -> None:
    """Each record as ``label  value`` lines, records apart by a blank line."""
    if not records:
        return
    labels = labels or [f.name for f, _ in records[0]]
    label_width = max(cell_len(label) for label in labels)
    texts = [[cell(f, value) for f, value in rec] for rec in records]
    columns = [_Column(records[0][i][0], "", [t[i] for t in texts]) for i in range(len(labels))]
    natural = max(c.natural for c in columns)
    minimum = max(c.minimum for c in columns)
    available = console.width - label_width - GAP
    if not console.is_terminal or minimum > available:
        for n, rec in enumerate(texts):
            if n:
                typer.echo("")
            for label, text in zip(labels, rec, strict=True):
                typer.echo(f"{label}{' ' * (label_width - cell_len(label) + GAP)}{text}".rstrip())
        return
    width = min(natural, available)
    for n, rec in enumerate(texts):
        grid = Table.grid(padding=(0, GAP // 2), collapse_padding=False, pad_edge=False)
        grid.add_column(width=label_width, no_wrap=True, style="bold")
        grid.add_column(width=width, overflow="fold")
        for label, text, c in zip(labels, rec, columns, strict=True):
            grid.add_row(Text(label), Text(text, no_wrap=not c.wraps, overflow="fold"))
        if n:
            console.print()
        console.print(grid)


def registered(row: Mapping[str, Any], label: str) -> str:
    """A tool file's or a document's line for one tool (``Registry.register_tools``' row):
    ``created LABEL``, ``updated LABEL: the, changed, fields`` or ``unchanged LABEL``."""
    changed = f": {', '.join(row['changed'])}" if row["change"] == "updated" else ""
    return f"{row['change']} {label}{changed}"

"""Read back what a run left: the database's invocations and attempts, and the worker logs."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from toolrelay.chaos.checks import AttemptRow, InvocationRow

_INVOCATIONS = """
SELECT i.id::text AS id, t.key AS tool, t.http_method AS method, t.idempotency_header,
       t.max_attempts, agents.tool_is_gated(t) AS gated, i.status, i.approval_status,
       i.decided_by IS NOT NULL AS decided, i.error_code, i.http_status, i.attempt,
       i.approval_returns, i.output,
       i.input, extract(epoch FROM i.created_at)::float8 AS created_at,
       extract(epoch FROM i.decided_at)::float8 AS decided_at, i.request_digest
  FROM agents.tool_invocations i JOIN agents.tools_registry t ON t.id = i.tool_id
 ORDER BY i.created_at, i.id
"""
# Whether each logged configuration was gated, by the database's own definition.
_GATING = """
SELECT agents.tool_is_gated(jsonb_populate_record(NULL::agents.tools_registry, v.row)) AS gated
  FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS v(row, n)
 ORDER BY v.n
"""
_ATTEMPTS = """
SELECT id, invocation_id::text AS invocation_id, attempt, worker, status_code, error_code
  FROM agents.tool_invocation_attempts ORDER BY id
"""


def read_database(url: str) -> tuple[list[InvocationRow], list[AttemptRow]]:
    """Everything, as the connecting (admin) user: row-level security does not hide rows."""
    with psycopg.connect(url, row_factory=dict_row) as conn:
        invocations = [InvocationRow(**row) for row in conn.execute(_INVOCATIONS).fetchall()]
        attempts = [AttemptRow(**row) for row in conn.execute(_ATTEMPTS).fetchall()]
    return invocations, attempts


def read_gating(url: str, rows: Sequence[Mapping[str, Any]]) -> list[bool]:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        found = conn.execute(_GATING, (json.dumps(list(rows), default=str),)).fetchall()
    return [bool(row["gated"]) for row in found]


@dataclass
class LogSummary:
    files: int = 0
    lines: int = 0
    dispatch: int = 0
    not_recorded: int = 0  # results a worker could not record (lease taken over, database gone)
    outcomes: Counter[str] = field(default_factory=Counter)
    events: Counter[str] = field(default_factory=Counter)  # action of other JSON lines
    tracebacks: Counter[str] = field(default_factory=Counter)  # last line of each
    other_lines: int = 0

    @property
    def stale_discarded(self) -> int:
        """Results refused because another worker had taken the lease over (fencing)."""
        return max(0, self.not_recorded - self.events["record_failed"])

    def as_dict(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "lines": self.lines,
            "dispatch_lines": self.dispatch,
            "not_recorded": self.not_recorded,
            "stale_results_discarded": self.stale_discarded,
            "outcomes": dict(self.outcomes),
            "events": dict(self.events),
            "tracebacks": dict(self.tracebacks),
            "other_lines": self.other_lines,
        }


def read_logs(log_dir: Path) -> tuple[LogSummary, dict[str, str]]:
    """A summary of the worker logs, and their text (to scan for secrets)."""
    summary = LogSummary()
    texts: dict[str, str] = {}
    for path in sorted(log_dir.glob("*.log")):
        text = path.read_text("utf-8", errors="replace")
        texts[f"log {path.name}"] = text
        summary.files += 1
        _summarise(text, summary)
    return summary, texts


def _summarise(text: str, summary: LogSummary) -> None:
    in_traceback = False
    last = ""
    for line in text.splitlines():
        summary.lines += 1
        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        if not isinstance(entry, dict):
            if line.startswith("Traceback"):
                in_traceback = True
            elif in_traceback and line and not line.startswith((" ", "\t")):
                summary.tracebacks[line[:160]] += 1
                in_traceback = False
            last = line
            summary.other_lines += 1
            continue
        if in_traceback:
            summary.tracebacks[last[:160]] += 1
            in_traceback = False
        action = entry.get("action")
        if action == "dispatch":
            summary.dispatch += 1
            summary.outcomes[f"{entry.get('outcome')}/{entry.get('error_code')}"] += 1
            if entry.get("recorded") is False:
                summary.not_recorded += 1
        else:
            summary.events[str(action or entry.get("level", "?"))] += 1

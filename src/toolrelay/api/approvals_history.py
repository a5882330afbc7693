"""The approvals page's history and one call's detail (issue 16, item 6; docs/api.md, "The
approvals page"): every decided and finished call, newest first, a page at a time, filtered
by tool, agent, status and who decided; and for one call its input, the request it sends or
sent, every attempt, and who decided it and why. Read-only, for any signed-in member; the
same session, rendering and escaping as the page itself (approvals.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import urlencode
from uuid import UUID

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from toolrelay.api.approvals import Ctx, _ago, _csrf, _html, _session
from toolrelay.errors import InvalidArgument, NotFound, ToolrelayError
from toolrelay.registry.fields import INVOCATION_STATUSES
from toolrelay.registry.members import Members
from toolrelay.registry.pages import decode_cursor, encode_cursor
from toolrelay.registry.policies import Policies
from toolrelay.registry.preview import preview_request

router = APIRouter(include_in_schema=False)

PAGE: Final = 25  # calls a history page shows
FILTERS: Final = ("tool", "agent", "status", "decided_by")


def _names(context: Any, caller: Any) -> dict[UUID, str]:
    """Who may have decided: members by name (the tenant itself as 'owner'), rules by theirs."""
    names = {m.id: m.name for m in Members(context.db).list(caller, include_removed=True)}
    names.setdefault(caller.owner, "owner")
    names |= {p.id: f"policy {p.name}" for p in Policies(context.db).list(caller)}
    return names


@router.get("/approvals/history")
def history(request: Request, context: Ctx) -> Response:
    caller = _session(request, context)
    if caller is None:
        return RedirectResponse("/approvals", status_code=303)
    chosen = {k: request.query_params.get(k) or None for k in FILTERS}
    error = None
    rows: list[Any] = []
    more = None
    try:
        if chosen["status"] is not None and chosen["status"] not in INVOCATION_STATUSES:
            raise InvalidArgument(f"status must be one of {', '.join(INVOCATION_STATUSES)}")
        decided_by = UUID(chosen["decided_by"]) if chosen["decided_by"] else None
        cursor = request.query_params.get("cursor")
        rows = context.registry(caller).list_invocations(
            chosen["status"], PAGE + 1, tool=chosen["tool"], agent=chosen["agent"],
            before=decode_cursor(cursor) if cursor else None, settled=True,
            decided_by=decided_by,
        )  # fmt: skip
        if len(rows) > PAGE:
            rows = rows[:PAGE]
            more = "?" + urlencode(
                {k: v for k, v in chosen.items() if v} | {"cursor": encode_cursor(rows[-1])}
            )
    except ValueError:
        error = "decided_by must be the id of a member or a policy"
    except ToolrelayError as exc:
        error = exc.message
    names = _names(context, caller)
    now = datetime.now(UTC)
    items = [
        {"row": row, "age": _ago(row["created_at"], now),
         "decider": names.get(row["decided_by_policy"] or row["decided_by"])}
        for row in rows
    ]  # fmt: skip
    return _html(
        "history.html", 400 if error else 200, items=items, chosen=chosen, more=more,
        error=error, statuses=[s for s in INVOCATION_STATUSES if s != "pending"],
        deciders=sorted(names.items(), key=lambda kv: kv[1]), csrf=_csrf(context, request),
    )  # fmt: skip


@router.get("/approvals/calls/{invocation_id}")
def detail(invocation_id: UUID, request: Request, context: Ctx) -> Response:
    caller = _session(request, context)
    if caller is None:
        return RedirectResponse("/approvals", status_code=303)
    registry = context.registry(caller)
    try:
        row = registry.get_invocation(invocation_id)
    except NotFound:
        return _html("detail.html", 404, row=None, csrf=_csrf(context, request))
    pending = registry.review_one(invocation_id) if row["status"] == "pending" else None
    preview = preview_request(pending) if pending is not None else None  # as its card shows
    names = _names(context, caller)
    approvals = [
        {
            "who": names.get(UUID(str(a["member_id"])), str(a["member_id"])),
            "at": a["approved_at"],
            "counts": a.get("counts", True),
        }
        for a in row.get("approvals") or []
    ]
    return _html(
        "detail.html", row=row, preview=preview, approvals=approvals, csrf=_csrf(context, request),
        decider=names.get(row["decided_by_policy"] or row["decided_by"]),
    )  # fmt: skip

"""What a delivery's body is, per format.

The outbox row holds the event as the database wrote it (``agents.webhook_payload``: type,
timestamp, data); the link to the call on the approvals page is added here, from
``TOOLRELAY_PUBLIC_URL``, so that a changed public address applies to what is still to be
sent. ``standard`` sends that object; ``slack`` a Slack-compatible incoming-webhook body,
``{"text": ...}`` with the link in Slack's ``<url|label>`` form.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from toolrelay.errors import ConfigurationError

PUBLIC_URL_ENV = "TOOLRELAY_PUBLIC_URL"
APPROVALS_PATH = "/approvals"

_VERBS = {
    "invocation.pending": "is waiting for approval",
    "invocation.approved": "was approved",
    "invocation.rejected": "was rejected",
    "invocation.completed": "completed",
    "invocation.failed": "failed",
    "invocation.expired": "expired without a decision",
}


def public_url(environ: Mapping[str, str] | None = None) -> str | None:
    """TOOLRELAY_PUBLIC_URL without a trailing slash; None when unset."""
    raw = (os.environ if environ is None else environ).get(PUBLIC_URL_ENV, "").strip()
    if not raw:
        return None
    if not raw.startswith(("http://", "https://")) or any(c in raw for c in "?# "):
        raise ConfigurationError(
            f"{PUBLIC_URL_ENV}={raw!r}: must be an http(s) URL without query or fragment,"
            " e.g. https://toolrelay.example.com"
        )
    return raw.rstrip("/")


def link(base: str | None, invocation_id: str) -> str | None:
    """The call on the approvals page (its fragment names the call)."""
    return None if base is None else f"{base}{APPROVALS_PATH}#invocation-{invocation_id}"


def event_body(event: Mapping[str, Any], base: str | None) -> dict[str, Any]:
    """The Standard Webhooks body: the stored event with ``data.link``."""
    data = dict(event["data"])
    data["link"] = link(base, str(data["invocation_id"]))
    return {"type": event["type"], "timestamp": event["timestamp"], "data": data}


def slack_body(event: Mapping[str, Any], base: str | None) -> dict[str, Any]:
    data = event["data"]
    where = link(base, str(data["invocation_id"]))
    what = f"`{_escape(str(data.get('tool_key') or 'a deleted tool'))}`"
    who = _escape(str(data.get("agent_name") or "a deleted agent"))
    text = f"Call of {what} by {who} {_VERBS.get(event['type'], event['type'])}"
    if data.get("error_code"):
        text += f" ({_escape(str(data['error_code']))})"
    text += f"; invocation {data['invocation_id']}"
    if where is not None:
        text += f". <{where}|Open it on the approvals page>"
    return {"text": text}


def render(fmt: str, event: Mapping[str, Any], base: str | None) -> bytes:
    """The exact bytes sent (and signed)."""
    body = slack_body(event, base) if fmt == "slack" else event_body(event, base)
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def _escape(text: str) -> str:
    """Slack's three control characters in message text."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

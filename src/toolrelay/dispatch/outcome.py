"""What one attempt came to, and how that is recorded."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

REDACTED = "[redacted]"
ERROR_BODY_CHARS = 500  # a trimmed body in an error message


@dataclass
class Outcome:
    """The decision for one claimed invocation.

    ``status`` is terminal (completed, failed, expired) or ``running`` for a retry after
    ``retry_in`` seconds. ``clear_sent`` marks a retry whose request provably never left.
    """

    status: str
    output: Any = None
    error: str | None = None
    error_code: str | None = None
    http_status: int | None = None
    output_mismatch: str | None = None
    retry_in: float = 0.0
    clear_sent: bool = False

    @classmethod
    def failed(cls, code: str, message: str, http_status: int | None = None) -> Outcome:
        return cls("failed", error=message, error_code=code, http_status=http_status)

    @classmethod
    def retry(
        cls,
        delay: float,
        code: str,
        message: str,
        *,
        never_left: bool,
        http_status: int | None = None,
    ) -> Outcome:
        return cls(
            "running",
            error=message,
            error_code=code,
            retry_in=delay,
            clear_sent=never_left,
            http_status=http_status,
        )


def scrub(value: Any, secrets: Iterable[str]) -> Any:
    """Replace every known secret inside strings of a JSON value."""
    known = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)
    if not known:
        return value
    return _scrub(value, known)


def _scrub(value: Any, known: list[str]) -> Any:
    if isinstance(value, str):
        for secret in known:
            value = value.replace(secret, REDACTED)
        return value
    if isinstance(value, list):
        return [_scrub(v, known) for v in value]
    if isinstance(value, dict):
        return {_scrub(k, known): _scrub(v, known) for k, v in value.items()}
    return value


def trim(text: str, limit: int = ERROR_BODY_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"

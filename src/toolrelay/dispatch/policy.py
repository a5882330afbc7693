"""Retry policy: which failures may be retried, and when."""

from __future__ import annotations

import random

from toolrelay.dispatch.http import Response

BACKOFF_BASE = 0.2  # seconds
BACKOFF_CAP = 30.0  # seconds
RETRY_AFTER_CAP = 300.0  # seconds; a longer Retry-After fails instead of holding a row
RETRYABLE_READ_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
IDEMPOTENT_METHODS = frozenset({"GET", "PUT", "DELETE"})


def is_idempotent(method: str, idempotency_header: str | None) -> bool:
    """May this request be sent again? Writes only with a declared idempotency key."""
    return method in IDEMPOTENT_METHODS or bool(idempotency_header)


def backoff(attempt: int) -> float:
    """Exponential backoff with full jitter."""
    return random.uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * 2 ** max(attempt - 1, 0)))


def retry_after(response: Response) -> float | None:
    """Seconds from a Retry-After header (delta-seconds form), if present and sane."""
    seconds = _retry_after_seconds(response)
    return seconds if seconds is not None and 0 <= seconds <= RETRY_AFTER_CAP else None


def waits_too_long(response: Response) -> float | None:
    """The Retry-After asked for, when it is longer than RETRY_AFTER_CAP: such a call fails.
    Retrying it after the backoff instead would spend every attempt at once on an upstream
    that asked for a pause (a rate limit that may block the owner's key)."""
    seconds = _retry_after_seconds(response)
    return seconds if seconds is not None and seconds > RETRY_AFTER_CAP else None


def _retry_after_seconds(response: Response) -> float | None:
    value = response.headers.get("Retry-After") or response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value.strip())  # nan and a negative number are not "longer"
    except ValueError:
        return None


def refused_unprocessed(response: Response) -> bool:
    """429, or 503 with Retry-After: the server says it did not process the request."""
    return response.status == 429 or (response.status == 503 and retry_after(response) is not None)

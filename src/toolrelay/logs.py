"""Structured JSON logs: every record carries ``action`` and the ids it concerns.

``configure`` gives one JSON-lines handler (stderr) to our loggers and to those of the
libraries we run under: uvicorn (``uvicorn``, ``uvicorn.error``, ``uvicorn.access``) and
psycopg (``psycopg``, ``psycopg.pool``). uvicorn must then be started with
``log_config=None`` so that it keeps these handlers.

The access log: uvicorn's own access line carries the query string and no duration, so it
is dropped; the app's ``AccessLog`` middleware (toolrelay.api.operations) writes one line per
request to ``uvicorn.access`` instead — method, path without the query string, status and
duration. uvicorn's ``access_log=False`` still silences it (it empties that logger).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
_DROPPED = {"color_message"}  # uvicorn's ANSI-coloured copy of the message

ACCESS_LOGGER = "uvicorn.access"
ACCESS_ACTION = "http_request"  # the action of the app's access lines; uvicorn's have none
LIBRARY_LOGGERS = ("uvicorn", "psycopg")


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry |= {
            k: v for k, v in record.__dict__.items() if k not in _STANDARD and k not in _DROPPED
        }
        if record.exc_info and record.levelno >= logging.ERROR:
            entry["exception"] = self.formatException(record.exc_info).splitlines()[-1]
        return json.dumps(entry, default=str)


class _AppAccessLinesOnly(logging.Filter):
    """On ``uvicorn.access``: keep the app's access lines, drop uvicorn's (query strings)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return getattr(record, "action", None) == ACCESS_ACTION


def _library_level(name: str, level: int) -> int:
    # psycopg.pool logs every connection handed out at INFO: only warnings unless debugging.
    if name == "psycopg" and level > logging.DEBUG:
        return max(level, logging.WARNING)
    return level


def configure(level: str = "INFO", stream: TextIO | None = None) -> None:
    """JSON lines on stderr (or ``stream``) for toolrelay, uvicorn and psycopg at ``level``
    (psycopg: WARNING and up unless DEBUG). Safe to call again: handlers are replaced."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r} (DEBUG, INFO, WARNING or ERROR)")
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JSONFormatter())
    for name in ("toolrelay", *LIBRARY_LOGGERS):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(_library_level(name, numeric))
        logger.propagate = False
    # Children that uvicorn's own configuration would give handlers: through "uvicorn".
    error = logging.getLogger("uvicorn.error")
    error.handlers[:] = []
    error.setLevel(logging.NOTSET)
    error.propagate = True
    access = logging.getLogger(ACCESS_LOGGER)
    access.handlers[:] = [handler]
    access.setLevel(numeric)
    access.propagate = False
    for old in [f for f in access.filters if isinstance(f, _AppAccessLinesOnly)]:
        access.removeFilter(old)
    access.addFilter(_AppAccessLinesOnly())

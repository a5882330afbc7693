"""Retention: keep invocation history bounded without touching anything runnable.

``--older-than`` is read here, not by PostgreSQL: its interval input takes ``90`` for 90
seconds, ``6m`` for six minutes and ``-30d`` or ``3 days ago`` for a moment in the future,
and each of those, typed by an operator who meant days or months, deleted nearly every
tenant's finished history. A duration here is one or more positive numbers, each with a
unit; ``m`` alone is refused as ambiguous.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Final

import psycopg

from toolrelay.db import Database, translate_db_error
from toolrelay.db.queries import load
from toolrelay.errors import InvalidArgument

PRUNE_BATCH = 10_000  # rows per statement: short transactions, no long locks

# Each unit as written -> PostgreSQL's word for it, and its length in seconds (a month 30
# days, a year 365: only to check the total is neither zero nor absurd).
_UNITS: Final = {
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), ("seconds", 1)),
    **dict.fromkeys(("min", "mins", "minute", "minutes"), ("minutes", 60)),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), ("hours", 3_600)),
    **dict.fromkeys(("d", "day", "days"), ("days", 86_400)),
    **dict.fromkeys(("w", "wk", "wks", "week", "weeks"), ("weeks", 604_800)),
    **dict.fromkeys(("mon", "mons", "month", "months"), ("months", 2_592_000)),
    **dict.fromkeys(("y", "yr", "yrs", "year", "years"), ("years", 31_536_000)),
}
_PART: Final = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)")
_MAX_SECONDS: Final = 1_000 * 31_536_000  # a thousand years: anything longer is a typo
_FORMS: Final = "like 30d, 12h, 90 days, 6mon or '1 year 6 months'"


@dataclass(frozen=True)
class Pruned:
    count: int  # finished invocations deleted (or, dry_run, that would be)
    cutoff: datetime  # those that finished before this
    dry_run: bool = False


def retention_interval(text: str) -> str:
    """``--older-than`` as PostgreSQL interval text (``"30d"`` -> ``"30 days"``); an
    InvalidArgument naming the problem for anything that is not a positive duration whose
    every number has a unit."""
    words = text.strip().lower()
    parts, position, seconds = [], 0, 0.0
    while position < len(words):
        found = _PART.match(words, position)
        if found is None:
            stray = re.match(r"[a-z]+", words[position:])
            where = f"has {stray.group()!r} where a number was expected: " if stray else ""
            raise _refused(text, f"{where}must be a positive duration {_FORMS}")
        number, unit = found.groups()
        if not unit:
            raise _refused(text, f"{number} has no unit: write {number}d for days, "
                                 f"{number}h for hours ({_FORMS})")  # fmt: skip
        if unit == "m":
            raise _refused(text, f"{number}m is ambiguous: write {number}min for minutes or "
                                 f"{number}mon for months")  # fmt: skip
        if unit not in _UNITS:
            raise _refused(text, f"{unit!r} is not a unit of time ({_FORMS})")
        name, length = _UNITS[unit]
        parts.append(f"{number} {name}")
        seconds += float(number) * length
        position = found.end()
        while position < len(words) and words[position] == " ":
            position += 1
    if not parts:
        raise _refused(text, f"must be a positive duration {_FORMS}")
    if seconds <= 0:
        raise _refused(text, "must be longer than zero: every finished invocation would go")
    if seconds > _MAX_SECONDS:
        raise _refused(text, "is too long to be meant (over a thousand years)")
    return " ".join(parts)


def _refused(text: str, why: str) -> InvalidArgument:
    return InvalidArgument(f"--older-than {text!r} {why}")


def prune(db: Database, older_than: str, batch: int = PRUNE_BATCH, dry_run: bool = False) -> Pruned:
    """Delete finished invocations (every owner's) that finished more than ``older_than``
    ago; ``dry_run``: only count them. The cutoff is taken once, so every batch deletes
    up to the same moment."""
    interval = retention_interval(older_than)
    queries = load("dispatch")
    try:
        with db.connect(autocommit=True) as conn:
            conn.execute("SET ROLE service_role")
            row = conn.execute("SELECT now() - %s::interval AS cutoff", (interval,)).fetchone()
            assert row is not None
            cutoff: datetime = row["cutoff"]
            if dry_run:
                counted = conn.execute(queries["prune_count"], {"cutoff": cutoff}).fetchone()
                return Pruned(int(counted["n"]) if counted else 0, cutoff, dry_run=True)
            total = 0
            while True:
                params = {"cutoff": cutoff, "batch": batch}
                deleted = conn.execute(queries["prune"], params).rowcount
                total += deleted
                if deleted < batch:
                    return Pruned(total, cutoff)
    except psycopg.Error as exc:
        raise translate_db_error(exc) from None

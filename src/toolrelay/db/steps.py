"""Work of several one-trip transactions written once, run by a thread or the event loop.

A generator yields each trip (identity, queries, whether a failure may be retried) and is
sent its rows, or thrown its error, back; ``run_steps`` drives it on ``Trips`` (a worker
thread), ``run_steps_async`` on ``Database.trip`` (the event loop, db/aio.py). So
``Registry.call`` has one body for the CLI and the API's threads and one for MCP's loop.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import TypeVar

import psycopg

from toolrelay.db.connect import Database, Identity, Query, Row, Trips

__all__ = ["Steps", "Trip", "checked_first", "run_steps", "run_steps_async"]

T = TypeVar("T")
Trip = tuple[Identity, Sequence[Query], bool]  # who, what, retried when it fails first
Steps = Generator[Trip, list[list[Row]], T]


def run_steps(trips: Trips, steps: Steps[T]) -> T:
    """The value ``steps`` returns, each of its trips run on ``trips``."""
    trip, value = _next(steps, None, None)
    while trip is not None:
        rows, error = None, None
        try:
            rows = trips.run(trip[0], trip[1], retry=trip[2])
        except psycopg.Error as exc:
            error = exc
        trip, value = _next(steps, rows, error)
    return value


async def run_steps_async(db: Database, steps: Steps[T]) -> T:
    """``run_steps`` from the event loop, each trip on ``db.trip``."""
    trip, value = _next(steps, None, None)
    while trip is not None:
        rows, error = None, None
        try:
            rows = await db.trip(trip[0], trip[1], retry=trip[2])
        except psycopg.Error as exc:
            error = exc
        trip, value = _next(steps, rows, error)
    return value


def _next(
    steps: Steps[T], rows: list[list[Row]] | None, error: psycopg.Error | None
) -> tuple[Trip | None, T]:
    """The next trip, its predecessor's rows sent in (or its error thrown in); once the
    steps return, no trip and their value. What the steps raise goes to the caller."""
    try:
        return steps.throw(error) if error is not None else steps.send(rows), None  # type: ignore[arg-type, return-value]
    except StopIteration as done:
        return None, done.value


def checked_first(steps: Steps[T], identity: Identity, check: Query, refused: str) -> Steps[T]:
    """``steps`` with ``check`` run first in their first trip (in its transaction, its rows
    not passed on). Steps that end or fail before making any trip still make one, with the
    check alone, before their value or error goes out: a caller the check refuses learns
    nothing else. The check's error (SQLSTATE ``refused``) goes to the caller as it is,
    never to ``steps``, which cannot take it for one of their own."""
    try:
        who, queries, retry = next(steps)
    except StopIteration as done:
        yield identity, [check], True
        value: T = done.value
        return value
    except Exception:
        yield identity, [check], True
        raise
    rows, error = None, None
    try:
        rows = (yield who, [check, *queries], retry)[1:]
    except psycopg.Error as exc:
        if exc.sqlstate == refused:
            raise
        error = exc
    trip, value = _next(steps, rows, error)
    while trip is not None:  # the rest as run_steps runs them
        rows, error = None, None
        try:
            rows = yield trip
        except psycopg.Error as exc:
            error = exc
        trip, value = _next(steps, rows, error)
    return value

"""Waiting for an invocation's outcome: one LISTEN connection per process wakes the waiters.

The worker's ``finish`` query sends one NOTIFY on ``toolrelay_done`` per batch, with the ids
whose outcome is terminal or back at 'pending', in its own transaction, so a woken waiter
sees the row. Migration 0017's trigger sends one when a decision or an expiry moves a call
out of 'pending'. A notification is only ever a hint to re-read the row: a waiter registers
before its first read (an outcome that lands during the read wakes the next wait), every
waiter is woken to re-read when the listener connects or drops (whatever was sent while
nobody listened), and while the listener is down waits fall back to a slow poll.

A caller that has just made the call may skip the first read (``unread_since``): when the
listener was listening before the call was committed, every settled state of that call
(its insert at 'pending', an outcome, a decision) is told to this listener after that;
either it is among the ids told recently, or it is still to come and wakes the waiter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, Final
from uuid import UUID

import psycopg

from toolrelay.errors import ConfigurationError

__all__ = ["DONE_CHANNEL", "FALLBACK_POLL_ENV", "WAITS_PER_AGENT", "Outcomes", "nothing_held"]

DONE_CHANNEL: Final = "toolrelay_done"
FALLBACK_POLL_ENV: Final = "TOOLRELAY_WAIT_POLL_SECONDS"
DEFAULT_FALLBACK_POLL: Final = 1.0  # seconds between reads while nobody listens
RECONNECT_MIN: Final = 0.2  # seconds; doubled after each failed connection, up to the max
RECONNECT_MAX: Final = 5.0
RECENT_IDS: Final = 50_000  # ids told lately, kept for waiters that skip their first read
# While the in-process worker holds a call, its taking waiter looks this often whether it
# still does (a call it gives up without a hand-off, e.g. a lost lease, is then read).
HOLD_CHECK: Final = 0.05  # seconds
# Calls one agent may wait on at once in a process (API ?wait, MCP tools/call): each holds an
# HTTP request and its socket open. Past it a wait answers at once with the call's state.
WAITS_PER_AGENT: Final = 64

Row = dict[str, Any]
log = logging.getLogger("toolrelay.outcomes")


def fallback_poll_from_env(environ: Mapping[str, str] | None = None) -> float:
    """TOOLRELAY_WAIT_POLL_SECONDS, else one second."""
    raw = (os.environ if environ is None else environ).get(FALLBACK_POLL_ENV, "").strip()
    if not raw:
        return DEFAULT_FALLBACK_POLL
    try:
        value = float(raw)
    except ValueError:
        raise ConfigurationError(f"{FALLBACK_POLL_ENV} is not a number: {raw!r}") from None
    if not value > 0:
        raise ConfigurationError(f"{FALLBACK_POLL_ENV} must be positive, got {raw!r}")
    return value


def nothing_held(key: str) -> bool:
    """``Outcomes.holding`` with no worker in the process."""
    return False


class Outcomes:
    """Invocation ids mapped to the events of the coroutines waiting on them.

    ``url`` None (behind a transaction pooler, where LISTEN does not work): poll only.
    The listener starts with the first waiter, in that waiter's event loop.
    """

    def __init__(
        self,
        url: str | None,
        fallback_poll: float | None = None,
        waits_per_agent: int = WAITS_PER_AGENT,
    ) -> None:
        self.url = url
        self.waits_per_agent = waits_per_agent
        self._agents_waiting: Counter[str] = Counter()
        self.fallback_poll = fallback_poll_from_env() if fallback_poll is None else fallback_poll
        self.listening = False
        self.epoch = 0  # one more at every (re)connection of the listener
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._recent: dict[str, None] = {}  # insertion-ordered: the oldest goes first
        # Outcomes handed over, for waiters taking them (None: handed, but a read must tell).
        self._handed: dict[str, Row | None] = {}
        self._taking: Counter[str] = Counter()  # ids waited on by ``take_handed`` waiters
        self._task: asyncio.Task[None] | None = None
        # Set by `serve`: whether its worker still holds this call (and so will hand its
        # outcome over). Its NOTIFY can wake the waiter before the hand-off does.
        self.holding: Callable[[str], bool] = nothing_held

    async def wait_for(
        self,
        invocation_id: UUID,
        read: Callable[[], Awaitable[Row]],
        settled: Callable[[Row], bool],
        seconds: float,
        gone: Callable[[], Awaitable[bool]] | None = None,
        unread_since: int | None = None,
        take_handed: bool = False,
        agent: str | None = None,
    ) -> Row:
        """``read()`` once ``settled`` by it, when ``seconds`` have passed, or when ``gone``.

        ``unread_since``: ``mark()`` taken before the call was made; skip the first read
        when the listener has listened since and has not told this id yet.
        ``take_handed``: an outcome the in-process worker hands over (``hand``) is the
        answer, unread: only for the caller that made the call (the row is not filtered
        by who may see it). ``agent``: the agent waiting; one already waiting on
        ``waits_per_agent`` calls here gets the state now instead of a wait (WAITS_PER_AGENT).
        """
        if agent is not None and self._agents_waiting[agent] >= self.waits_per_agent:
            seconds = 0.0  # its share of this process's open requests is taken
        deadline = time.monotonic() + seconds
        key = str(invocation_id)
        with self._watch(key) as event, self._take(key, take_handed), self._counted(agent):
            skip = self.listening and self.epoch == unread_since and key not in self._recent
            while True:
                if take_handed and key in self._handed:  # the worker is done with it
                    handed = self._handed.pop(key)
                    if handed is not None and settled(handed):
                        return handed
                    held = False
                else:
                    held = take_handed and self.holding(key) and deadline > time.monotonic()
                if not skip and not held:  # held: the hand-off is still to come, unread
                    event.clear()  # before the read: an outcome landing during it wakes us
                    row = await read()
                    remaining = deadline - time.monotonic()
                    if settled(row) or remaining <= 0 or (gone is not None and await gone()):
                        return row
                skip = False
                remaining = deadline - time.monotonic()
                timeout = remaining if self.listening else min(self.fallback_poll, remaining)
                if held:  # cleared with no await since the look at _handed: no hand is lost
                    event.clear()
                    timeout = min(timeout, HOLD_CHECK)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), timeout)

    def mark(self) -> int | None:
        """Before making a call: what ``wait_for(unread_since=...)`` compares (None: read)."""
        self._start()
        return self.epoch if self.listening else None

    def wake(self, ids: Iterable[str]) -> None:
        """Wake whoever waits on these ids (a NOTIFY payload, or an in-process hand-off)."""
        for key in ids:
            self._recent[key] = None
            for event in self._waiters.get(key, ()):
                event.set()
        while len(self._recent) > RECENT_IDS:
            del self._recent[next(iter(self._recent))]

    def hand(self, outcomes: Mapping[str, Row | None]) -> None:
        """The in-process worker's outcomes as written (None: a read must tell): kept for
        waiters that take them, and everyone waiting on these ids woken."""
        for key, row in outcomes.items():
            if key in self._taking:
                self._handed[key] = row
        self.wake(outcomes)

    def _counted(self, agent: str | None) -> contextlib.AbstractContextManager[None]:
        return _counting(self._agents_waiting, agent)

    def _take(self, key: str, taking: bool) -> contextlib.AbstractContextManager[None]:
        # the last taker gone, an outcome handed over for it is dropped
        return _counting(self._taking, key if taking else None, self._drop_handed)

    def _drop_handed(self, key: str) -> None:
        self._handed.pop(key, None)

    def waiting(self, invocation_id: UUID | None = None) -> bool:
        """Whether someone waits on this call (None: on any call) now."""
        return bool(self._waiters) if invocation_id is None else str(invocation_id) in self._waiters

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    @contextlib.contextmanager
    def _watch(self, key: str) -> Iterator[asyncio.Event]:
        self._start()
        event = asyncio.Event()
        self._waiters.setdefault(key, set()).add(event)
        try:
            yield event
        finally:
            peers = self._waiters.get(key)
            if peers is not None:
                peers.discard(event)
                if not peers:
                    del self._waiters[key]

    def _start(self) -> None:
        if self.url is None:
            return
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self.listening = False
            self._task = loop.create_task(self._listen(self.url), name="toolrelay-outcomes")

    def _wake_all(self) -> None:
        for events in self._waiters.values():
            for event in events:
                event.set()

    async def _listen(self, url: str) -> None:
        delay = RECONNECT_MIN
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {DONE_CHANNEL}")
                    self.epoch += 1
                    self.listening = True
                    delay = RECONNECT_MIN
                    self._wake_all()  # whatever landed while nobody listened
                    async for note in conn.notifies():
                        self.wake(note.payload.split(","))
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                log.warning(
                    "not listening for outcomes; waits poll until it reconnects",
                    extra={"action": "outcomes_listen_error", "error": str(exc)[:200]},
                )
            finally:
                self.listening = False
                self.epoch += 1  # a mark taken before this drop no longer holds
                self._wake_all()  # they poll now
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX)


@contextlib.contextmanager
def _counting(
    counts: Counter[str], key: str | None, on_last: Callable[[str], object] | None = None
) -> Iterator[None]:
    """``counts[key]`` one higher while the block runs (nothing for None); at zero the key
    goes, and ``on_last(key)`` is called."""
    if key is None:
        yield
        return
    counts[key] += 1
    try:
        yield
    finally:
        counts[key] -= 1
        if not counts[key]:
            del counts[key]
            if on_last is not None:
                on_last(key)

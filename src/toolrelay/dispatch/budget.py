"""How many bytes of upstream answers one worker holds read, parsed and not yet recorded.

A JSON answer costs far more once Python has parsed it than on the wire: ordinary JSON
10-15x, nested empty arrays (``[[],[],...]``) ~45x (5 MiB became 220 MiB). A worker runs
up to ``concurrency`` calls of every tenant's tools, and each call's parsed output is held
until its result is written, so one hostile upstream answering 64 calls at once could take
the process's memory, and every other tenant's calls with it. The budget bounds the answers
held at once: a call whose answer does not fit waits, after reading it and before parsing
it, until earlier calls have recorded theirs. An answer larger than the whole budget runs
alone. Answers of ordinary sizes never wait.

One answer is bounded too: before parsing, ``parsed_weight`` estimates what it will take
(erring high), and an answer past the worker's ``max_answer`` is not parsed at all. Without
it an owner's ``max_response_bytes`` (up to 1 GiB) let one answer weigh 36-45 GiB parsed.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Final

__all__ = ["DEFAULT_ANSWER_BUDGET", "DEFAULT_MAX_ANSWER", "AnswerBudget", "parsed_weight"]

DEFAULT_ANSWER_BUDGET: Final = 16 * 1024 * 1024  # bytes of answers on the wire
DEFAULT_MAX_ANSWER: Final = 1024 * 1024 * 1024  # bytes one answer may take once parsed
# Bytes a parsed value may take beyond its text: measured with tracemalloc over the shapes
# that weigh most (`[{"a":[]},...]` 62, `[[[[]]]],...` 66, short non-ASCII strings 89).
PER_VALUE: Final = 96


def parsed_weight(body: bytes) -> int:
    """What ``body`` will take once json.loads has parsed it, estimated high: its own bytes
    (string contents) and PER_VALUE for every value it can hold. A value or key starts the
    text or follows '[', '{', ',' or ':' (those inside strings count too: only ever more)."""
    starts = body.count(b"[") + body.count(b"{") + body.count(b",") + body.count(b":")
    return len(body) + PER_VALUE * (starts + 1)


class AnswerBudget:
    """Bytes taken by calls holding an answer, first come first served."""

    def __init__(
        self, total: int = DEFAULT_ANSWER_BUDGET, max_answer: int = DEFAULT_MAX_ANSWER
    ) -> None:
        if total < 1:
            raise ValueError("the answer budget must be at least 1 byte")
        if max_answer < 1:
            raise ValueError("the largest answer must be at least 1 byte")
        self.total = total
        self.max_answer = max_answer  # parsed_weight of one answer at most
        self.held = 0
        self.peak = 0  # most ever held at once
        self.waited = 0  # calls that had to wait for room
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    async def take(self, size: int) -> int:
        """Wait for room for an answer of ``size`` bytes; the bytes taken (give them back
        with ``give_back`` once the call's result is recorded, whatever happened)."""
        size = min(max(size, 0), self.total)
        if not self._waiting and self.held + size <= self.total:
            self._hold(size)
            return size
        self.waited += 1
        room: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((size, room))
        try:
            await room
        except asyncio.CancelledError:
            if room.done() and not room.cancelled():
                self.give_back(size)  # room was made just as the call was cancelled
            else:
                self._waiting.remove((size, room))
                self._wake()  # a smaller call behind it may fit now
            raise
        return size

    def give_back(self, size: int) -> None:
        self.held -= size
        self._wake()

    def _hold(self, size: int) -> None:
        self.held += size
        self.peak = max(self.peak, self.held)

    def _wake(self) -> None:
        while self._waiting and self.held + self._waiting[0][0] <= self.total:
            size, room = self._waiting.popleft()
            self._hold(size)
            room.set_result(None)

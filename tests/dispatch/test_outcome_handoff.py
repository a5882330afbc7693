"""Outcomes.hand: the in-process worker's outcome is the answer of the caller that made the
call, without reading it back; nobody else takes it, and nothing is kept for nobody."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from toolrelay.dispatch.outcomes import Outcomes

Row = dict[str, Any]


class Reads:
    """The read a waiter would make (the database's answer stands in as a row)."""

    def __init__(self, row: Row) -> None:
        self.row, self.count = row, 0

    async def __call__(self) -> Row:
        self.count += 1
        return self.row


def finished(row: Row) -> bool:
    return row["status"] in ("completed", "failed")


async def test_a_handed_outcome_answers_the_caller_that_made_the_call() -> None:
    outcomes = Outcomes(None)  # nobody listens: only the hand-off can wake it before 30 s
    ident = uuid.uuid4()
    reads = Reads({"id": str(ident), "status": "running"})
    waiting = asyncio.create_task(outcomes.wait_for(ident, reads, finished, 30.0, take_handed=True))
    while not outcomes.waiting(ident):
        await asyncio.sleep(0)
    handed = {"id": str(ident), "status": "completed", "output": {"ok": True}}
    outcomes.hand({str(ident): handed})
    assert await asyncio.wait_for(waiting, 5.0) is handed
    assert reads.count == 1  # its first read only (no mark: the listener was down)
    assert outcomes._handed == {} and outcomes._taking == {}


async def test_other_waiters_read_instead() -> None:
    """The status tool's waiter (any id, checked by who may read it) is woken, and reads."""
    outcomes = Outcomes(None)
    ident = uuid.uuid4()
    row = {"id": str(ident), "status": "completed", "output": {"from": "the database"}}
    reads = Reads({"id": str(ident), "status": "running"})
    waiting = asyncio.create_task(outcomes.wait_for(ident, reads, finished, 30.0))
    while not outcomes.waiting(ident):
        await asyncio.sleep(0)
    reads.row = row
    outcomes.hand({str(ident): {"id": str(ident), "status": "completed", "output": "handed"}})
    assert (await asyncio.wait_for(waiting, 5.0))["output"] == {"from": "the database"}
    assert reads.count == 2
    assert outcomes._handed == {}  # nobody took it: not kept


async def test_an_outcome_without_a_row_is_read() -> None:
    outcomes = Outcomes(None)
    ident = uuid.uuid4()
    reads = Reads({"id": str(ident), "status": "running"})
    waiting = asyncio.create_task(outcomes.wait_for(ident, reads, finished, 30.0, take_handed=True))
    while not outcomes.waiting(ident):
        await asyncio.sleep(0)
    reads.row = {"id": str(ident), "status": "failed", "error_code": "tool_changed"}
    outcomes.hand({str(ident): None})  # e.g. sent back to approval: only a read can tell
    assert (await asyncio.wait_for(waiting, 5.0))["error_code"] == "tool_changed"
    assert reads.count == 2


async def held_waiter() -> tuple[Outcomes, str, set[str], Reads, asyncio.Task[Row]]:
    """A caller waiting on its own call, which the in-process worker holds; it has started
    waiting (or already returned: then the test's asserts tell why)."""
    outcomes = Outcomes(None)
    ident = uuid.uuid4()
    held = {str(ident)}
    outcomes.holding = held.__contains__
    reads = Reads({"id": str(ident), "status": "completed"})
    waiting = asyncio.create_task(outcomes.wait_for(ident, reads, finished, 30.0, take_handed=True))
    for _ in range(1000):
        if outcomes.waiting(ident) or waiting.done():
            break
        await asyncio.sleep(0)
    return outcomes, str(ident), held, reads, waiting


async def test_a_notification_before_the_hand_off_does_not_make_the_caller_read() -> None:
    """The worker's finish commits, and its NOTIFY can reach the listener before the worker
    hands the row over: while the worker still holds the call, the caller waits for it."""
    outcomes, key, _, reads, waiting = await held_waiter()
    outcomes.wake([key])  # the NOTIFY, first
    for _ in range(5):
        await asyncio.sleep(0)
    handed = {"id": key, "status": "completed", "output": {"ok": True}}
    outcomes.hand({key: handed})
    assert await asyncio.wait_for(waiting, 5.0) is handed
    assert reads.count == 0


async def test_a_call_the_worker_gives_up_without_a_hand_off_is_read() -> None:
    """Held, then let go with nothing handed (its lease was lost, say): the caller reads it
    within HOLD_CHECK, woken or not."""
    _, _, held, reads, waiting = await held_waiter()
    for _ in range(5):
        await asyncio.sleep(0)
    assert reads.count == 0  # held: not read yet
    held.clear()
    assert await asyncio.wait_for(waiting, 5.0) is reads.row
    assert reads.count == 1


async def test_a_hand_off_without_a_row_is_read_at_once_while_still_held() -> None:
    """The worker hands None (a read must tell, e.g. the call went back to approval) before
    it lets the call go: the caller reads then, not at its next HOLD_CHECK."""
    outcomes, key, _, reads, waiting = await held_waiter()
    outcomes.hand({key: None})
    for _ in range(5):
        await asyncio.sleep(0)
    assert waiting.done()
    assert reads.count == 1

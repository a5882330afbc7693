"""One agent cannot hold a process's connections with long polls (a second tenant's view).

Every `?wait` on /v1 and every MCP `tools/call` keeps its HTTP request, and so a socket, open
until the call settles, up to MAX_WAIT (60 s) or TOOLRELAY_MCP_WAIT_SECONDS. The rate limit
only spaces their starts (20 a second after a burst of 60), so one agent token, leaked or
looping, held ~1,260 of them at once: on a server whose file limit is systemd's default 1,024,
every other tenant's connection was then refused. Now an agent waits on at most
WAITS_PER_AGENT calls at once in a process; a further request is answered at once with the
call's state (the client asks again, as it does after a wait that ran out).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from toolrelay.dispatch.outcomes import Outcomes

RUNNING = {"status": "running"}


def _settled(row: dict[str, Any]) -> bool:
    return row["status"] == "completed"


async def test_an_agents_waits_beyond_its_share_answer_at_once() -> None:
    outcomes = Outcomes(None, fallback_poll=60.0, waits_per_agent=2)
    reads = asyncio.Queue[str]()

    def reader(who: str) -> Any:
        async def read() -> dict[str, Any]:
            reads.put_nowait(who)
            return RUNNING

        return read

    def waiting(who: str) -> asyncio.Future[dict[str, Any]]:
        return asyncio.ensure_future(
            outcomes.wait_for(uuid.uuid4(), reader(who), _settled, 60.0, agent=who)
        )

    held = [waiting("a"), waiting("a"), waiting("b")]
    for _ in held:  # each has read once and now waits for its outcome
        await reads.get()
    # the agent's third: its share is taken, so the state now, at once (not in 60 s)
    third = await asyncio.wait_for(
        outcomes.wait_for(uuid.uuid4(), reader("a"), _settled, 60.0, agent="a"), 5.0
    )
    assert third == RUNNING
    assert not any(task.done() for task in held)  # the first two, and another agent's, wait
    for task in held[:2]:  # once they end, the agent may wait again
        task.cancel()
    await asyncio.gather(*held[:2], return_exceptions=True)
    assert await reads.get() == "a"  # the third's read, discarded
    call, rows = uuid.uuid4(), iter([RUNNING, {"status": "completed"}])

    async def read_again() -> dict[str, Any]:
        reads.put_nowait("again")
        return next(rows)

    again = asyncio.ensure_future(outcomes.wait_for(call, read_again, _settled, 60.0, agent="a"))
    assert await reads.get() == "again"  # read once, running: it waits for the outcome
    outcomes.wake([str(call)])  # one over the share would have answered "running" already
    assert await asyncio.wait_for(again, 5.0) == {"status": "completed"}
    held[2].cancel()
    await asyncio.gather(held[2], return_exceptions=True)

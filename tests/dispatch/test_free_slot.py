"""A free slot is used while calls wait, however few slots are free.

A worker with calls in flight claimed only once a quarter of its slots were free (to batch
claims when calls finish fast). With slow calls in the other slots, a call made meanwhile
waited for them: 7 of 8 slots held by calls of 30 s, the next call waited up to 30 s with
a slot idle (and the worker, not registered asleep, was not even told of it). Now the
worker claims for fewer free slots once no call has finished, and none was claimed, for
50 ms (``PARTIAL_CLAIM_AFTER``).
"""

from __future__ import annotations

from collections.abc import Callable

from tests.dispatch.test_owner_fairness import Held, quiet_worker, sending
from tests.dispatch.upstream import Upstream
from tests.registry.helpers import agent_with_tool
from toolrelay.registry import Registry


async def test_a_call_made_while_most_slots_are_held_takes_a_free_one(
    make_registry: Callable[[], Registry], upstream: Upstream, database_url: str
) -> None:
    held = Held()
    upstream.routes["/slow"] = held.slow
    upstream.routes["/fast"] = held.fast
    slow, fast = make_registry(), make_registry()
    agent, tool = agent_with_tool(slow, endpoint_url=f"{upstream.base_url}/slow")
    for _ in range(7):
        slow.invoke(agent, tool["key"], {})
    worker = quiet_worker(database_url, slots=8)  # a quarter: 2 slots
    async with sending(worker, held):
        assert [await held.next_arrival() for _ in range(7)] == ["slow"] * 7
        fast_agent, fast_tool = agent_with_tool(fast, endpoint_url=f"{upstream.base_url}/fast")
        call = fast.invoke(fast_agent, fast_tool["key"], {})
        assert await held.next_arrival() == "fast"  # before: only once 2 slow calls ended
        assert worker.sending == 7
    assert fast.get_invocation(str(call))["status"] == "completed"


async def test_a_slot_freed_among_held_ones_takes_the_next_call(
    make_registry: Callable[[], Registry], upstream: Upstream, database_url: str
) -> None:
    held = Held()
    upstream.routes["/slow"] = held.slow
    registry = make_registry()
    agent, tool = agent_with_tool(registry, endpoint_url=f"{upstream.base_url}/slow")
    calls = [registry.invoke(agent, tool["key"], {}) for _ in range(10)]
    worker = quiet_worker(database_url, slots=8)
    async with sending(worker, held):
        assert [await held.next_arrival() for _ in range(8)] == ["slow"] * 8
        held.release_one()  # one slot free: before, the ninth call waited for a second
        assert await held.next_arrival() == "slow"
        held.release_one()
        assert await held.next_arrival() == "slow"
    assert {registry.get_invocation(str(c))["status"] for c in calls} == {"completed"}

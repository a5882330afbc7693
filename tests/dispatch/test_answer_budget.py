"""One worker holds a bounded amount of upstream answers at once (dispatch/budget.py).

A parsed JSON answer weighs up to ~45x its bytes (nested empty arrays), and each is held
until its result is written: eight hostile answers arriving together took eight times the
memory of one. With the budget, a call whose answer does not fit waits before parsing it
until earlier calls have recorded theirs."""

from __future__ import annotations

import asyncio
import json
import tracemalloc

import pytest
from aiohttp import web

from tests.dispatch.test_worker import Drain, tool_at
from tests.dispatch.upstream import Upstream
from tests.registry.helpers import add_tool
from toolrelay.dispatch.budget import AnswerBudget, parsed_weight
from toolrelay.registry import Registry

CALLS = 8
ARRAYS = 100_000
ANSWER = b"[" + b",".join([b"[]"] * ARRAYS) + b"]"  # 300 kB on the wire, ~7 MB parsed


async def test_answers_arriving_together_are_held_within_the_budget(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    everyone = asyncio.Event()

    async def together(_request: web.Request, hit: int) -> web.Response:
        if hit == CALLS:
            everyone.set()
        await everyone.wait()  # all eight answers leave at once
        return web.Response(body=ANSWER, content_type="application/json")

    upstream.routes["/heavy"] = together
    tool = add_tool(registry, "heavy.get", **tool_at(upstream, "/heavy"))
    registry.create_agent("bot")
    registry.assign("bot", tool["key"])
    calls = [registry.invoke("bot", tool["key"], {}) for _ in range(CALLS)]
    tracemalloc.start()
    try:
        worker = await drain(concurrency=CALLS, answer_budget=len(ANSWER) + 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert {registry.get_invocation(c)["status"] for c in calls} == {"completed"}
    assert registry.get_invocation(calls[0])["output"] == [[]] * ARRAYS
    assert worker.budget.peak == len(ANSWER)  # one answer held at a time
    assert worker.budget.waited == CALLS - 1 and worker.budget.held == 0
    # Measured: 15 MiB with the budget, 56 MiB with it out of the way (all eight held).
    assert peak < 30 * 2**20, f"{peak / 2**20:.0f} MiB at the peak"


async def test_an_answer_larger_than_the_budget_runs_alone_and_waits_in_turn() -> None:
    budget = AnswerBudget(100)
    first = await budget.take(60)
    big = asyncio.create_task(budget.take(500))  # larger than all of it: takes all of it
    small = asyncio.create_task(budget.take(10))  # would fit now, but comes after
    await asyncio.sleep(0)  # one turn of the loop: both tasks reach their wait
    assert not big.done() and not small.done() and budget.held == 60
    budget.give_back(first)
    assert await big == 100 and not small.done()
    budget.give_back(100)
    assert await small == 10 and budget.held == 10


async def test_a_call_cancelled_while_waiting_gives_its_place_away() -> None:
    budget = AnswerBudget(100)
    await budget.take(90)
    stuck = asyncio.create_task(budget.take(50))
    behind = asyncio.create_task(budget.take(10))
    await asyncio.sleep(0)  # one turn of the loop: both tasks reach their wait
    stuck.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stuck
    assert await behind == 10 and budget.held == 100  # it fit beside the 90 once alone


async def test_one_answer_heavier_than_the_worker_allows_is_not_parsed(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    # The same 300 kB twice: nested arrays (~7 MB parsed) and one string (~300 kB parsed).
    # Before: an owner's max_response_bytes (up to 1 GiB) was the only bound on one answer,
    # 36-45 GiB parsed for a worker every tenant shares.
    text = b'"' + b"x" * (len(ANSWER) - 2) + b'"'

    async def heavy(_request: web.Request, _hit: int) -> web.Response:
        return web.Response(body=ANSWER, content_type="application/json")

    async def light(_request: web.Request, _hit: int) -> web.Response:
        return web.Response(body=text, content_type="application/json")

    upstream.routes["/heavy"] = heavy
    upstream.routes["/light"] = light
    registry.create_agent("bot")
    calls = {}
    for name in ("heavy", "light"):
        tool = add_tool(registry, f"{name}.get", **tool_at(upstream, f"/{name}"))
        registry.assign("bot", tool["key"])
        calls[name] = registry.invoke("bot", tool["key"], {})
    limit = 4 * 2**20
    assert parsed_weight(text) < limit < 7 * 2**20 < parsed_weight(ANSWER)
    tracemalloc.start()
    try:
        await drain(max_answer=limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    heavy_call = registry.get_invocation(calls["heavy"])
    assert heavy_call["status"] == "failed" and heavy_call["error_code"] == "response_too_large"
    assert heavy_call["http_status"] == 200 and heavy_call["output"] is None
    assert heavy_call["error"].startswith(f"the response's {len(ANSWER):,} bytes would take about")
    assert "more than the 4 MiB this worker allows one answer (HTTP 200)" in heavy_call["error"]
    light_call = registry.get_invocation(calls["light"])
    assert light_call["status"] == "completed" and light_call["output"] == text.decode()[1:-1]
    assert peak < 7 * 2**20, f"{peak / 2**20:.1f} MiB at the peak: the heavy answer was parsed"


@pytest.mark.parametrize(
    "body",
    [
        b"[" + b",".join([b"[]"] * 50_000) + b"]",
        b"[" + b",".join([b'{"a":[]}'] * 20_000) + b"]",
        b"[" + b",".join([b"[[[[]]]]"] * 20_000) + b"]",
        b"[" + b",".join(['"\u00e9\u4e2d"'.encode()] * 50_000) + b"]",
        b"[" + b",".join([b"0.5"] * 50_000) + b"]",
        b'{"' + b'":1,"'.join(b"k%d" % i for i in range(30_000)) + b'":1}',
    ],
    ids=["arrays", "objects", "nested", "strings", "floats", "keys"],
)
def test_the_estimate_is_never_below_what_parsing_takes(body: bytes) -> None:
    tracemalloc.start()
    try:
        parsed = json.loads(body)
        taken, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del parsed
    assert taken < parsed_weight(body) < 8 * max(taken, len(body))

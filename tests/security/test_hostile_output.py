"""What an upstream answers is data, never a way to break the worker: an answer nested
deeper than every later step can follow (the output schema's validator, credential
scrubbing, the JSON sent to the database and to the agent) fails its own call with a clear
error and is recorded once; the calls beside it (another owner's, in the same batch)
complete. Before the bound, the parser's RecursionError killed the call's task: it waited
out its lease and ended `network_error` ("gave up"), a write `outcome_unknown`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import pytest
from aiohttp import web

from tests.dispatch.upstream import Upstream
from tests.registry.helpers import add_tool
from toolrelay.credentials import CredentialStore, Keyring, generate_master_key
from toolrelay.db import Database
from toolrelay.dispatch import executor
from toolrelay.dispatch.worker import Worker
from toolrelay.registry import Registry
from toolrelay.registry.validation import MAX_JSON_DEPTH

Drain = Callable[..., Awaitable[Worker]]
RECURSIVE = {"type": "array", "items": {"$ref": "#"}}  # validated level by level


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def answering(body: bytes) -> Callable[[web.Request, int], Awaitable[web.Response]]:
    async def handler(_request: web.Request, _hit: int) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    return handler


def read_tool(registry: Registry, key: str, url: str, **fields: Any) -> None:
    add_tool(registry, key, endpoint_url=url, **({"max_attempts": 1} | fields))
    registry.create_agent("bot")
    registry.assign("bot", key)


def answered_together(upstream: Upstream, bodies: dict[str, bytes]) -> None:
    """Routes answering once each of them has its request, one after the other in the order
    given: their results share a batch, the first path's first."""
    arrived = asyncio.Event()
    turns = {path: asyncio.Event() for path in bodies}
    order = list(bodies)

    def route(path: str, body: bytes) -> Callable[[web.Request, int], Awaitable[web.Response]]:
        async def handler(_request: web.Request, _hit: int) -> web.Response:
            if all(upstream.hits[p] for p in order):
                arrived.set()
            await arrived.wait()
            if order.index(path):
                await turns[order[order.index(path) - 1]].wait()
            turns[path].set()
            return web.Response(body=body, content_type="application/json")

        return handler

    for path, body in bodies.items():
        upstream.routes[path] = route(path, body)


@dataclass
class SideBySide:
    """One owner's call to the hostile path, and another owner's to /fine, made together."""

    hostile: Registry
    call: UUID
    other: Registry
    fine: UUID

    def outcome(self) -> dict[str, Any]:
        assert self.other.get_invocation(self.fine)["status"] == "completed"
        return self.hostile.get_invocation(self.call)


def side_by_side(
    make_registry: Callable[[], Registry], upstream: Upstream, path: str, **fields: Any
) -> SideBySide:
    hostile, other = make_registry(), make_registry()
    read_tool(hostile, "hostile.read", f"{upstream.base_url}{path}", **fields)
    read_tool(other, "fine.read", f"{upstream.base_url}/fine")
    return SideBySide(hostile, hostile.invoke("bot", "hostile.read", {}),
                      other, other.invoke("bot", "fine.read", {}))  # fmt: skip


# One level over the bound; and far beyond what Python's parser itself can read.
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 100_000])
async def test_a_deeply_nested_answer_fails_its_call_alone(
    depth: int, make_registry: Callable[[], Registry], upstream: Upstream, drain: Drain
) -> None:
    upstream.routes["/deep"] = answering(nested(depth))
    upstream.routes["/fine"] = answering(b'{"ok": true}')
    made = side_by_side(make_registry, upstream, "/deep", schema_output=RECURSIVE)

    await drain(lease_seconds=30.0)  # a task that died would hold the drain for 30 s

    call = made.outcome()
    assert (call["status"], call["error_code"]) == ("failed", "invalid_output")
    assert f"more than {MAX_JSON_DEPTH} levels deep" in call["error"]
    assert call["output"] is None
    assert len(call["attempts"]) == 1 and upstream.hits["/deep"] == 1


async def test_an_answer_at_the_bound_goes_through_every_step(
    registry: Registry, upstream: Upstream, drain: Drain, db: Database
) -> None:
    """At the bound: validated against a recursive schema, scrubbed of a credential, stored
    and read back whole."""
    keyring = Keyring.parse(generate_master_key())
    cred = CredentialStore(db, keyring).add(registry.owner, "api_key", "k", "sk-deep-0123456")
    upstream.routes["/deep"] = answering(nested(MAX_JSON_DEPTH))
    read_tool(registry, "deep.read", f"{upstream.base_url}/deep", schema_output=RECURSIVE,
              auth_method="api_key", credential_ref=cred, auth_param_name="X-Key")  # fmt: skip
    inv = registry.invoke("bot", "deep.read", {})
    await drain(keyring=keyring, lease_seconds=30.0)
    call = registry.get_invocation(inv)
    assert (call["status"], call["output_mismatch"]) == ("completed", None), call
    depth, value = 0, call["output"]
    while value is not None:
        depth += 1
        value = value[0] if value else None
    assert depth == MAX_JSON_DEPTH


def broken(*_args: object) -> object:
    raise RuntimeError("a bug with sk-not-a-real-secret in its message")


@pytest.mark.parametrize(
    ("method", "code"), [("GET", "dispatch_error"), ("POST", "outcome_unknown")]
)
async def test_a_call_the_worker_fails_on_is_recorded_at_once_and_sent_once(
    method: str,
    code: str,
    registry: Registry,
    upstream: Upstream,
    drain: Drain,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A fault injected where the answer is read (after the request left): whatever the
    worker fails on next is this call's outcome now, not a task that dies and a lease that
    sends it again (a read) or ends it `outcome_unknown` half a minute later (a write); the
    exception's message, which could hold anything, is in neither the error nor the log."""
    monkeypatch.setattr(executor, "completed", broken)
    read_tool(registry, "any.call", f"{upstream.base_url}/fine", http_method=method,
              max_attempts=3)  # fmt: skip
    inv = registry.invoke("bot", "any.call", {})
    await drain(lease_seconds=30.0)
    call = registry.get_invocation(inv)
    assert (call["status"], call["error_code"]) == ("failed", code)
    assert "RuntimeError" in call["error"] and "sk-not" not in call["error"]
    assert upstream.hits["/fine"] == 1 and len(call["attempts"]) == 1
    [logged] = [r for r in caplog.records if getattr(r, "action", None) == "dispatch_failed"]
    assert logged.error.startswith("RuntimeError at ")  # type: ignore[attr-defined]
    assert "sk-not" not in caplog.text


async def test_what_jsonb_cannot_hold_in_an_answer_is_replaced_and_the_batch_goes_on(
    make_registry: Callable[[], Registry], upstream: Upstream, drain: Drain
) -> None:
    """PostgreSQL stores no NUL (U+0000) and no unpaired surrogate in text or jsonb: one in an
    answer made the result's batch fail whole, every call in it (another owner's too) then
    left to its lease. Each becomes U+FFFD, as an undecodable byte does; the call completes
    (its side effect happened); a failure's message is cleaned the same way."""

    async def with_nul(_request: web.Request, _hit: int) -> web.Response:
        body = b'{"te\\u0000xt": "a\\u0000b", "s": "x\\udc00y", "pair": "\\ud83d\\ude00"}'
        return web.Response(body=body, content_type="application/json")

    async def failing_with_nul(_request: web.Request, _hit: int) -> web.Response:
        return web.Response(body=b"no\x00pe", status=400, content_type="text/plain")

    upstream.routes["/nul"] = with_nul
    upstream.routes["/nul400"] = failing_with_nul
    upstream.routes["/fine"] = answering(b'{"ok": true}')
    hostile, other = make_registry(), make_registry()
    add_tool(hostile, "nul.read", endpoint_url=f"{upstream.base_url}/nul", max_attempts=1)
    add_tool(hostile, "nul.fail", endpoint_url=f"{upstream.base_url}/nul400", max_attempts=1)
    hostile.create_agent("bot")
    for key in ("nul.read", "nul.fail"):
        hostile.assign("bot", key)
    read_tool(other, "fine.read", f"{upstream.base_url}/fine")
    made = [hostile.invoke("bot", "nul.read", {}), hostile.invoke("bot", "nul.fail", {})]
    fine = other.invoke("bot", "fine.read", {})

    await drain(lease_seconds=30.0)  # a failed batch would hold the drain for 30 s

    assert other.get_invocation(fine)["status"] == "completed"
    read, failed = (hostile.get_invocation(i) for i in made)
    assert read["status"] == "completed"
    assert read["output"] == {"te\ufffdxt": "a\ufffdb", "s": "x\ufffdy", "pair": "\U0001f600"}
    assert (failed["status"], failed["error_code"]) == ("failed", "http_error")
    assert "no\ufffdpe" in failed["error"]
    assert upstream.hits["/nul"] == upstream.hits["/nul400"] == 1


# What Python's json reads but JSON has not, and jsonb refuses: before, the result's batch
# write failed whole (NaN, Infinity, a double's overflow), or the call's task died (an int
# longer than Python converts).
@pytest.mark.parametrize(
    ("body", "says"),
    [(b'{"x": NaN}', "NaN, which is not JSON"),
     (b"[-Infinity]", "-Infinity, which is not JSON"),
     (b'{"x": 1e400}', "beyond a double's range"),
     (b"[" + b"9" * 400 + b".5]", "beyond a double's range"),
     (b"[" + b"9" * 5000 + b"]", "an integer of more than 4,300 digits"),
     (b'{"x": "caf\xe9"}', "expected a JSON response")],  # not UTF-8: not a number's fault
)  # fmt: skip
async def test_a_number_jsonb_cannot_hold_fails_its_call_alone(
    body: bytes,
    says: str,
    make_registry: Callable[[], Registry],
    upstream: Upstream,
    drain: Drain,
) -> None:
    upstream.routes["/odd"] = answering(body)
    upstream.routes["/fine"] = answering(
        b'{"ok": true, "big": 1e300, "long": ' + b"7" * 4000 + b"}"
    )
    made = side_by_side(make_registry, upstream, "/odd")

    await drain(lease_seconds=30.0)

    call = made.outcome()
    kept = made.other.get_invocation(made.fine)["output"]  # in range: kept (1e300: a numeric)
    assert (kept["big"], kept["long"]) == (10**300, int("7" * 4000))
    assert (call["status"], call["error_code"]) == ("failed", "invalid_output")
    assert says in call["error"]
    assert upstream.hits["/odd"] == 1


async def test_a_result_the_database_refuses_takes_no_other_result_with_it(
    make_registry: Callable[[], Registry],
    upstream: Upstream,
    drain: Drain,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The last line behind the checks above: with the NUL left in (the cleaning switched off
    here, standing for a value nobody foresaw), the batch holding it is refused, and each
    result is then written alone: the other owner's call keeps its answer, and the refused
    one keeps its outcome (completed: its side effect happened) without the output."""
    monkeypatch.setattr(executor, "storable", lambda value: value)
    answered_together(upstream, {"/nul": b'{"x": "a\\u0000b"}', "/fine": b'{"ok": true}'})
    made = side_by_side(make_registry, upstream, "/nul")

    await drain(lease_seconds=30.0)

    call = made.outcome()
    assert made.other.get_invocation(made.fine)["output"] == {"ok": True}
    assert (call["status"], call["output"]) == ("completed", None)
    assert "the database refused to store what the upstream answered" in call["output_mismatch"]
    assert upstream.hits["/nul"] == 1 and len(call["attempts"]) == 1


async def test_a_result_refused_even_without_its_answer_leaves_the_rest_of_its_batch(
    make_registry: Callable[[], Registry],
    upstream: Upstream,
    drain: Drain,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A value the rewrite keeps (here a NUL put into the attempt's recorded URL, standing for
    one nobody foresaw): the refused call is left to its lease, and the result written after
    it in the same batch is still written (before, the rewrite's error stopped the loop and
    every result of the batch was lost with it)."""
    monkeypatch.setattr(executor, "storable", lambda value: value)
    record = executor.Attempt.record

    def poisoned(attempt: executor.Attempt, row: Any, outcome: Any) -> dict[str, Any]:
        recorded = record(attempt, row, outcome)
        if row["tool_key"] == "hostile.read" and row["attempt"] == 1:
            recorded["request_url"] = "http://x/\x00"
        return recorded

    monkeypatch.setattr(executor.Attempt, "record", poisoned)
    answered_together(upstream, {"/nul": b'{"x": "a\\u0000b"}', "/fine": b'{"ok": true}'})
    made = side_by_side(make_registry, upstream, "/nul")

    await drain(lease_seconds=2.0)  # the refused call's lease runs out; it is claimed again

    assert made.other.get_invocation(made.fine)["output"] == {"ok": True}
    assert made.hostile.get_invocation(made.call)["status"] == "failed"  # gave up, attempt 2
    assert upstream.hits["/fine"] == 1

"""What a running worker says: its start line, a summary every interval, and a warning for
each active tool the egress allow-list will refuse (issue 13, item 8)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import secrets
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from aiohttp import web
from psycopg import conninfo

from tests.dispatch.conftest import LOOPBACK_ONLY
from tests.dispatch.upstream import Upstream
from tests.pgtest import create_database, drop_database
from tests.registry.helpers import add_tool
from toolrelay.db import Database, migrate
from toolrelay.dispatch.egress import ALLOW_ENV, EgressPolicy
from toolrelay.dispatch.preflight import broad_entries, describe_database
from toolrelay.dispatch.worker import Worker, WorkerSettings
from toolrelay.logs import JSONFormatter
from toolrelay.registry import Registry

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "s3cret-Pw0rd"
WAIT = 30.0  # seconds: an upper bound for what takes well under one
INTERVAL = 0.5  # seconds: the test-shortened summary interval
SLACK = 1.5  # seconds a summary may come late on a loaded machine


@pytest.fixture
def fresh_url(admin_url: str) -> Iterator[str]:
    """A database of its own: a worker claims whatever runnable rows a database holds."""
    url = create_database(admin_url, prefix="toolrelay_logs")
    migrate(url)
    yield url
    drop_database(admin_url, url)


@pytest.fixture
def registry(fresh_url: str) -> Registry:
    return Registry(Database(fresh_url), uuid.uuid4())


class Captured(logging.Handler):
    """The worker's records, each formatted by our JSONFormatter and parsed back."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(JSONFormatter())
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))

    def actions(self, action: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line.get("action") == action]


@pytest.fixture
def captured() -> Iterator[Captured]:
    logger = logging.getLogger("toolrelay.worker")
    handler, level = Captured(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def with_password(url: str) -> str:
    """The same database as a URL with a password in it (trust auth ignores it)."""
    p = conninfo.conninfo_to_dict(url)
    user, db, port = p.get("user") or "postgres", p["dbname"], p.get("port") or "5432"
    host = str(p.get("host") or "")
    if host.startswith("/") or not host:
        return f"postgresql://{user}:{PASSWORD}@/{db}?host={quote(host, safe='')}&port={port}"
    return f"postgresql://{user}:{PASSWORD}@{host}:{port}/{db}"


# --- the start line and the summary, from `toolrelay worker` itself ---------------------------


async def test_start_line_names_the_worker_and_its_database_never_the_password(
    fresh_url: str, tmp_path: Path
) -> None:
    url = with_password(fresh_url)
    key = base64.b64encode(secrets.token_bytes(32)).decode()
    env = os.environ | {
        "DATABASE_URL": url,
        "TOOLRELAY_HOME": str(tmp_path),
        "TOOLRELAY_MASTER_KEY": f"logs:{key}",
        "TOOLRELAY_EGRESS_ALLOW": "127.0.0.1, api.internal.example, 10.9.0.0/16:8443@tool=x*",
        "TOOLRELAY_SUMMARY_INTERVAL": str(INTERVAL),  # the flag's environment variable
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "toolrelay.cli", "worker", "--concurrency", "3",
        "--lease-seconds", "7", env=env, cwd=ROOT, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    raw: list[bytes] = []
    seen_at: dict[str, float] = {}
    try:
        async with asyncio.timeout(WAIT):
            while "worker_summary" not in seen_at:
                line = await proc.stderr.readline()
                assert line, b"".join(raw).decode()
                raw.append(line)
                seen_at.setdefault(json.loads(line).get("action", ""), time.monotonic())
        proc.send_signal(signal.SIGTERM)
        _, rest = await asyncio.wait_for(proc.communicate(), WAIT)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    stderr = (b"".join(raw) + rest).decode()
    assert proc.returncode == 0, stderr
    assert PASSWORD not in stderr
    lines = [json.loads(line) for line in stderr.splitlines()]  # every line is JSON

    [start] = [line for line in lines if line.get("action") == "worker_start"]
    params = conninfo.conninfo_to_dict(fresh_url)
    host = params.get("host") or "local socket"
    assert start["database"] == f"{host}:{params.get('port') or 5432}/{params['dbname']}"
    assert start["level"] == "info" and start["logger"] == "toolrelay.worker"
    assert start["frozen_objects"] > 10_000  # startup's objects, out of the collector's way
    assert start["worker_id"].count(":") == 2  # host:pid:random
    assert (start["concurrency"], start["lease_seconds"]) == (3, 7.0)
    assert (start["pooler"], start["egress_guard"], start["credentials"]) == (
        "none", "on", "usable",
    )  # fmt: skip
    assert start["summary_interval"] == INTERVAL
    assert start["egress_allow"] == [
        "api.internal.example",
        "127.0.0.1/32",
        "10.9.0.0/16:8443@tool=x*",
    ]

    # The first summary within one interval (and some slack) of the start line.
    assert seen_at["worker_summary"] - seen_at["worker_start"] < INTERVAL + SLACK
    idle = next(line for line in lines if line.get("action") == "worker_summary")
    assert idle["message"].startswith("worker summary: claimed 0, completed 0, failed 0")
    assert (idle["claimed"], idle["in_flight"], idle["failed_by_code"]) == (0, 0, {})
    assert [line["action"] for line in lines][-1] == "worker_stop", stderr


def test_database_is_described_without_its_password() -> None:
    forms = [
        f"postgresql://app:{PASSWORD}@db.internal:6432/relay?sslmode=require",
        f"host=db.internal port=6432 dbname=relay user=app password={PASSWORD}",
    ]
    for url in forms:
        described = describe_database(url)
        assert described == {"database": "db.internal:6432/relay", "database_user": "app"}
    assert describe_database("postgresql:///relay")["database"] == "local socket:5432/relay"
    assert PASSWORD not in str(describe_database(f"postgresql://a:{PASSWORD}@[bad"))


# --- the summary's counts --------------------------------------------------------------------


@pytest.fixture
async def held_route(upstream: Upstream) -> AsyncIterator[asyncio.Event]:
    release = asyncio.Event()

    async def held(_: web.Request, _hit: int) -> web.Response:
        await release.wait()
        return web.json_response({"held": True})

    upstream.routes["/held"] = held
    yield release
    release.set()


async def test_summary_counts_what_happened_in_each_interval(
    registry: Registry,
    upstream: Upstream,
    fresh_url: str,
    captured: Captured,
    held_route: asyncio.Event,
) -> None:
    async def bad(_: web.Request, _hit: int) -> web.Response:
        return web.json_response({"error": "no"}, status=400)

    async def flaky(_: web.Request, hit: int) -> web.Response:
        if hit == 1:
            return web.json_response({"busy": True}, status=503, headers={"Retry-After": "0"})
        return web.json_response({"ok": True})

    upstream.routes |= {"/bad": bad, "/flaky": flaky}
    registry.create_agent("bot")
    calls: list[str] = []
    for key, endpoint, times in [
        ("ok", f"{upstream.base_url}/ok", 2),  # completed twice
        ("bad", f"{upstream.base_url}/bad", 1),  # failed: http_error
        ("flaky", f"{upstream.base_url}/flaky", 1),  # retried once, then completed
        ("blocked", "http://10.1.2.3/x", 1),  # failed: egress_blocked, nothing sent
        ("held", f"{upstream.base_url}/held", 1),  # in flight until released
    ]:
        add_tool(registry, key, endpoint_url=endpoint)
        registry.assign("bot", key)
        calls += [registry.invoke("bot", key, {}) for _ in range(times)]

    settings = WorkerSettings(concurrency=16, lease_seconds=5.0, summary_interval=INTERVAL)
    worker = Worker(fresh_url, settings, None, LOOPBACK_ONLY)
    started = time.monotonic()
    task = asyncio.create_task(worker.run())

    async def summary_where(check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        async with asyncio.timeout(WAIT):
            while True:
                found = [s for s in captured.actions("worker_summary") if check(s)]
                if found:
                    return found[0]
                await asyncio.sleep(0.02)

    try:
        first = await summary_where(lambda _: True)
        assert time.monotonic() - started < INTERVAL + SLACK
        holding = await summary_where(lambda s: s["in_flight"] == 1)  # the held call
        held_route.set()
        async with asyncio.timeout(WAIT):
            while any(registry.get_invocation(i)["status"] == "running" for i in calls):
                await asyncio.sleep(0.02)
        done = datetime.now(UTC).isoformat()
        after = await summary_where(lambda s: s["time"] > done)
    finally:
        worker.stop()
        await asyncio.wait_for(task, WAIT)
    assert first["time"] <= holding["time"] < after["time"]
    assert after["in_flight"] == 0

    summaries = captured.actions("worker_summary") + captured.actions("worker_stop")
    assert all(s["seconds"] < INTERVAL + SLACK for s in summaries[:-1])
    total: Counter[str] = Counter()
    by_code: Counter[str] = Counter()
    for s in summaries:
        total.update({k: s[k] for k in ("claimed", "completed", "failed", "retried",
                                        "lost_leases", "returned_to_approval", "expired")})  # fmt: skip
        by_code.update(s["failed_by_code"])
    assert dict(total) == {
        "claimed": 7,  # six calls, the flaky one twice
        "completed": 4,
        "failed": 2,
        "retried": 1,
        "lost_leases": 0,
        "returned_to_approval": 0,
        "expired": 0,
    }
    assert by_code == {"http_error": 1, "egress_blocked": 1}
    assert {registry.get_invocation(i)["status"] for i in calls} == {"completed", "failed"}
    failing = next(s for s in summaries if s["failed"])
    assert "failed " in failing["message"] and "http_error" in json.dumps(summaries)


# --- tools the allow-list will refuse -------------------------------------------------------


async def test_warns_at_start_about_active_tools_the_allow_list_refuses(
    registry: Registry, upstream: Upstream, fresh_url: str, captured: Captured
) -> None:
    tools = {
        "private.tool": "http://10.1.2.3/x",
        "loopback.tool": f"{upstream.base_url}/never",  # a live server: nothing may reach it
        "localhost.tool": "http://localhost:8080/x",  # judged without a lookup
        "scoped.tool": "http://10.1.2.4/x",  # the entry for it is scoped to other tools
        "allowed.tool": "http://127.0.0.2/x",  # let through by its entry
        "public.tool": "https://8.8.8.8/x",  # public: nothing to say
        "disabled.tool": "http://10.1.2.5/x",  # not active: not checked
    }
    for key, endpoint in tools.items():
        add_tool(registry, key, endpoint_url=endpoint)
    registry.set_tool_status("disabled.tool", "disabled")
    policy = EgressPolicy.from_env({"TOOLRELAY_EGRESS_ALLOW": "127.0.0.2,10.1.2.4@tool=other.*"})

    worker = Worker(fresh_url, WorkerSettings(drain=True), None, policy)
    await asyncio.wait_for(worker.run(), WAIT)

    warned = {w["tool"]: w for w in captured.actions("tool_unreachable")}
    assert set(warned) == {"private.tool", "loopback.tool", "localhost.tool", "scoped.tool"}
    assert all(
        w["level"] == "warning" and w["owner"] == str(registry.owner) for w in warned.values()
    )
    assert "10.1.2.3 is not public (private)" in warned["private.tool"]["reason"]
    assert "127.0.0.1 is not public (loopback)" in warned["loopback.tool"]["reason"]
    assert "localhost resolves to 127.0.0.1 (loopback)" in warned["localhost.tool"]["reason"]
    assert "is not for tool scoped.tool" in warned["scoped.tool"]["reason"]
    for key, w in warned.items():  # one line a person can act on: the tool, then why
        assert w["message"] == (
            f"tool {key}: the egress allow-list will refuse its calls: {w['reason']}"
        )
    assert not captured.actions("tool_unchecked")  # literals and localhost: no lookups
    assert sum(upstream.hits.values()) == 0  # checking sent nothing


def test_broad_allow_entries_are_named_with_why() -> None:
    allow = ("0.0.0.0/0, 169.254.0.0/16:80@tool=probe.*, 10.0.0.0/8, 127.0.0.1,"
             " fd00::/8, 2a00::/16, api.internal.example")  # fmt: skip
    found = dict(broad_entries(EgressPolicy.from_env({ALLOW_ENV: allow})))
    assert set(found) == {"0.0.0.0/0", "169.254.0.0/16:80@tool=probe.*", "fd00::/8", "2a00::/16"}
    assert "cloud metadata address 169.254.169.254" in found["0.0.0.0/0"]
    assert "cloud metadata address 169.254.169.254" in found["169.254.0.0/16:80@tool=probe.*"]
    assert "cloud metadata address fd00:ec2::254" in found["fd00::/8"]
    assert "a /16 opens" in found["2a00::/16"] and "mostly off" in found["2a00::/16"]
    assert broad_entries(EgressPolicy.from_env({ALLOW_ENV: "10.0.0.0/8, 127.0.0.1"})) == []


async def test_warns_at_start_about_broad_allow_entries(fresh_url: str, captured: Captured) -> None:
    """A tired operator's `TOOLRELAY_EGRESS_ALLOW=0.0.0.0/0` ("make it work") turns the guard
    off for everything, the cloud metadata service included: the worker says so at start."""
    policy = EgressPolicy.from_env({ALLOW_ENV: "0.0.0.0/0, 10.20.0.0/16"})
    worker = Worker(fresh_url, WorkerSettings(drain=True), None, policy)
    await asyncio.wait_for(worker.run(), WAIT)
    [warned] = captured.actions("egress_allow_broad")
    assert (warned["level"], warned["entry"]) == ("warning", "0.0.0.0/0")
    assert warned["message"].startswith(f"{ALLOW_ENV} entry '0.0.0.0/0': it lets tool calls")
    assert "169.254.169.254" in warned["reason"]

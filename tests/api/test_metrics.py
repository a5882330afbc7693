"""`toolrelay serve` for operators: /metrics in Prometheus' text format (the in-process
worker's counters and the pending-approvals gauge), and every log line — uvicorn's and
psycopg's included — one JSON object, with no query strings (issue 13, item 8)."""

from __future__ import annotations

import base64
import io
import json
import logging
import math
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.api.conftest import settings
from tests.api.servers import serve_app
from tests.dispatch.upstream import Upstream
from tests.pgtest import create_database, drop_database
from tests.registry.helpers import add_tool
from toolrelay import logs
from toolrelay.api import create_app
from toolrelay.api.operations import client_allowed, metrics_networks
from toolrelay.credentials import Keyring
from toolrelay.db import Database, migrate
from toolrelay.errors import ConfigurationError
from toolrelay.registry import Registry

ROOT = Path(__file__).resolve().parents[2]
WAIT = 30.0  # seconds: an upper bound for what takes well under one
SECRET = "q-s3cret-value"  # sent only in query strings: must never reach a log line

# --- Prometheus' text exposition format, checked line by line --------------------------------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
_SAMPLE = re.compile(
    rf"^(?P<name>{_NAME})(?:\{{(?P<labels>(?:{_LABEL})(?:,{_LABEL})*,?)?\}})?"
    r" (?P<value>\S+)(?: -?\d+)?$"
)
_TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count", "")}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse_prometheus(text: str) -> Samples:
    """Every sample by (name, labels); fails on anything the text format does not allow."""
    assert text.endswith("\n")
    types: dict[str, str] = {}
    samples: Samples = {}
    done: set[str] = set()  # families whose samples are over: each family is one block
    current: str | None = None
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                assert re.fullmatch(_NAME, parts[2]), line
                if parts[1] == "TYPE":
                    assert parts[2] not in types and parts[3] in _TYPES, line
                    types[parts[2]] = parts[3]
            continue
        assert line.strip(), "no blank lines"
        match = _SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name = match["name"]
        family = next(
            (f for f, t in types.items()
             if name == f or any(name == f + s for s in _SUFFIXES.get(t, ()))),
            name,
        )  # fmt: skip
        assert family in types, f"{name} has no TYPE line before it"
        if family != current:
            assert family not in done, f"{family}'s samples are not together"
            if current is not None:
                done.add(current)
            current = family
        value = match["value"]
        number = float(value)  # also +Inf, -Inf, NaN
        assert not math.isnan(number) or value == "NaN"
        labels = frozenset(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"',
                                      match["labels"] or ""))  # fmt: skip
        assert (name, labels) not in samples, f"duplicate sample {line!r}"
        samples[(name, labels)] = number
    try:  # the reference parser too, where it is installed
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        return samples
    parsed = {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    assert parsed.keys() >= {k for k in samples if not k[0].endswith("_created")}
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


# --- a server of its own, on a database of its own --------------------------------------------


@pytest.fixture(scope="module")
def fresh_url(admin_url: str) -> Iterator[str]:
    """The pending gauge counts every owner's calls: only this module's may be there."""
    url = create_database(admin_url, prefix="toolrelay_metrics")
    migrate(url)
    yield url
    drop_database(admin_url, url)


@pytest.fixture(scope="module")
def metrics_api(fresh_url: str, keyring: Keyring) -> Iterator[str]:
    with serve_app(create_app(settings(fresh_url, keyring))) as url:
        yield url


def pending_calls(db: Database, count: int) -> list[uuid.UUID]:
    """``count`` calls of a gated tool, for a new owner: each waits for a decision."""
    registry = Registry(db, uuid.uuid4())
    add_tool(registry, "gated", requires_approval=True)
    registry.create_agent("bot")
    registry.assign("bot", "gated")
    calls = [registry.invoke("bot", "gated", {}) for _ in range(count)]
    assert {registry.get_invocation(c)["status"] for c in calls} == {"pending"}
    return calls


def test_metrics_reports_worker_counters_and_pending_approvals(
    metrics_api: str, fresh_url: str, upstream: Upstream
) -> None:
    db = Database(fresh_url)
    pending_calls(db, 2)
    pending_calls(db, 1)  # another owner: the gauge covers all of them
    expired = pending_calls(db, 1)  # pending, but its window closed before any sweep
    with psycopg.connect(fresh_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE agents.tool_invocations SET approval_expires_at = now() - interval '1 s'"
            " WHERE id = %s",
            (expired[0],),
        )
    runner = Registry(db, uuid.uuid4())  # one call the in-process worker completes
    add_tool(runner, "echo", endpoint_url=f"{upstream.base_url}/echo")
    runner.create_agent("bot")
    runner.assign("bot", "echo")
    done = runner.invoke("bot", "echo", {})
    deadline = time.monotonic() + WAIT
    while runner.get_invocation(done)["status"] != "completed":
        assert time.monotonic() < deadline
        time.sleep(0.05)

    with httpx.Client(base_url=metrics_api, timeout=WAIT) as http:
        answer = http.get("/metrics")
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
        samples = parse_prometheus(answer.text)
        assert value(samples, "toolrelay_pending_approvals") == 3
        assert value(samples, "toolrelay_database_up") == 1
        completed = value(samples, "toolrelay_invocations_total", status="completed", error_code="")
        assert completed >= 1
        assert value(samples, "toolrelay_claimed_total") >= 1
        assert value(samples, "toolrelay_in_flight") == 0
        assert value(samples, "toolrelay_attempt_seconds_count") >= 1
        assert value(samples, "toolrelay_attempt_seconds_bucket", le="+Inf") >= 1

        # Read at scrape time, but cached briefly: a scrape storm is one query per window.
        pending_calls(db, 1)
        again = parse_prometheus(http.get("/metrics").text)
        assert value(again, "toolrelay_pending_approvals") == 3


def test_metrics_answers_only_loopback_unless_configured(metrics_api: str) -> None:
    # uvicorn trusts X-Forwarded-For from loopback here: the client is then 203.0.113.9.
    with httpx.Client(base_url=metrics_api, timeout=WAIT) as http:
        refused = http.get("/metrics", headers={"X-Forwarded-For": "203.0.113.9"})
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "permission_denied"
        assert "TOOLRELAY_METRICS_ALLOW" in refused.json()["error"]["message"]
        assert http.get("/healthz", headers={"X-Forwarded-For": "203.0.113.9"}).status_code in (
            200,
            503,
        )

    default = metrics_networks({})
    assert client_allowed("127.0.0.1", default) and client_allowed("::1", default)
    assert client_allowed("::ffff:127.0.0.1", default)
    assert not client_allowed("10.1.2.3", default) and not client_allowed(None, default)
    assert not client_allowed("testclient", default)
    wider = metrics_networks({"TOOLRELAY_METRICS_ALLOW": "10.0.0.0/8, 2001:db8::/32"})
    assert client_allowed("10.1.2.3", wider) and client_allowed("2001:db8::5", wider)
    assert not client_allowed("192.0.2.1", wider)
    with pytest.raises(ConfigurationError, match="TOOLRELAY_METRICS_ALLOW"):
        metrics_networks({"TOOLRELAY_METRICS_ALLOW": "10.0.0.0/33"})


# --- the log lines of `toolrelay serve` itself ----------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_logs_json_lines_only_and_no_query_strings(fresh_url: str, tmp_path: Path) -> None:
    port = free_port()
    key = base64.b64encode(secrets.token_bytes(32)).decode()
    env = os.environ | {
        "DATABASE_URL": fresh_url,
        "TOOLRELAY_HOME": str(tmp_path),
        "TOOLRELAY_MASTER_KEY": f"serve:{key}",
        "TOOLRELAY_EGRESS_ALLOW": "",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolrelay.cli", "serve", "--port", str(port)],
        env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=WAIT) as http:
            deadline = time.monotonic() + WAIT
            while True:
                try:
                    if http.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
            scraped = http.get("/metrics", params={"token": SECRET})
            assert scraped.status_code == 200
            assert value(parse_prometheus(scraped.text), "toolrelay_database_up") == 1
            assert http.get("/v1/tools", params={"api_key": SECRET}).status_code == 401
            assert http.get(f"/nowhere?{SECRET}").status_code == 404
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    stderr = err.decode()
    assert proc.returncode == 0, stderr
    assert SECRET not in stderr and "\x1b[" not in stderr  # no query strings, no colours
    lines = [json.loads(line) for line in stderr.splitlines() if line.strip()]  # all JSON

    by_logger = {line["logger"] for line in lines}
    assert {"uvicorn.error", "uvicorn.access", "toolrelay.worker"} <= by_logger, by_logger
    assert any(line["message"].startswith("Uvicorn running on") for line in lines)
    [start] = [line for line in lines if line.get("action") == "worker_start"]  # in-process
    # serve froze what its startup made before serving (toolrelay/heap.py): tens of thousands
    assert start["frozen_objects"] > 10_000, start
    access = [line for line in lines if line["logger"] == "uvicorn.access"]
    assert all(line.get("action") == "http_request" for line in access), access  # ours only
    requests = {(line["method"], line["path"], line["status"]) for line in access}
    assert {
        ("GET", "/metrics", 200),
        ("GET", "/v1/tools", 401),
        ("GET", "/nowhere", 404),
    } <= requests
    for line in access:
        assert "?" not in line["path"] and "?" not in line["message"]
        assert isinstance(line["duration_ms"], float) and line["duration_ms"] >= 0
        assert line["client"] == "127.0.0.1"
        assert line["message"] == f"{line['method']} {line['path']} {line['status']}"


# --- the libraries' loggers, through logs.configure -----------------------------------------


@pytest.fixture
def configured() -> Iterator[io.StringIO]:
    """A buffer for logs.configure; every logger it touches is put back afterwards."""
    names = ["toolrelay", "uvicorn", "uvicorn.error", "uvicorn.access", "psycopg"]
    saved: dict[str, Any] = {}
    for name in names:
        logger = logging.getLogger(name)
        saved[name] = (logger.handlers[:], logger.level, logger.propagate, logger.filters[:])
    yield io.StringIO()
    for name, (handlers, level, propagate, filters) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers[:], logger.propagate, logger.filters[:] = handlers, propagate, filters
        logger.setLevel(level)


def test_configure_gives_libraries_our_json_format(configured: io.StringIO) -> None:
    logs.configure("INFO", stream=configured)
    logging.getLogger("psycopg.pool").warning("error connecting in %r: %s", "pool-1", "refused")
    logging.getLogger("psycopg.pool").info("connection given by %r", "pool-1")  # too chatty
    logging.getLogger("uvicorn.error").info(
        "Started server process [%d]", 42, extra={"color_message": "\x1b[36m42\x1b[0m"}
    )
    # uvicorn's own access line (query string, no duration) is dropped; the app writes its own.
    logging.getLogger("uvicorn.access").info(
        '%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", f"/x?k={SECRET}", "1.1", 200
    )
    logging.getLogger("toolrelay.worker").debug("not at INFO")
    lines = [json.loads(line) for line in configured.getvalue().splitlines()]
    assert [(line["logger"], line["level"], line["message"]) for line in lines] == [
        ("psycopg.pool", "warning", "error connecting in 'pool-1': refused"),
        ("uvicorn.error", "info", "Started server process [42]"),
    ]
    assert "color_message" not in lines[1]

    logs.configure(
        "DEBUG", stream=configured
    )  # again: handlers replaced, not added; psycopg's detail shown
    configured.truncate(0)
    configured.seek(0)
    logging.getLogger("psycopg.pool").info("connection given by %r", "pool-1")
    assert len(configured.getvalue().splitlines()) == 1

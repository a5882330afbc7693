"""Databases for one run, the tool under test, and invocations created as the owner does.

Every entry point gets its PostgreSQL server and scratch databases from ``scratch_server``
(DATABASE_URL's server, else an embedded one) and its owner, agent and tool from
``provision``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
from psycopg import conninfo
from psycopg.rows import dict_row

from bench.constants import (
    AGENT_NAME,
    API_KEY_HEADER,
    API_KEY_PREFIX,
    API_KEY_SECRET,
    DB_PREFIX,
    ENQUEUE_CHUNK,
    PROCESS_START_TIMEOUT_S,
    READ_TOOL_KEY,
    TOOL_KEY,
    WORKER_READY_POLL_S,
)
from bench.procs import Child, parent_pid
from toolrelay.credentials import CredentialStore, Keyring, generate_master_key
from toolrelay.db import Database, migrate
from toolrelay.db.connect import owner_identity
from toolrelay.registry import Registry, ToolSpec

TERMINAL = ("completed", "failed", "rejected", "expired")
INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0}},
    "required": ["n"],
}
ENQUEUE_SQL = (
    "SELECT count(fn_invoke_tool(%(agent)s, %(tool)s, jsonb_build_object('n', g))) AS n"
    " FROM generate_series(%(start)s::int, %(stop)s::int) AS g"
)
# toolrelay.db.connect's identity (owner_identity), for a whole session instead of a transaction
SESSION_IDENTITY_SQL = (
    "SELECT set_config('role', %s, false),"
    " set_config('request.jwt.claim.sub', %s, false),"
    " set_config('request.jwt.claims', %s, false)"
)


EMBEDDED_STOP_TIMEOUT_S = 10.0


def server_admin_url(scratch: Path) -> tuple[str, str, Callable[[], None]]:
    """(admin URL, where it came from, how to stop it): DATABASE_URL's server, else an
    embedded one under ``scratch`` that the returned callable stops (before scratch goes)."""
    url = os.environ.get("DATABASE_URL", "").strip()
    if url:
        return url, "DATABASE_URL", lambda: None
    return embedded_server(scratch)


def embedded_server(scratch: Path) -> tuple[str, str, Callable[[], None]]:
    """An embedded server with its data under ``scratch``/pgdata: (admin URL, where it came
    from, how to stop it, postmaster and all, before scratch goes)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver

        server = pgserver.get_server(  # type: ignore[attr-defined]
            scratch / "pgdata", cleanup_mode="stop"
        )

    def stop() -> None:
        pid = server.get_pid()
        with contextlib.suppress(Exception):
            server.cleanup()
        if pid and _alive(pid):  # pgserver may decline: stop the postmaster ourselves
            os.kill(pid, signal.SIGINT)  # PostgreSQL's fast shutdown
            deadline = time.monotonic() + EMBEDDED_STOP_TIMEOUT_S
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)

    return str(server.get_uri()), "embedded (pgserver)", stop


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def create_database(admin_url: str, label: str) -> str:
    name = f"{DB_PREFIX}_{label}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return conninfo.make_conninfo(admin_url, dbname=name)


def drop_database(admin_url: str, url: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname(url)}" WITH (FORCE)')


@dataclass
class Server:
    """One run's PostgreSQL server, its scratch directory and the databases made on it."""

    admin_url: str
    source: str  # "DATABASE_URL" or "embedded (pgserver)"
    scratch: Path
    databases: list[str] = field(default_factory=list)

    def database(self, label: str) -> str:
        """A fresh database, dropped when the run ends; its URL."""
        url = create_database(self.admin_url, label)
        self.databases.append(url)
        return url


@contextmanager
def scratch_server(
    prefix: str, say: Callable[[str], None] = print, keep: bool = False
) -> Iterator[Server]:
    """A scratch directory and a server for one run. At the end, also after a failure, the
    databases are dropped and an embedded server stopped, each step whatever the others did;
    the directory is removed unless the run failed or ``keep`` (then its path is said)."""
    scratch = Path(tempfile.mkdtemp(prefix=prefix))
    scratch.chmod(0o755)  # an embedded server runs as its own user and must reach it
    admin_url, source, stop_server = server_admin_url(scratch)
    server = Server(admin_url, source, scratch)
    ok = False
    try:
        yield server
        ok = True
    finally:
        steps: list[Callable[[], object]] = [
            functools.partial(drop_database, admin_url, url) for url in server.databases
        ]
        for step in [*steps, stop_server]:
            try:
                step()
            except Exception as exc:
                say(f"cleanup failed: {exc!r}")
        if ok and not keep:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            say(f"scratch directory kept: {scratch}")


def dbname(url: str) -> str:
    return str(conninfo.conninfo_to_dict(url)["dbname"])


def postmaster_of(url: str) -> int | None:
    """The PostgreSQL server's main process, when it runs on this machine and is visible."""
    with psycopg.connect(url) as conn:  # its parent read while it lives: it exits after
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        return parent_pid(row[0]) if row else None


def server_version(url: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "?"


@dataclass(frozen=True)
class Fixture:
    """One owner, one agent, one ungated POST tool with an api_key credential, and its GET
    twin (``READ_TOOL_KEY``: the same upstream and credential, ``n`` in the query)."""

    url: str
    owner: UUID
    agent_id: UUID
    tool_id: UUID
    master_key: str

    @property
    def db(self) -> Database:
        return Database(self.url)


def provision(url: str, upstream_url: str) -> Fixture:
    migrate(url)
    master_key = generate_master_key()
    db = Database(url)
    owner = uuid.uuid4()
    cred = CredentialStore(db, Keyring.parse(master_key)).add(
        owner, "api_key", "bench", API_KEY_SECRET
    )
    registry = Registry(db, owner)
    agent_id = registry.create_agent(AGENT_NAME)
    ids = {}
    for key, method, place in ((TOOL_KEY, "POST", "body"), (READ_TOOL_KEY, "GET", "query")):
        spec = ToolSpec(
            key=key,
            name=f"Benchmark {method}",
            endpoint_url=upstream_url,
            http_method=method,
            egress_class="read_only",  # not gated: runnable as soon as invoked
            schema_input=INPUT_SCHEMA,
            request_template={place: {"n": "{{input.n}}"}},
            auth_method="api_key",
            credential_ref=cred,
            auth_param_name=API_KEY_HEADER,
            auth_param_prefix=API_KEY_PREFIX,
        )
        ids[key] = UUID(str(registry.register_tool(spec)["id"]))
        registry.assign(AGENT_NAME, key)
    return Fixture(url, owner, agent_id, ids[TOOL_KEY], master_key)


def enqueue(fx: Fixture, n: int) -> None:
    """Create ``n`` invocations through fn_invoke_tool, as the owner, ENQUEUE_CHUNK per
    statement."""
    for start in range(1, n + 1, ENQUEUE_CHUNK):
        stop = min(start + ENQUEUE_CHUNK, n + 1) - 1
        with fx.db.as_owner(fx.owner) as conn:
            params = {"agent": fx.agent_id, "tool": fx.tool_id, "start": start, "stop": stop}
            conn.execute(ENQUEUE_SQL, params)


def act_as_owner(conn: psycopg.Connection[Any], owner: UUID) -> None:
    """``conn``, for the rest of its session, as the API's owner role for ``owner``."""
    conn.execute(SESSION_IDENTITY_SQL, owner_identity(owner))


@contextmanager
def admin(url: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    """Superuser, autocommit: bookkeeping the harness does between phases."""
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        yield conn


def wait_until(
    url: str,
    query: str,
    ready: Callable[[dict[str, Any]], bool],
    what: str,
    timeout: float = PROCESS_START_TIMEOUT_S,
    watch: Sequence[Child] = (),
) -> None:
    """Poll ``query`` until ``ready`` accepts its row: a fresh connection each time (so a
    fresh snapshot: pg_stat_activity is cached per transaction). RuntimeError when a child
    in ``watch`` exits first, TimeoutError("``what`` ...") after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in watch:
            if child.poll() is not None:
                raise RuntimeError(f"{child.name} exited early:\n{child.tail()}")
        with admin(url) as conn:
            row = conn.execute(query).fetchone()
        if row is not None and ready(row):
            return
        time.sleep(WORKER_READY_POLL_S)
    raise TimeoutError(f"{what} within {timeout:g} s")


def clear_invocations(url: str) -> None:
    """Start a phase from an empty queue and fresh statistics."""
    with admin(url) as conn:
        conn.execute("TRUNCATE agents.tool_invocations CASCADE")
        conn.execute("VACUUM ANALYZE agents.tool_invocations")
        conn.execute("VACUUM ANALYZE agents.tool_invocation_attempts")


@dataclass
class DrainStats:
    """What the database says about the invocations of one phase."""

    total: int
    by_status: dict[str, int]
    first_start: float  # epoch seconds: earliest attempt started_at
    last_finish: float  # epoch seconds: latest invocation finished_at
    attempts: int

    @property
    def non_terminal(self) -> int:
        return sum(v for k, v in self.by_status.items() if status_of(k) not in TERMINAL)

    @property
    def not_completed(self) -> int:
        return self.total - self.by_status.get("completed", 0)


def drain_stats(url: str) -> DrainStats:
    with admin(url) as conn:
        rows = conn.execute(
            "SELECT status || coalesce('/' || error_code, '') AS status, count(*) AS n"
            " FROM agents.tool_invocations GROUP BY 1"
        ).fetchall()
        window = conn.execute(
            "SELECT extract(epoch FROM (SELECT min(started_at)"
            "   FROM agents.tool_invocation_attempts))::float8 AS first_start,"
            " extract(epoch FROM (SELECT max(finished_at)"
            "   FROM agents.tool_invocations))::float8 AS last_finish,"
            " (SELECT count(*) FROM agents.tool_invocation_attempts) AS attempts"
        ).fetchone()
    by_status = {r["status"]: int(r["n"]) for r in rows}
    assert window is not None
    return DrainStats(
        total=sum(by_status.values()),
        by_status=by_status,
        first_start=float(window["first_start"] or 0.0),
        last_finish=float(window["last_finish"] or 0.0),
        attempts=int(window["attempts"]),
    )


def invocation_times(url: str, ids: list[str]) -> dict[str, tuple[float, float | None, str]]:
    """id -> (created_at, finished_at, outcome), as epoch seconds; outcome is the status,
    with the error code after a slash when there is one (``failed/timeout``)."""
    with admin(url) as conn:
        rows = conn.execute(
            "SELECT id::text AS id, extract(epoch FROM created_at)::float8 AS created,"
            " extract(epoch FROM finished_at)::float8 AS finished,"
            " status || coalesce('/' || error_code, '') AS outcome"
            " FROM agents.tool_invocations WHERE id = ANY(%s::uuid[])",
            (ids,),
        ).fetchall()
    return {r["id"]: (r["created"], r["finished"], r["outcome"]) for r in rows}


def status_of(outcome: str) -> str:
    return outcome.split("/", 1)[0]

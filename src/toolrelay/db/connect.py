"""Connections, with the caller's identity set per transaction (Supabase's convention)."""

from __future__ import annotations

import json
import select
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from uuid import UUID

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from toolrelay import config
from toolrelay.db.embedded import embedded_url
from toolrelay.db.errors import check_url, storable_text

if TYPE_CHECKING:
    from toolrelay.db.aio import AsyncTrips

Row = dict[str, Any]
Query = tuple[str, Mapping[str, Any]]  # SQL and its named parameters

OWNER_ROLE = "authenticated"
DISPATCHER_ROLE = "service_role"

_SET_IDENTITY = (
    "SELECT set_config('role', %s, true),"
    " set_config('request.jwt.claim.sub', %s, true),"
    " set_config('request.jwt.claims', %s, true)"
)
# The same as utility statements, for a string bound client-side (Trips): no statement to
# parse, plan and run, so a third of the cost (~35 k instructions in PostgreSQL instead of
# ~100 k, bench/instructions.py); SET takes no server-side parameter, hence the other form.
_SET_IDENTITY_LOCAL = (
    "SET LOCAL role = %s; SET LOCAL request.jwt.claim.sub = %s; SET LOCAL request.jwt.claims = %s"
)


def resolve_database_url() -> str:
    """DATABASE_URL as given (any libpq form), else the embedded server's."""
    url = config.database_url_from_env()
    if url is None:
        return embedded_url(config.home())
    check_url(url)
    return url


POOL_MAX = 8  # connections per Database (per process) for owner and dispatcher transactions
POOL_MAX_IDLE = 60.0  # seconds an idle pooled connection is kept
POOL_TIMEOUT = 30.0  # seconds to wait for a pooled connection (the API uses less)


class _Broken(Exception):
    """The pooled connection was dead before the transaction did anything: use another."""


class Database:
    """Transactions on one database, each stating who is acting, over a small pool.

    Identity is set per transaction (``set_config(..., true)``), so pooled connections carry
    no caller's state, and no server-side prepared statements are used: the same code is
    safe behind PgBouncer in transaction mode.
    """

    def __init__(
        self, url: str | None = None, pool_size: int = POOL_MAX, timeout: float = POOL_TIMEOUT
    ) -> None:
        self.url = url or resolve_database_url()
        self._pool_size = pool_size
        self._timeout = timeout  # seconds to wait for a connection before giving up
        self._pool: ConnectionPool[psycopg.Connection[Row]] | None = None
        self._lock = threading.Lock()
        self._async: AsyncTrips | None = None

    async def trip(
        self, identity: Identity, queries: Sequence[Query], *, retry: bool = True
    ) -> list[list[Row]]:
        """``Trips.run`` from the event loop, on a pool of the running loop (db/aio.py)."""
        if self._async is None:
            from toolrelay.db.aio import AsyncTrips  # it imports this module

            self._async = AsyncTrips(self.url, self._pool_size, self._timeout, POOL_MAX_IDLE)
        with storable_text():
            return await self._async.run(identity, queries, retry=retry)

    async def aclose(self) -> None:
        """Close the running event loop's pool of ``trip``, if it has one."""
        if self._async is not None:
            await self._async.close()

    def connect(self, autocommit: bool = False) -> psycopg.Connection[Row]:
        """A new connection of its own (not pooled), for callers that manage it."""
        return psycopg.connect(self.url, autocommit=autocommit, row_factory=dict_row)

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None

    def _get_pool(self) -> ConnectionPool[psycopg.Connection[Row]]:
        with self._lock:
            if self._pool is None:
                pool: ConnectionPool[psycopg.Connection[Row]] = ConnectionPool(
                    self.url,
                    min_size=0,
                    max_size=self._pool_size,
                    max_idle=POOL_MAX_IDLE,
                    timeout=self._timeout,
                    kwargs={"row_factory": dict_row, "prepare_threshold": None},
                    open=True,
                    name="toolrelay",
                )
                self._pool = pool
                weakref.finalize(self, pool.close)
            return self._pool

    @contextmanager
    def _transaction(
        self, role: str, sub: str, claims: str, first: Query | None = None
    ) -> Iterator[tuple[psycopg.Connection[Row], Row | None]]:
        # A pooled connection may have died (a database restart): the first round trip
        # tells, before anything was done, so one retry on a fresh connection is safe.
        for attempt in range(2):
            try:
                with storable_text(), self._connection() as conn:
                    try:
                        row = _begin(conn, (role, sub, claims), first)
                    except psycopg.OperationalError:
                        if attempt:
                            raise
                        raise _Broken() from None
                    yield conn, row  # the pool commits on success, rolls back on error
                    return
            except _Broken:
                continue

    def ping(self) -> bool:
        """Whether the database answers now (within the pool timeout)."""
        try:
            with self._connection() as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def _getconn(
        self,
    ) -> tuple[ConnectionPool[psycopg.Connection[Row]], psycopg.Connection[Row]]:
        pool = self._get_pool()
        try:
            return pool, pool.getconn()
        except PoolTimeout:
            # The database is gone: the pool would retry with a growing backoff and answer
            # late once it is back. A fresh pool connects on the next request instead.
            self.close()
            raise

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Row]]:
        pool, conn = self._getconn()
        try:
            with conn:  # commit on success, roll back on error (the pool's own behaviour)
                yield conn
        finally:
            pool.putconn(conn)

    @contextmanager
    def as_owner(
        self,
        owner: UUID | str,
        agent_id: UUID | str | None = None,
        member_id: UUID | str | None = None,
    ) -> Iterator[psycopg.Connection[Row]]:
        """A transaction run as role ``authenticated`` for ``owner`` (the tenant) and,
        optionally, one of its agents or members."""
        with self._transaction(*owner_identity(owner, agent_id, member_id)) as (conn, _):
            yield conn

    @contextmanager
    def trips(self) -> Iterator[Trips]:
        """One pooled connection for transactions of one round trip each (``Trips.run``)."""
        trips = Trips(self)
        try:
            yield trips
        finally:
            trips.release()

    @contextmanager
    def as_owner_reading(
        self,
        owner: UUID | str,
        agent_id: UUID | str | None,
        first: Query,
        member_id: UUID | str | None = None,
    ) -> Iterator[tuple[psycopg.Connection[Row], Row | None]]:
        """``as_owner`` whose first read (its first row) comes back in the same round trip
        as BEGIN and the identity: a pipeline, so still no server-side prepared statement."""
        with self._transaction(*owner_identity(owner, agent_id, member_id), first) as pair:
            yield pair

    @contextmanager
    def as_dispatcher(self) -> Iterator[psycopg.Connection[Row]]:
        """A transaction run as role ``service_role``, the only one that reads ciphertext."""
        with self._transaction(DISPATCHER_ROLE, "", "") as (conn, _):
            yield conn


Identity = tuple[str, str, str]  # role, auth.uid(), the JWT claims (JSON)
DISPATCHER: Identity = (DISPATCHER_ROLE, "", "")


def owner_identity(
    owner: UUID | str, agent_id: UUID | str | None = None, member_id: UUID | str | None = None
) -> Identity:
    """The tenant ``owner``, as one of its agents or members when given (the database reads
    a member's role from agents.members on every check: migration 0025)."""
    claims: dict[str, str] = {"sub": str(owner), "role": OWNER_ROLE}
    if agent_id is not None:
        claims["agent_id"] = str(agent_id)
    if member_id is not None:
        claims["member_id"] = str(member_id)
    return OWNER_ROLE, str(owner), json.dumps(claims)


class Trips:
    """Transactions of one round trip each, on one pooled connection (issue 14).

    BEGIN, the identity, the statements and COMMIT travel as one simple-query string, its
    parameters bound client-side by psycopg (its literal quoting; no server-side prepared
    statement, so PgBouncer in transaction mode is fine). Four statements cost one round
    trip instead of four: ~140 µs instead of ~350 µs here. Each ``run`` is its own
    transaction; a caller needing work between two statements (validation) runs two.
    """

    def __init__(self, db: Database) -> None:
        self._db = db
        self._pool: ConnectionPool[psycopg.Connection[Row]] | None = None
        self._conn: psycopg.Connection[Row] | None = None
        self._proven = False  # a trip succeeded on this connection: it is alive

    def run(
        self, identity: Identity, queries: Sequence[Query], *, retry: bool = True
    ) -> list[list[Row]]:
        """The rows of each query, in order, run in one transaction as ``identity``.

        A pooled connection the server closed while it sat idle (a restart) is seen before
        sending (its socket has something to read) and replaced. One that fails its first
        trip otherwise is tried once more on a fresh connection when ``retry`` (reads:
        give False for a trip that writes, which may have landed before the failure).
        Later trips are not retried (the connection was alive a moment ago)."""
        for attempt in range(2):
            conn = self._checkout()
            try:
                with storable_text():
                    return _one_trip(conn, identity, queries)
            except psycopg.OperationalError:
                if self._proven or attempt or not retry or not conn.closed:
                    raise
                self.release()
            finally:
                if not conn.closed:
                    self._proven = True
        raise AssertionError("unreachable")

    def _checkout(self) -> psycopg.Connection[Row]:
        while self._conn is None:
            self._pool, self._conn = self._db._getconn()
            if not self._proven and not quiet(self._conn):
                self._conn.close()  # closed by the server (it said so, or hung up): another
                self.release()
                continue
            self._conn.autocommit = True  # the string holds its own BEGIN and COMMIT
        return self._conn

    def release(self) -> None:
        pool, conn, self._conn = self._pool, self._conn, None
        if pool is None or conn is None:
            return
        if not conn.closed and conn.info.transaction_status != TransactionStatus.IDLE:
            conn.close()  # never back in the pool mid-transaction, nor left in autocommit
        if not conn.closed:
            conn.autocommit = False
        pool.putconn(conn)


def quiet(conn: psycopg.Connection[Row] | psycopg.AsyncConnection[Row]) -> bool:
    """Whether an idle connection has nothing to read: an idle server sends nothing (pooled
    connections do not LISTEN) unless it is closing the connection."""
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return False
    return not readable


def trip_string(
    cur: psycopg.ClientCursor[Row] | psycopg.AsyncClientCursor[Row],
    identity: Identity,
    queries: Sequence[Query],
) -> str:
    """BEGIN, the identity, the statements and COMMIT as one string, bound client-side."""
    parts = [cur.mogrify(_SET_IDENTITY_LOCAL, identity)]
    parts += [cur.mogrify(sql, params) for sql, params in queries]
    return "BEGIN; " + "; ".join(parts) + "; COMMIT"


def _one_trip(
    conn: psycopg.Connection[Row], identity: Identity, queries: Sequence[Query]
) -> list[list[Row]]:
    cur = psycopg.ClientCursor(conn, row_factory=dict_row)
    try:
        cur.execute(trip_string(cur, identity, queries))
    except psycopg.Error:
        if conn.info.transaction_status == TransactionStatus.INERROR:
            conn.execute("ROLLBACK")
        raise
    results: list[list[Row]] = []
    while True:
        if cur.description is not None:  # BEGIN, SET and COMMIT return no rows
            results.append(cur.fetchall())
        if not cur.nextset():
            break
    return results


def _begin(
    conn: psycopg.Connection[Row], identity: tuple[str, str, str], first: Query | None
) -> Row | None:
    """Set the identity (BEGIN goes with it) and, when given, run a first read with it."""
    if first is None:
        conn.execute(_SET_IDENTITY, identity)
        return None
    with conn.pipeline():
        conn.execute(_SET_IDENTITY, identity)
        cur = conn.execute(*first)
    return cur.fetchone()

"""The deliverer: sends due webhook deliveries, signed, through the egress guard.

It runs inside ``toolrelay worker`` (``run_in_worker``, a side task of the worker's loop)
on the worker's database pool, as the dispatcher. It keeps up to ``DELIVERY_BATCH``
deliveries in flight, at most ``PER_SUBSCRIPTION`` of one subscription (a slow receiver
holds no more than that, whoever else is waiting), claiming due rows (FOR UPDATE SKIP
LOCKED; the claim is a lease of ``DELIVERY_LEASE`` seconds) as slots free, and records
results in batches as they come. A failure is retried after an exponential backoff with
jitter; after the row's ``max_attempts`` it is dead (the dead letter). Delivery is at least
once: a deliverer that dies after sending leaves the row to be sent again with the same
``webhook-id``.

Every request goes through ``toolrelay.dispatch.http.send`` on a connector made by
``make_connector``: the egress guard of tool calls, outside a tool call (so only the
unscoped ``TOOLRELAY_EGRESS_ALLOW`` entries apply), redirects never followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import aiohttp
import psycopg
from psycopg import AsyncConnection
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from yarl import URL

from toolrelay.credentials import Keyring
from toolrelay.credentials.crypto import DataKeyUnopened
from toolrelay.credentials.resolve import key_opens_nothing, wrong_master_key
from toolrelay.db.queries import load
from toolrelay.dispatch.batcher import Batcher
from toolrelay.dispatch.egress import EgressPolicy, make_connector
from toolrelay.dispatch.http import SendFailure, SendSpec, outbound_session, send
from toolrelay.dispatch.metrics import family
from toolrelay.errors import ConfigurationError, EgressBlocked, ToolrelayError, UnknownMasterKey
from toolrelay.notify import payloads
from toolrelay.notify.signing import headers as signed_headers
from toolrelay.notify.subscriptions import HIDDEN, delivery_url, shown_url, unseal_secret

if TYPE_CHECKING:
    from toolrelay.dispatch.worker import Worker

log = logging.getLogger("toolrelay.notify")

Row = dict[str, Any]

DELIVERY_BATCH = 32  # deliveries in flight at once (and claimed by one deliver_once pass)
PER_SUBSCRIPTION = 4  # of them, to one subscription at most: a slow receiver holds no more
DELIVERY_LEASE = 60.0  # seconds a claimed row is held before it is due again
POLL_INTERVAL = 1.0  # seconds between looks for due deliveries when none were found
CONNECT_TIMEOUT = 5.0  # seconds
TOTAL_TIMEOUT = 15.0  # seconds for the whole exchange
MAX_RESPONSE_BYTES = 64 * 1024  # of the receiver's answer, read and dropped
BACKOFF_BASE = 30.0  # seconds before the second attempt
BACKOFF_FACTOR = 4.0  # each later wait is this many times the one before
BACKOFF_CAP = 8 * 3600.0  # seconds; no wait is longer (nor a Retry-After honoured past it)
BACKOFF_JITTER = 0.2  # up to this fraction is taken off each wait, at random
COUNTS_INTERVAL = 15.0  # seconds between reads of the pending/dead gauges
PRUNE_INTERVAL = 3600.0  # seconds between removals of old delivered rows
DELIVERED_RETENTION = 7 * 86400.0  # seconds a delivered row is kept
ERROR_CHARS = 300  # of a recorded error
KEYLESS_RETRY = 60.0  # seconds before a try this process could not sign is made again
ERROR_DELAY = 5.0  # seconds to wait after the database or a bug stopped a pass
USER_AGENT = "toolrelay-webhooks"


def backoff(attempts: int, rand: float | None = None) -> float:
    """Seconds to wait after failed attempt number ``attempts`` (1-based)."""
    wait = min(BACKOFF_CAP, BACKOFF_BASE * BACKOFF_FACTOR ** max(0, attempts - 1))
    return wait * (1 - BACKOFF_JITTER * (random.random() if rand is None else rand))


@dataclass
class Result:
    id: str
    attempts: int
    ok: bool
    status: int | None = None
    error: str | None = None
    retry_in: float = 0.0
    # Not an attempt: this process lacks the master key the secret is sealed with (a key
    # rotation half-way), so the try spends none of the delivery's attempts.
    uncounted: bool = False


class DeliveryMetrics:
    """Counters of this process's attempts, and gauges of the outbox (all owners)."""

    def __init__(self) -> None:
        self.delivered = 0
        self.failed = 0  # attempts that failed (retried later, or dead)
        self.died = 0  # deliveries that became dead letters here
        self.pending: int | None = None
        self.dead: int | None = None

    def lines(self) -> list[str]:
        lines = [
            *family(
                "toolrelay_webhook_attempts_total",
                "counter",
                "Webhook delivery attempts made by this process, by result.",
                [
                    f'toolrelay_webhook_attempts_total{{result="delivered"}} {self.delivered}',
                    f'toolrelay_webhook_attempts_total{{result="failed"}} {self.failed}',
                ],
            ),
            *family(
                "toolrelay_webhook_dead_letters_total",
                "counter",
                "Webhook deliveries this process gave up on after their last attempt.",
                [f"toolrelay_webhook_dead_letters_total {self.died}"],
            ),
        ]
        if self.pending is not None and self.dead is not None:
            lines += family(
                "toolrelay_webhook_deliveries",
                "gauge",
                "Webhook deliveries in the outbox, all owners: pending (to be sent) or dead.",
                [
                    f'toolrelay_webhook_deliveries{{state="pending"}} {self.pending}',
                    f'toolrelay_webhook_deliveries{{state="dead"}} {self.dead}',
                ],
            )
        return lines


class Deliverer:
    def __init__(
        self,
        pool: AsyncConnectionPool[AsyncConnection[Row]],
        keyring: Keyring | None,
        egress: EgressPolicy,
        session: aiohttp.ClientSession,
        *,
        public_url: str | None = None,
        metrics: DeliveryMetrics | None = None,
        batch: int = DELIVERY_BATCH,
    ) -> None:
        self.pool = pool
        self.keyring = keyring
        self.egress = egress
        self.session = session
        self.public_url = public_url
        self.metrics = metrics or DeliveryMetrics()
        self.batch = batch
        self.q = load("webhooks")

    async def deliver_once(self, now: datetime | None = None) -> int:
        """One pass (for tests; ``run`` keeps deliveries flowing): claim what is due at
        ``now`` (default: the database's clock), send it, record the results. Returns how
        many rows were claimed. ``now`` schedules retries too, so tests drive time with it;
        signatures always carry the real time."""
        rows = await self._claim(self.batch, {}, now)
        if not rows:
            return 0
        results = await asyncio.gather(*(self._attempt(row) for row in rows))
        await asyncio.shield(self._record(results, now))
        return len(rows)

    async def _claim(self, limit: int, busy: Mapping[str, int], now: datetime | None) -> list[Row]:
        """Up to ``limit`` due rows, each subscription within its room (``busy``: its
        deliveries in flight here)."""
        full = [sub for sub, n in busy.items() if n >= PER_SUBSCRIPTION]
        params = {"now": now, "limit": limit, "lease": DELIVERY_LEASE, "full": full,
                  "per_subscription": PER_SUBSCRIPTION, "busy": Jsonb(dict(busy))}  # fmt: skip
        async with self.pool.connection() as conn:
            return await (await conn.execute(self.q["claim"], params)).fetchall()

    async def refresh_counts(self) -> None:
        async with self.pool.connection() as conn:
            row = await (await conn.execute(self.q["counts"])).fetchone()
        if row is not None:
            self.metrics.pending, self.metrics.dead = int(row["pending"]), int(row["dead"])

    async def prune(self) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(self.q["prune"], {"seconds": DELIVERED_RETENTION})

    async def run(self, stopping: asyncio.Event) -> None:
        """Until ``stopping``: up to ``batch`` deliveries in flight, ``PER_SUBSCRIPTION`` of
        one subscription at most. A slot that frees is filled at once (one receiver taking
        its time holds back nobody else's deliveries); with nothing due, a poll."""
        recorder: Batcher[Result, None] = Batcher(self._record_all)
        flight: dict[asyncio.Task[None], str] = {}  # delivery -> its subscription
        counted = pruned = 0.0
        stop = asyncio.ensure_future(stopping.wait())
        try:
            while not stopping.is_set():
                free, filled = self.batch - len(flight), False
                busy = Counter(flight.values())
                try:
                    if time.monotonic() - counted > COUNTS_INTERVAL:
                        counted = time.monotonic()
                        await self.refresh_counts()
                    if time.monotonic() - pruned > PRUNE_INTERVAL:
                        pruned = time.monotonic()
                        await self.prune()
                    rows = await self._claim(free, busy, None) if free > 0 else []
                except (psycopg.Error, ToolrelayError) as exc:
                    log.warning(
                        "webhook deliveries could not be read",
                        extra={"action": "webhook_db_error", "error": str(exc)[:200]},
                    )
                    self.metrics.pending = self.metrics.dead = None
                    await _wait(stopping, ERROR_DELAY)
                    continue
                except Exception:  # a bug: say so, and keep delivering
                    log.exception("webhook delivery pass failed", extra={"action": "webhook_error"})
                    await _wait(stopping, ERROR_DELAY)
                    continue
                for row in rows:
                    sub = str(row["subscription_id"])
                    busy[sub] += 1
                    filled = filled or busy[sub] >= PER_SUBSCRIPTION
                    flight[asyncio.create_task(self._deliver(row, recorder))] = sub
                claimed = len(rows)
                # more may be due now: the claim was full, or stopped at a subscription's
                # room with other rows perhaps behind it
                if claimed and (claimed == free or filled):
                    continue
                await asyncio.wait({stop, *flight}, timeout=POLL_INTERVAL,
                                   return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
                for task in [t for t in flight if t.done()]:
                    del flight[task]
        finally:
            stop.cancel()
            try:  # what is in flight ends (each within TOTAL_TIMEOUT) and is recorded
                if flight:
                    await asyncio.wait(set(flight))
                await recorder.drain()
            except asyncio.CancelledError:  # not waited for: their leases run out, then
                for task in flight:  # they are sent again (at least once)
                    task.cancel()
                raise

    async def _deliver(self, row: Row, recorder: Batcher[Result, None]) -> None:
        result = await self._attempt(row)
        try:
            await recorder.submit(result)
        except psycopg.Error as exc:  # sent but not recorded: due again after its lease
            log.warning(
                "a webhook delivery's result could not be recorded",
                extra={"action": "webhook_db_error", "delivery_id": result.id,
                       "error": str(exc)[:200]},
            )  # fmt: skip

    async def _record_all(self, results: Sequence[Result]) -> list[None]:
        await self._record(results, None)
        return [None] * len(results)

    async def _attempt(self, row: Row) -> Result:
        try:
            result = await self._send(row)
        except Exception as exc:  # a bug: this row fails, the batch goes on
            log.exception("webhook delivery attempt failed", extra={"action": "webhook_error"})
            result = Result(str(row["id"]), row["attempts"], ok=False,
                            error=f"internal error: {type(exc).__name__}")  # fmt: skip
        outcome = "delivered" if result.ok else "not_sent" if result.uncounted else "failed"
        if outcome == "delivered":
            self.metrics.delivered += 1
        elif outcome == "failed":
            self.metrics.failed += 1
            if row["attempts"] >= row["max_attempts"]:
                self.metrics.died += 1
            result.retry_in = max(result.retry_in, backoff(row["attempts"]))
        log.log(
            logging.WARNING if result.uncounted else logging.INFO,  # a key this process lacks
            "webhook delivery attempt finished",
            extra={
                "action": "webhook_delivery",
                "delivery_id": str(row["id"]),
                "subscription_id": str(row["subscription_id"]),
                "event": row["event"],
                "attempt": row["attempts"],
                "outcome": outcome,
                "http_status": result.status,
                "dead": outcome == "failed" and row["attempts"] >= row["max_attempts"],
                "error": result.error if result.uncounted else None,
            },
        )
        return result

    async def _send(self, row: Row) -> Result:
        result = Result(str(row["id"]), row["attempts"], ok=False)
        if self.keyring is None:
            result.error = "this worker has no master key, so it cannot sign webhooks"
            return result
        url = ""
        try:
            try:
                secret = unseal_secret(self.keyring, row)
                url = delivery_url(self.keyring, row)
            except DataKeyUnopened as exc:
                if await key_opens_nothing(self.pool, self.keyring, exc.key_id):
                    raise wrong_master_key(
                        exc.key_id, f"webhook {row['subscription_id']}"
                    ) from None
                raise
            body = payloads.render(row["format"], row["payload"], self.public_url)
            spec = SendSpec(
                method="POST",
                url=url,
                headers={
                    "Content-Type": "application/json",
                    "User-Agent": USER_AGENT,
                    **signed_headers(secret, str(row["id"]), int(time.time()), body),
                },
                body=None,
                connect_timeout=CONNECT_TIMEOUT,
                total_timeout=TOTAL_TIMEOUT,
                max_bytes=MAX_RESPONSE_BYTES,
                follow_redirects=False,
            )
            spec.payload = body
            response = await send(self.session, self.egress, spec)
        except EgressBlocked as exc:
            result.error = _scrubbed(f"egress_blocked: {exc.message}", url)
            return result
        except SendFailure as exc:  # an invalid URL's error quotes it
            result.error = _scrubbed(f"{exc.code}: {exc.message}", url)
            return result
        except UnknownMasterKey as exc:  # this process's configuration, not the receiver
            result.error = f"{exc.code}: {exc.message}"[:ERROR_CHARS]
            result.uncounted, result.retry_in = True, KEYLESS_RETRY
            return result
        except ToolrelayError as exc:  # the secret does not decrypt, say
            result.error = f"{exc.code}: {exc.message}"[:ERROR_CHARS]
            return result
        result.status = response.status
        result.ok = 200 <= response.status < 300
        if not result.ok:
            result.error = f"the receiver answered {response.status}"
            if 300 <= response.status < 400:
                result.error += " (redirects are not followed)"
            result.retry_in = _retry_after(response.headers)
        return result

    async def _record(self, results: Sequence[Result], now: datetime | None) -> None:
        payload = Jsonb([asdict(r) for r in results])
        async with self.pool.connection() as conn:
            await conn.execute(self.q["record"], {"results": payload, "now": now})


def _scrubbed(error: str, url: str) -> str:
    """An error to record (``last_error``, which owners read and a dump holds) without the
    URL's path or query, the part that may be its credential."""
    if url:
        try:
            parsed = URL(url)
            hidden = [url, parsed.path_qs, parsed.raw_path_qs, parsed.path, parsed.raw_path,
                      parsed.query_string, parsed.raw_query_string]  # fmt: skip
        except (ValueError, TypeError):
            hidden = [url]
        for part in sorted((p for p in hidden if len(p) > 1), key=len, reverse=True):
            error = error.replace(part, HIDDEN if part != url else shown_url(url))
    return error[:ERROR_CHARS]


def _retry_after(headers: dict[str, str]) -> float:
    """A Retry-After in seconds (the HTTP-date form is ignored), capped."""
    raw = next((v for k, v in headers.items() if k.lower() == "retry-after"), "")
    try:
        return min(BACKOFF_CAP, max(0.0, float(raw)))
    except ValueError:
        return 0.0


async def _wait(stopping: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stopping.wait(), seconds)


async def run_in_worker(worker: Worker) -> None:
    """The worker's side task: deliver on its pool, under its egress policy, until it
    stops; the metrics join the worker's. A worker without a master key cannot sign, so
    it leaves deliveries to workers that have one (rather than spend their attempts)."""
    if worker.keyring is None:
        log.info(
            "webhooks: not delivering (no master key to unseal their secrets)",
            extra={"action": "webhook_disabled"},
        )
        return
    try:
        base = payloads.public_url()
    except ConfigurationError as exc:
        log.warning(f"webhooks: {exc.message}; links are left out",
                    extra={"action": "webhook_config"})  # fmt: skip
        base = None
    connector = make_connector(worker.egress, limit=DELIVERY_BATCH)
    async with outbound_session(connector) as session:  # as tool calls: no cookies, one send
        deliverer = Deliverer(
            worker.store.pool, worker.keyring, worker.egress, session, public_url=base
        )
        worker.metrics.extra.append(deliverer.metrics.lines)
        await deliverer.run(worker.stopping)

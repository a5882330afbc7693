"""The dispatcher: claims runnable invocations, sends them, records what happened.

One asyncio loop per process. Claims come in batches (FOR UPDATE SKIP LOCKED), woken by
LISTEN/NOTIFY with polling as a fallback; leases are renewed by a heartbeat; results are
fenced by (lease owner, attempt) so a worker whose lease was taken over writes nothing.

Calls notify only while some worker is asleep (migrations 0016 and 0018): a worker that
finds nothing to claim registers asleep, claims once more, and only then waits; its next
claim wakes it. With calls in flight it first waits a moment for one of them to finish
(a finished call wakes it anyway), so a busy worker rarely registers and invokers rarely
notify.

It says what it is doing: a start line (who, where, what it may reach), a warning for each
active tool the egress allow-list will refuse, and one summary line per interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from toolrelay.credentials import CredentialResolver, Keyring
from toolrelay.credentials.keys import KEY_ENV, KEY_FILE_ENV
from toolrelay.db.queries import load
from toolrelay.dispatch.batcher import Batcher
from toolrelay.dispatch.budget import DEFAULT_ANSWER_BUDGET, DEFAULT_MAX_ANSWER, AnswerBudget
from toolrelay.dispatch.egress import ALLOW_ENV, EgressPolicy, make_connector
from toolrelay.dispatch.executor import Attempt, Executor, credential_row, precheck, tries
from toolrelay.dispatch.http import outbound_session
from toolrelay.dispatch.metrics import Counts, Metrics, serve_metrics
from toolrelay.dispatch.outcome import HANDED_BACK, Outcome
from toolrelay.dispatch.policy import is_idempotent
from toolrelay.dispatch.preflight import (
    EndpointCheck,
    Finding,
    Target,
    allow_list,
    broad_entries,
    describe_database,
)
from toolrelay.dispatch.store import Busy, DispatchStore, Row, open_pool
from toolrelay.errors import ConfigurationError, DispatchError, UnknownMasterKey
from toolrelay.notify.deliver import run_in_worker as deliver_webhooks
from toolrelay.registry.service import Claim

log = logging.getLogger("toolrelay.worker")

CHANNEL = "toolrelay_runnable"
POLL_INTERVAL = 1.0  # seconds; the fallback when no notification arrives
# With calls in flight and nothing to claim: how long to wait for one of them to finish
# (which wakes the loop) before registering asleep, so that calls notify again.
SLEEP_AFTER = 0.003  # seconds
SLEEP_RETRY = 0.05  # seconds to stay awake after registering asleep timed out on the lock
LISTEN_CHECK = 0.05  # seconds between looks at whether LISTEN is up, before registering
# A call's slot is free once its outcome is decided; its result is then recorded in a
# batch. While other calls are still being sent, a batch of results waits this long for
# more (a call alone is recorded at once), and at most this many results wait to be
# recorded per slot before no more is claimed.
RESULT_LINGER = 0.004  # seconds
# After a claim that found less than it asked for, a call finishing makes the next claim
# wait until this long after that one: at a few hundred calls per second, claims of a
# few calls each instead of one per call (a claim costs PostgreSQL ~150 µs whatever its
# size). A notification is not held back.
CLAIM_GAP = 0.002  # seconds
# With fewer slots free than a claim's batch (a quarter of the slots), the worker claims
# for them once no call has finished for this long (and none was claimed): calls that
# finish fast free a batch's worth sooner and claims stay batched; while the calls left are
# slow (an upstream taking 30 s), a free slot is not idle while calls wait (it was, until a
# quarter of the slots were free). 10 ms, or counted from the last claim alone, claimed for
# a few slots at a time in a drain of fast calls by 2 and 4 workers on a saturated machine
# (+5-40 µs of PostgreSQL a call); a worker's loop can be held up that long there.
PARTIAL_CLAIM_AFTER = 0.05  # seconds
# Where the worker would register asleep but calls keep coming (its last two claims that
# found calls were less than STAY_AWAKE apart, the last less than STAY_AWAKE ago): look
# again after POLL_AWAKE, doubling at each empty look, until STAY_AWAKE has passed. Each
# registration takes the wake lock, which every call being made waits for, and makes the
# calls after it notify: at ~1,000 calls/s a worker registered some 75 times a second, and
# a call's insert waited 1.1 ms for the lock on average (bench/RESULTS.md, session 20).
STAY_AWAKE = 0.02  # seconds
POLL_AWAKE = 0.002  # seconds
RECORDING_PER_SLOT = 1
EXPIRE_INTERVAL = 5.0  # seconds between sweeps of pending approvals past their window
SHUTDOWN_GRACE = 10.0  # seconds in-flight calls get after SIGTERM
DB_RETRY_DELAY = 0.5  # seconds between attempts to reach a database that went away
CLAIM_BATCH = 64
# The most of a worker's slots one owner's calls take by hand-off (``reserve``); past it
# they queue, and the claim gives every owner with calls waiting its turn (migration 0051).
HAND_OFF_SHARE = 0.5
SUMMARY_ENV = "TOOLRELAY_SUMMARY_INTERVAL"
SUMMARY_INTERVAL = 60.0  # seconds between summary lines
# Seconds a worker passes a tool over after meeting its credential sealed with a master key
# it does not have (the call went back to the queue for a worker that has the key).
PASS_OVER_S = 60.0
MAX_FINDINGS_LOGGED = 50  # tool lines at start, per kind; then one line with the rest's count


def _summary_interval_from_env() -> float:
    raw = os.environ.get(SUMMARY_ENV, "").strip()
    if not raw:
        return SUMMARY_INTERVAL
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise ConfigurationError(f"{SUMMARY_ENV}={raw!r}: must be a number of seconds above 0")
    return seconds


def _one_less(counts: Counter[UUID], key: UUID) -> None:
    """One fewer of ``key``, gone at none: what the claim is sent lists only what is held."""
    if (left := counts[key] - 1) > 0:
        counts[key] = left
    else:
        del counts[key]


# Bytes of an answer past which its outcome is written apart from the batch (see done_large).
LARGE_ANSWER_BYTES = 256 * 1024


@dataclass
class WorkerSettings:
    concurrency: int = 64
    lease_seconds: float = 30.0
    drain: bool = False
    metrics_port: int | None = None
    worker_id: str = ""
    # Behind PgBouncer in transaction mode: no session state, no prepared statements.
    pooler: bool = False
    # A direct (not pooled) connection for LISTEN; without one behind a pooler, poll only.
    listen_url: str | None = None
    poll_interval: float = POLL_INTERVAL
    # Migration 0018's sleep protocol: calls notify only while some worker is asleep. Off:
    # this worker never registers, and every call notifies while no registered worker runs.
    sleep_protocol: bool = True
    # While calls keep coming this often, the worker looks again for this long instead of
    # registering asleep (STAY_AWAKE; 0: register as soon as a claim comes up short).
    stay_awake: float = STAY_AWAKE
    # Seconds between summary lines at INFO (default: TOOLRELAY_SUMMARY_INTERVAL, else 60).
    summary_interval: float = field(default_factory=_summary_interval_from_env)
    # Bytes of upstream answers held read and parsed at once, across calls (budget.py).
    answer_budget: int = DEFAULT_ANSWER_BUDGET
    # What one answer may take once parsed (budget.parsed_weight); past it, not parsed.
    max_answer: int = DEFAULT_MAX_ANSWER

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.lease_seconds <= 0:
            raise ValueError("lease_seconds must be positive")
        if not self.summary_interval > 0:
            raise ValueError("summary_interval must be positive")
        if self.answer_budget < 1:
            raise ValueError("answer_budget must be at least 1 byte")
        if self.max_answer < 1:
            raise ValueError("max_answer must be at least 1 byte")
        self.worker_id = (
            self.worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        )


class Worker:
    def __init__(
        self,
        url: str,
        settings: WorkerSettings,
        keyring: Keyring | None,
        egress: EgressPolicy | None = None,
    ) -> None:
        self.url = url
        self.settings = settings
        self.keyring = keyring
        self.resolver: CredentialResolver | None = None
        self.egress = egress or EgressPolicy.from_env()
        self.metrics = Metrics()
        self.budget = AnswerBudget(settings.answer_budget, settings.max_answer)  # budget.py
        # Set by a notification, a (re)connected listener, stop(), a lapsed registration.
        self.wakeup = asyncio.Event()
        self.freed = asyncio.Event()  # a call in flight finished: a slot is free
        self.listening = False  # LISTEN is active now on the listener's connection
        self.registered = False  # follows the sleep protocol (migration 0018), as far as known
        self.asleep = False  # registered asleep: calls notify it; its next claim wakes it
        self._quiet = False  # the last wait ran out with calls in flight and none finished
        self._short_at = 0.0  # when the last claim found less than it asked for (0: full)
        self._claimed_at = 0.0  # when the last claim was made (monotonic)
        self._freed_at = 0.0  # when a call in flight last freed its slot (monotonic)
        self._found_at = 0.0  # when a claim last found calls (monotonic)
        self._found_gap = float("inf")  # seconds between the last two claims that found calls
        self._empty_looks = 0  # looks _stay_awake has scheduled since then
        self.stopping = asyncio.Event()
        # Background loops end on these flags as well as by cancellation: on Python 3.11 a
        # task cancelled in the same step as psycopg_pool hands it a connection carries on
        # (the pool's asyncio.wait_for returns the connection), and a loop that lost its
        # cancellation would keep the worker from stopping (tests/dispatch/
        # test_lost_cancellation.py). ``stopping`` ends the registration loop; ``_ending``,
        # set once calls in flight are done, the heartbeat, summaries and listener.
        self._ending = False
        self.inflight: dict[UUID, asyncio.Task[None]] = {}  # claimed, result not recorded
        self.sending = 0  # of those, outcome not decided yet: they hold a slot
        self.tool_limits: dict[UUID, tuple[int, asyncio.Semaphore]] = {}  # by tool: size
        # Calls of limited tools started here and not decided: a claim takes no more of a
        # tool than its limit less these (a full tool's calls wait in the queue, not here).
        self.tool_busy: Counter[UUID] = Counter()
        # Calls of each owner started here and not decided: a claim counts an owner's turns
        # from these (migration 0051), so a slot that frees goes to an owner holding fewer.
        self.owner_busy: Counter[UUID] = Counter()
        # Tools whose credential is sealed with a master key this worker lacks: passed over
        # by its claims until then (monotonic), their calls left to workers with the key.
        self.keyless: dict[UUID, float] = {}
        # Calls a drain handed back for a worker with the master key (it says so at its end)
        self.handed_back: dict[UUID, str] = {}  # invocation id: the key id it needs
        self.recording: set[UUID] = set()
        # Calls this process is making, claimed for this worker as they are inserted
        # (``reserve``/``adopt``, migration 0036): each holds a slot until its row starts.
        self.reserved = 0
        self.owner_reserved: Counter[UUID] = Counter()  # of those, by owner (``reserve``)
        self._adopting: Batcher[UUID, None] | None = None
        # In `serve`, the app's Outcomes.hand: its waiters wake as soon as `finish` commits,
        # without waiting for the NOTIFY (still sent, for every other process), and are
        # handed the outcome as written (id -> row, None where a read must tell).
        self.on_outcomes: Callable[[Mapping[str, Row | None]], None] | None = None
        self._told: dict[str, Row] = {}  # id -> what the waiter's row takes of the claim
        # Claim in batches: while work is in flight, wait until a quarter of the slots are
        # free rather than paying one claim round trip per finished call (or until no call
        # has finished for PARTIAL_CLAIM_AFTER).
        self._min_claim = max(1, min(CLAIM_BATCH, settings.concurrency) // 4)
        self._last_counts = Counts()
        self._endpoint_check = EndpointCheck(self.egress)
        self._last_summary = time.monotonic()

    async def run(self) -> None:
        self._log_start()
        pool = open_pool(self.url, pooler=self.settings.pooler)
        await pool.open(wait=True)
        self.store = DispatchStore(
            pool, self.settings.worker_id, pooler=self.settings.pooler,
            written_rows=self.on_outcomes is not None,
        )  # fmt: skip
        names = await self._check_endpoints(pool)
        self.sent: Batcher[Row, bool] = Batcher(self._flush_sent)
        self.done: Batcher[tuple[Row, Row], UUID | None] = Batcher(
            self._flush_results, linger=self._result_linger, full=CLAIM_BATCH
        )
        # Large answers are written in statements of their own: PostgreSQL parses a 5 MiB
        # answer nested 99 deep in ~0.7 s, and every call batched with it (any tenant's)
        # waited that long for its outcome (an audit: p99 30 s for a bystander tenant).
        self.done_large: Batcher[tuple[Row, Row], UUID | None] = Batcher(self._flush_results)
        if self.keyring is not None:
            self.resolver = CredentialResolver(pool, self.keyring)
        connector = make_connector(self.egress, limit=self.settings.concurrency)
        metrics_runner = None
        if self.settings.metrics_port is not None:
            metrics_runner = await serve_metrics(
                self.metrics, "127.0.0.1", self.settings.metrics_port
            )
        async with outbound_session(connector) as session:
            self.executor = Executor(
                session, self.egress, self._resolve, self._before_send, self.budget,
                self._refused,
            )  # fmt: skip
            self._adopting = Batcher(self._flush_adopted)
            self._registering = asyncio.create_task(self._registration())
            side = [
                asyncio.create_task(self._listen()),
                asyncio.create_task(self._heartbeat()),
                asyncio.create_task(self._summaries()),
                asyncio.create_task(self._check_names(names)),
                asyncio.create_task(deliver_webhooks(self)),  # docs/notifications.md
            ]
            try:
                await self._loop()
            finally:
                self.stopping.set()  # the loop may have ended by an error
                adopting, self._adopting = self._adopting, None  # calls made now notify
                # Hand-offs still being read are started (then drained) or, once stopping,
                # given back: none is left claimed for a worker that is gone.
                if adopting is not None:
                    await adopting.drain()
                await self._shutdown()
                self._ending = True
                for task in side:
                    task.cancel()
                await asyncio.gather(*side, return_exceptions=True)
                self._log_summary("worker stopped", "worker_stop")
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        await pool.close()

    def stop(self) -> None:
        self.stopping.set()
        self.wakeup.set()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)

    # --- the loop ------------------------------------------------------------------------

    async def _loop(self) -> None:
        last_expiry = 0.0
        while not self.stopping.is_set():
            # Cleared before claiming, so a NOTIFY that lands during the claim is not lost.
            self.wakeup.clear()
            self.freed.clear()
            if time.monotonic() - last_expiry > EXPIRE_INTERVAL:
                last_expiry = time.monotonic()
                await self._db_call(self.store.expire_approvals())
            free = self._free()
            claimed = 0
            timeout = self.settings.poll_interval
            if batch_wait := self._batch_wait(free):
                timeout = batch_wait
            elif free:
                want = min(free, CLAIM_BATCH)
                busy = self._busy()
                self._claimed_at = time.monotonic()
                rows = await self._db_call(
                    self.store.claim(want, self.settings.lease_seconds, self.asleep, busy)
                )
                if rows is None:
                    continue  # the database went away (already waited): try again
                self.asleep = False
                for row in rows:
                    self._start(row)
                claimed = len(rows)
                if claimed:
                    self._found()
                if claimed == want or (claimed and self._filled_up(busy[1])):
                    # there may be more ready right now: past the calls of a tool that
                    # this claim filled, which it looked at and left
                    self._short_at = 0.0
                    continue
                self._short_at = time.monotonic()
                if self.registered and self.listening:
                    if self.sending and not self._quiet:
                        timeout = SLEEP_AFTER  # one finishing wakes us: no need to sleep yet
                    elif (awake := self._stay_awake()) is not None:
                        timeout = awake  # calls came moments ago: look again soon
                    else:
                        timeout = await self._sleep(free - claimed)
                        if timeout == 0:
                            continue  # the last claim found calls: look for more
            if await self._drained(claimed):
                return
            await self._wait(timeout)

    def _batch_wait(self, free: int) -> float:
        """How long to wait for a batch's worth of free slots before claiming (0: claim now,
        or nothing is free): until no call has finished, and none was claimed, for
        PARTIAL_CLAIM_AFTER."""
        if not free or free >= self._min_claim:
            return 0.0
        settled = max(self._claimed_at, self._freed_at)
        return max(0.0, settled + PARTIAL_CLAIM_AFTER - time.monotonic())

    def _free(self) -> int:
        """Slots for new calls: one per call not being sent, while the results waiting to
        be recorded stay within RECORDING_PER_SLOT per slot."""
        concurrency = self.settings.concurrency
        backlog = (1 + RECORDING_PER_SLOT) * concurrency - len(self.inflight) - self.reserved
        return min(concurrency - self.sending - self.reserved, backlog)

    # --- calls handed over by this process (migration 0036) ------------------------------

    def holds(self, invocation_id: str) -> bool:
        """Whether this worker has the call in flight (its outcome not recorded yet)."""
        return UUID(invocation_id) in self.inflight

    @property
    def taking_hand_offs(self) -> bool:
        """Whether calls can be handed to this worker now (it has started and is not
        stopping; ``reserve`` still needs a free slot). Read from any thread."""
        return self._adopting is not None and not self.stopping.is_set()

    def reserve(self, owner: UUID | None = None) -> Claim | None:
        """A slot for a call this process is about to make (for ``owner``): the claim to
        make it with (worker id, lease seconds; Registry.invoke's ``claim``), or None when
        this worker is not running, has no slot free, or holds its share for that owner
        (the call is then made unclaimed, and the claim gives owners their turns: ``poke``).
        Every reservation is followed by ``adopt``. Called in this worker's event loop."""
        if not self.taking_hand_offs or self._free() <= 0:
            return None
        if owner is not None:
            share = max(1, int(self.settings.concurrency * HAND_OFF_SHARE))
            if self.owner_busy[owner] + self.owner_reserved[owner] >= share:
                return None
            self.owner_reserved[owner] += 1
        self.reserved += 1
        return self.settings.worker_id, self.settings.lease_seconds

    def poke(self) -> None:
        """A call was made unclaimed by this process: claim now rather than at the next
        wake-up (a worker awake and sending is not notified)."""
        self.wakeup.set()

    def adopt(self, invocation_id: UUID | None, owner: UUID | None = None) -> None:
        """After ``reserve``: send the call made with that claim (None: no call was made;
        one that waits for approval was not claimed, and its read finds nothing to start).
        Its slot stays reserved until its row is read."""
        if owner is not None:
            _one_less(self.owner_reserved, owner)
        if invocation_id is None or self._adopting is None:
            self.reserved -= 1
            if invocation_id is not None:  # stopping: its lease runs out, another claims it
                log.info(
                    "a call made while stopping is left to its lease",
                    extra={"action": "adopt_skipped", "invocation_id": str(invocation_id)},
                )
            return
        self._adopting.enqueue(invocation_id)

    async def _flush_adopted(self, ids: Sequence[UUID]) -> list[None]:
        """One read for every call handed over since the last: started like claimed rows
        (the tool's settings and gating read now, as a claim reads them). A call not found
        as this worker's first attempt (it waits for approval, or its lease ran out and
        someone else has it) is not started."""
        try:
            rows = await self._db_call(self.store.adopt(ids))
        except BaseException:
            self.reserved -= len(ids)
            raise
        if rows is None and self._adopting is not None and not self.stopping.is_set():
            # The database went away (``_db_call`` waited): read them again, rather than
            # leave calls claimed for this worker until their leases run out. Their slots
            # stay reserved meanwhile.
            for key in ids:
                self._adopting.enqueue(key)
            return [None] * len(ids)
        self.reserved -= len(ids)
        if self.stopping.is_set() and rows:  # not started: give them back to any worker
            await self._db_call(self.store.release([row["id"] for row in rows]))
            rows = []
        # A call of a tool with no room here would wait for it inside a slot: back to the
        # queue instead, where this worker's claims find it once the tool has room.
        queued = []
        keyless = set(self._keyless_tools())
        for row in rows or ():
            limit = row["max_concurrency"]
            if (limit and self.tool_busy[row["tool_id"]] >= limit) or row["tool_id"] in keyless:
                queued.append(row["id"])
            else:
                self._start(row)
        if queued:
            await self._db_call(self.store.release(queued))
        return [None] * len(ids)

    def _result_linger(self) -> float:
        return RESULT_LINGER if self.sending else 0.0

    def _found(self) -> None:
        """A claim found calls: when, and how long after the last that did (``_stay_awake``)."""
        now = time.monotonic()
        self._found_gap, self._found_at = now - self._found_at, now
        self._empty_looks = 0

    def _stay_awake(self) -> float | None:
        """How long to wait before looking again while calls keep coming (and count that
        look); None when they came further apart than ``stay_awake``, or none came for that
        long (then register asleep: at a few calls a second, looks cost more than they save)."""
        since = time.monotonic() - self._found_at
        if max(since, self._found_gap) >= self.settings.stay_awake:
            return None
        wait = min(POLL_AWAKE * (1 << self._empty_looks), self.settings.stay_awake - since)
        self._empty_looks += 1
        return wait

    async def _sleep(self, free: int) -> float:
        """Register asleep and claim once more; how long to wait next (0: claim again)."""
        self._claimed_at = time.monotonic()
        result = await self._db_call(
            self.store.sleep_and_claim(
                min(free, CLAIM_BATCH), self.settings.lease_seconds, self._busy()
            )
        )
        if result is None:
            return 0.0
        asleep, rows = result
        for row in rows:
            self._start(row)
        self.asleep = asleep  # True even when rows came: the next claim wakes it
        if rows:
            self._found()  # calls made as it registered: they are calls coming too
            return 0.0
        return self.settings.poll_interval if asleep else SLEEP_RETRY

    async def _drained(self, claimed: int) -> bool:
        """--drain: done when nothing is in flight here and nothing is running anywhere."""
        if not self.settings.drain or self.inflight or claimed:
            return False
        return not await self._db_call(self.store.busy(self._keyless_tools()), default=True)

    async def _wait(self, timeout: float) -> None:
        """Until a notification, stop(), or ``timeout``; also until a call in flight
        finishes, unless asleep (then new calls notify, and a free slot changes nothing)
        or full (then until one finishes)."""
        waiters: list[asyncio.Future[Any]] = [asyncio.ensure_future(self.wakeup.wait())]
        if not self.asleep or self.settings.drain:
            waiters.append(asyncio.ensure_future(self.freed.wait()))
        done, pending = await asyncio.wait(
            waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        for fut in pending:
            fut.cancel()
        if done and not self.wakeup.is_set() and self._short_at:  # a call finished
            gap = self._short_at + CLAIM_GAP - time.monotonic()
            if gap > 0:
                await asyncio.sleep(gap)
        self._quiet = not done and bool(self.sending)

    async def _db_call(self, coro: Any, default: Any = None) -> Any:
        """Run a store call; a database that went away is retried on the next turn."""
        try:
            return await coro
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            log.warning(
                "database unavailable", extra={"action": "db_error", "error": str(exc)[:200]}
            )
            await asyncio.sleep(DB_RETRY_DELAY)
            return default

    def _start(self, row: Row) -> None:
        self.metrics.claimed += 1
        self.sending += 1
        self.owner_busy[row["owner"]] += 1
        limit = self._tool_limit(row)
        if limit is not None:
            self.tool_busy[row["tool_id"]] += 1
        task = asyncio.create_task(self._handle(row, limit))
        self.inflight[row["id"]] = task
        self.metrics.in_flight = len(self.inflight)
        key: UUID = row["id"]
        task.add_done_callback(lambda _task: self._finished(key))

    def _finished(self, key: UUID) -> None:
        self.inflight.pop(key, None)
        self.metrics.in_flight = len(self.inflight)
        self.freed.set()

    # --- one invocation ------------------------------------------------------------------

    def _decided(self, owner: UUID) -> None:
        """A call's outcome is known (or it was given up): its slot is free."""
        self.sending -= 1
        _one_less(self.owner_busy, owner)
        self._freed_at = time.monotonic()
        self.freed.set()

    async def _handle(self, row: Row, limit: asyncio.Semaphore | None) -> None:
        attempt = Attempt()
        try:
            await self._attempt(row, limit, attempt)
        finally:  # recorded, handed back or left to its lease: its answer is no longer held
            self.budget.give_back(attempt.held)

    async def _attempt(self, row: Row, limit: asyncio.Semaphore | None, attempt: Attempt) -> None:
        try:
            try:
                async with limit if limit is not None else contextlib.nullcontext():
                    outcome, _ = await self._decide(row, attempt)
            finally:
                if limit is not None:
                    self._tool_done(row["tool_id"])
                self._decided(row["owner"])
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            # The database went away mid-way: the lease expires and the row is recovered.
            log.warning(
                "database unavailable during dispatch; leaving the lease to expire",
                extra={"action": "dispatch_db_error", "invocation_id": str(row["id"]),
                       "error": str(exc)[:200]},
            )  # fmt: skip
            return
        except Exception as exc:  # a bug of ours on this call: recorded now, not left to the lease
            outcome = failed_here(row, attempt, exc)
        if outcome.status == "lost":
            self.metrics.lost_leases += 1
            return
        if outcome.status == HANDED_BACK:
            await self._hand_back(row, outcome)
            return
        seconds = time.monotonic() - attempt.started
        # Shielded: a shutdown must not lose a result that was already decided, nor hand
        # the claim back while that result is being written.
        self.recording.add(row["id"])
        try:
            recorded = await self._record(row, outcome, attempt)
        finally:
            self.recording.discard(row["id"])
        if recorded:  # not written: counted as a lost lease or an unrecorded result instead
            self.metrics.observe(outcome.status, outcome.error_code, seconds)
        log.info(
            "invocation attempt finished",
            extra={
                "action": "dispatch",
                "invocation_id": str(row["id"]),
                "tool": row["tool_key"],
                "attempt": row["attempt"],
                "outcome": outcome.status,
                "error_code": outcome.error_code,
                "http_status": outcome.http_status,
                "recorded": recorded,
            },
        )

    async def _decide(self, row: Row, attempt: Attempt) -> tuple[Outcome, list[str]]:
        if row["sent_at"] is None and (row["tool_status"] is None or row["agent_status"] is None):
            gone = precheck(row)  # the tool or agent was deleted: its settings are all NULL
            assert gone is not None
            return gone, []
        if row["sent_at"] is not None:  # a previous attempt may have left: a dead worker's
            self.metrics.recovered += 1
            if not is_idempotent(row["http_method"], row["idempotency_header"]):
                return Outcome.failed(
                    "outcome_unknown",
                    "the worker sending this write stopped before recording a result; it may"
                    " have reached the upstream, so it is not sent again",
                ), []
        if tries(row) > row["max_attempts"]:
            return Outcome.failed(
                "outcome_unknown" if row["sent_at"] else "network_error",
                f"gave up after {row['max_attempts']} attempts",
            ), []
        return await self.executor.run(row, attempt)

    def _tool_limit(self, row: Mapping[str, Any]) -> asyncio.Semaphore | None:
        """The limiter a call of this tool waits on, of the size the claim read: a limit the
        owner changed applies to the calls claimed after it (those sending keep theirs)."""
        limit = row["max_concurrency"]
        if not limit:
            return None
        held = self.tool_limits.get(row["tool_id"])
        if held is None or held[0] != limit:
            held = self.tool_limits[row["tool_id"]] = (limit, asyncio.Semaphore(limit))
        return held[1]

    def _tool_done(self, tool: UUID) -> None:
        """A limited tool's call is decided. If the tool had no room, calls of it may wait
        in the queue (left by a claim, or handed back) that no notification will announce:
        wake the loop to claim them, asleep or not."""
        if self.tool_busy[tool] >= self.tool_limits[tool][0]:
            self.wakeup.set()
        _one_less(self.tool_busy, tool)

    def _full(self) -> list[UUID]:
        """The limited tools with no room left here."""
        return [t for t, n in self.tool_busy.items() if n >= self.tool_limits[t][0]]

    def _busy(self) -> Busy:
        """For the claim: the limited tools' calls held here, the tools it passes over
        (those with no room, and those whose credential it cannot open), and the calls of
        each owner held here."""
        return (
            dict(self.tool_busy),
            [*self._full(), *self._keyless_tools()],
            dict(self.owner_busy),
        )

    def _keyless_tools(self) -> list[UUID]:
        """The tools passed over now for a master key this worker lacks."""
        now = time.monotonic()
        for tool in [t for t, until in self.keyless.items() if until <= now]:
            del self.keyless[tool]
        return list(self.keyless)

    async def _hand_back(self, row: Row, outcome: Outcome) -> None:
        """The call's credential is sealed with a master key this worker does not have (a
        key rotation reaching the workers one by one): nothing was sent, so the call goes
        back to the queue, attempt uncounted, for a worker with the key; this one passes the
        tool over for PASS_OVER_S and says so once per tool and window."""
        first = row["tool_id"] not in self._keyless_tools()
        self.keyless[row["tool_id"]] = time.monotonic() + PASS_OVER_S
        if self.settings.drain:  # what a drain says it left (a long-running worker: its log)
            self.handed_back[row["id"]] = outcome.detail or ""
        await self._db_call(self.store.release([row["id"]]))
        if first and outcome.error_code == "master_key_wrong":
            log.error(
                f"{outcome.error} (give this worker the right key in {KEY_ENV} or"
                f" {KEY_FILE_ENV} and restart it)",
                extra={"action": "master_key_wrong", "key_id": outcome.detail,
                       "tool": row["tool_key"], "credential_id": str(row["credential_ref"]),
                       "invocation_id": str(row["id"]), "pass_over_seconds": PASS_OVER_S},
            )  # fmt: skip
        elif first:
            log.error(
                "a credential is sealed with a master key this worker does not have: its"
                " calls are left to workers that have it (add the key to this worker's"
                f" {KEY_ENV} or {KEY_FILE_ENV} and restart it)",
                extra={"action": "master_key_missing", "key_id": outcome.detail,
                       "tool": row["tool_key"], "credential_id": str(row["credential_ref"]),
                       "invocation_id": str(row["id"]), "pass_over_seconds": PASS_OVER_S},
            )  # fmt: skip

    def _filled_up(self, full_before: Sequence[UUID]) -> bool:
        """Whether a tool has no room now that had some before the last claim."""
        return not set(self._full()) <= set(full_before)

    async def _before_send(self, row: Mapping[str, Any]) -> bool:
        """Durably mark a write as possibly sent; False when our lease is gone."""
        return await self.sent.enqueue({"id": row["id"], "attempt": row["attempt"]})

    async def _refused(self, row: Mapping[str, Any]) -> bool:
        """The upstream refused the call's credential: whether to send it again (401)."""
        if self.resolver is None or row["credential_ref"] is None:
            return False
        return await self.resolver.refused(row["credential_ref"], credential_row(row))

    async def _resolve(
        self, credential_id: UUID, host: str, port: int | None, row: Mapping[str, Any] | None
    ) -> str:
        if self.resolver is None:
            # No key at all lacks this one too: the call goes back to a worker that has it,
            # as for a key id this worker lacks (never failed for this worker's configuration).
            raise UnknownMasterKey(
                "this worker has no master key, so it cannot use credentials", key_id=""
            )
        return await self.resolver.resolve(
            credential_id, host, port, self.executor.session, dict(row) if row else None
        )

    async def _record(self, row: Row, outcome: Outcome, attempt: Attempt) -> bool:
        result = {
            "id": str(row["id"]),
            "attempt": row["attempt"],
            "status": outcome.status,
            "output": outcome.output,
            "error": outcome.error,
            "error_code": outcome.error_code,
            "http_status": outcome.http_status,
            "output_mismatch": outcome.output_mismatch,
            "retry_in_ms": outcome.retry_in * 1000,
            "clear_sent": outcome.clear_sent,
            # for a call sent back to approval: its new window and the configuration it waits on
            "approval_ttl_seconds": row["approval_ttl_seconds"],
            "fingerprint": row["current_fingerprint"],
        }
        if self.on_outcomes is not None:
            self._told[result["id"]] = {k: row[k] for k in ("input", "tool_key", "agent_name")}
        # Queued before the first await, and only the wait is shielded: a shutdown does not
        # lose a result already decided (nor hand the claim back while it is written).
        batcher = self.done_large if attempt.held > LARGE_ANSWER_BYTES else self.done
        queued = batcher.enqueue((result, attempt.record(row, outcome)))
        try:
            written = await asyncio.shield(queued)
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            log.warning(
                "could not record a result; the lease will expire and be recovered",
                extra={"action": "record_failed", "invocation_id": str(row["id"]),
                       "error": str(exc)[:200]},
            )  # fmt: skip
            self.metrics.unrecorded += 1
            return False
        if written is None:
            self.metrics.lost_leases += 1
        return written is not None

    async def _flush_sent(self, items: Sequence[Row]) -> list[bool]:
        marked = await self.store.mark_sent(items)
        return [item["id"] in marked for item in items]

    async def _flush_results(self, items: Sequence[tuple[Row, Row]]) -> list[UUID | None]:
        try:
            written = await self._finish(items)
        finally:
            told = [(r, self._told.pop(r["id"], None)) for r, _ in items]
        if self.on_outcomes is not None:
            self.on_outcomes({
                r["id"]: _outcome_row(r, claimed, written[UUID(r["id"])])
                for r, claimed in told if r["status"] != "running" and UUID(r["id"]) in written
            })  # fmt: skip
        return [UUID(r["id"]) if UUID(r["id"]) in written else None for r, _ in items]

    async def _finish(self, items: Sequence[tuple[Row, Row]]) -> dict[UUID, Row]:
        """``finish`` for the batch; when the database refuses a value in it (a DataError:
        something the checks before it did not foresee), each result alone, so that one
        call's result cannot take the others' with it. A refused one is recorded again
        without what an upstream wrote into it: its outcome stands (a completed call stays
        completed: its side effect happened), its output and texts are replaced by a note."""
        try:
            return await self.store.finish([r for r, _ in items], [a for _, a in items])
        except psycopg.DataError as exc:
            if len(items) == 1:
                return await self._finish_refused(*items[0], exc)
            log.warning(
                "the database refused a result batch; recording each alone",
                extra={"action": "finish_split", "error": type(exc).__name__,
                       "calls": len(items)},
            )  # fmt: skip
            written: dict[UUID, Row] = {}
            for item in items:
                written |= await self._finish([item])
            return written

    async def _finish_refused(
        self, result: Row, attempt: Row, exc: psycopg.DataError
    ) -> dict[UUID, Row]:
        """One result the database refused, written again without the upstream's output and
        texts. Refused again (a value elsewhere in it), it is not written at all: the call is
        left to its lease, and the other results of its batch are still written."""
        log.error(
            "the database refused a call's result",
            extra={"action": "finish_refused", "invocation_id": result["id"],
                   "error": type(exc).__name__, "sqlstate": exc.sqlstate},
        )  # fmt: skip
        what = "output" if result["status"] == "completed" else "error text"
        note = (
            f"the database refused to store what the upstream answered ({type(exc).__name__});"
            f" the {what} was not kept"
        )
        kept = result | {"output": None, "output_mismatch": None}
        kept["output_mismatch" if result["status"] == "completed" else "error"] = note
        noted = attempt | {"error": note if attempt["error"] is not None else None}
        try:
            return await self.store.finish([kept], [noted])
        except psycopg.DataError as again:
            log.error(
                "the database refused a call's result twice; leaving the call to its lease",
                extra={"action": "finish_refused", "invocation_id": result["id"],
                       "error": type(again).__name__, "sqlstate": again.sqlstate},
            )  # fmt: skip
            return {}

    # --- what it says about itself --------------------------------------------------------

    def _log_start(self) -> None:
        s = self.settings
        if s.listen_url:  # LISTEN/NOTIFY over a direct connection of its own
            listen = f"LISTEN on {describe_database(s.listen_url)['database']}"
        else:
            listen = "none: polling only" if s.pooler else "LISTEN on the database"
        log.info(
            "worker started",
            extra={
                "action": "worker_start",
                "worker_id": s.worker_id,
                "concurrency": s.concurrency,
                "lease_seconds": s.lease_seconds,
                **describe_database(self.url),
                "pooler": "transaction" if s.pooler else "none",
                "listen": listen,
                "poll_interval": s.poll_interval,
                "drain": s.drain,
                "summary_interval": s.summary_interval,
                "metrics_port": s.metrics_port,
                "egress_guard": "on" if self.egress.enabled else "off",
                "egress_allow": allow_list(self.egress),
                "credentials": "usable" if self.keyring is not None else "no master key",
                "frozen_objects": gc.get_freeze_count(),  # toolrelay/heap.py; 0 if not settled
            },
        )
        for entry, why in broad_entries(self.egress) if self.egress.enabled else ():
            log.warning(
                f"{ALLOW_ENV} entry {entry!r}: {why}; allow only the addresses tools need",
                extra={"action": "egress_allow_broad", "entry": entry, "reason": why},
            )

    async def _check_endpoints(
        self, pool: AsyncConnectionPool[AsyncConnection[Row]]
    ) -> list[Target]:
        """Warn now about active tools whose calls the allow-list refuses: IP literals and
        localhost at once; returns the host names, checked in the background."""
        if not self.egress.enabled:
            return []
        try:
            async with pool.connection() as conn:
                cur = await conn.execute(load("operations")["active_endpoints"])
                tools = await cur.fetchall()
        except psycopg.Error as exc:
            log.warning(
                "could not list active tools to check them against the egress allow-list",
                extra={"action": "egress_check_failed", "error": str(exc)[:200]},
            )
            return []
        findings, names = self._endpoint_check.literal(tools)
        self._log_findings(findings)
        return names

    async def _check_names(self, names: list[Target]) -> None:
        if names:
            self._log_findings(await self._endpoint_check.resolved(names))

    def _log_findings(self, findings: list[Finding]) -> None:
        for refused in (True, False):
            some = [f for f in findings if f.refused is refused]
            for finding in some[:MAX_FINDINGS_LOGGED]:
                if refused:
                    log.warning(
                        f"tool {finding.tool}: the egress allow-list will refuse its calls:"
                        f" {finding.reason}",
                        extra={"action": "tool_unreachable", "tool": finding.tool,
                               "owner": finding.owner, "reason": finding.reason},
                    )  # fmt: skip
                else:
                    log.info(
                        f"tool {finding.tool}: not checked against the egress allow-list:"
                        f" {finding.reason}",
                        extra={"action": "tool_unchecked", "tool": finding.tool,
                               "owner": finding.owner, "reason": finding.reason},
                    )  # fmt: skip
            if len(some) > MAX_FINDINGS_LOGGED:
                rest = len(some) - MAX_FINDINGS_LOGGED
                log.log(
                    logging.WARNING if refused else logging.INFO,
                    f"and {rest} more tools {'refused' if refused else 'not checked'}",
                    extra={"action": "tool_unreachable" if refused else "tool_unchecked",
                           "more": rest},
                )  # fmt: skip

    async def _summaries(self) -> None:
        interval = self.settings.summary_interval
        due = time.monotonic() + interval
        while not self._ending:  # on a fixed cadence: a slow line does not push the next ones back
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            self._log_summary("worker summary", "worker_summary")
            due = max(due + interval, time.monotonic())

    def _log_summary(self, message: str, action: str) -> None:
        """One line: what happened since the previous summary, and what is in flight now."""
        now, counts = time.monotonic(), self.metrics.counts()
        delta = counts.since(self._last_counts)
        seconds = now - self._last_summary
        self._last_counts, self._last_summary = counts, now
        failed = delta.by_code("failed")
        log.info(
            f"{message}: {_summary_text(delta, failed, len(self.inflight))}"
            f" in the last {seconds:.1f} s",
            extra={
                "action": action,
                "worker_id": self.settings.worker_id,
                "seconds": round(seconds, 3),
                "claimed": delta.claimed,
                "completed": delta.status("completed"),
                "failed": delta.status("failed"),
                "failed_by_code": failed,
                "retried": delta.status("running"),
                "returned_to_approval": delta.status("pending"),
                "expired": delta.status("expired"),
                "in_flight": len(self.inflight),
                "lost_leases": delta.lost_leases,
                "unrecorded": delta.unrecorded,
            },
        )

    # --- background ----------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        interval = self.settings.lease_seconds / 3
        while not self._ending:  # calls in flight while stopping are still renewed
            await asyncio.sleep(interval)
            ids = list(self.inflight)
            if ids:
                await self._db_call(self.store.heartbeat(ids, self.settings.lease_seconds))

    def _listen_url(self) -> str | None:
        return self.settings.listen_url or (None if self.settings.pooler else self.url)

    async def _listen(self) -> None:
        """Wake the loop on NOTIFY; reconnect when the database goes away."""
        url = self._listen_url()
        if url is None:
            return  # LISTEN does not work through a transaction pooler: poll only
        while not self._ending:
            try:
                async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self.listening = True
                    self.wakeup.set()  # anything that arrived while we were not listening
                    async for _ in conn.notifies():
                        self.wakeup.set()
            except (psycopg.OperationalError, psycopg.InterfaceError):
                pass
            finally:
                self.listening = False  # asleep or not, nothing would wake us now: poll
            await asyncio.sleep(DB_RETRY_DELAY)

    async def _registration(self) -> None:
        """Follow the sleep protocol (migration 0018): register once listening, renew every
        lease/3. A registration found lapsed may have lost its sleeper row: wake up."""
        if not self.settings.sleep_protocol or self._listen_url() is None:
            return  # polling only: calls must keep notifying whoever listens
        interval = self.settings.lease_seconds / 3
        while not self.stopping.is_set():  # as well as cancelled: a cancellation can be lost
            if self.listening:
                live = await self._db_call(self.store.register(self.settings.lease_seconds))
                if live is not None:
                    if not live:  # newly on (or lapsed): the loop should go to sleep anew
                        self.wakeup.set()
                    self.registered = True
                    await asyncio.sleep(interval)
                    continue
            await asyncio.sleep(LISTEN_CHECK)

    async def _shutdown(self) -> None:
        self._registering.cancel()
        await asyncio.gather(self._registering, return_exceptions=True)
        if self.registered:  # no longer asleep; calls notify again while no one else is
            self.registered = self.asleep = False
            await self._db_call(self.store.unregister())
        if self.inflight:
            _, pending = await asyncio.wait(list(self.inflight.values()), timeout=SHUTDOWN_GRACE)
            ids = [
                key
                for key, task in self.inflight.items()
                if task in pending and key not in self.recording
            ]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            if ids:
                await self._db_call(self.store.release(ids))


def _outcome_row(result: Row, claimed: Row | None, written: Row) -> Row | None:
    """What a waiter may be handed of a finished call: the row as get_invocation reads it,
    from what ``finish`` wrote and what the claim read (input, tool key, agent name); None
    for a call sent back to approval (a read tells its new approval state)."""
    if claimed is None or result["status"] not in ("completed", "failed"):
        return None
    return written | {
        "input": claimed["input"],
        "output": result["output"],
        "tool_key": claimed["tool_key"] or written["deleted_tool_key"],
        "agent_name": claimed["agent_name"] or written["deleted_agent_name"],
        "retried_by": None,  # a call is retried only once finished, by a later request
    }


def _summary_text(delta: Counts, failed: dict[str, int], in_flight: int) -> str:
    codes = ", ".join(f"{code} {n}" for code, n in failed.items())
    parts = [
        f"claimed {delta.claimed}",
        f"completed {delta.status('completed')}",
        f"failed {delta.status('failed')}" + (f" ({codes})" if codes else ""),
        f"retried {delta.status('running')}",
    ]
    if delta.status("pending"):
        parts.append(f"returned to approval {delta.status('pending')}")
    if delta.status("expired"):
        parts.append(f"expired {delta.status('expired')}")
    parts += [f"in flight {in_flight}", f"lost leases {delta.lost_leases}"]
    if delta.unrecorded:
        parts.append(f"unrecorded {delta.unrecorded}")
    return ", ".join(parts)


async def run_worker(
    url: str, settings: WorkerSettings, keyring: Keyring | None, egress: EgressPolicy | None = None
) -> Worker:
    worker = Worker(url, settings, keyring, egress)
    worker.install_signal_handlers()
    await worker.run()
    return worker


def failed_here(row: Mapping[str, Any], attempt: Attempt, exc: Exception) -> Outcome:
    """The outcome of a call the worker itself failed on (a bug, on this call's data): told
    now, not left to its lease to be sent again, and never a second send of a write that may
    have left. Neither the log nor the error holds the exception's message (a credential may
    be in it): its type and where it was raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else "?"
    log.error(
        "the worker failed on a call",
        extra={"action": "dispatch_failed", "invocation_id": str(row["id"]),
               "error": f"{type(exc).__name__} at {where}"},
    )  # fmt: skip
    if attempt.request is not None and not is_idempotent(
        row["http_method"], row["idempotency_header"]
    ):
        return Outcome.failed(
            "outcome_unknown",
            f"the worker failed ({type(exc).__name__}) after sending this write; it may have"
            " reached the upstream, so it is not sent again",
        )
    return Outcome.failed(
        DispatchError.code,
        f"the worker failed on this call ({type(exc).__name__}); it was not sent again",
    )

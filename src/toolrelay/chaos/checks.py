"""The invariants a chaos run must keep, as pure functions over what was recorded.

Four witnesses are compared: the database (invocations and their attempt history), the
upstream (every request it received, by invocation id, and what it answered), the log of
every configuration the owner wrote, and the logs. docs/reliability.md states each
invariant in words; the names here match it.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolrelay.chaos.fidelity import (
    Call,
    ConfigVersion,
    HostsVersion,
    Judge,
    credential_admitted,
    follows_redirect,
)
from toolrelay.chaos.upstream import Arrival
from toolrelay.dispatch.outcome import scrub
from toolrelay.dispatch.policy import is_idempotent

TERMINAL = frozenset({"completed", "failed", "rejected", "expired"})
GAVE_UP_CODES = frozenset({"outcome_unknown", "network_error"})
SHOWN_VIOLATIONS = 20


@dataclass
class InvocationRow:
    id: str
    tool: str
    method: str
    idempotency_header: str | None
    max_attempts: int
    gated: bool
    status: str
    approval_status: str
    decided: bool  # an owner approved or rejected it
    error_code: str | None
    http_status: int | None
    attempt: int
    output: Any
    input: Any = field(default_factory=dict)
    approval_returns: int = 0  # claims that put it back to pending: no attempt counted
    created_at: float = 0.0  # epoch seconds
    decided_at: float | None = None
    request_digest: str | None = None

    @property
    def write(self) -> bool:
        """Never sent twice: POST or PATCH without a declared idempotency header."""
        return not is_idempotent(self.method, self.idempotency_header)


@dataclass
class AttemptRow:
    id: int
    invocation_id: str
    attempt: int
    worker: str
    status_code: int | None
    error_code: str | None


@dataclass
class RunData:
    invocations: list[InvocationRow]
    attempts: list[AttemptRow]
    arrivals: Mapping[str, Sequence[Arrival]]
    without_invocation: int = 0
    canaries: Mapping[str, int] = field(default_factory=dict)  # address -> connections
    blocked_redirects_issued: int = 0
    secrets: Mapping[str, Sequence[str]] = field(default_factory=dict)  # kind -> values
    texts: Mapping[str, str] = field(default_factory=dict)  # source -> content to scan
    decisions: Mapping[str, str] = field(default_factory=dict)  # invocation -> script choice
    probe_ids: Sequence[str] = ()
    coverage: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # name -> (got, min)
    versions: Mapping[str, Sequence[ConfigVersion]] = field(default_factory=dict)  # by tool
    hosts: Mapping[str, Sequence[HostsVersion]] = field(default_factory=dict)  # by credential
    committed: Mapping[str, float] = field(default_factory=dict)  # invocation -> made by then
    drain_exit: int | None = 0  # the final worker --drain's exit code (None: timed out)
    frozen_pids: frozenset[int] = frozenset()  # worker processes the run stalled (SIGSTOP)

    def gating_changed(self) -> set[str]:
        """Tools the owner gated or ungated during the run."""
        return {k for k, vs in self.versions.items() if len({v.gated for v in vs}) > 1}

    def call(self, inv: InvocationRow) -> Call:
        return Call(
            id=inv.id,
            tool=inv.tool,
            input=inv.input,
            created_at=inv.created_at,
            created_by=self.committed.get(inv.id, math.inf),
            decided_at=inv.decided_at,
            request_digest=inv.request_digest,
        )

    def attempts_by_invocation(self) -> dict[str, list[AttemptRow]]:
        grouped: dict[str, list[AttemptRow]] = defaultdict(list)
        for row in self.attempts:
            grouped[row.invocation_id].append(row)
        return grouped


@dataclass
class CheckResult:
    name: str
    ok: bool
    checked: int  # how many things were looked at
    summary: str
    violations: list[str] = field(default_factory=list)
    violation_count: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "checked": self.checked,
            "summary": self.summary,
            "violation_count": self.violation_count,
            "violations": self.violations,
        }


def _result(name: str, checked: int, summary: str, violations: list[str]) -> CheckResult:
    return CheckResult(
        name=name,
        ok=not violations,
        checked=checked,
        summary=summary,
        violations=violations[:SHOWN_VIOLATIONS],
        violation_count=len(violations),
    )


def accepted(arrivals: Iterable[Arrival]) -> int:
    """Requests the upstream may have processed: all but explicit refusals (429, 503+RA)."""
    return sum(1 for a in arrivals if a.accepted)


def answer_of(inv: InvocationRow, arrivals: Sequence[Arrival]) -> Arrival | None:
    """The upstream request whose complete 2xx answer is the invocation's recorded output."""
    out = inv.output
    if not isinstance(out, dict) or out.get("invocation") != inv.id:
        return None
    seq = out.get("seq")
    if not isinstance(seq, int) or not 1 <= seq <= len(arrivals):
        return None
    arrival = arrivals[seq - 1]
    status = arrival.status
    if not arrival.complete or status is None or not 200 <= status < 300:
        return None
    return arrival if status == inv.http_status else None


def _gave_a_definite_answer(inv: InvocationRow, arrivals: Sequence[Arrival]) -> bool:
    """The recorded HTTP status is one the upstream really sent, whole, to this invocation."""
    return inv.http_status is not None and any(
        a.complete and a.status == inv.http_status for a in arrivals
    )


# --- the checks ----------------------------------------------------------------------------


def check_terminal(data: RunData) -> CheckResult:
    bad = [f"{i.id} ({i.tool}) is {i.status}" for i in data.invocations if i.status not in TERMINAL]
    if data.drain_exit != 0:
        ended = "timed out" if data.drain_exit is None else f"exited {data.drain_exit}"
        bad.insert(0, f"the final worker --drain {ended} (see chaos-out/logs/worker-drain.log)")
    return _result(
        "all_terminal",
        len(data.invocations),
        "every invocation ended: completed, failed, rejected or expired",
        bad,
    )


def check_writes_at_most_once(data: RunData) -> CheckResult:
    bad, writes = [], 0
    for inv in data.invocations:
        if not inv.write:
            continue
        writes += 1
        seen = data.arrivals.get(inv.id, ())
        if accepted(seen) > 1:
            actions = ",".join(a.action for a in seen)
            bad.append(
                f"{inv.id} ({inv.tool}) reached the upstream {accepted(seen)} times: {actions}"
            )
    return _result(
        "writes_at_most_once",
        writes,
        "no write was processed twice (refusals 429/503+Retry-After excepted)",
        bad,
    )


def check_write_outcomes(data: RunData) -> CheckResult:
    bad, writes = [], 0
    for inv in data.invocations:
        if not inv.write:
            continue
        writes += 1
        seen = data.arrivals.get(inv.id, ())
        n = accepted(seen)
        what = f"{inv.id} ({inv.tool}) {inv.status}/{inv.error_code} http={inv.http_status}"
        if inv.status == "completed":
            if n != 1 or answer_of(inv, seen) is None:
                bad.append(f"{what}: completed but the upstream processed it {n} times")
        elif inv.status == "failed" and inv.error_code == "outcome_unknown":
            continue  # honest either way: seen 0 or 1 times
        elif n and not (inv.status == "failed" and _gave_a_definite_answer(inv, seen)):
            bad.append(
                f"{what}: processed {n} time(s), but recorded neither the answer nor unknown"
            )
    return _result(
        "write_outcomes",
        writes,
        "a write seen once is completed, outcome_unknown or a failure carrying the upstream's"
        " real answer; any other failure was never seen",
        bad,
    )


def check_completed_are_real(data: RunData) -> CheckResult:
    bad, completed = [], 0
    for inv in data.invocations:
        if inv.status != "completed":
            continue
        completed += 1
        if answer_of(inv, data.arrivals.get(inv.id, ())) is None:
            bad.append(
                f"{inv.id} ({inv.tool}) completed with HTTP {inv.http_status}, but that is not a"
                " whole 2xx answer the upstream gave it"
            )
    return _result(
        "completed_are_real_answers",
        completed,
        "every completed invocation's output is a whole 2xx answer the upstream sent it",
        bad,
    )


def check_recorded_statuses(data: RunData) -> CheckResult:
    bad, recorded = [], 0
    for inv in data.invocations:
        if inv.http_status is None:
            continue
        recorded += 1
        if not _gave_a_definite_answer(inv, data.arrivals.get(inv.id, ())):
            bad.append(f"{inv.id} ({inv.tool}) records HTTP {inv.http_status}, never answered")
    return _result(
        "recorded_statuses_are_real",
        recorded,
        "every recorded HTTP status was really answered, whole, for that invocation",
        bad,
    )


def check_attempt_bounds(data: RunData) -> CheckResult:
    bad = []
    grouped = data.attempts_by_invocation()
    for inv in data.invocations:
        rows = grouped.get(inv.id, [])
        numbers = [r.attempt for r in rows]
        # a claim that put the call back to pending approval counts no attempt
        limit = inv.max_attempts + inv.approval_returns
        where = f"{inv.id} ({inv.tool}, max_attempts {inv.max_attempts})"
        # Past the limit a claim only gives up. A worker frozen while giving up loses its
        # lease, the next claim gives up again, and the frozen one's row is recorded when it
        # wakes: one give-up per frozen worker, and one more.
        past = [r for r in rows if r.attempt > limit]
        unexplained = [r for r in past if _pid(r.worker) not in data.frozen_pids]
        if len(unexplained) > 1:
            bad.append(
                f"{where}: {len(rows)} attempts recorded, {len(unexplained)} of them giving"
                " up by workers never frozen"
            )
        if len(set(numbers)) != len(numbers):
            bad.append(f"{where}: attempt numbers recorded twice: {sorted(numbers)}")
        for row in past:
            if row.status_code is not None or row.error_code not in GAVE_UP_CODES:
                bad.append(
                    f"{where}: attempt {row.attempt} went past the limit"
                    f" (status {row.status_code}, {row.error_code})"
                )
    return _result(
        "attempt_bounds",
        len(data.invocations),
        "attempt numbers are unique; requests only in attempts 1..max_attempts; past them,"
        " one give-up without sending, and one more per worker frozen while giving up",
        bad,
    )


def _pid(worker: str) -> int | None:
    """The process id in a worker id (host:pid:random, dispatch/worker.py)."""
    parts = worker.rsplit(":", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def check_result_from_last_claim(data: RunData) -> CheckResult:
    bad, claimed = [], 0
    grouped = data.attempts_by_invocation()
    for inv in data.invocations:
        if inv.attempt < 1 or inv.status not in TERMINAL:
            continue
        claimed += 1
        rows = grouped.get(inv.id, [])
        last = [r for r in rows if r.attempt == inv.attempt]
        where = f"{inv.id} ({inv.tool})"
        if any(r.attempt > inv.attempt for r in rows):
            bad.append(f"{where}: an attempt numbered above the invocation's {inv.attempt}")
        if not last:
            bad.append(
                f"{where}: ended at attempt {inv.attempt}, which recorded nothing: an earlier,"
                " stale claim wrote the result"
            )
        elif not any(
            (r.error_code, r.status_code) == (inv.error_code, inv.http_status) for r in last
        ):
            got = ", ".join(f"{r.error_code}/{r.status_code}" for r in last)
            bad.append(
                f"{where}: result {inv.error_code}/{inv.http_status} is not what its last claim"
                f" (attempt {inv.attempt}) recorded ({got}): a stale claim overwrote it"
            )
    return _result(
        "result_from_last_claim",
        claimed,
        "the recorded result is the one of the invocation's last claim (fencing held)",
        bad,
    )


def check_gated(data: RunData) -> CheckResult:
    bad, gated = [], 0
    changed = data.gating_changed()  # requests_as_approved decides each of their requests
    for inv in data.invocations:
        if not inv.gated or inv.tool in changed:
            continue
        gated += 1
        seen = len(data.arrivals.get(inv.id, ()))
        approved = inv.decided and inv.approval_status in ("approved", "expired")
        scripted = data.decisions.get(inv.id)
        if seen and not approved:
            bad.append(f"{inv.id} ({inv.tool}) sent {seen} time(s) but {inv.approval_status}")
        if seen and scripted is not None and scripted != "approve":
            bad.append(f"{inv.id} ({inv.tool}) sent although the script chose {scripted}")
        if inv.status == "rejected" and (seen or scripted not in (None, "reject")):
            bad.append(f"{inv.id} ({inv.tool}) rejected, script {scripted}, seen {seen}")
    also = f" ({len(changed)} tools gated and ungated: see requests_as_approved)" if changed else ""
    return _result(
        "gated_only_after_approval",
        gated,
        "nothing gated reached the upstream unless approved; rejected and unapproved ones"
        f" never{also}",
        bad,
    )


def check_egress(data: RunData) -> CheckResult:
    bad = [f"canary {addr} got {n} connection(s)" for addr, n in data.canaries.items() if n]
    blocked = [i for i in data.invocations if i.error_code == "egress_blocked"]
    for inv in blocked:
        seen = data.arrivals.get(inv.id, ())
        if not any(a.action == "redirect_blocked" and a.complete for a in seen):
            bad.append(f"{inv.id} ({inv.tool}) egress_blocked without a redirect to explain it")
    if data.blocked_redirects_issued and not blocked:
        bad.append("the upstream redirected to blocked addresses, but nothing was refused")
    return _result(
        "egress_guard",
        data.blocked_redirects_issued,
        f"{len(blocked)} redirects to blocked addresses refused (egress_blocked);"
        f" canaries {dict(data.canaries)} contacted 0 times",
        bad,
    )


def check_requests_identified(data: RunData) -> CheckResult:
    known = {i.id: i for i in data.invocations}
    bad = []
    if data.without_invocation:
        bad.append(f"{data.without_invocation} request(s) without an invocation header")
    total = 0
    for inv_id, seen in data.arrivals.items():
        total += len(seen)
        inv = known.get(inv_id)
        if inv is None:
            bad.append(f"{len(seen)} request(s) for unknown invocation {inv_id!r}")
            continue
        for a in seen:
            if a.auth_ok is False:
                bad.append(f"{inv_id} ({inv.tool}) request {a.seq} had a wrong credential")
            if a.auth_ok and not _bound_here(data, inv, a):
                bad.append(
                    f"{inv_id} ({inv.tool}) request {a.seq} carried a credential whose allowed"
                    " hosts did not admit the upstream at any moment since the call was made"
                )
            if inv.idempotency_header and a.idempotency_key != f"toolrelay-{inv_id}":
                bad.append(f"{inv_id} ({inv.tool}) request {a.seq} without its idempotency key")
    return _result(
        "requests_identified",
        total,
        "every request named a known invocation, carried the right credential (one its"
        " allowed hosts admitted here) and, where declared, its idempotency key",
        bad,
    )


def _bound_here(data: RunData, inv: InvocationRow, arrival: Arrival) -> bool:
    versions = data.versions.get(inv.tool, ())
    refs = {str(v.row.get("credential_ref")) for v in versions if v.row.get("credential_ref")}
    hosts = [h for ref in refs for h in data.hosts.get(ref, ())]
    return credential_admitted(hosts, arrival, inv.created_at)


def check_requests_as_approved(data: RunData) -> CheckResult:
    """Every request received is a rendering that was approved, or one made while its tool
    was ungated under a configuration current in between (fidelity.py)."""
    judge = Judge(data.versions)
    known = {i.id: i for i in data.invocations}
    values = [v for vs in data.secrets.values() for v in vs]
    bad: list[str] = []
    how: Counter[str] = Counter()
    if data.without_invocation:
        bad.append(f"{data.without_invocation} request(s) without an invocation header")
    for inv_id in [i.id for i in data.invocations] + sorted(set(data.arrivals) - set(known)):
        seen = data.arrivals.get(inv_id, ())
        inv = known.get(inv_id)
        if inv is None:
            bad.append(f"{len(seen)} request(s) for unknown invocation {inv_id!r}")
            continue
        for a in seen:
            where = f"{inv.id} ({inv.tool}) request {a.seq} at {a.target.partition('?')[0]}"
            if a.target.startswith("/final/"):
                previous = seen[a.seq - 2] if a.seq >= 2 else None
                if follows_redirect(previous, a):
                    how["followed redirect"] += 1
                else:
                    bad.append(f"{where}: a redirect target, but no redirect of it was followed")
                continue
            verdict = judge.verdict(data.call(inv), a)
            if verdict.how is None:
                bad.append(f"{where}: {verdict.problem}")
            else:
                how[verdict.how] += 1
    bad = list(scrub(bad, values))  # a credential sent where it does not belong stays unshown
    shown = ", ".join(f"{n} {k}" for k, n in sorted(how.items()))
    return _result(
        "requests_as_approved",
        sum(how.values()) + len(bad),
        "every request received, credential and client headers aside, is the rendering that"
        f" was approved or one made ungated under the configuration current ({shown})",
        bad,
    )


def check_secrets(data: RunData) -> CheckResult:
    bad = []
    for source, text in data.texts.items():
        for kind, values in data.secrets.items():
            for value in values:
                if len(value) < 8:
                    continue
                if value in text or value.encode().hex() in text:
                    bad.append(f"a {kind} value appears in {source}")
                    break
    count = sum(len(v) for v in data.secrets.values())
    return _result(
        "no_secret_leaked",
        count,
        f"none of {count} secret values in {len(data.texts)} sources (pg_dump, logs, report)",
        bad,
    )


def check_probe(data: RunData) -> CheckResult:
    bad = []
    known = {i.id: i for i in data.invocations}
    for inv_id in data.probe_ids:
        inv = known.get(inv_id)
        if inv is None:
            bad.append(f"probe {inv_id} missing")
            continue
        seq = inv.output.get("seq") if isinstance(inv.output, dict) else None
        if (inv.status, inv.http_status, seq) != ("completed", 201, 2):
            bad.append(
                f"probe {inv_id}: {inv.status} HTTP {inv.http_status} from request {seq}; the"
                " live worker's answer (201, request 2) was expected, not the stalled one's"
            )
    return _result(
        "stale_lease_probe",
        len(data.probe_ids),
        "a worker frozen past its lease finished later; the rescuer's result stood",
        bad,
    )


def check_coverage(data: RunData) -> CheckResult:
    bad = [
        f"{name}: {got} (at least {minimum} expected)"
        for name, (got, minimum) in data.coverage.items()
        if got < minimum
    ]
    shown = ", ".join(f"{k} {v[0]}" for k, v in data.coverage.items())
    return _result("faults_exercised", len(data.coverage), shown, bad)


CHECKS = (
    check_terminal,
    check_writes_at_most_once,
    check_write_outcomes,
    check_completed_are_real,
    check_recorded_statuses,
    check_attempt_bounds,
    check_result_from_last_claim,
    check_gated,
    check_egress,
    check_requests_identified,
    check_requests_as_approved,
    check_secrets,
    check_probe,
    check_coverage,
)


def run_checks(data: RunData) -> list[CheckResult]:
    return [check(data) for check in CHECKS]

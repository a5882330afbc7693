"""Each chaos invariant holds on a clean record and fails on the violation it names."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tests.chaos.records import claim_row, now, send, tool_row, version
from toolrelay.chaos.checks import (
    AttemptRow,
    CheckResult,
    InvocationRow,
    RunData,
    check_attempt_bounds,
    check_completed_are_real,
    check_coverage,
    check_egress,
    check_gated,
    check_probe,
    check_recorded_statuses,
    check_requests_identified,
    check_result_from_last_claim,
    check_secrets,
    check_terminal,
    check_write_outcomes,
    check_writes_at_most_once,
    run_checks,
)
from toolrelay.chaos.fidelity import HostsVersion
from toolrelay.chaos.upstream import Arrival, ChaosUpstream

INV = "00000000-0000-4000-8000-000000000001"


def inv(**fields: Any) -> InvocationRow:
    base = InvocationRow(
        id=INV,
        tool="chaos.post",
        method="POST",
        idempotency_header=None,
        max_attempts=3,
        gated=False,
        status="completed",
        approval_status="not_required",
        decided=False,
        error_code=None,
        http_status=201,
        attempt=1,
        output={"invocation": INV, "seq": 1, "status": 201},
    )
    return replace(base, **fields)


def arrival(seq: int = 1, action: str = "ok", status: int | None = 201, **fields: Any) -> Arrival:
    return Arrival(
        seq=seq,
        method=fields.pop("method", "POST"),
        path="/api/chaos.post",
        action=action,
        at=0.0,
        status=status,
        complete=fields.pop("complete", status is not None),
        **fields,
    )


def attempt(
    n: int = 1, status: int | None = 201, code: str | None = None, worker: str = "host:100:ab12"
) -> AttemptRow:
    return AttemptRow(
        id=n, invocation_id=INV, attempt=n, worker=worker, status_code=status, error_code=code
    )


def data(
    invocation: InvocationRow,
    arrivals: list[Arrival],
    attempts: list[AttemptRow] | None = None,
    **fields: Any,
) -> RunData:
    rows = attempts if attempts is not None else [attempt(1, invocation.http_status)]
    return RunData(invocations=[invocation], attempts=rows, arrivals={INV: arrivals}, **fields)


async def test_a_clean_run_passes_every_check(upstream: ChaosUpstream) -> None:
    # The request as the dispatcher really sends it, under the tool's logged configuration.
    row = tool_row(upstream.base_url, "chaos.post", "POST")
    record = inv(input={"n": 1, "text": "x"}, created_at=now() - 1)
    sent = await send(upstream, claim_row(row, INV, record.input))
    answer = replace(sent, action="ok", status=201, complete=True)
    clean = data(record, [answer], versions={"chaos.post": [version(row)]})
    results = run_checks(clean)
    assert all(r.ok for r in results), [r for r in results if not r.ok]


def test_stuck_invocation_fails_terminal() -> None:
    assert not check_terminal(data(inv(status="running"), [])).ok


def test_a_drain_that_did_not_exit_0_fails_terminal() -> None:
    assert check_terminal(data(inv(), [], drain_exit=0)).ok
    for code in (1, None):
        result = check_terminal(data(inv(), [], drain_exit=code))
        assert not result.ok and "worker --drain" in result.violations[0]


def test_write_processed_twice_fails_but_refusals_do_not_count() -> None:
    twice = [arrival(1, "reset_after", None), arrival(2)]
    assert not check_writes_at_most_once(data(inv(), twice)).ok
    refused_then_ok = [arrival(1, "refuse_429", 429), arrival(2, "refuse_503", 503), arrival(3)]
    record = inv(output={"invocation": INV, "seq": 3, "status": 201}, attempt=3)
    assert check_writes_at_most_once(data(record, refused_then_ok)).ok
    # an idempotent POST may be sent again
    idem = inv(idempotency_header="Idempotency-Key", output={"invocation": INV, "seq": 2})
    assert check_writes_at_most_once(data(idem, twice)).ok


@pytest.mark.parametrize(
    ("record", "seen", "ok"),
    [
        # seen once: completed (with that answer), outcome_unknown, or the real answer
        (inv(), [arrival()], True),
        (inv(status="failed", error_code="outcome_unknown", http_status=None, output=None),
         [arrival(1, "reset_after", None)], True),
        (inv(status="failed", error_code="outcome_unknown", http_status=None, output=None),
         [], True),
        (inv(status="failed", error_code="http_error", http_status=502, output=None),
         [arrival(1, "error_5xx", 502)], True),
        # a failure that claims an answer the upstream never gave whole
        (inv(status="failed", error_code="http_error", http_status=200, output=None),
         [arrival(1, "truncated", 200, complete=False)], False),
        # a local failure after the upstream processed it: the write is lost to the record
        (inv(status="failed", error_code="network_error", http_status=None, output=None),
         [arrival(1, "reset_after", None)], False),
        (inv(status="failed", error_code="credential_error", http_status=None, output=None),
         [], True),
        # completed, but the upstream never processed it
        (inv(), [], False),
        (inv(), [arrival(1, "refuse_429", 429)], False),
        # expired or rejected after the upstream processed it
        (inv(status="expired", error_code="approval_expired", http_status=None, output=None),
         [arrival(1, "ok", 200)], False),
    ],
)  # fmt: skip
def test_write_outcomes(record: InvocationRow, seen: list[Arrival], ok: bool) -> None:
    assert check_write_outcomes(data(record, seen)).ok is ok


def test_completed_output_must_be_a_whole_2xx_answer_with_the_same_status() -> None:
    read = inv(method="GET", tool="chaos.read")
    assert check_completed_are_real(data(read, [arrival(method="GET")])).ok
    assert not check_completed_are_real(data(read, [])).ok
    assert not check_completed_are_real(data(read, [arrival(status=200, method="GET")])).ok
    cut = [arrival(complete=False, method="GET")]
    assert not check_completed_are_real(data(read, cut)).ok
    other = inv(method="GET", output={"invocation": "someone-else", "seq": 1})
    assert not check_completed_are_real(data(other, [arrival(method="GET")])).ok


def test_recorded_status_must_have_been_answered() -> None:
    record = inv(status="failed", error_code="http_error", http_status=404, output=None)
    assert check_recorded_statuses(data(record, [arrival(1, "error_4xx", 404)])).ok
    assert not check_recorded_statuses(data(record, [arrival(1, "error_4xx", 400)])).ok


def test_attempt_bounds() -> None:
    read = inv(method="GET", max_attempts=2, attempt=3)
    ok_rows = [attempt(1, 500, "http_error"), attempt(2, 200), attempt(3, None, "network_error")]
    assert check_attempt_bounds(data(read, [], ok_rows)).ok
    too_many = [*ok_rows, attempt(4, None, "network_error")]
    assert not check_attempt_bounds(data(read, [], too_many)).ok
    sent_past_limit = [attempt(1, 500, "http_error"), attempt(3, 200)]
    assert not check_attempt_bounds(data(read, [], sent_past_limit)).ok
    twice = [attempt(1, 500, "http_error"), attempt(1, 200)]
    assert not check_attempt_bounds(data(read, [], twice)).ok


def test_a_worker_frozen_while_giving_up_explains_one_more_give_up() -> None:
    # attempt 3 gave up in a worker (pid 200) frozen before recording it; attempt 4, the
    # next claim, gave up too; the frozen worker's row arrived when it woke
    read = inv(method="GET", max_attempts=2, attempt=4)
    rows = [
        attempt(1, 500, "http_error"),
        attempt(2, 503, "http_error"),
        attempt(3, None, "network_error", worker="host:200:cd34"),
        attempt(4, None, "network_error"),
    ]
    assert check_attempt_bounds(data(read, [], rows, frozen_pids=frozenset({200}))).ok
    # the same rows with no worker frozen: a claim gave up twice for no reason
    result = check_attempt_bounds(data(read, [], rows))
    assert not result.ok
    assert "2 of them giving up by workers never frozen" in result.violations[0]
    # being frozen excuses a give-up, never a request past the limit
    sent = [*rows[:2], attempt(3, 200, worker="host:200:cd34"), attempt(4, None, "network_error")]
    assert not check_attempt_bounds(data(read, [], sent, frozen_pids=frozenset({200}))).ok


def test_a_stale_result_over_the_last_claims_is_caught() -> None:
    # attempt 1's worker froze; attempt 2 took over and got 201; attempt 1 wrote its 200 last
    record = inv(method="GET", attempt=2, http_status=200)
    rows = [attempt(1, 200), attempt(2, 201)]
    result = check_result_from_last_claim(data(record, [], rows))
    assert not result.ok and "stale claim" in result.violations[0]
    fine = inv(method="GET", attempt=2, http_status=201)
    assert check_result_from_last_claim(data(fine, [], rows)).ok
    assert not check_result_from_last_claim(data(fine, [], [attempt(1, 200)])).ok
    never_claimed = inv(status="rejected", attempt=0, http_status=None)
    assert check_result_from_last_claim(data(never_claimed, [], [])).ok


def test_gated_invocations_are_sent_only_after_approval() -> None:
    approved = inv(gated=True, approval_status="approved", decided=True)
    assert check_gated(data(approved, [arrival()], decisions={INV: "approve"})).ok
    rejected = inv(gated=True, status="rejected", approval_status="rejected", decided=True)
    assert check_gated(data(rejected, [], decisions={INV: "reject"})).ok
    assert not check_gated(data(rejected, [arrival()], decisions={INV: "reject"})).ok
    never = inv(gated=True, status="expired", approval_status="expired", decided=False)
    assert not check_gated(data(never, [arrival()], decisions={INV: "ignore"})).ok


def test_egress() -> None:
    blocked = inv(method="GET", status="failed", error_code="egress_blocked", http_status=None)
    redirect = [arrival(1, "redirect_blocked", 302, method="GET")]
    good = data(blocked, redirect, canaries={"127.0.0.2:1": 0}, blocked_redirects_issued=1)
    assert check_egress(good).ok
    assert not check_egress(replace(good, canaries={"127.0.0.2:1": 1})).ok
    assert not check_egress(replace(good, arrivals={INV: []})).ok
    nothing_refused = data(inv(), [arrival()], blocked_redirects_issued=3)
    assert not check_egress(nothing_refused).ok


def test_requests_identified() -> None:
    assert check_requests_identified(data(inv(), [arrival()])).ok
    assert not check_requests_identified(data(inv(), [arrival(auth_ok=False)])).ok
    assert not check_requests_identified(data(inv(), [arrival()], without_invocation=1)).ok
    stranger = RunData(invocations=[inv()], attempts=[], arrivals={"nobody": [arrival()]})
    assert not check_requests_identified(stranger).ok
    idem = inv(idempotency_header="Idempotency-Key")
    assert not check_requests_identified(data(idem, [arrival()])).ok
    keyed = arrival(idempotency_key=f"toolrelay-{INV}")
    assert check_requests_identified(data(idem, [keyed])).ok


def test_secrets_are_found_plain_or_hex_and_never_shown() -> None:
    secret = "sk-live-0123456789"
    clean = data(inv(), [arrival()], secrets={"api_key": [secret]}, texts={"log": "nothing"})
    assert check_secrets(clean).ok
    for text in (f"x {secret} y", f"\\x{secret.encode().hex()}"):
        result = check_secrets(replace(clean, texts={"pg_dump": text}))
        assert not result.ok
        assert secret not in str(result.as_dict())


def test_probe_and_coverage() -> None:
    stood = inv(method="GET", http_status=201, output={"invocation": INV, "seq": 2})
    assert check_probe(data(stood, [], probe_ids=[INV])).ok
    overwritten = inv(method="GET", http_status=200, output={"invocation": INV, "seq": 1})
    assert not check_probe(data(overwritten, [], probe_ids=[INV])).ok
    covered: CheckResult = check_coverage(data(inv(), [], coverage={"kills": (3, 1)}))
    assert covered.ok
    assert not check_coverage(data(inv(), [], coverage={"kills": (0, 1)})).ok


def test_credential_sent_only_while_its_hosts_admitted_the_upstream() -> None:
    cred = "00000000-0000-4000-8000-0000000000cc"
    row = tool_row("http://127.0.0.1:8080", "chaos.read_key", "GET", credential_ref=cred)
    sent = arrival(auth_ok=True, headers=(("Host", "127.0.0.1:8080"),), wall=10.0)
    record = inv(tool="chaos.read_key", created_at=5.0)

    def run(*hosts: HostsVersion) -> bool:
        logged = data(
            record, [sent], versions={"chaos.read_key": [version(row)]}, hosts={cred: list(hosts)}
        )
        return check_requests_identified(logged).ok

    assert run(HostsVersion(["127.0.0.1"]))
    assert run(HostsVersion(["127.0.0.1:8080"]))
    assert not run(HostsVersion(["127.0.0.1:8081"]))
    assert not run()
    # the binding admitted it only before the call was made, or only after the request
    assert not run(HostsVersion(["127.0.0.1"], end=4.0), HostsVersion(["x"], start=3.9))
    assert not run(HostsVersion(["x"], end=11.0), HostsVersion(["127.0.0.1"], start=10.5))
    assert run(HostsVersion(["127.0.0.1"], end=6.0), HostsVersion(["x"], start=5.9))


def test_tools_whose_gating_changed_are_left_to_requests_as_approved() -> None:
    row = tool_row("http://127.0.0.1:8080", "chaos.post", "POST")
    never = inv(gated=True, status="failed", approval_status="not_required", decided=False)
    sent_once = data(never, [arrival()], decisions={})
    assert not check_gated(sent_once).ok
    toggled = replace(
        sent_once,
        versions={"chaos.post": [version(row, 0, gated=False), version(row, 1, gated=True)]},
    )
    result = check_gated(toggled)
    assert result.ok and "1 tools gated and ungated" in result.summary


def test_a_claim_that_went_back_to_approval_counts_no_attempt() -> None:
    # one attempt allowed; the first claim found the tool gated since and sent nothing
    rows = [attempt(1, None, "approval_required"), attempt(2, 200)]
    returned = inv(method="GET", max_attempts=1, attempt=2, approval_returns=1)
    assert check_attempt_bounds(data(returned, [], rows)).ok
    result = check_attempt_bounds(data(replace(returned, approval_returns=0), [], rows))
    assert not result.ok
    assert "attempt 2 went past the limit" in result.violations[0]

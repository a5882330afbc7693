"""requests_as_approved: what the upstream received is what was approved, or what an
ungated configuration current at the time renders; anything else is caught and named.

The requests are real: the dispatcher's Executor sends them to the chaos upstream on
loopback, and the check is fed the upstream's own record.
"""

from __future__ import annotations

import dataclasses
import json
import math
import uuid
from typing import Any

import pytest

from tests.chaos.records import API_KEY, claim_row, digest, now, send, tool_row, version
from toolrelay.chaos.checks import InvocationRow, RunData, check_requests_as_approved
from toolrelay.chaos.fidelity import ConfigVersion
from toolrelay.chaos.mutations import (
    INPUT_SCHEMA_WITH_DEFAULTS,
    template_variant,
    with_revision,
)
from toolrelay.chaos.upstream import Arrival, ChaosUpstream

INPUT = {"n": 7, "text": "a b+c'!%&=é中🙂\u202e\t\"\\", "chaos": "ok"}


def invocation(inv_id: str, tool: str, created: float, **fields: Any) -> InvocationRow:
    base = InvocationRow(
        id=inv_id,
        tool=tool,
        method="POST",
        idempotency_header=None,
        max_attempts=1,
        gated=False,
        status="completed",
        approval_status="not_required",
        decided=False,
        error_code=None,
        http_status=200,
        attempt=1,
        output=None,
        input=INPUT,
        created_at=created,
    )
    return dataclasses.replace(base, **fields)


def run(inv: InvocationRow, arrivals: list[Arrival], *versions: ConfigVersion) -> RunData:
    return RunData(
        invocations=[inv],
        attempts=[],
        arrivals={inv.id: arrivals},
        versions={versions[0].tool: list(versions)},
        committed={inv.id: inv.created_at},
        secrets={"api_key": [API_KEY]},
    )


def forged(arrival: Arrival, **changes: Any) -> Arrival:
    return dataclasses.replace(arrival, **changes)


async def test_approved_requests_sent_by_the_executor_pass(upstream: ChaosUpstream) -> None:
    # A gated POST with a header credential and a reshaped template, approved as rendered.
    row = tool_row(
        upstream.base_url,
        "t.post",
        "POST",
        request_template=template_variant("POST", 1),
        auth_method="api_key",
        auth_param_name="X-Api-Key",
        credential_ref=uuid.uuid4(),
        egress_class="write",
        idempotency_header="Idempotency-Key",
    )
    inv_id = str(uuid.uuid4())
    created = now()
    approved = digest(row, inv_id, INPUT)
    arrival = await send(upstream, claim_row(row, inv_id, INPUT))
    assert ("X-Api-Key", API_KEY) in arrival.headers  # the credential really was there
    inv = invocation(
        inv_id, "t.post", created, request_digest=approved, decided_at=created, decided=True
    )
    result = check_requests_as_approved(run(inv, [arrival], version(row, gated=True)))
    assert result.ok, result.violations
    assert "1 approved" in result.summary


@pytest.mark.parametrize("shape", [0, 1, 2])
async def test_ungated_requests_sent_by_the_executor_pass(
    upstream: ChaosUpstream, shape: int
) -> None:
    # GET: input text in the query (shape 1), the whole input merged into it (shape 2).
    row = tool_row(
        upstream.base_url, "t.get", "GET", request_template=template_variant("GET", shape)
    )
    row["endpoint_url"] += "/v3?src=r3"
    inv_id = str(uuid.uuid4())
    created = now()
    arrival = await send(upstream, claim_row(row, inv_id, INPUT))
    result = check_requests_as_approved(
        run(invocation(inv_id, "t.get", created), [arrival], version(row))
    )
    assert result.ok, result.violations
    assert "1 ungated" in result.summary


async def test_a_request_that_is_not_the_approved_one_is_caught(upstream: ChaosUpstream) -> None:
    """Approved as rendered under r0; what arrived was rendered under r1 (a default sent,
    and the template changed): the violation names the call and what differs."""
    before = tool_row(upstream.base_url, "t.write", "POST", egress_class="write")
    after = dict(before) | {
        "request_template": with_revision(before["request_template"], 1),
        "schema_input": INPUT_SCHEMA_WITH_DEFAULTS,
    }
    inv_id = str(uuid.uuid4())
    created = now()
    approved = digest(before, inv_id, INPUT)
    arrival = await send(upstream, claim_row(after, inv_id, INPUT))  # sent as it renders now
    body = json.loads(arrival.body) | {"to": "attacker@example.invalid"}
    with_default = forged(arrival, body=json.dumps(body).encode())
    inv = invocation(
        inv_id, "t.write", created, request_digest=approved, decided_at=created, decided=True
    )
    versions = (
        version(before, 0, gated=True, end=arrival.wall),
        version(after, 1, gated=True, start=arrival.wall - 0.01),
    )
    for got, differs in ((arrival, "header x-chaos-config"), (with_default, "body")):
        result = check_requests_as_approved(run(inv, [got], *versions))
        assert not result.ok
        assert result.violation_count == 1
        violation = result.violations[0]
        assert violation.startswith(f"{inv_id} (t.write) request 1")
        assert "received a different request" in violation
        assert differs in violation, violation
    # The approved request itself passes.
    exact = await send(upstream, claim_row(before, inv_id, INPUT))
    assert check_requests_as_approved(run(inv, [exact], *versions)).ok


async def test_a_gated_call_sent_unapproved_is_caught(upstream: ChaosUpstream) -> None:
    row = tool_row(upstream.base_url, "t.gated", "POST", egress_class="write")
    inv_id = str(uuid.uuid4())
    arrival = await send(upstream, claim_row(row, inv_id, INPUT))
    inv = invocation(inv_id, "t.gated", now() - 1, approval_status="pending")
    result = check_requests_as_approved(run(inv, [arrival], version(row, gated=True)))
    assert not result.ok
    assert "never approved; made while its tool was gated" in result.violations[0]
    assert "closest configuration r0 (test, gated): equal" in result.violations[0]
    # Sent before its approval: the same.
    early = invocation(
        inv_id, "t.gated", now() - 1, request_digest=digest(row, inv_id, INPUT),
        decided_at=arrival.wall + 1, decided=True,
    )  # fmt: skip
    result = check_requests_as_approved(run(early, [arrival], version(row, gated=True)))
    assert not result.ok and "sent before its approval" in result.violations[0]


async def test_ungated_only_under_a_configuration_current_in_between(
    upstream: ChaosUpstream,
) -> None:
    """A call made ungated may be sent under any ungated configuration current between its
    creation and the request, not under one before it, and not under a gated one."""
    old = tool_row(upstream.base_url, "t.read", "GET")
    new = dict(old) | {"request_template": with_revision(old["request_template"], 1)}
    inv_id = str(uuid.uuid4())
    arrival = await send(upstream, claim_row(old, inv_id, INPUT))
    t = arrival.wall
    inv = invocation(inv_id, "t.read", t - 1.0)
    # r0 current until just before the call was made: its rendering no longer allowed
    stale = (version(old, 0, end=t - 2.0), version(new, 1, start=t - 2.1))
    result = check_requests_as_approved(run(inv, [arrival], *stale))
    assert not result.ok and "no ungated configuration current since" in result.violations[0]
    assert "closest configuration r1" in result.violations[0]
    # r0 current when the call was made, r1 since: both allowed
    fresh = (version(old, 0, end=t - 0.5), version(new, 1, start=t - 0.6))
    assert check_requests_as_approved(run(inv, [arrival], *fresh)).ok
    # made ungated (r0), then gated (r1 renders the same as r0 here): r0 was still current
    # in the window, so it passes; the run makes every gating change render anew (a new
    # X-Chaos-Config) so that a request sent under the gated configuration cannot pass.
    regated = dict(new) | {"requires_approval": True}
    gated = (version(old, 0, end=t - 0.5), version(regated, 1, gated=True, start=t - 0.6))
    sent_gated = await send(upstream, claim_row(regated, inv_id, INPUT))
    result = check_requests_as_approved(run(inv, [sent_gated], *gated))
    assert not result.ok and "closest configuration r1 (test, gated): equal" in result.violations[0]
    # made while gated, sent after an ungating: not allowed either
    late = (version(regated, 0, gated=True, end=t - 0.5), version(new, 1, start=t - 0.6))
    result = check_requests_as_approved(run(inv, [sent_gated], *late))
    assert not result.ok and "made while its tool was gated" in result.violations[0]


async def test_anything_the_renderer_did_not_emit_is_caught(upstream: ChaosUpstream) -> None:
    row = tool_row(upstream.base_url, "t.post", "POST")
    inv_id = str(uuid.uuid4())
    arrival = await send(upstream, claim_row(row, inv_id, INPUT))
    inv = invocation(inv_id, "t.post", now() - 1)
    extra = forged(arrival, headers=(*arrival.headers, ("X-Debug", "1")))
    leaked = forged(arrival, headers=(*arrival.headers, ("Authorization", f"Bearer {API_KEY}")))
    path = forged(arrival, target=arrival.target.replace("/api/t.post", "/api/t.post/v9"))
    for got, says in ((extra, "header x-debug"), (leaked, "header authorization"), (path, "URL")):
        result = check_requests_as_approved(run(inv, [got], version(row)))
        assert not result.ok and says in result.violations[0], result.violations
        assert API_KEY not in str(result.as_dict())  # a misplaced credential is never shown
    assert check_requests_as_approved(run(inv, [arrival], version(row))).ok


async def test_followed_redirects_and_unknown_calls(upstream: ChaosUpstream) -> None:
    row = tool_row(upstream.base_url, "t.read", "GET")
    inv_id = str(uuid.uuid4())
    arrival = await send(upstream, claim_row(row, inv_id, INPUT))
    inv = invocation(inv_id, "t.read", now() - 1)
    redirect = forged(arrival, action="redirect_self", status=307)
    follow = forged(arrival, seq=2, target="/final/t.read?chaos=ok", action="ok")
    result = check_requests_as_approved(run(inv, [redirect, follow], version(row)))
    assert result.ok and "1 followed redirect" in result.summary
    result = check_requests_as_approved(run(inv, [arrival, follow], version(row)))
    assert not result.ok and "no redirect of it was followed" in result.violations[0]
    stranger = run(inv, [arrival], version(row))
    stranger.arrivals = {**stranger.arrivals, "nobody": [arrival]}
    stranger.without_invocation = 2
    assert check_requests_as_approved(stranger).violation_count == 2


async def test_query_credential_leaves_the_rest_of_the_url_alone(upstream: ChaosUpstream) -> None:
    row = tool_row(
        upstream.base_url,
        "t.key",
        "POST",
        auth_method="api_key",
        auth_placement="query",
        auth_param_name="api_key",
        credential_ref=uuid.uuid4(),
    )
    inv_id = str(uuid.uuid4())
    arrival = await send(upstream, claim_row(row, inv_id, INPUT))
    assert "api_key=" in arrival.target
    inv = invocation(inv_id, "t.key", now() - 1)
    assert check_requests_as_approved(run(inv, [arrival], version(row))).ok


async def test_query_credential_with_input_text_in_the_query(upstream: ChaosUpstream) -> None:
    row = tool_row(
        upstream.base_url,
        "t.key",
        "GET",
        request_template=template_variant("GET", 1),  # input text in the query
        auth_method="api_key",
        auth_placement="query",
        auth_param_name="api_key",
        credential_ref=uuid.uuid4(),
    )
    inv_id = str(uuid.uuid4())
    arrival = await send(upstream, claim_row(row, inv_id, INPUT))
    inv = invocation(inv_id, "t.key", now() - 1)
    result = check_requests_as_approved(run(inv, [arrival], version(row)))
    assert result.ok, result.violations


def test_no_configuration_log_is_a_violation() -> None:
    inv = invocation(str(uuid.uuid4()), "t.none", 0.0)
    arrival = Arrival(seq=1, method="GET", path="/api/t.none", action="ok", at=0.0, wall=1.0)
    data = RunData(invocations=[inv], attempts=[], arrivals={inv.id: [arrival]})
    result = check_requests_as_approved(data)
    assert not result.ok and "no configuration of its tool was logged" in result.violations[0]
    assert math.isinf(data.call(inv).created_by)

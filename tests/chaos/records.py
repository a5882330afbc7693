"""Real rendered rows and real recorded requests for the checks' tests.

``send`` pushes a call through the dispatcher's own Executor to the chaos upstream on
loopback, so what the checks are fed is what the upstream really recorded.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import aiohttp

from toolrelay.chaos.fidelity import ConfigVersion
from toolrelay.chaos.scenario import INPUT_SCHEMA, template
from toolrelay.chaos.upstream import Arrival, ChaosUpstream
from toolrelay.dispatch.egress import EgressPolicy, make_connector
from toolrelay.dispatch.executor import Attempt, Executor, build_request, request_digest

API_KEY = "ck-test-0123456789abcdef+/=&%"
LOOPBACK = EgressPolicy.from_env({"TOOLRELAY_EGRESS_ALLOW": "127.0.0.1"})


def tool_row(base_url: str, key: str, method: str, **fields: Any) -> dict[str, Any]:
    """A tool row as stored, with what the executor and the renderer read."""
    return {
        "id": uuid.uuid4(),
        "key": key,
        "endpoint_url": f"{base_url}/api/{key}",
        "http_method": method,
        "request_template": template(method),
        "schema_input": INPUT_SCHEMA,
        "schema_output": {},
        "auth_method": "none",
        "auth_placement": "header",
        "auth_param_name": "Authorization",
        "auth_param_prefix": "",
        "credential_ref": None,
        "idempotency_header": None,
        "requires_approval": False,
        "egress_class": "read_only",
        "response_pointer": None,
        "timeout_seconds": 5.0,
        "connect_timeout_seconds": 5.0,
        "max_response_bytes": 1_000_000,
        "max_attempts": 1,
    } | fields


def version(
    row: Mapping[str, Any], rev: int = 0, gated: bool = False, **times: float
) -> ConfigVersion:
    return ConfigVersion(str(row["key"]), rev, "test", dict(row), gated=gated, **times)


def digest(row: Mapping[str, Any], inv_id: str, input: Mapping[str, Any]) -> str:
    return request_digest(build_request(dict(row) | {"id": inv_id, "input": input}))


def claim_row(tool: Mapping[str, Any], inv_id: str, input: Mapping[str, Any]) -> dict[str, Any]:
    """What the claim statement returns for one runnable, ungated call."""
    return dict(tool) | {
        "id": inv_id,
        "owner": uuid.uuid4(),
        "input": dict(input),
        "attempt": 1,
        "approval_returns": 0,
        "tool_key": tool["key"],
        "tool_status": "active",
        "agent_status": "active",
        "assignment_allowed": True,
        "approval_status": "not_required",
        "approval_expires_at": None,
        "config_fingerprint": "f",
        "current_fingerprint": "f",
        "gated_now": False,
        "request_digest": None,
    }


async def send(upstream: ChaosUpstream, row: Mapping[str, Any]) -> Arrival:
    """Send one call with the real executor; returns what the upstream recorded of it."""

    async def resolve(*_: Any) -> str:
        return API_KEY

    async def before_send(_: Mapping[str, Any]) -> bool:
        return True

    async with aiohttp.ClientSession(connector=make_connector(LOOPBACK, limit=4)) as session:
        session._retry_connection = False  # as the worker does
        executor = Executor(session, LOOPBACK, resolve, before_send)
        outcome, _ = await executor.run(row, Attempt())
    assert outcome.status == "completed", (outcome.error_code, outcome.error)
    return upstream.seen(str(row["id"]))[-1]


def now() -> float:
    return datetime.now(UTC).timestamp()

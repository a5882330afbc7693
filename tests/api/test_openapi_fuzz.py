"""Schemathesis against the served OpenAPI: no 5xx, and every answer matches the schema.

Property-based and bounded (a few examples per operation and mode) so the run stays short.
The operations are read from the app's schema at collection time (no I/O: the app is only
built, not served) and each becomes its own test; requests go to the real server.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from toolrelay.api import ApiSettings, create_app
from toolrelay.db import Database
from toolrelay.registry import Registry, ToolSpec
from toolrelay.tokens import TokenStore

# Examples per operation and generation mode; more with TOOLRELAY_FUZZ_EXAMPLES.
MAX_EXAMPLES = int(os.environ.get("TOOLRELAY_FUZZ_EXAMPLES", "8"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]

SCHEMA = schemathesis.openapi.from_dict(
    create_app(ApiSettings(database_url="postgresql:///unused", run_worker=False)).openapi()
)
OPERATIONS = {op.label: op for op in (result.ok() for result in SCHEMA.get_all_operations())}
# Negative cases need something to get wrong: a parameter or a body.
WITH_INPUT = sorted(
    f"{method.upper()} {path}"
    for path, methods in SCHEMA.raw_schema["paths"].items()
    for method, spec in methods.items()
    if spec.get("parameters") or spec.get("requestBody")
)
CASES = [(label, GenerationMode.POSITIVE) for label in sorted(OPERATIONS)] + [
    (label, GenerationMode.NEGATIVE) for label in WITH_INPUT
]


@pytest.fixture(scope="module")
def tokens(db: Database) -> dict[str, str]:
    """An owner with a tool and an agent that may call it, so that some generated requests
    find something; the agent's endpoints are fuzzed with the agent's token."""
    owner = uuid.uuid4()
    registry = Registry(db, owner)
    registry.register_tool(ToolSpec(key="echo.get", name="Echo", http_method="GET",
                                    endpoint_url="https://api.example.com/echo",
                                    egress_class="read_only", status="disabled"))  # fmt: skip
    agent_id = registry.create_agent("fuzz-bot")
    registry.assign("fuzz-bot", "echo.get")
    store = TokenStore(db)
    return {"owner": store.create(owner)[1], "agent": store.create(owner, agent_id)[1]}


def test_the_served_schema_is_the_one_fuzzed(api: str) -> None:
    served = httpx.get(f"{api}/openapi.json").json()
    assert served["paths"].keys() == SCHEMA.raw_schema["paths"].keys()
    assert len(OPERATIONS) >= 25


@pytest.mark.parametrize(("label", "mode"), CASES, ids=[f"{m.value}-{label}" for label, m in CASES])
def test_operation_never_5xx_and_answers_within_its_schema(
    label: str, mode: GenerationMode, api: str, tokens: dict[str, str]
) -> None:
    token = tokens["agent" if " /v1/agent/" in label else "owner"]
    headers = {"Authorization": f"Bearer {token}"}

    @given(case=OPERATIONS[label].as_strategy(generation_mode=mode))
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(case: Any) -> None:
        case.call_and_validate(base_url=api, headers=headers, checks=CHECKS)

    check()

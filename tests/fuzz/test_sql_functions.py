"""The owner-facing SQL functions under random input.

For every call: it succeeds and wrote what it was given, or it fails with an expected
SQLSTATE (22xxx, 23xxx, P0002, 42501, TR001-TR005) that translates to a specific,
non-empty error, and nothing in the database changed.
"""

from __future__ import annotations

import json
import uuid
from typing import Any
from uuid import UUID

import psycopg
import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from tests.fuzz.strategies import (
    FUZZ,
    assert_clear_refusal,
    call,
    json_objects,
    json_values,
    keys,
    maybe,
    methods,
    names,
    snapshot,
    templates,
    texts,
    urls,
    uuid_texts,
    valid_keys,
    valid_names,
    valid_templates,
)
from tests.registry.helpers import add_tool
from toolrelay.db import Database
from toolrelay.registry import Registry
from toolrelay.registry.service import REGISTER_SQL

REGISTER = REGISTER_SQL  # the statement Registry.register_tool runs
JSON_PARAMS = ("schema_input", "schema_output", "request_template")

# Half the examples are valid everywhere (random text where any text goes, so the write
# happens), half take anything in every parameter.
valid_register_params = st.fixed_dictionaries(
    {
        "key": valid_keys,
        "name": valid_names,
        "description": maybe(texts),
        "category": maybe(texts),
        "schema_input": maybe(st.just({"type": "object"})),
        "schema_output": maybe(json_objects),
        "auth_method": st.just("none"),
        "requires_approval": maybe(st.booleans()),
        "is_dangerous": maybe(st.booleans()),
        "endpoint_url": maybe(st.just("https://api.example.com/v1/x")),
        "http_method": maybe(st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE"])),
        "request_template": maybe(valid_templates),
        "auth_placement": maybe(st.sampled_from(["header", "query"])),
        "auth_param_name": maybe(valid_names),
        "credential_ref": st.none(),
        "egress_class": st.sampled_from(["read_only", "write"]),
        "auth_param_prefix": maybe(texts.filter(lambda t: "\r" not in t and "\n" not in t)),
        "response_pointer": maybe(st.one_of(st.just(""), texts.map(lambda t: "/" + t))),
    }
)
any_register_params = st.fixed_dictionaries(
    {
        "key": maybe(keys),
        "name": maybe(names),
        "description": maybe(texts),
        "category": maybe(texts),
        "schema_input": maybe(st.one_of(json_objects, json_values)),
        "schema_output": maybe(st.one_of(json_objects, json_values)),
        "auth_method": maybe(st.one_of(st.sampled_from(["none", "api_key", "oauth"]), texts)),
        "requires_approval": maybe(st.booleans()),
        "is_dangerous": maybe(st.booleans()),
        "endpoint_url": maybe(urls),
        "http_method": maybe(methods),
        "request_template": maybe(templates),
        "auth_placement": maybe(st.one_of(st.sampled_from(["header", "query"]), texts)),
        "auth_param_name": maybe(names),
        "credential_ref": maybe(st.uuids()),
        "egress_class": maybe(st.one_of(st.sampled_from(["none", "read_only", "write"]), texts)),
        "auth_param_prefix": maybe(st.one_of(texts, st.just("Bearer "), st.just("a\r\nb"))),
        "response_pointer": maybe(st.one_of(texts, st.sampled_from(["", "/", "/a/0", "a"]))),
    }
)
register_params = st.one_of(valid_register_params, any_register_params)


@pytest.fixture(scope="module")
def world(db: Database) -> dict[str, Any]:
    """One owner with an agent and tools in every state fn_invoke_tool distinguishes."""
    registry = Registry(db, uuid.uuid4())
    agent = registry.create_agent("fuzz-bot")
    registry.create_agent("other-bot")
    tools = {
        "read": add_tool(registry, "fuzz.read"),
        "gated": add_tool(registry, "fuzz.write", http_method="POST", egress_class="write"),
        "no_endpoint": add_tool(registry, "fuzz.none", endpoint_url=None, egress_class="none"),
        "disabled": add_tool(registry, "fuzz.off", status="disabled"),
        "unassigned": add_tool(registry, "fuzz.lonely"),
        "denied": add_tool(registry, "fuzz.denied"),
    }
    for name in ("read", "gated", "no_endpoint", "disabled"):
        registry.assign("fuzz-bot", tools[name]["key"])
    registry.assign("fuzz-bot", tools["denied"]["key"], allowed=False)
    return {"registry": registry, "agent": agent, "tools": {k: v["id"] for k, v in tools.items()}}


@FUZZ
@given(params=register_params)
def test_fn_register_tool(db: Database, params: dict[str, Any]) -> None:
    owner = uuid.uuid4()
    sql_params = {
        k: Jsonb(v) if k in JSON_PARAMS and v is not None else v for k, v in params.items()
    }
    before = snapshot(db)
    row, error = call(db, owner, REGISTER, sql_params)
    if error is not None:
        assert_clear_refusal(error)
        assert snapshot(db) == before, "a failed fn_register_tool wrote something"
        return
    assert row is not None
    assert (row["owner"], row["key"], row["name"]) == (owner, params["key"], params["name"])
    assert row["category"] == ("general" if params["category"] is None else params["category"])
    if row["egress_class"] == "write":
        assert row["requires_approval"] is True


@FUZZ
@given(name=maybe(names))
def test_fn_create_agent(db: Database, name: str | None) -> None:
    owner = uuid.uuid4()
    before = snapshot(db)
    row, error = call(db, owner, "SELECT fn_create_agent(%s) AS id", (name,))
    if error is not None:
        assert_clear_refusal(error)
        assert snapshot(db) == before
        return
    assert row is not None
    with db.connect() as conn:
        stored = conn.execute(
            "SELECT owner, name FROM agents.agents WHERE id = %s", (row["id"],)
        ).fetchone()
    assert stored == {"owner": owner, "name": name}


TOOL_STATES = ["read", "gated", "no_endpoint", "disabled", "unassigned", "denied"]
valid_invoke = st.fixed_dictionaries(
    {
        "agent": st.just("real"),
        "tool": st.sampled_from(["read", "gated"]),
        "payload": json_objects,
        "run_id": maybe(st.uuids()),
        "as_agent": st.sampled_from([None, "self"]),
    }
)
any_invoke = st.fixed_dictionaries(
    {
        "agent": st.one_of(st.just("real"), st.uuids()),
        "tool": st.one_of(st.sampled_from(TOOL_STATES), st.uuids()),
        "payload": maybe(json_values),
        "run_id": maybe(st.uuids()),
        "as_agent": st.one_of(st.sampled_from([None, "self"]), st.uuids()),
    }
)


@FUZZ
@given(case=st.one_of(valid_invoke, any_invoke))
def test_fn_invoke_tool(db: Database, world: dict[str, Any], case: dict[str, Any]) -> None:
    agent, tool, payload = case["agent"], case["tool"], case["payload"]
    run_id, as_agent = case["run_id"], case["as_agent"]
    owner = world["registry"].owner
    agent_id = world["agent"] if agent == "real" else agent
    tool_id = world["tools"][tool] if isinstance(tool, str) else tool
    caller = world["agent"] if as_agent == "self" else as_agent
    assert caller is None or isinstance(caller, UUID)
    value = Jsonb(payload) if payload is not None else None
    before = snapshot(db)
    row, error = call(
        db,
        owner,
        "SELECT fn_invoke_tool(%s, %s, %s, %s) AS id",
        (agent_id, tool_id, value, run_id),
        agent=caller,
    )
    if error is not None:
        assert_clear_refusal(error)
        assert snapshot(db) == before
        return
    assert row is not None
    with db.connect() as conn:
        stored = conn.execute(
            "SELECT input = %s AS same_input, run_id, status, tool_id"
            " FROM agents.tool_invocations WHERE id = %s",
            (value, row["id"]),
        ).fetchone()
    assert stored is not None
    # jsonb equality: 9.47905784798391e+16 and 94790578479839100 are the same JSON number.
    assert stored["same_input"] is True
    assert (stored["run_id"], stored["tool_id"]) == (run_id, tool_id)
    assert stored["status"] == ("pending" if tool == "gated" else "running")


@FUZZ
@given(reason=maybe(texts), target=st.one_of(st.just("pending"), st.just("done"), st.uuids()))
def test_fn_reject_tool_invocation(
    db: Database, world: dict[str, Any], reason: str | None, target: str | UUID
) -> None:
    registry: Registry = world["registry"]
    pending = registry.invoke("fuzz-bot", "fuzz.write", {"text": "x"})
    if target == "done":
        registry.reject(pending)
    inv_id = target if isinstance(target, UUID) else pending
    before = snapshot(db)
    _, error = call(
        db, registry.owner, "SELECT fn_reject_tool_invocation(%s, %s)", (inv_id, reason)
    )
    if error is not None:
        assert_clear_refusal(error)
        assert snapshot(db) == before
        assert target != "pending"
        return
    assert target == "pending"
    stored = registry.get_invocation(pending)
    assert (stored["status"], stored["reject_reason"]) == ("rejected", reason)
    assert stored["error"] == "rejected by owner" + (f": {reason}" if reason is not None else "")


@FUZZ
@given(
    function=st.sampled_from(
        [
            "SELECT fn_approve_tool_invocation(%(a)s)",
            "SELECT fn_assign_tool(%(a)s, %(b)s, %(allowed)s)",
            "SELECT fn_revoke_tool(%(a)s, %(b)s)",
        ]
    ),
    a=st.uuids(),
    b=st.uuids(),
    allowed=maybe(st.booleans()),
)
def test_functions_with_unknown_ids(
    db: Database, function: str, a: UUID, b: UUID, allowed: bool | None
) -> None:
    before = snapshot(db)
    _, error = call(db, uuid.uuid4(), function, {"a": a, "b": b, "allowed": allowed})
    assert error is not None, "an unknown id was accepted"
    assert_clear_refusal(error)
    assert snapshot(db) == before


@FUZZ
@given(
    sub=maybe(st.one_of(uuid_texts, texts)),
    claims=maybe(
        st.one_of(
            st.fixed_dictionaries({"sub": uuid_texts}).map(json.dumps),
            st.fixed_dictionaries({"sub": uuid_texts, "agent_id": uuid_texts}).map(json.dumps),
            texts,
            json_values.map(json.dumps),
        )
    ),
)
def test_identity_claims(db: Database, sub: str | None, claims: str | None) -> None:
    """Whatever the JWT settings hold, the caller is a valid owner, or is refused clearly."""
    before = snapshot(db)
    try:
        with db.connect() as conn, conn.transaction():
            conn.execute(
                "SELECT set_config('role', 'authenticated', true),"
                " set_config('request.jwt.claim.sub', %s, true),"
                " set_config('request.jwt.claims', %s, true)",
                (sub or "", claims or ""),
            )
            row = conn.execute(
                "SELECT fn_create_agent(%s) AS id", (f"id-{uuid.uuid4()}",)
            ).fetchone()
    except psycopg.Error as exc:
        assert_clear_refusal(exc)
        assert snapshot(db) == before
        return
    assert row is not None
    event("succeeded")
    with db.connect() as conn:
        owner = conn.execute(
            "SELECT owner FROM agents.agents WHERE id = %s", (row["id"],)
        ).fetchone()
    assert owner is not None
    expected = sub if sub else json.loads(claims or "{}").get("sub")
    assert str(owner["owner"]) == str(UUID(str(expected)))

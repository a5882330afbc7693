"""The Registry facade under random tool definitions, updates and inputs.

Template rendering, URL and header rules and the egress guard's address parsing have their
own property tests (tests/dispatch/test_template.py, test_egress.py). These cover what sits
on top: whatever an owner sends, the answer is success (and the stored tool validates) or a
clear InvalidArgument / InvalidInput, never another exception, and a refusal writes nothing.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from tests.fuzz.strategies import (
    FUZZ,
    json_objects,
    json_values,
    maybe,
    methods,
    mostly,
    names,
    snapshot,
    templates,
    texts,
    urls,
    valid_keys,
    valid_names,
    valid_templates,
)
from tests.registry.helpers import add_tool
from toolrelay.db import Database
from toolrelay.errors import InvalidArgument, InvalidInput, NotFound
from toolrelay.registry import Registry, ToolSpec
from toolrelay.registry.models import UPDATABLE_COLUMNS
from toolrelay.registry.validation import check_tool

finite = st.floats(allow_nan=False, allow_infinity=False)
settings_values = {
    "connect_timeout_seconds": maybe(st.one_of(finite, st.integers(-5, 100))),
    "timeout_seconds": maybe(st.one_of(st.floats(), st.integers(-5, 5000))),
    "max_response_bytes": maybe(st.integers(-(2**40), 2**40)),
    "max_attempts": maybe(st.integers(-3, 30)),
    "max_concurrency": maybe(st.integers(-3, 100)),
    "idempotency_header": maybe(st.one_of(st.just("Idempotency-Key"), texts)),
    "approval_ttl_seconds": maybe(st.integers(-(2**40), 2**40)),
    "approvals_required": maybe(st.integers(-3, 40_000)),
    "status": maybe(st.one_of(st.sampled_from(["active", "disabled", "deprecated"]), texts)),
}
specs = st.fixed_dictionaries(
    {
        "key": valid_keys,
        "name": mostly(valid_names, names),
        "endpoint_url": mostly(st.just("https://api.example.com/v1/{{input.id}}"), maybe(urls)),
        "http_method": mostly(st.sampled_from(["GET", "POST", "PUT", "PATCH"]), maybe(methods)),
        "egress_class": maybe(st.sampled_from(["none", "read_only", "write"])),
        "request_template": mostly(valid_templates, maybe(templates)),
        "schema_input": mostly(st.just({"type": "object"}), json_objects),
        "schema_output": mostly(st.just({}), json_objects),
        "auth_placement": maybe(st.one_of(st.sampled_from(["header", "query"]), texts)),
        "auth_param_name": maybe(names),
        "auth_param_prefix": maybe(texts),
        "response_pointer": maybe(st.one_of(st.sampled_from(["", "/0", "/a~1b"]), texts)),
    },
    optional=settings_values,
)


def stored_tool_is_sane(row: dict[str, Any]) -> None:
    check_tool(row)  # what was stored validates as a whole
    assert 0 < row["timeout_seconds"] <= 3600
    assert row["connect_timeout_seconds"] > 0
    assert 1 <= row["max_attempts"] <= 20
    if row["egress_class"] == "write":
        assert row["requires_approval"] is True


@FUZZ
@given(fields=specs)
def test_register_tool_succeeds_or_refuses_clearly(db: Database, fields: dict[str, Any]) -> None:
    registry = Registry(db, uuid.uuid4())
    before = snapshot(db)
    try:
        row = registry.register_tool(ToolSpec.from_mapping(fields))
    except InvalidArgument as exc:
        event("refused")
        assert exc.message.strip()
        assert snapshot(db) == before, "a refused register_tool wrote something"
        return
    event("registered")
    stored_tool_is_sane(row)
    assert registry.get_tool(fields["key"])["id"] == row["id"]


TEXT_COLUMNS = (
    "name", "description", "category", "endpoint_url", "http_method", "auth_method",
    "auth_placement", "auth_param_name", "auth_param_prefix", "egress_class",
    "response_pointer", "idempotency_header", "status",
)  # fmt: skip
typed_values: dict[str, st.SearchStrategy[Any]] = {
    **{column: maybe(st.one_of(texts, names)) for column in TEXT_COLUMNS},
    "schema_input": st.one_of(json_objects, json_values),
    "schema_output": st.one_of(json_objects, json_values),
    "request_template": st.one_of(valid_templates, templates),
    "requires_approval": maybe(st.booleans()),
    "is_dangerous": maybe(st.booleans()),
    "connect_timeout_seconds": st.one_of(finite, st.integers(-5, 100)),
    "timeout_seconds": st.one_of(finite, st.integers(-5, 5000)),
    "max_response_bytes": st.integers(-(2**70), 2**70),
    "max_attempts": st.integers(-(2**40), 2**40),
    "max_concurrency": maybe(st.integers(-5, 2**40)),
    "approval_ttl_seconds": st.integers(-(2**70), 2**70),
    "approvals_required": maybe(st.integers(-(2**40), 2**40)),
    "credential_ref": maybe(st.uuids()),
}
assert set(typed_values) == set(UPDATABLE_COLUMNS)
changes_of_the_right_type = st.one_of(
    st.lists(
        st.sampled_from(UPDATABLE_COLUMNS).flatmap(lambda c: typed_values[c].map(lambda v: (c, v))),
        max_size=3,
    ).map(dict),
    st.dictionaries(texts, json_values, min_size=1, max_size=2),  # unknown columns
)


@FUZZ
@given(changes=changes_of_the_right_type)
def test_update_tool_succeeds_or_refuses_clearly(db: Database, changes: dict[str, Any]) -> None:
    registry = Registry(db, uuid.uuid4())
    add_tool(registry, "fuzz.update")
    before = snapshot(db)
    try:
        row = registry.update_tool("fuzz.update", changes)
    except InvalidArgument as exc:
        event("refused")
        assert exc.message.strip()
        assert snapshot(db) == before
        return
    event("updated")
    stored_tool_is_sane(row)


@pytest.mark.parametrize(
    "changes",
    [{"timeout_seconds": True}, {"name": {"a": 1}}, {"description": [True, 1]}],
    ids=["bool-for-real", "object-for-text", "mixed-list"],
)
def test_update_tool_with_a_value_of_the_wrong_type(db: Database, changes: dict[str, Any]) -> None:
    registry = Registry(db, uuid.uuid4())
    add_tool(registry, "fuzz.update")
    with pytest.raises(InvalidArgument):
        registry.update_tool("fuzz.update", changes)


def invoke_tool(db: Database, schema: str) -> Registry:
    registry = Registry(db, uuid.uuid4())
    schema_input: dict[str, Any] = {"type": "object"}
    if schema == "strict":
        schema_input = {
            "type": "object",
            "properties": {"text": {"type": "string", "maxLength": 5}, "n": {"type": "integer"}},
            "required": ["text"],
            "additionalProperties": False,
        }
    add_tool(registry, "fuzz.invoke", schema_input=schema_input)
    registry.create_agent("bot")
    registry.assign("bot", "fuzz.invoke")
    return registry


@FUZZ
@given(payload=json_objects, schema=st.sampled_from(["open", "strict"]))
def test_invoke_validates_input_or_refuses_clearly(db: Database, payload: Any, schema: str) -> None:
    registry = invoke_tool(db, schema)
    before = snapshot(db)
    try:
        inv_id = registry.invoke("bot", "fuzz.invoke", payload)
    except (InvalidInput, InvalidArgument) as exc:
        event(type(exc).__name__)
        assert exc.message.strip()
        assert snapshot(db) == before
        return
    event("invoked")
    assert registry.get_invocation(inv_id)["status"] == "running"


@pytest.mark.parametrize("payload", [[1, 2], True, "text", 5], ids=repr)
def test_invoke_with_input_that_is_not_an_object(db: Database, payload: Any) -> None:
    registry = invoke_tool(db, "open")
    with pytest.raises((InvalidInput, InvalidArgument)):
        registry.invoke("bot", "fuzz.invoke", payload)


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_connect_timeout_must_be_finite(db: Database, value: float) -> None:
    registry = Registry(db, uuid.uuid4())
    with pytest.raises((InvalidArgument, NotFound)):
        add_tool(registry, "fuzz.timeout", connect_timeout_seconds=value)

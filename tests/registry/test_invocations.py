"""Invoking: the gating matrix, approvals, rejections, expiry and clear errors."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tests.registry.helpers import add_tool, agent_with_tool
from toolrelay import errors
from toolrelay.db import Database
from toolrelay.registry import Registry


@pytest.mark.parametrize(
    ("fields", "status", "approval"),
    [
        ({}, "running", "not_required"),
        ({"requires_approval": True}, "pending", "pending"),
        ({"egress_class": "write", "http_method": "POST"}, "pending", "pending"),
        ({"is_dangerous": True}, "pending", "pending"),
        ({"egress_class": "none"}, "pending", "pending"),  # an endpoint with unknown egress
    ],
)
def test_gating_matrix(
    registry: Registry, fields: dict[str, Any], status: str, approval: str
) -> None:
    agent, tool = agent_with_tool(registry, **fields)
    inv = registry.get_invocation(registry.invoke(agent, tool["key"], {"text": "hi"}))
    assert (inv["status"], inv["approval_status"]) == (status, approval)
    assert (inv["approval_expires_at"] is not None) == (status == "pending")


def test_approve_moves_pending_to_running(registry: Registry) -> None:
    agent, tool = agent_with_tool(registry, requires_approval=True)
    inv_id = registry.invoke(agent, tool["key"], {"text": "hi"})
    registry.approve(inv_id)
    inv = registry.get_invocation(inv_id)
    assert (inv["status"], inv["approval_status"]) == ("running", "approved")
    assert inv["decided_by"] == registry.owner


def test_reject_records_reason(registry: Registry) -> None:
    agent, tool = agent_with_tool(registry, requires_approval=True)
    inv_id = registry.invoke(agent, tool["key"], {"text": "hi"})
    registry.reject(inv_id, "not today")
    inv = registry.get_invocation(inv_id)
    assert (inv["status"], inv["approval_status"], inv["reject_reason"]) == (
        "rejected",
        "rejected",
        "not today",
    )


def test_approve_and_reject_act_only_on_pending(registry: Registry) -> None:
    agent, tool = agent_with_tool(registry, requires_approval=True)
    inv_id = registry.invoke(agent, tool["key"], {"text": "hi"})
    registry.approve(inv_id)
    with pytest.raises(errors.InvalidState, match="not pending"):
        registry.approve(inv_id)
    with pytest.raises(errors.InvalidState, match="not pending"):
        registry.reject(inv_id)
    ungated = add_tool(registry, key="echo.free")
    registry.assign(agent, ungated["key"])
    free_id = registry.invoke(agent, ungated["key"], {})
    with pytest.raises(errors.InvalidState):
        registry.approve(free_id)


def test_only_the_agents_owner_can_decide(make_registry: Callable[[], Registry]) -> None:
    alice, bob = make_registry(), make_registry()
    agent, tool = agent_with_tool(alice, requires_approval=True)
    inv_id = alice.invoke(agent, tool["key"], {})
    with pytest.raises(errors.NotFound):
        bob.approve(inv_id)
    with pytest.raises(errors.NotFound):
        bob.reject(inv_id)
    assert alice.get_invocation(inv_id)["status"] == "pending"


def test_an_agent_identity_cannot_approve(registry: Registry, db: Database) -> None:
    agent, tool = agent_with_tool(registry, requires_approval=True)
    inv_id = registry.invoke(agent, tool["key"], {})
    agent_id = registry.get_agent(agent)["id"]
    with (
        pytest.raises(psycopg.errors.InsufficientPrivilege, match="agent identity"),
        db.as_owner(registry.owner, agent_id=agent_id) as conn,
    ):
        conn.execute("SELECT fn_approve_tool_invocation(%s)", (inv_id,))
    assert registry.get_invocation(inv_id)["status"] == "pending"


def test_concurrent_approve_and_reject_leave_one_decision(registry: Registry) -> None:
    agent, tool = agent_with_tool(registry, requires_approval=True)
    for _ in range(5):
        inv_id = registry.invoke(agent, tool["key"], {})
        outcomes: list[str] = []
        barrier = threading.Barrier(2)

        def decide(action: Callable[[], None], name: str) -> None:
            barrier.wait()
            try:
                action()
                outcomes.append(name)
            except errors.InvalidState:
                outcomes.append("refused")

        threads = [
            threading.Thread(target=decide, args=(lambda: registry.approve(inv_id), "approved")),
            threading.Thread(target=decide, args=(lambda: registry.reject(inv_id), "rejected")),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcomes) in (["approved", "refused"], ["refused", "rejected"])
        final = registry.get_invocation(inv_id)["approval_status"]
        assert final == next(o for o in outcomes if o != "refused")


def test_pending_approval_expires(registry: Registry, db: Database) -> None:
    agent, tool = agent_with_tool(registry, requires_approval=True)
    inv_id = registry.invoke(agent, tool["key"], {})
    with db.connect(autocommit=True) as conn:  # the clock moves on
        conn.execute(
            "UPDATE agents.tool_invocations SET approval_expires_at = now() - interval '1 second'"
            " WHERE id = %s",
            (inv_id,),
        )
    with pytest.raises(errors.ApprovalExpired, match="approval window closed"):
        registry.approve(inv_id)
    assert registry.expire_pending() == 1
    inv = registry.get_invocation(inv_id)
    assert (inv["status"], inv["approval_status"], inv["error_code"]) == (
        "expired",
        "expired",
        "approval_expired",
    )


def test_invoke_errors_are_clear(registry: Registry) -> None:
    agent, tool = agent_with_tool(
        registry,
        schema_input={
            "type": "object",
            "required": ["text"],
            "properties": {"text": {"type": "string"}},
        },
    )
    with pytest.raises(errors.InvalidInput, match=r"input\.text: 5 is not of type 'string'"):
        registry.invoke(agent, tool["key"], {"text": 5})
    with pytest.raises(errors.InvalidInput, match="'text' is a required property"):
        registry.invoke(agent, tool["key"], {})
    with pytest.raises(errors.NotFound, match="tool nope.nothing not found"):
        registry.invoke(agent, "nope.nothing", {})
    other = add_tool(registry, key="echo.other")
    with pytest.raises(errors.NotAssigned, match="not assigned"):
        registry.invoke(agent, other["key"], {})
    registry.assign(agent, other["key"], allowed=False)
    with pytest.raises(errors.NotAssigned, match="denied"):
        registry.invoke(agent, other["key"], {})
    registry.set_tool_status(tool["key"], "disabled")
    with pytest.raises(errors.ToolInactive, match="disabled"):
        registry.invoke(agent, tool["key"], {"text": "x"})
    assert registry.list_invocations() == []


def test_revoke_stops_new_invocations(registry: Registry) -> None:
    agent, tool = agent_with_tool(registry)
    assert registry.revoke(agent, tool["key"]) is True
    assert registry.revoke(agent, tool["key"]) is False
    with pytest.raises(errors.NotAssigned):
        registry.invoke(agent, tool["key"], {})


def test_register_rejects_bad_configuration_and_writes_nothing(registry: Registry) -> None:
    with pytest.raises(errors.InvalidArgument, match="schema_input is not a valid JSON Schema"):
        add_tool(registry, key="bad.schema", schema_input={"type": "nonsense"})
    with pytest.raises(
        errors.InvalidArgument,
        match="http_method .TRACE. is not allowed: it must be one of GET, POST",
    ):
        add_tool(registry, key="bad.method", http_method="TRACE")
    with pytest.raises(errors.InvalidArgument, match="bad.template"):
        add_tool(registry, key="bad.template", request_template={"body": "{{secrets.key}}"})
    assert registry.list_tools() == []

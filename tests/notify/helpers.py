"""Builders for webhook tests."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tests.notify.conftest import Receiver
from tests.registry.helpers import add_tool
from toolrelay.notify import EVENTS


def subscribe(
    owner: SimpleNamespace,
    receiver: Receiver,
    path: str = "/hook",
    events: tuple[str, ...] = EVENTS,
    fmt: str = "standard",
) -> tuple[dict[str, Any], str]:
    """A subscription of ``owner`` to ``receiver``'s ``path``, verified there."""
    row, secret = owner.webhooks.add(f"{receiver.base_url}{path}", list(events), fmt)
    receiver.secrets[path] = secret
    return row, secret


def tool_for(
    owner: SimpleNamespace,
    receiver: Receiver,
    gated: bool,
    key: str = "crm.lookup",
    agent: str = "bot",
    **fields: Any,
) -> str:
    """A tool calling the receiver's /tool (answers 200 unless scripted), assigned to
    ``agent`` (created if need be)."""
    add_tool(owner.registry, key, endpoint_url=f"{receiver.base_url}/tool",
             requires_approval=gated, **fields)  # fmt: skip
    if not any(a["name"] == agent for a in owner.registry.list_agents()):
        owner.registry.create_agent(agent)
    owner.registry.assign(agent, key)
    return key

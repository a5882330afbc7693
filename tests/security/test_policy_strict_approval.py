"""An approval rule cannot be met by leaving out what it checks (agent input -> policies).

JSON Schema's keywords are vacuous for what they do not apply to: ``{"properties": {"amount":
{"maximum": 100}}}`` holds for an input without ``amount``, and for ``"amount": "100000"`` (a
string: ``maximum`` is about numbers). Where the tool's own schema leaves a property optional
or untyped (imported APIs often do), an agent, which is hostile, had its call approved by
such a rule (docs/approvals.md's own example was one) by omitting the amount or sending it as
text. An approval rule is now read strictly: every property it constrains must be there, and
of the type its keywords are about; a reject rule is read as written (a vacuous match there
rejects more, never less).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.registry.helpers import agent_with_tool
from toolrelay.db import Database
from toolrelay.registry import Registry
from toolrelay.registry.policies import Policies, strict_approval

# A tool as an OpenAPI import makes them: properties optional, amount of any type.
LOOSE: dict[str, Any] = {
    "type": "object",
    "properties": {"amount": {}, "channel": {"type": "string"}, "memo": {"type": "string"},
                   "to": {"type": "object"}},
}  # fmt: skip
SMALL = {"properties": {"amount": {"maximum": 100}, "channel": {"enum": ["general", "ops"]}}}
NESTED = {"properties": {"to": {"properties": {"iban": {"pattern": "^DE"}}}}}


@pytest.fixture
def bot(registry: Registry, db: Database) -> Registry:
    agent_with_tool(registry, key="pay.loose", egress_class="write", requires_approval=True,
                    http_method="POST", schema_input=LOOSE)  # fmt: skip
    return Registry(db, registry.owner, agent_id=registry.get_agent("bot")["id"])


@pytest.mark.parametrize(
    ("rule", "given", "approved"),
    [
        (SMALL, {"amount": 50, "channel": "ops"}, True),
        (SMALL, {"amount": 50.5, "channel": "general", "memo": "x"}, True),
        (SMALL, {"amount": 5000, "channel": "ops"}, False),
        (SMALL, {"channel": "ops"}, False),  # no amount: was approved
        (SMALL, {"amount": "100000", "channel": "ops"}, False),  # as text: was approved
        (SMALL, {"amount": [100000], "channel": "ops"}, False),  # in a list: was approved
        (SMALL, {"amount": 50}, False),  # no channel: was approved
        (NESTED, {"to": {"iban": "DE89"}}, True),
        (NESTED, {"to": {}}, False),  # was approved
        (NESTED, {"to": {"iban": 1234}}, False),  # was approved
        (NESTED, {}, False),  # was approved
    ],
)
def test_an_approval_rule_matches_only_what_it_names(
    registry: Registry, db: Database, bot: Registry, rule: dict[str, Any],
    given: dict[str, Any], approved: bool,
) -> None:  # fmt: skip
    Policies(db).add(registry.owner, "pay.loose", "small payments", "approve", rule)
    made = bot.invoke("bot", "pay.loose", given)
    status = registry.get_invocation(made)["status"]
    assert status == ("running" if approved else "pending"), (rule, given)


def test_a_reject_rule_is_read_as_written(registry: Registry, db: Database, bot: Registry) -> None:
    """A rule that rejects: a call without the property it names is rejected as before."""
    Policies(db).add(registry.owner, "pay.loose", "never ceo", "reject",
                     {"properties": {"channel": {"const": "ceo"}}})  # fmt: skip
    made = bot.invoke("bot", "pay.loose", {"amount": 1})
    assert registry.get_invocation(made)["status"] == "rejected"


def test_the_strict_reading_only_ever_adds_constraints() -> None:
    """Inside not, oneOf and if, more constraints would let more through: left as written."""
    rule = {
        "properties": {"a": {"minimum": 1}},
        "not": {"properties": {"b": {"maxLength": 3}}},
        "oneOf": [{"properties": {"c": {"maximum": 1}}}, {"required": ["d"]}],
        "if": {"properties": {"e": {"minimum": 0}}}, "then": {"required": ["f"]},
        "$defs": {"x": {"properties": {"g": {"minimum": 0}}}},
    }  # fmt: skip
    strict = strict_approval(rule)
    assert strict["required"] == ["a"]
    assert strict["properties"]["a"] == {"minimum": 1, "type": "number"}
    for kept in ("not", "oneOf", "if", "$defs"):
        assert strict[kept] == rule[kept]
    assert strict["then"] == {"required": ["f"], "type": "object"}  # stricter there: stricter
    assert rule["properties"]["a"] == {"minimum": 1}  # the stored rule is not changed

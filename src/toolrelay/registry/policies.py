"""Policies for the obvious cases (issue 16, item 5; migration 0028, docs/approvals.md): rules
an admin attaches to a tool, approving or rejecting a call that waits for approval when its
input matches a JSON Schema.

``apply_policies`` is toolrelay's own step after a call is made pending: as the dispatcher
role (the only one ``fn_policy_decide`` is granted to) it reads the tool's rules, checks the
input with jsonschema, rejection rules first, and lets the first that matches decide; an
approval binds to the digest of the request the call renders now, as a person's does.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final
from uuid import UUID

import psycopg

from toolrelay.db import Database, translate_db_error
from toolrelay.db.connect import Row
from toolrelay.errors import InvalidArgument, InvalidInput, NotFound
from toolrelay.registry.preview import approval_digest
from toolrelay.registry.validation import check_json_schema, validate_input
from toolrelay.tokens import Acting, as_acting

__all__ = ["ACTIONS", "Policies", "Policy", "apply_policies", "strict_approval"]

ACTIONS: Final = ("approve", "reject")
_COLUMNS: Final = (
    "p.id, p.tool_id, t.key AS tool_key, p.name, p.action, p.input_schema, p.created_at,"
    " p.tool_fingerprint IS NOT DISTINCT FROM agents.tool_fingerprint(t) AS current,"
    " s.confirmations, s.needed AS confirmations_needed, s.in_force"
)
_FROM: Final = (
    " FROM agents.tool_policies p JOIN agents.tools_registry t ON t.id = p.tool_id"
    " CROSS JOIN LATERAL agents.policy_standing(p.id) s"
)
_PENDING: Final = """
SELECT i.id, i.input, i.status, t.key AS tool_key, t.endpoint_url, t.http_method,
       t.request_template, t.auth_placement, t.auth_param_name, t.idempotency_header,
       coalesce((SELECT jsonb_agg(jsonb_build_object('id', p.id, 'action', p.action,
                                                     'schema', p.input_schema,
                                                     'in_force', p.action = 'reject'
                                                         OR (SELECT s.in_force FROM
                                                             agents.policy_standing(p.id) s))
                                  ORDER BY p.action DESC, p.created_at, p.id)
                   FROM agents.tool_policies p WHERE p.tool_id = i.tool_id
                    AND p.owner = i.owner), '[]') AS policies
  FROM agents.tool_invocations i
  JOIN agents.tools_registry t ON t.id = i.tool_id
 WHERE i.id = %s AND i.status = 'pending'
"""  # reject sorts before approve: a rejection rule wins


@dataclass(frozen=True)
class Policy:
    id: UUID
    tool_id: UUID
    tool_key: str
    name: str
    action: str
    input_schema: dict[str, Any]
    created_at: datetime
    # Bound to the tool as it is (migration 0042): False once the tool's request changed
    # since the rule was added or confirmed; an approval rule then decides nothing.
    current: bool
    # Admins who confirmed it for the tool as it is, and how many its calls need (0048).
    confirmations: int
    confirmations_needed: int
    # Whether it decides calls now: a rejection rule always; an approval rule when current,
    # confirmed by enough admins, and not only by the tool's last editor in a team.
    in_force: bool


class Policies:
    """Add, list and remove a tool's rules, as ``who`` (an admin changes them)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def add(
        self, who: Acting, tool: str, name: str, action: str, input_schema: Mapping[str, Any]
    ) -> Policy:
        if action not in ACTIONS:
            raise InvalidArgument(f"action must be approve or reject, got {action!r}")
        if not isinstance(input_schema, Mapping):
            raise InvalidArgument("the rule's schema must be a JSON Schema object")
        check_json_schema(f"policy {name!r}: its schema", input_schema)
        with self._as(who) as conn:
            found = conn.execute(
                "SELECT id FROM agents.tools_registry WHERE key = %s OR id::text = %s",
                (tool, tool),
            ).fetchone()
            if found is None:
                raise NotFound(f"tool {tool} not found")
            row = conn.execute(
                "INSERT INTO agents.tool_policies (tool_id, name, action, input_schema)"
                " VALUES (%s, %s, %s, %s) RETURNING id",
                (found["id"], name.strip(), action, json.dumps(input_schema)),
            ).fetchone()
            assert row is not None
            return self._one(conn, row["id"])

    def list(self, who: Acting, tool: str | None = None) -> builtins.list[Policy]:
        with self._as(who) as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS}{_FROM}"
                " WHERE %(tool)s::text IS NULL OR t.key = %(tool)s OR t.id::text = %(tool)s"
                " ORDER BY t.key, p.created_at, p.id",
                {"tool": tool},
            ).fetchall()
        return [Policy(**row) for row in rows]

    def confirm(self, who: Acting, policy_id: UUID) -> Policy:
        """Bind a rule to its tool as it is now (an admin, having looked at its request)."""
        with self._as(who) as conn:
            conn.execute("SELECT fn_confirm_policy(%s)", (policy_id,))
            return self._one(conn, policy_id)

    def remove(self, who: Acting, policy_id: UUID) -> None:
        with self._as(who) as conn:
            gone = conn.execute(
                "DELETE FROM agents.tool_policies WHERE id = %s RETURNING id", (policy_id,)
            ).fetchone()
        if gone is None:
            raise NotFound(f"policy {policy_id} not found")

    def _one(self, conn: psycopg.Connection[Row], policy_id: UUID) -> Policy:
        row = conn.execute(
            f"SELECT {_COLUMNS}{_FROM} WHERE p.id = %s",
            (policy_id,),
        ).fetchone()
        assert row is not None
        return Policy(**row)

    def _as(self, who: Acting) -> AbstractContextManager[psycopg.Connection[Row]]:
        return as_acting(self._db, who)


# Keywords that hold vacuously for any value not of their type ("maximum" passes a string).
_TYPE_OF_KEYWORD: Final = {
    **dict.fromkeys(("maximum", "minimum", "exclusiveMaximum", "exclusiveMinimum",
                     "multipleOf"), "number"),
    **dict.fromkeys(("maxLength", "minLength", "pattern", "format"), "string"),
    **dict.fromkeys(("items", "prefixItems", "maxItems", "minItems", "uniqueItems",
                     "contains", "maxContains", "minContains"), "array"),
    **dict.fromkeys(("properties", "required", "maxProperties", "minProperties",
                     "additionalProperties", "patternProperties", "propertyNames",
                     "dependentRequired", "dependentSchemas"), "object"),
}  # fmt: skip
# Where a stricter subschema makes the whole stricter. Not under not, oneOf or if (there it
# can let more through), nor $defs (a $ref may reach it from such a place).
_STRICTER_INSIDE: Final = ("allOf", "anyOf", "items", "prefixItems", "contains",
                           "additionalProperties", "propertyNames", "then", "else")  # fmt: skip
_STRICTER_MAPS: Final = ("properties", "patternProperties", "dependentSchemas")


def strict_approval(schema: Any) -> Any:
    """An approval rule as it is applied: every property a (sub)schema constrains is
    required, and a subschema whose keywords are about one type of value must be of that
    type. A copy that only ever adds constraints, so it matches a subset of what the rule as
    written matches: what the rule does not name stays unchecked, but nothing it names can
    be met by leaving it out or sending another type (docs/approvals.md)."""
    if not isinstance(schema, dict):
        return schema
    strict = dict(schema)
    for key in _STRICTER_INSIDE:
        value = strict.get(key)
        if isinstance(value, list):
            strict[key] = [strict_approval(each) for each in value]
        elif isinstance(value, dict):
            strict[key] = strict_approval(value)
    for key in _STRICTER_MAPS:
        value = strict.get(key)
        if isinstance(value, dict):
            strict[key] = {name: strict_approval(each) for name, each in value.items()}
    named = strict.get("properties")
    if isinstance(named, dict) and named:
        required = strict.get("required")
        listed = list(required) if isinstance(required, list) else []
        strict["required"] = listed + [name for name in named if name not in listed]
    types = sorted({_TYPE_OF_KEYWORD[k] for k in strict if k in _TYPE_OF_KEYWORD})
    if types and "type" not in strict:
        strict["type"] = types[0] if len(types) == 1 else types
    return strict


NOT_IN_FORCE: Final = "TR003"  # fn_policy_decide: the rule does not stand (migration 0048)


def apply_policies(db: Database, invocation_id: UUID) -> str | None:
    """Let the first rule of the call's tool that its input matches decide a pending call;
    the status it then has, or None when no rule matched (or it is not pending)."""
    try:
        with db.as_dispatcher() as conn:
            row = conn.execute(_PENDING, (invocation_id,)).fetchone()
            if row is None or not row["policies"]:
                return None
            for policy in row["policies"]:
                if not policy["in_force"]:
                    continue  # changed since reviewed (0042), or short of admins (0048)
                schema = policy["schema"]
                if policy["action"] == "approve":  # an agent must not meet it by omission
                    schema = strict_approval(schema)
                try:
                    validate_input(schema, row["input"])
                except InvalidInput:
                    continue
                digest = approval_digest(row) if policy["action"] == "approve" else None
                try:
                    with conn.transaction():  # a savepoint: a refusal undoes only itself
                        decided = conn.execute(
                            "SELECT fn_policy_decide(%s, %s, %s) AS status",
                            (invocation_id, policy["id"], digest),
                        ).fetchone()
                except psycopg.Error as exc:
                    if exc.sqlstate != NOT_IN_FORCE:
                        raise
                    # It stopped being in force since the read above (a confirmer removed,
                    # the tool edited): the next rule, or a person, decides the call.
                    continue
                assert decided is not None
                return str(decided["status"])
    except psycopg.Error as exc:
        raise translate_db_error(exc) from None
    return None

"""The RFC's worked example and its three constraints, run as an owner in plain SQL."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest

from toolrelay.db import Database

EXAMPLE = Path(__file__).parents[2] / "examples/postiz/rfc_worked_example.sql"


def run_as_owner(db: Database, owner: uuid.UUID, sql: str, params: object = None) -> None:
    with psycopg.connect(db.url, autocommit=True) as conn:
        conn.execute("SET ROLE authenticated")
        conn.execute("SELECT set_config('request.jwt.claim.sub', %s, false)", (str(owner),))
        conn.execute(sql, params)  # type: ignore[arg-type]


def psql_vars(sql: str, **values: str) -> str:
    """Substitute psql's :'name' variables the way psql does (quoted literals)."""
    for name, value in values.items():
        sql = sql.replace(f":'{name}'", "'" + value.replace("'", "''") + "'")
    return sql


def test_rfc_worked_example_runs_verbatim_as_owner(db: Database) -> None:
    owner = uuid.uuid4()
    with db.as_owner(owner) as conn:
        cred = conn.execute(
            "INSERT INTO agents.credentials (name, kind, key_id, wrapped_key, nonce, ciphertext)"
            " VALUES ('postiz', 'api_key', 'k', '\\x00', '\\x00', '\\x00') RETURNING id"
        ).fetchone()
    assert cred is not None
    sql = psql_vars(
        EXAMPLE.read_text(),
        postiz_host="postiz.example.com:5000",
        postiz_api_key_secret_id=str(cred["id"]),
    )
    run_as_owner(db, owner, sql)
    with db.as_owner(owner) as conn:
        row = conn.execute(
            "SELECT * FROM agents.tools_registry WHERE key = 'postiz.create_post'"
        ).fetchone()
    assert row is not None
    assert row["name"] == "Postiz: Create Post"
    assert row["category"] == "social"
    assert row["auth_method"] == "api_key"
    assert row["endpoint_url"] == "http://postiz.example.com:5000/api/public/v1/posts"
    assert row["http_method"] == "POST"
    assert row["auth_placement"] == "header"
    assert row["auth_param_name"] == "Authorization"
    assert row["egress_class"] == "write"
    assert row["requires_approval"] is True
    assert row["credential_ref"] == cred["id"]
    assert row["schema_input"]["required"] == ["integrationId", "content"]


def test_register_defaults_are_the_platforms(db: Database) -> None:
    owner = uuid.uuid4()
    with db.as_owner(owner) as conn:
        row = conn.execute("SELECT (fn_register_tool('calc.add', 'Add')).*").fetchone()
    assert row is not None
    assert (row["description"], row["category"], row["schema_input"], row["schema_output"]) == (
        None,
        "general",
        {},
        {},
    )
    assert (row["auth_method"], row["requires_approval"], row["is_dangerous"]) == (
        "none",
        False,
        False,
    )
    assert (row["http_method"], row["request_template"], row["auth_placement"]) == (
        "POST",
        {},
        "header",
    )
    assert (row["auth_param_name"], row["egress_class"], row["status"]) == (
        "Authorization",
        "none",
        "active",
    )


def test_register_upserts_on_owner_and_key(db: Database) -> None:
    owner = uuid.uuid4()
    with db.as_owner(owner) as conn:
        first = conn.execute("SELECT (fn_register_tool('t.x', 'One')).*").fetchone()
        second = conn.execute(
            "SELECT (fn_register_tool('t.x', 'Two', p_category => 'misc')).*"
        ).fetchone()
        count = conn.execute("SELECT count(*) AS n FROM agents.tools_registry").fetchone()
    assert first is not None and second is not None and count is not None
    assert first["id"] == second["id"]
    assert (second["name"], second["category"], count["n"]) == ("Two", "misc", 1)


@pytest.mark.parametrize(
    ("assignment", "constraint"),
    [
        ("http_method = 'TRACE'", "tools_registry_http_method_check"),
        ("auth_placement = 'cookie'", "tools_registry_auth_placement_check"),
        ("egress_class = 'read_only'", "tools_registry_endpoint_required_unless_none_check"),
        ("auth_method = 'password'", "tools_registry_auth_method_check"),
    ],
)
def test_rfc_constraints_reject_by_name(db: Database, assignment: str, constraint: str) -> None:
    owner = uuid.uuid4()
    with db.as_owner(owner) as conn:
        conn.execute("SELECT fn_register_tool('t.c', 'C')")
    with pytest.raises(psycopg.errors.CheckViolation) as info, db.as_owner(owner) as conn:
        conn.execute(f"UPDATE agents.tools_registry SET {assignment} WHERE key = 't.c'")
    assert info.value.diag.constraint_name == constraint


def test_none_egress_without_endpoint_is_valid(db: Database) -> None:
    owner = uuid.uuid4()
    with db.as_owner(owner) as conn:
        row = conn.execute("SELECT (fn_register_tool('t.n', 'N')).*").fetchone()
    assert row is not None and row["endpoint_url"] is None and row["egress_class"] == "none"


def test_write_tool_always_requires_approval(db: Database) -> None:
    owner = uuid.uuid4()
    with db.as_owner(owner) as conn:
        conn.execute("SELECT fn_register_tool('t.w', 'W', p_requires_approval => false)")
        row = conn.execute(
            "UPDATE agents.tools_registry SET endpoint_url = 'https://x.test/a',"
            " egress_class = 'write', requires_approval = false WHERE key = 't.w' RETURNING *"
        ).fetchone()
    assert row is not None and row["requires_approval"] is True

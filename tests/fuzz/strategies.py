"""Hypothesis strategies and database helpers shared by the fuzz tests."""

from __future__ import annotations

import re
from typing import Any
from uuid import UUID

import psycopg
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st

from toolrelay.db import Database, translate_db_error
from toolrelay.errors import ToolrelayError

# Bounded for CI: every example is a round trip to PostgreSQL.
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# What the SQL functions may raise: bad values (22), constraints (23), not found, not
# allowed, and the registry's own TR001-TR005. Anything else is a crash.
EXPECTED_SQLSTATE = re.compile(r"22[0-9A-Z]{3}|23[0-9A-Z]{3}|P0002|42501|TR00[1-5]")

TABLES = (
    "agents",
    "tools_registry",
    "tool_assignments",
    "tool_invocations",
    "tool_invocation_attempts",
    "credentials",
)

# Any text PostgreSQL can store: every code point but NUL and lone surrogates.
texts = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=80)
names = st.one_of(
    texts,
    st.sampled_from(["", " ", "\t", "a", "ok.name", "x" * 200, "名前", "🙂", "a\nb"]),
)
keys = st.one_of(texts, st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,30}", fullmatch=True))
uuid_texts = st.uuids().map(str)
# JSON as a client would send it; strings may hold NUL, which jsonb refuses (22P05).
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(st.characters(codec="utf-8"), max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=5)
urls = st.one_of(
    st.sampled_from(
        [
            "https://api.example.com/v1/items",
            "http://127.0.0.1:8080/x?a=1",
            "https://api.example.com/{{input.id}}",
            "ftp://example.com/",
            "https://",
            "javascript:alert(1)",
            "https://user:pw@api.example.com/",
        ]
    ),
    texts,
)
methods = st.one_of(st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE", "get"]), texts)
templates = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "headers": st.one_of(st.dictionaries(texts, json_values, max_size=3), json_values),
            "query": st.one_of(st.dictionaries(texts, json_values, max_size=3), json_values),
            "body": json_values,
        },
    ),
    json_objects,
    json_values,
)


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


def mostly(valid: st.SearchStrategy[Any], other: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Usually (3 in 4) a valid value, so the write happens with random text in it."""
    return st.integers(min_value=0, max_value=3).flatmap(lambda n: other if n == 3 else valid)


valid_keys = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,30}", fullmatch=True)
valid_names = texts.map(lambda t: f"{t} n")
valid_templates = st.fixed_dictionaries(
    {},
    optional={
        "headers": st.dictionaries(
            st.from_regex(r"X-[A-Za-z0-9-]{1,10}", fullmatch=True),
            st.text(st.characters(codec="utf-8", exclude_categories=("Cc",)), max_size=20),
            max_size=2,
        ),
        "query": st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=2),
        "body": json_values,
    },
)


def snapshot(db: Database) -> dict[str, tuple[int, str]]:
    """Every row of every table, as a count and a digest (read as the admin, past RLS)."""
    state: dict[str, tuple[int, str]] = {}
    with db.connect() as conn:
        for table in TABLES:
            row = conn.execute(
                f"SELECT count(*) AS n, coalesce(md5(string_agg(x::text, '|'"
                f" ORDER BY x.id::text)), '') AS digest FROM agents.{table} x"
            ).fetchone()
            assert row is not None
            state[table] = (int(row["n"]), str(row["digest"]))
    return state


def call(
    db: Database, owner: UUID | str, query: str, params: Any, agent: UUID | None = None
) -> tuple[dict[str, Any] | None, psycopg.Error | None]:
    """One statement in one transaction as the owner (or the owner's agent)."""
    try:
        with db.as_owner(owner, agent) as conn:
            row = conn.execute(query, params).fetchone()
        event("succeeded")
        return row, None
    except psycopg.Error as exc:
        return None, exc


def assert_clear_refusal(exc: psycopg.Error) -> ToolrelayError:
    """An expected SQLSTATE, translated to a specific error with a message."""
    state = exc.sqlstate or "(none)"
    event(f"refused {state}")
    assert EXPECTED_SQLSTATE.fullmatch(state), f"unexpected SQLSTATE {state}: {exc}"
    error = translate_db_error(exc)
    assert type(error) is not ToolrelayError, f"{state} maps to no specific error: {exc}"
    assert error.message.strip(), f"{state} has an empty message"
    assert len(error.message) < 2000
    return error

"""Finding 11 (and 2 through PostgREST's door) on a database laid out like Supabase.

On Supabase every request logs in as ``authenticator`` (LOGIN NOINHERIT, a member of anon,
authenticated and service_role), then sets ``role`` and ``request.jwt.claims`` inside the
transaction. fn_expire_tool_invocations trusted ``pg_has_role(session_user, 'service_role',
'MEMBER')``, true for every such request, so an anon request expired everyone's calls; and
Supabase's default privileges grant EXECUTE on every new public function to anon. Now the
decision is on the effective role and the claims, and no public.fn_* is anon's.
"""

from __future__ import annotations

import importlib
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg import conninfo

from tests.pgtest import create_database, drop_database
from tests.registry.helpers import agent_with_tool
from toolrelay.db import Database, migrate
from toolrelay.db.migrate import Migration
from toolrelay.registry import Registry

API_ROLES = ("anon", "authenticated", "service_role")

# Roles are cluster-wide, and other test sessions use authenticated and service_role
# concurrently: create what is missing (as 0001 would), never drop or alter what exists.
ROLES = """
DO $$
DECLARE
    v_role text;
BEGIN
    IF to_regrole('anon') IS NULL THEN
        BEGIN CREATE ROLE anon NOLOGIN NOINHERIT;
        EXCEPTION WHEN duplicate_object THEN NULL; END;
    END IF;
    IF to_regrole('authenticated') IS NULL THEN
        BEGIN CREATE ROLE authenticated NOLOGIN NOINHERIT;
        EXCEPTION WHEN duplicate_object THEN NULL; END;
    END IF;
    IF to_regrole('service_role') IS NULL THEN
        BEGIN CREATE ROLE service_role NOLOGIN NOINHERIT BYPASSRLS;
        EXCEPTION WHEN duplicate_object THEN NULL; END;
    END IF;
    IF to_regrole('authenticator') IS NULL THEN
        BEGIN CREATE ROLE authenticator LOGIN NOINHERIT;
        EXCEPTION WHEN duplicate_object THEN NULL; END;
    END IF;
    FOREACH v_role IN ARRAY ARRAY['anon', 'authenticated', 'service_role'] LOOP
        IF NOT pg_has_role('authenticator', v_role, 'MEMBER') THEN
            EXECUTE format('GRANT %I TO authenticator', v_role);
        END IF;
    END LOOP;
END
$$
"""

# What a Supabase project has before our migrations run: its own auth.uid() (the GoTrue
# definition: the per-claim setting, else the JSON claims), schema usage for the API roles,
# and default privileges that give them everything the migrating role creates in public.
SUPABASE = """
CREATE SCHEMA auth;
CREATE FUNCTION auth.uid() RETURNS uuid LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('request.jwt.claim.sub', true), ''),
                    (nullif(current_setting('request.jwt.claims', true), '')::jsonb ->> 'sub'))::uuid
$$;
CREATE FUNCTION auth.role() RETURNS text LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('request.jwt.claim.role', true), ''),
                    (nullif(current_setting('request.jwt.claims', true), '')::jsonb ->> 'role'))
$$;
GRANT USAGE ON SCHEMA auth, public TO anon, authenticated, service_role;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT ALL ON TABLES TO anon, authenticated, service_role;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT ALL ON FUNCTIONS TO anon, authenticated, service_role;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT ALL ON SEQUENCES TO anon, authenticated, service_role;
"""

AUTH_UID_SOURCE = "SELECT prosrc FROM pg_proc WHERE oid = 'auth.uid()'::regprocedure"


@pytest.fixture(scope="module")
def supabase_url(admin_url: str) -> Iterator[str]:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(ROLES)
    url = create_database(admin_url, prefix="toolrelay_supabase")
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(SUPABASE)
            before = conn.execute(AUTH_UID_SOURCE).fetchone()
        migrate(url)
        with psycopg.connect(url) as conn:
            assert conn.execute(AUTH_UID_SOURCE).fetchone() == before  # the bootstrap kept it
        yield url
    finally:
        drop_database(admin_url, url)


@pytest.fixture(scope="module")
def supabase_db(supabase_url: str) -> Iterator[Database]:
    db = Database(supabase_url)
    yield db
    db.close()


@contextmanager
def as_authenticator(url: str) -> Iterator[psycopg.Connection[Any]]:
    """A session whose session_user is authenticator, as PostgREST's are. Logged in as it
    where the server lets us (trust, or a .pgpass); else the test's superuser becomes it
    with SET SESSION AUTHORIZATION, which sets session_user the same way."""
    try:
        conn = psycopg.connect(conninfo.make_conninfo(url, user="authenticator"), autocommit=True)
    except psycopg.OperationalError:
        conn = psycopg.connect(url, autocommit=True)
        try:
            conn.execute("SET SESSION AUTHORIZATION authenticator")
        except psycopg.errors.InsufficientPrivilege:
            conn.close()
            pytest.skip("cannot log in as authenticator, nor become it")
    with conn:
        yield conn


@contextmanager
def postgrest(url: str, role: str, **claims: str) -> Iterator[psycopg.Connection[Any]]:
    """One request the way PostgREST 12 makes it: as authenticator, inside a transaction,
    role and the JSON claims as transaction-local settings (no request.jwt.claim.sub)."""
    with as_authenticator(url) as conn, conn.transaction():
        conn.execute(
            "SELECT set_config('role', %s, true), set_config('request.jwt.claims', %s, true)",
            (role, json.dumps({"role": role} | claims)),
        )
        yield conn


def overdue_call(db: Database) -> tuple[Registry, UUID]:
    """A new owner with one call waiting for approval whose window has closed."""
    registry = Registry(db, uuid.uuid4())
    agent, tool = agent_with_tool(registry, requires_approval=True)
    call = registry.invoke(agent, tool["key"], {})
    with db.as_dispatcher() as conn:
        conn.execute(
            "UPDATE agents.tool_invocations SET approval_expires_at = now() - interval '1 s'"
            " WHERE id = %s",
            (call,),
        )
    return registry, call


def status(registry: Registry, call: UUID) -> str:
    return str(registry.get_invocation(call)["status"])


def public_functions(url: str) -> list[tuple[str, list[str]]]:
    """Every public.fn_*, each with its argument types."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT p.oid::regproc::text, array(SELECT format_type(t, NULL)"
            "   FROM unnest(p.proargtypes) AS t)"
            "  FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace"
            "   AND p.proname LIKE 'fn\\_%' ORDER BY 1"
        ).fetchall()
    return [(str(name), list(types)) for name, types in rows]


def test_security_definer_sees_the_role_postgrest_set(supabase_url: str) -> None:
    """The experiment the expiry check rests on: inside SECURITY DEFINER current_user is the
    definer, current_setting('role') is the caller's SET ROLE, 'none' when there was none
    (then the session user is the effective role); agents.caller_role() says which."""
    with psycopg.connect(supabase_url, autocommit=True) as conn:
        definer = conn.execute("SELECT current_user").fetchone()
        conn.execute(
            "CREATE SCHEMA IF NOT EXISTS probe; GRANT USAGE ON SCHEMA probe TO PUBLIC;"
            "CREATE OR REPLACE FUNCTION probe.who() RETURNS text[] LANGUAGE sql"
            " SECURITY DEFINER SET search_path = pg_catalog AS $$ SELECT ARRAY[current_user::text,"
            " session_user::text, current_setting('role'), agents.caller_role()::text] $$;"
            "GRANT EXECUTE ON FUNCTION probe.who() TO PUBLIC"
        )
    assert definer is not None
    with as_authenticator(supabase_url) as conn:
        row = conn.execute("SELECT probe.who()").fetchone()
    assert row == ([definer[0], "authenticator", "none", "authenticator"],)
    for role in API_ROLES:
        with postgrest(supabase_url, role) as conn:
            row = conn.execute("SELECT probe.who()").fetchone()
        assert row == ([definer[0], "authenticator", role, role],)


def test_anon_can_execute_no_fn_and_expires_nothing(
    supabase_url: str, supabase_db: Database
) -> None:
    calls = [overdue_call(supabase_db) for _ in range(2)]
    with (
        pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for"),
        postgrest(supabase_url, "anon") as conn,
    ):
        conn.execute("SELECT fn_expire_tool_invocations()")
    assert [status(registry, call) for registry, call in calls] == ["pending", "pending"]
    for name, types in public_functions(supabase_url):
        args = ", ".join(f"NULL::{t}" for t in types)
        with (
            pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for"),
            postgrest(supabase_url, "anon") as conn,
        ):
            conn.execute(f"SELECT public.{name}({args})")


def test_functions_that_later_migrations_create_are_closed_to_anon(
    supabase_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Like 0013's new fn_approve_tool_invocation(uuid, text): created after 0012, it gets
    EXECUTE for anon from the default privileges; migrate() takes it away after every run."""
    migrations = importlib.import_module("toolrelay.db.migrate")
    later = Migration(
        "9999",
        "later_function",
        "CREATE FUNCTION public.fn_later_probe(p uuid DEFAULT NULL) RETURNS integer"
        " LANGUAGE sql AS 'SELECT 1'",
    )
    shipped = migrations.available_migrations()
    monkeypatch.setattr(migrations, "available_migrations", lambda: [*shipped, later])
    assert migrate(supabase_url) == ["9999"]
    with psycopg.connect(supabase_url) as conn:
        for name, _ in public_functions(supabase_url):
            can = {
                role: conn.execute(
                    "SELECT has_function_privilege(%s, p.oid, 'EXECUTE') FROM pg_proc p"
                    " WHERE p.oid = %s::regproc",
                    (role, name),
                ).fetchone()
                for role in (*API_ROLES, "authenticator")
            }
            assert can == {
                "anon": (False,), "authenticated": (True,), "service_role": (True,),
                "authenticator": (False,),
            }, name  # fmt: skip
        ledger = conn.execute(
            "SELECT has_table_privilege('anon', 'public.toolrelay_migrations',"
            " 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE')"
        ).fetchone()
    assert ledger == (False,)
    with (
        pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for"),
        postgrest(supabase_url, "anon") as conn,
    ):
        conn.execute("SELECT public.fn_later_probe()")


def test_owner_claims_expire_only_that_owners_calls(
    supabase_url: str, supabase_db: Database
) -> None:
    (alice, alices), (bob, bobs) = overdue_call(supabase_db), overdue_call(supabase_db)
    # authenticated without a sub: no owner, and not the dispatcher (although authenticator,
    # the session user, is a member of service_role).
    with (
        pytest.raises(psycopg.errors.InsufficientPrivilege, match="not authenticated"),
        postgrest(supabase_url, "authenticated") as conn,
    ):
        conn.execute("SELECT fn_expire_tool_invocations()")
    assert (status(alice, alices), status(bob, bobs)) == ("pending", "pending")

    with postgrest(supabase_url, "authenticated", sub=str(alice.owner)) as conn:
        row = conn.execute("SELECT fn_expire_tool_invocations() AS n").fetchone()
    assert row == (1,)
    assert (status(alice, alices), status(bob, bobs)) == ("expired", "pending")

    with postgrest(supabase_url, "service_role") as conn:  # the dispatcher's key
        row = conn.execute("SELECT fn_expire_tool_invocations() AS n").fetchone()
    assert row is not None and row[0] >= 1
    assert status(bob, bobs) == "expired"


def test_agent_claims_through_postgrest_cannot_change_configuration(
    supabase_url: str, supabase_db: Database
) -> None:
    registry = Registry(supabase_db, uuid.uuid4())
    agent, tool = agent_with_tool(registry, http_method="POST", egress_class="write")
    bot = registry.get_agent(agent)["id"]
    with supabase_db.as_owner(registry.owner) as conn:
        conn.execute(
            "INSERT INTO agents.credentials (name, kind, allowed_hosts, key_id, wrapped_key,"
            " nonce, ciphertext) VALUES ('k', 'api_key', '{api.example.com}', 'k1', '\\x00',"
            " '\\x00', '\\x00')"
        )
    claims = {"sub": str(registry.owner), "agent_id": str(bot)}
    writes = [
        "UPDATE agents.tools_registry SET requires_approval = false, egress_class = 'read_only'",
        f"INSERT INTO agents.agents (name) VALUES ('clone-{uuid.uuid4().hex[:6]}')",
        "UPDATE agents.agents SET status = 'disabled'",
        "DELETE FROM agents.tool_assignments",
        "UPDATE agents.credentials SET allowed_hosts = '{evil.example}'",
    ]
    for sql in writes:
        with (
            pytest.raises(psycopg.errors.InsufficientPrivilege, match="agent identity"),
            postgrest(supabase_url, "authenticated", **claims) as conn,
        ):
            conn.execute(sql)
    with postgrest(supabase_url, "authenticated", **claims) as conn:
        assert conn.execute("SELECT count(*) FROM agents.credentials").fetchone() == (0,)
        assert conn.execute("SELECT id FROM agents.agents").fetchall() == [(bot,)]
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="agent identity"):
            conn.execute("SELECT fn_assign_tool(%s, %s)", (bot, tool["id"]))
    current = registry.get_tool(tool["key"])
    assert (current["requires_approval"], current["egress_class"]) == (True, "write")
    assert registry.get_agent(agent)["status"] == "active"
    assert [a["tool"] for a in registry.list_assignments()] == [tool["key"]]
    with supabase_db.as_owner(registry.owner) as conn:
        hosts = conn.execute("SELECT allowed_hosts FROM agents.credentials").fetchall()
    assert hosts == [{"allowed_hosts": ["api.example.com"]}]

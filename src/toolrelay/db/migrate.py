"""Ordered SQL migrations shipped in the package, applied once each under an advisory lock."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import resources

import psycopg
from psycopg import conninfo

from toolrelay.db.errors import where
from toolrelay.errors import ConfigurationError

log = logging.getLogger("toolrelay.db")

MIGRATIONS_PACKAGE = "toolrelay.db.migrations"
# Any constant works; it only has to be the same for every migrating process.
MIGRATION_LOCK_KEY = 0x746F6F6C72656C61  # "toolrela"

_CREATE_LEDGER = """
CREATE TABLE IF NOT EXISTS public.toolrelay_migrations (
    version     text PRIMARY KEY,
    name        text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)
"""


@dataclass(frozen=True)
class Migration:
    version: str
    name: str
    sql: str


# Supabase's default privileges grant EXECUTE on every new function in schema public to
# anon (the role of a request without a login), and ALL on every new table there. Our
# functions check the caller themselves, but none is meant for anon: after every run, and
# so for functions that later migrations create too, no public.fn_* is executable by anon
# or PUBLIC (what PUBLIC could call, authenticated and service_role keep), and the ledger
# is the migrating role's alone. Idempotent; nothing happens where no role anon exists.
CLOSE_TO_ANON = r"""
DO $$
DECLARE
    v_fn regprocedure;
    v_api_roles text := (SELECT string_agg(quote_ident(r), ', ') FROM unnest(
        ARRAY['authenticated', 'service_role']) AS r WHERE to_regrole(r) IS NOT NULL);
BEGIN
    IF to_regrole('anon') IS NULL THEN
        RETURN;
    END IF;
    FOR v_fn IN
        SELECT p.oid::regprocedure FROM pg_proc p
         WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'fn\_%'
         ORDER BY p.oid
    LOOP
        IF EXISTS (SELECT 1 FROM pg_proc p,
                          aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
                    WHERE p.oid = v_fn AND a.grantee = 0 AND a.privilege_type = 'EXECUTE') THEN
            IF v_api_roles IS NOT NULL THEN
                EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', v_fn, v_api_roles);
            END IF;
            EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', v_fn);
        END IF;
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM anon', v_fn);
    END LOOP;
    EXECUTE 'REVOKE ALL ON public.toolrelay_migrations FROM PUBLIC, anon'
            || coalesce(', ' || v_api_roles, '');
END
$$
"""

# The kept configuration fingerprints (migration 0038) against the formula, after every run:
# a later migration that adds a column to agents.tools_registry (which the formula covers)
# changes every tool's fingerprint, and so fails the calls made before it (tool_changed),
# as when the fingerprint was computed at every claim. Writes nothing when they agree.
FINGERPRINTS_VERSION = "0038"
REFRESH_FINGERPRINTS = "SELECT agents.refresh_tool_fingerprints()"


def available_migrations() -> list[Migration]:
    files = resources.files(MIGRATIONS_PACKAGE)
    found = []
    for entry in files.iterdir():
        if entry.name.endswith(".sql"):
            version, _, rest = entry.name.partition("_")
            found.append(Migration(version, rest.removesuffix(".sql"), entry.read_text("utf-8")))
    return sorted(found, key=lambda m: m.version)


def applied_migrations(conn: psycopg.Connection[tuple[object, ...]]) -> set[str]:
    conn.execute(_CREATE_LEDGER)
    rows = conn.execute("SELECT version FROM public.toolrelay_migrations").fetchall()
    return {str(row[0]) for row in rows}


def _say_if_older(
    conn: psycopg.Connection[tuple[object, ...]], done: set[str], known: set[str]
) -> None:
    """Warn when the database has migrations this code does not know: this process is
    older than the schema (a rolling upgrade's old half, an old CLI), and the functions it
    calls may have changed under it."""
    if done <= known:
        return
    rows = conn.execute(
        "SELECT version, name FROM public.toolrelay_migrations"
        " WHERE version <> ALL(%s) ORDER BY version",
        (sorted(known),),
    ).fetchall()
    unknown = [f"{version}_{name}" for version, name in rows]
    if unknown:
        log.warning(
            "the database has migrations this toolrelay does not know (%s): this process"
            " is older than the schema; upgrade it (and stop old workers once new ones run)",
            ", ".join(unknown),
            extra={"action": "schema_newer", "unknown_migrations": unknown},
        )


def check_schema(url: str) -> None:
    """Read only: refuse (ConfigurationError) a database without toolrelay's schema, or
    behind this code, naming ``toolrelay migrate``; warn when it is ahead (schema_newer).
    For commands that must not change the schema of whatever DATABASE_URL names."""
    with psycopg.connect(url, autocommit=True) as conn:
        ledger = conn.execute("SELECT to_regclass('public.toolrelay_migrations')").fetchone()
        if ledger is None or ledger[0] is None:
            raise ConfigurationError(
                f"the database {_named(url)} has no toolrelay schema: if it is the right one,"
                " run `toolrelay migrate` first (nothing was written to it)"
            )
        rows = conn.execute("SELECT version FROM public.toolrelay_migrations").fetchall()
        done = {str(row[0]) for row in rows}
        available = available_migrations()
        _say_if_older(conn, done, {m.version for m in available})
    pending = [f"{m.version}_{m.name}" for m in available if m.version not in done]
    if pending:
        raise ConfigurationError(
            f"the database {_named(url)} is {len(pending)} migration(s) behind this toolrelay"
            f" ({pending[0]} … {pending[-1]}): run `toolrelay migrate` (serve and worker"
            " apply them when they start); nothing was changed"
        )


def _named(url: str) -> str:
    dbname = conninfo.conninfo_to_dict(url).get("dbname") or "(default)"
    return f"{dbname!s} at {where(url)}"


def migrate(url: str, target: str | None = None) -> list[str]:
    """Apply pending migrations up to ``target`` (inclusive), then ``CLOSE_TO_ANON``;
    return the versions applied."""
    applied_now: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        try:
            done = applied_migrations(conn)
            available = available_migrations()
            _say_if_older(conn, done, {m.version for m in available})
            for migration in available:
                if target is not None and migration.version > target:
                    break
                if migration.version in done:
                    continue
                with conn.transaction():
                    conn.execute(migration.sql.encode())
                    conn.execute(
                        "INSERT INTO public.toolrelay_migrations (version, name) VALUES (%s, %s)",
                        (migration.version, migration.name),
                    )
                applied_now.append(migration.version)
            with conn.transaction():
                conn.execute(CLOSE_TO_ANON)
                if FINGERPRINTS_VERSION in done or FINGERPRINTS_VERSION in applied_now:
                    conn.execute(REFRESH_FINGERPRINTS)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
    return applied_now

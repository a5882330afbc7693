"""Ordered SQL migrations shipped in the package, applied once each under an advisory lock."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

import psycopg

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


def migrate(url: str, target: str | None = None) -> list[str]:
    """Apply pending migrations up to ``target`` (inclusive); return the versions applied."""
    applied_now: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        try:
            done = applied_migrations(conn)
            for migration in available_migrations():
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
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
    return applied_now

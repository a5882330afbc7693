"""Migrations: idempotent, concurrent-safe, and RFC-0006 exactly as written."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.pgtest import create_database, drop_database
from toolrelay.db import available_migrations, migrate

RFC_SQL = (
    Path(__file__).parents[2]
    / "src/toolrelay/db/migrations/0003_rfc0006_endpoint_and_credential.sql"
)


@pytest.fixture
def empty_db(admin_url: str) -> Iterator[str]:
    url = create_database(admin_url, prefix="toolrelay_mig")
    yield url
    drop_database(admin_url, url)


def test_migrate_is_idempotent(empty_db: str) -> None:
    first = migrate(empty_db)
    assert first == [m.version for m in available_migrations()]
    assert migrate(empty_db) == []


def test_concurrent_migrations_apply_each_once(empty_db: str) -> None:
    results: list[list[str]] = []
    threads = [threading.Thread(target=lambda: results.append(migrate(empty_db))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    applied = sorted(v for r in results for v in r)
    assert applied == [m.version for m in available_migrations()]


def test_rfc_migration_is_its_own_file_verbatim() -> None:
    text = RFC_SQL.read_text()
    for fragment in (
        'ADD COLUMN "endpoint_url" "text"',
        """ADD COLUMN "http_method" "text" DEFAULT 'POST'::"text" NOT NULL""",
        """ADD COLUMN "request_template" "jsonb" DEFAULT '{}'::"jsonb" NOT NULL""",
        """ADD COLUMN "auth_placement" "text" DEFAULT 'header'::"text" NOT NULL""",
        """ADD COLUMN "auth_param_name" "text" DEFAULT 'Authorization'::"text" NOT NULL""",
        'ADD COLUMN "credential_ref" "uuid"',
        '"tools_registry_http_method_check"',
        '"tools_registry_auth_placement_check"',
        '"tools_registry_endpoint_required_unless_none_check"',
    ):
        assert fragment in text


def test_rfc_migration_is_additive_for_existing_rows(empty_db: str) -> None:
    migrate(empty_db, target="0002")
    owner = uuid.uuid4()
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO agents.tools_registry (owner, key, name) VALUES (%s, 'calc.add', 'Add')",
            (owner,),
        )
    migrate(empty_db, target="0003")
    with psycopg.connect(empty_db) as conn:
        row = conn.execute(
            "SELECT egress_class, endpoint_url, http_method, request_template, auth_placement,"
            " auth_param_name, credential_ref FROM agents.tools_registry WHERE key = 'calc.add'"
        ).fetchone()
    assert row == ("none", None, "POST", {}, "header", "Authorization", None)
    migrate(empty_db)  # the rest applies on top of the pre-existing row


def test_rfc_columns_have_the_rfc_types_and_defaults(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT column_name, data_type, column_default, is_nullable"
            " FROM information_schema.columns WHERE table_schema = 'agents'"
            " AND table_name = 'tools_registry' AND column_name = ANY(%s)",
            (
                [
                    "endpoint_url",
                    "http_method",
                    "request_template",
                    "auth_placement",
                    "auth_param_name",
                    "credential_ref",
                ],
            ),
        ).fetchall()
    got = {r[0]: r[1:] for r in rows}
    assert got == {
        "endpoint_url": ("text", None, "YES"),
        "http_method": ("text", "'POST'::text", "NO"),
        "request_template": ("jsonb", "'{}'::jsonb", "NO"),
        "auth_placement": ("text", "'header'::text", "NO"),
        "auth_param_name": ("text", "'Authorization'::text", "NO"),
        "credential_ref": ("uuid", None, "YES"),
    }


def test_invocation_ids_are_time_ordered_version_7(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT agents.uuid_v7() AS id, clock_timestamp() AS at FROM generate_series(1, 50)"
        ).fetchall()
        default = conn.execute(
            "SELECT column_default FROM information_schema.columns WHERE table_schema = 'agents'"
            " AND table_name = 'tool_invocations' AND column_name = 'id'"
        ).fetchone()
    ids = [row[0] for row in rows]
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    assert len(set(ids)) == len(ids)
    for ident, at in zip(ids, (row[1] for row in rows), strict=True):
        assert abs(int.from_bytes(ident.bytes[:6], "big") - at.timestamp() * 1000) < 5
    assert [i.bytes[:6] for i in ids] == sorted(i.bytes[:6] for i in ids)
    assert default is not None and "uuid_v7" in default[0]


def test_a_process_older_than_the_schema_says_so(
    empty_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A rolling upgrade's old processes (or a laptop's old CLI) meet migrations they do not
    know: each says so when it starts (serve, worker and the CLI migrate first), naming them,
    instead of misbehaving quietly against functions that changed under it."""
    migrate(empty_db)
    with caplog.at_level("WARNING", logger="toolrelay.db"):
        migrate(empty_db)
    assert not caplog.records  # the same version: nothing to say
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute("INSERT INTO public.toolrelay_migrations (version, name)"
                     " VALUES ('9001', 'from_the_future')")  # fmt: skip
    with caplog.at_level("WARNING", logger="toolrelay.db"):
        assert migrate(empty_db) == []
    (record,) = caplog.records
    assert record.levelname == "WARNING"
    assert getattr(record, "action", None) == "schema_newer"
    assert "9001_from_the_future" in record.getMessage()
    assert "upgrade" in record.getMessage()

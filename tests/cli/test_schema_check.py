"""A command run against the wrong database, or before a deploy's `toolrelay migrate`, says
so instead of installing or upgrading toolrelay's schema there.

Every CLI command used to apply pending migrations to whatever DATABASE_URL named:
`toolrelay tool list` with a mistyped URL installed 50-odd migrations (two schemas, and the
roles, which are the cluster's) into an unrelated application's database, printed an empty
table and exited 0; against a production database it upgraded the schema under the running
workers without a word. Against DATABASE_URL only `toolrelay migrate`, `serve` and `worker`
(deploy steps, docs/operations.md) change the schema now; the embedded database, which is
toolrelay's own, is still migrated by any command.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from typer.testing import CliRunner

from tests.pgtest import create_database, drop_database
from toolrelay.cli import context
from toolrelay.cli.main import app
from toolrelay.db import migrate
from toolrelay.db.migrate import available_migrations

runner = CliRunner()


@pytest.fixture
def other_url(admin_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A database of its own, named by DATABASE_URL for the CLI."""
    url = create_database(admin_url, "toolrelay_other")
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("TOOLRELAY_OWNER", str(uuid.uuid4()))
    context.database.cache_clear()
    try:
        yield url
    finally:
        context.database.cache_clear()
        drop_database(admin_url, url)


def schemas(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT nspname FROM pg_namespace").fetchall()
    return {r[0] for r in rows}


def applied(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT version FROM public.toolrelay_migrations ORDER BY 1")
        return [r[0] for r in rows.fetchall()]


@pytest.mark.parametrize("command", [["tool", "list"], ["owner", "list"], ["invocations", "list"]])
def test_a_database_without_the_schema_is_left_alone(other_url: str, command: list[str]) -> None:
    with psycopg.connect(other_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE app_users (id int)")  # somebody else's database
    result = runner.invoke(app, command)
    assert result.exit_code != 0, result.output
    assert "no toolrelay schema" in result.output and "toolrelay migrate" in result.output
    assert not {"agents", "auth"} & schemas(other_url)
    with psycopg.connect(other_url) as conn:
        assert conn.execute("SELECT to_regclass('public.toolrelay_migrations')").fetchone() == (
            None,
        )


def test_a_database_behind_this_toolrelay_is_not_upgraded(other_url: str) -> None:
    versions = [m.version for m in available_migrations()]
    migrate(other_url, target=versions[-3])
    result = runner.invoke(app, ["tool", "list"])
    assert result.exit_code != 0, result.output
    assert "2 migration(s) behind" in result.output and "toolrelay migrate" in result.output
    assert versions[-1] in result.output
    assert applied(other_url) == versions[:-2]
    # The deploy step does it, and then the command runs.
    assert runner.invoke(app, ["migrate"]).exit_code == 0
    context.database.cache_clear()
    listed = runner.invoke(app, ["tool", "list"])
    assert listed.exit_code == 0, listed.output
    assert applied(other_url) == versions

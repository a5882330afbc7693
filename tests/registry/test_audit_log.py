"""Reading the audit log of configuration through every door: the Registry functions
(filters, pages that stay put), `toolrelay audit` and `GET /v1/audit`; each door's own
changes are logged with the owner as the actor."""

from __future__ import annotations

import base64
import json
import secrets
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, get_args

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from tests.pgtest import create_database, drop_database
from tests.registry.helpers import add_tool
from toolrelay.api import ApiSettings, create_app
from toolrelay.api.audit_routes import AuditKind
from toolrelay.cli import context
from toolrelay.cli.audit import AuditKind as CliAuditKind
from toolrelay.cli.main import app
from toolrelay.credentials import Keyring, MasterKey
from toolrelay.db import Database, migrate
from toolrelay.errors import InvalidArgument
from toolrelay.registry import Registry
from toolrelay.registry.audit import AUDIT_KINDS, audit_page, read_audit
from toolrelay.tokens import TokenStore

runner = CliRunner()
SECRET = "sk_cli_" + secrets.token_hex(12)


def test_newest_first_with_filters(registry: Registry) -> None:
    tool = add_tool(registry, "notes.list")
    bot = registry.create_agent("bot")
    registry.assign("bot", "notes.list")
    registry.update_tool("notes.list", {"name": "Notes"})
    rows = read_audit(registry)
    assert [(r["kind"], r["action"]) for r in rows] == [
        ("tool", "update"), ("assignment", "insert"), ("agent", "insert"), ("tool", "insert"),
    ]  # fmt: skip
    assert [r["action"] for r in read_audit(registry, kind="tool")] == ["update", "insert"]
    assert [r["kind"] for r in read_audit(registry, object=str(bot))] == ["agent"]
    # By label: the key as it was at the time of each row.
    assert [r["object_id"] for r in read_audit(registry, object="notes.list")] == [tool["id"]] * 2
    since = rows[1]["at"]
    assert [r["id"] for r in read_audit(registry, since=since)] == [r["id"] for r in rows[:2]]
    assert read_audit(registry, since=datetime.now(UTC) + timedelta(hours=1)) == []
    assert read_audit(registry, limit=1) == rows[:1]


def test_pages_return_every_row_once_while_rows_are_added(registry: Registry) -> None:
    for n in range(7):
        registry.create_agent(f"a{n}")
    seen: list[int] = []
    page, cursor = audit_page(registry, 3)
    seen += [r["id"] for r in page]
    registry.create_agent("late")  # a new row lands before the first page, not in the next
    while cursor is not None:
        page, cursor = audit_page(registry, 3, cursor=cursor)
        seen += [r["id"] for r in page]
    assert len(seen) == len(set(seen)) == 7
    assert seen == sorted(seen, reverse=True)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"kind": "tools"}, "kind 'tools' is not one of"),
        ({"since": datetime(2026, 1, 1)}, "time zone"),
        ({"cursor": "bm9wZQ"}, "cursor is not one the audit log handed out"),
        ({"limit": 0}, "limit 0 is not allowed"),
    ],
)
def test_bad_arguments_are_one_clear_error(
    registry: Registry, arguments: dict[str, Any], message: str
) -> None:
    limit = arguments.pop("limit", 10)
    with pytest.raises(InvalidArgument, match=message):
        audit_page(registry, limit, **arguments)


# --- the CLI -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cli_database(admin_url: str) -> Iterator[str]:
    """A database of its own: the CLI refuses a master key that does not open every
    credential in the database, and other tests seal theirs under keys of their own."""
    url = create_database(admin_url, prefix="toolrelay_audit_cli")
    migrate(url)
    yield url
    drop_database(admin_url, url)


@pytest.fixture
def cli_owner(cli_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    owner = str(uuid.uuid4())
    key = base64.b64encode(secrets.token_bytes(32)).decode()
    monkeypatch.setenv("DATABASE_URL", cli_database)
    monkeypatch.setenv("TOOLRELAY_HOME", str(tmp_path))
    monkeypatch.setenv("TOOLRELAY_OWNER", owner)
    monkeypatch.setenv("TOOLRELAY_MASTER_KEY", f"audit:{key}")
    monkeypatch.delenv("TOOLRELAY_MASTER_KEY_FILE", raising=False)
    context.database.cache_clear()
    yield owner
    context.database.cache_clear()


def cli(*args: str, stdin: str | None = None) -> str:
    result = runner.invoke(app, list(args), input=stdin)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_the_cli_logs_its_changes_and_shows_them(cli_owner: str) -> None:
    cli("tool", "register", "weather.get", "--name", "Weather")
    cli("tool", "update", "weather.get", "--set", "description=Today's weather")
    agent = cli("agent", "create", "bot").strip()
    cli("assign", "bot", "weather.get")
    credential = cli("credential", "add", "--kind", "api_key", "--name", "wx", stdin=SECRET)
    doc = json.loads(cli("audit", "--json"))
    items = doc["items"]
    assert [(i["kind"], i["action"]) for i in items] == [
        ("credential", "insert"), ("assignment", "insert"), ("agent", "insert"),
        ("tool", "update"), ("tool", "insert"),
    ]  # fmt: skip
    assert doc["next_cursor"] is None
    assert {(i["actor"], i["actor_role"]) for i in items} == {(cli_owner, "authenticated")}
    assert items[0]["object_id"] == credential.strip() and items[2]["object_id"] == agent
    assert items[3]["changes"] == {"description": {"old": None, "new": "Today's weather"}}
    assert SECRET not in json.dumps(doc)
    assert json.loads(cli("audit", "-o", "json", "--kind", "agent"))["items"] == [items[2]]

    table = cli("audit", "--kind", "tool").splitlines()
    assert table[0].split() == ["at", "actor", "role", "kind", "action", "object", "object_id",
                                "changes"]  # fmt: skip
    assert cli_owner in table[1] and 'description: null → "Today\'s weather"' in table[1]
    assert len(table) == 3

    first = runner.invoke(app, ["audit", "--limit", "2"])
    assert first.exit_code == 0 and first.stderr.startswith("next page: --cursor ")
    cursor = first.stderr.split()[-1]
    rest = json.loads(cli("audit", "--json", "--cursor", cursor, "--since", "1h"))["items"]
    assert rest == items[2:]


def test_the_cli_refuses_bad_arguments_in_one_line(cli_owner: str) -> None:
    bad = runner.invoke(app, ["audit", "--since", "yesterday"])
    assert bad.exit_code == 1 and bad.stderr.startswith("error: --since must be a time")
    assert "Traceback" not in bad.output
    unknown = runner.invoke(app, ["audit", "--kind", "tools"])
    assert unknown.exit_code == 2  # typer's own usage error, naming the choices
    assert all(kind in unknown.output for kind in AUDIT_KINDS)


# --- the HTTP API ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def api(database_url: str) -> Iterator[TestClient]:
    keyring = Keyring([MasterKey("audit-api", secrets.token_bytes(32))])
    settings = ApiSettings(database_url=database_url, keyring=keyring, run_worker=False)
    with TestClient(create_app(settings)) as client:
        yield client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_the_api_logs_its_changes_and_shows_them_to_the_owner_only(
    api: TestClient, db: Database
) -> None:
    owner = uuid.uuid4()
    _, token = TokenStore(db).create(owner, name="audit")
    me = bearer(token)
    assert api.post("/v1/tools", json={"key": "x.y", "name": "X"}, headers=me).status_code == 201
    patch = api.patch("/v1/tools/x.y", json={"requires_approval": True}, headers=me)
    assert patch.status_code == 200, patch.text
    created = api.post("/v1/agents", json={"name": "bot"}, headers=me)
    assert created.status_code == 201
    added = api.post("/v1/credentials", headers=me,
                     json={"kind": "api_key", "name": "k", "secret": SECRET})  # fmt: skip
    assert added.status_code == 201, added.text

    page = api.get("/v1/audit", headers=me)
    assert page.status_code == 200, page.text
    items = page.json()["items"]
    assert [(i["kind"], i["action"]) for i in items] == [
        ("credential", "insert"), ("agent", "insert"), ("tool", "update"), ("tool", "insert"),
        ("token", "insert"),
    ]  # fmt: skip
    assert {i["actor"] for i in items} == {str(owner)}
    assert items[2]["changes"] == {"requires_approval": {"old": False, "new": True}}
    assert SECRET not in page.text

    tools = api.get("/v1/audit", params={"kind": "tool", "limit": 1}, headers=me).json()
    assert tools["items"] == items[2:3] and tools["next_cursor"]
    more = api.get("/v1/audit", params={"kind": "tool", "cursor": tools["next_cursor"]},
                   headers=me).json()  # fmt: skip
    assert more == {"items": items[3:4], "next_cursor": None}
    since = items[1]["at"]
    recent = api.get("/v1/audit", params={"since": since}, headers=me).json()["items"]
    assert recent == items[:2]
    by_name = api.get("/v1/audit", params={"object": "bot"}, headers=me).json()["items"]
    assert by_name == [items[1]]

    agent_token = api.post("/v1/tokens", json={"agent": "bot"}, headers=me).json()["token"]
    refused = api.get("/v1/audit", headers=bearer(agent_token))
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "permission_denied"
    assert api.get("/v1/audit").status_code == 401
    someone = uuid.uuid4()
    _, other = TokenStore(db).create(someone)
    theirs = api.get("/v1/audit", headers=bearer(other)).json()["items"]
    assert [(i["kind"], i["actor"]) for i in theirs] == [("token", str(someone))]  # its own
    for params in ({"cursor": "bm9wZQ"}, {"kind": "tools"}, {"limit": 0}, {"since": "soon"}):
        bad = api.get("/v1/audit", params=params, headers=me)
        assert bad.status_code == 422, (params, bad.text)


def test_every_door_takes_the_same_kinds() -> None:
    assert tuple(get_args(AuditKind)) == AUDIT_KINDS
    assert tuple(kind.value for kind in CliAuditKind) == AUDIT_KINDS

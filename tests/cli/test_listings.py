"""Listings a person and a script can use (issue 13, item 5): full ids in every table at any
width, piped or not; `--output json|jsonl` carrying exactly the fields docs/cli.md names;
`invocations list` filters and cursor pages; `token list` with agent names; `--version`;
`tool enable` beside `tool disable`."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner, Result

from tests.credentials.conftest import keyring_text, make_keyring
from tests.pgtest import create_database, drop_database
from toolrelay.api import schemas
from toolrelay.cli import context, render
from toolrelay.cli.agents import InvocationStatus, parse_since
from toolrelay.cli.main import app
from toolrelay.db import migrate
from toolrelay.registry.pages import decode_cursor

ROOT = Path(__file__).parents[2]
TOOL_FILE = ROOT / "examples/postiz/tool.yaml"
DOCS = ROOT / "docs/cli.md"
UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
SECRET = "sk-live-" + "x7" * 20
KEYS = keyring_text(make_keyring("listings"))  # one key for the module's database
runner = CliRunner()


@pytest.fixture(scope="module")
def listings_db(admin_url: str) -> Iterator[str]:
    """A database of its own: credentials here are sealed with this module's key only (the
    CLI refuses keys it lacks for credentials stored by other tests)."""
    url = create_database(admin_url, "toolrelay_listings")
    migrate(url)
    yield url
    drop_database(admin_url, url)


@pytest.fixture
def cli_owner(listings_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    owner = str(uuid.uuid4())
    monkeypatch.setenv("DATABASE_URL", listings_db)
    monkeypatch.setenv("TOOLRELAY_OWNER", owner)
    monkeypatch.setenv("TOOLRELAY_HOME", str(tmp_path))
    monkeypatch.setenv("TOOLRELAY_MASTER_KEY", KEYS)
    monkeypatch.delenv("TOOLRELAY_MASTER_KEY_FILE", raising=False)
    context.database.cache_clear()
    yield owner
    context.database.cache_clear()


def invoke(*args: str, stdin: str | None = None, columns: int = 80) -> Result:
    return runner.invoke(app, list(args), input=stdin, env={"COLUMNS": str(columns)})


def run(*args: str, stdin: str | None = None, columns: int = 80) -> str:
    result = invoke(*args, stdin=stdin, columns=columns)
    assert result.exit_code == 0, (args, result.output)
    return result.stdout


def as_json(*args: str) -> Any:
    return json.loads(run(*args, "--output", "json"))


def make_tool(key: str) -> None:
    run("tool", "register", key, "--name", f"Tool {key}", "--endpoint", "https://api.example.com/x",
        "--method", "GET", "--egress-class", "read_only")  # fmt: skip


def populate() -> dict[str, Any]:
    """One of everything, with the ids a person would copy."""
    run("tool", "apply", str(TOOL_FILE))
    agent = run("agent", "create", "social-bot").strip()
    run("assign", "social-bot", "postiz.create_post")
    invocations = [
        run("invoke", "social-bot", "postiz.create_post", "-i",
            json.dumps({"integrationId": f"i{n}", "content": "hi"})).strip()
        for n in range(3)
    ]  # fmt: skip
    credential = run("credential", "add", "--kind", "api_key", "--name", "postiz",
                     "--host", "api.example.com", stdin=SECRET + "\n").strip()  # fmt: skip
    owner_token = run("token", "create", "--owner", "--name", "laptop").strip()
    agent_token = run("token", "create", "--agent", "social-bot").strip()
    tokens = [t["id"] for t in as_json("token", "list")["items"]]
    return {
        "agent": agent,
        "tool": as_json("tool", "show", "postiz.create_post")["id"],
        "invocations": invocations,
        "credential": credential,
        "tokens": tokens,
        "secrets": [SECRET, owner_token, agent_token],
    }


def assert_ids_intact(out: str, ids: list[str]) -> None:
    assert "…" not in out
    for ident in ids:
        assert re.search(rf"(^|\s){ident}(\s|$)", out, re.M), (ident, out)
    # nothing that looks like the start of an id is cut short
    for fragment in re.findall(r"\b[0-9a-f]{8}-[0-9a-f-]*", out):
        assert UUID_RE.fullmatch(fragment), (fragment, out)


def tables(made: dict[str, Any], owner: str) -> list[tuple[list[str], list[str]]]:
    """Every table a person reads, with the ids it must show whole."""
    inv = made["invocations"][0]
    return [
        (["agent", "list"], [made["agent"]]),
        (["invocations", "list"], made["invocations"]),
        (["credential", "list"], [made["credential"]]),
        (["token", "list"], made["tokens"]),
        (["owner", "list"], [owner]),
        (["tool", "show", "postiz.create_post", "-o", "table"], [made["tool"]]),
        (["invocations", "show", inv, "-o", "table"], [inv, made["agent"], made["tool"]]),
    ]


def test_every_table_shows_full_ids_piped_at_80_columns(cli_owner: str) -> None:
    made = populate()
    for args, ids in tables(made, cli_owner):
        out = run(*args, columns=80)
        assert_ids_intact(out, ids)
        assert not any(s in out for s in made["secrets"])
    listed = run("invocations", "list")
    rows = [line.split()[0] for line in listed.splitlines()[1:]]
    assert rows == made["invocations"][::-1]  # one row per line, newest first, id first


@pytest.mark.parametrize("width", [30, 50, 80, 100, 120, 200])
def test_on_a_terminal_ids_stay_whole_at_any_width(
    cli_owner: str, width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = populate()
    terminal = Console(force_terminal=True, width=width, color_system=None)
    monkeypatch.setattr(render, "console", terminal)
    for args, ids in tables(made, cli_owner):
        out = run(*args, columns=width)
        assert_ids_intact(out, ids)
        if width >= 60:  # wide enough for a field name and an id: nothing runs past the edge
            assert max(len(line.rstrip()) for line in out.splitlines()) <= width, (args, out)


def test_wide_terminals_get_one_row_per_line(
    cli_owner: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = populate()
    monkeypatch.setattr(
        render, "console", Console(force_terminal=True, width=200, color_system=None)
    )
    lines = run("invocations", "list").splitlines()
    assert lines[0].split() == ["id", "tool", "agent", "status", "approval", "error", "created"]
    assert [line.split()[0] for line in lines[1:]] == made["invocations"][::-1]


# --- JSON ---------------------------------------------------------------------------------


def documented_shapes() -> dict[str, list[tuple[str, str]]]:
    """docs/cli.md's field tables: shape name -> [(field, type)]."""
    shapes: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in DOCS.read_text().splitlines():
        if line.startswith("### "):
            current = line[4:].strip()
            shapes[current] = []
        elif current and (m := re.match(r"\| `(\w+)` \| ([^|]+) \|", line)):
            shapes[current].append((m[1], m[2].strip()))
    return shapes


def test_docs_name_every_field_with_its_type() -> None:
    docs = documented_shapes()
    for s in render.SHAPES:
        fields = [(f.name, f.doc_type) for f in s.fields]
        if s is render.INVOCATION_DETAIL:
            assert fields == docs["invocation"] + docs["invocation_detail"]
        else:
            assert fields == docs[s.name], s.name


def test_the_json_is_the_http_apis() -> None:
    pairs = [
        (render.TOOL, schemas.ToolOut),
        (render.AGENT, schemas.AgentOut),
        (render.CREDENTIAL, schemas.CredentialOut),
        (render.INVOCATION, schemas.InvocationOut),
        (render.INVOCATION_DETAIL, schemas.InvocationDetail),
        (render.ATTEMPT, schemas.AttemptOut),
    ]
    for s, model in pairs:
        assert [f.name for f in s.fields] == list(model.model_fields), s.name
    token = [f.name for f in render.TOKEN.fields if f.name != "agent_name"]
    assert token == list(schemas.TokenOut.model_fields)
    assert {s.value for s in InvocationStatus} == set(schemas.InvocationStatus.__args__)


def check_types(s: render.Shape, obj: dict[str, Any]) -> None:
    assert list(obj) == [f.name for f in s.fields]
    for f in s.fields:
        value = obj[f.name]
        if value is None:
            assert f.nullable, (s.name, f.name)
            continue
        if f.type == "uuid":
            assert isinstance(value, str) and str(uuid.UUID(value)) == value
        elif f.type == "time":
            assert isinstance(value, str) and value.endswith("Z")
            assert datetime.fromisoformat(value).utcoffset() == timedelta(0)
        elif f.type in ("string", "text"):
            assert isinstance(value, str)
        elif f.type in ("integer", "bytes"):
            assert isinstance(value, int) and not isinstance(value, bool)
        elif f.type == "number":
            assert isinstance(value, int | float) and not isinstance(value, bool)
        elif f.type == "boolean":
            assert isinstance(value, bool)
        elif f.type == "object":
            assert isinstance(value, dict)
        elif f.type == "string[]":
            assert isinstance(value, list) and all(isinstance(v, str) for v in value)
        elif f.items is not None:
            for item in value:
                check_types(f.items, item)


def test_json_and_jsonl_carry_the_documented_fields(cli_owner: str) -> None:
    made = populate()
    inv = made["invocations"][0]
    for args, s in [
        (("tool", "list"), render.TOOL),
        (("agent", "list"), render.AGENT),
        (("invocations", "list"), render.INVOCATION),
        (("credential", "list"), render.CREDENTIAL),
        (("token", "list"), render.TOKEN),
        (("owner", "list"), render.OWNER),
    ]:
        out = run(*args, "-o", "json")
        doc = json.loads(out)
        paged = args == ("invocations", "list")
        assert list(doc) == (["items", "next_cursor"] if paged else ["items"])
        assert doc["items"], args
        for item in doc["items"]:
            check_types(s, item)
        lines = run(*args, "-o", "jsonl").splitlines()
        assert [json.loads(line) for line in lines] == doc["items"]
        assert not any(secret in out for secret in made["secrets"])
    for args, s in [
        (("tool", "show", "postiz.create_post"), render.TOOL),
        (("invocations", "show", inv), render.INVOCATION_DETAIL),
    ]:
        shown = json.loads(run(*args))  # a show's default is json
        check_types(s, shown)
        assert json.loads(run(*args, "-o", "jsonl")) == shown
        assert len(run(*args, "-o", "jsonl").splitlines()) == 1
    detail = json.loads(run("invocations", "show", inv))
    assert detail["id"] == inv and detail["agent_id"] == made["agent"]
    assert detail["attempts"] == []
    [cred] = as_json("credential", "list")["items"]
    assert (cred["id"], cred["allowed_hosts"]) == (made["credential"], ["api.example.com"])


def test_token_list_names_the_agents(cli_owner: str) -> None:
    helper = run("agent", "create", "helper").strip()
    run("token", "create", "--agent", "helper")
    run("token", "create", "--owner")
    items = {t["kind"]: t for t in as_json("token", "list")["items"]}
    assert (items["agent"]["agent_id"], items["agent"]["agent_name"]) == (helper, "helper")
    assert (items["owner"]["agent_id"], items["owner"]["agent_name"]) == (None, None)
    rows = {line.split()[1]: line.split() for line in run("token", "list").splitlines()[1:]}
    assert rows["agent"][2] == "helper" and rows["owner"][2] == "-"


# --- invocations list: filters and pages --------------------------------------------------


def ids(*args: str) -> list[str]:
    return [i["id"] for i in as_json("invocations", "list", *args)["items"]]


def test_filters_return_exactly_the_expected_rows(cli_owner: str) -> None:
    for key in ("a.one", "b.two"):
        make_tool(key)
    for agent in ("alice", "bob"):
        run("agent", "create", agent)
        for key in ("a.one", "b.two"):
            run("assign", agent, key)
    made: list[tuple[str, str, str]] = []  # (id, agent, tool), oldest first
    for agent, key in [("alice", "a.one"), ("bob", "a.one"), ("alice", "b.two"),
                       ("bob", "b.two"), ("alice", "a.one")]:  # fmt: skip
        made.append((run("invoke", agent, key).strip(), agent, key))
    newest_first = [m[0] for m in reversed(made)]
    assert ids() == newest_first

    def expect(pred: Any) -> list[str]:
        return [m[0] for m in reversed(made) if pred(m)]

    assert ids("--agent", "alice") == expect(lambda m: m[1] == "alice")
    assert ids("--tool", "a.one") == expect(lambda m: m[2] == "a.one")
    assert ids("--agent", "bob", "--tool", "b.two") == expect(lambda m: m[1:] == ("bob", "b.two"))
    alice_id = as_json("agent", "list")["items"][0]["id"]
    tool_id = as_json("tool", "show", "b.two")["id"]
    assert ids("--agent", alice_id) == ids("--agent", "alice")
    assert ids("--tool", tool_id) == ids("--tool", "b.two")
    assert ids("--status", "running") == newest_first  # read_only tools need no approval
    assert ids("--status", "pending") == []

    created = {i["id"]: i["created_at"] for i in as_json("invocations", "list")["items"]}
    third = made[2][0]
    assert ids("--since", created[third]) == newest_first[:3]  # at or after it
    assert ids("--since", created[third], "--agent", "alice") == [made[4][0], made[2][0]]
    assert ids("--since", "1h") == newest_first
    assert ids("--since", (datetime.now(UTC) + timedelta(hours=1)).isoformat()) == []


def test_cursor_pages_return_every_row_once(cli_owner: str) -> None:
    make_tool("p.tool")
    run("agent", "create", "pager")
    run("assign", "pager", "p.tool")
    made = [run("invoke", "pager", "p.tool").strip() for _ in range(7)][::-1]

    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        doc = as_json(
            "invocations", "list", "--limit", "3", *(["--cursor", cursor] if cursor else [])
        )
        seen += [i["id"] for i in doc["items"]]
        pages += 1
        cursor = doc["next_cursor"]
        if cursor is None:
            break
        decode_cursor(cursor)  # the API's own cursor format
    assert (seen, pages) == (made, 3)

    # table and jsonl give the next page's cursor on stderr, never wrapped
    first = invoke("invocations", "list", "--limit", "4")
    [hint] = first.stderr.splitlines()
    assert hint.startswith("next page: --cursor ")
    rest = run("invocations", "list", "--limit", "4", "--cursor", hint.split()[-1], "-o", "jsonl")
    assert [json.loads(line)["id"] for line in rest.splitlines()] == made[4:]
    assert invoke("invocations", "list", "--limit", "4", "--cursor", hint.split()[-1]).stderr == ""

    # since + cursor: the since bound ends the listing, whatever the page size
    created = {i["id"]: i["created_at"] for i in as_json("invocations", "list")["items"]}
    doc = as_json("invocations", "list", "--since", created[made[3]], "--limit", "2")
    assert [i["id"] for i in doc["items"]] == made[:2] and doc["next_cursor"]
    doc = as_json("invocations", "list", "--since", created[made[3]], "--limit", "2", "--cursor",
                  doc["next_cursor"])  # fmt: skip
    assert [i["id"] for i in doc["items"]] == made[2:4] and doc["next_cursor"] is None


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--status", "bogus"], 2, "bogus"),
        (["--limit", "0"], 2, "--limit"),
        (["--limit", "-5"], 2, "--limit"),
        (["--since", "yesterday"], 1, "--since must be a time"),
        (["--since", "99999999999d"], 1, "--since must be a time"),
        (["--cursor", "not-a-cursor"], 1, "cursor is not one toolrelay handed out"),
        (["--output", "xml"], 2, "xml"),
    ],
)
def test_bad_listing_arguments_are_one_clear_error(
    cli_owner: str, args: list[str], code: int, message: str
) -> None:
    result = invoke("invocations", "list", *args)
    assert result.exit_code == code, result.output
    assert message in result.stderr and "Traceback" not in result.output
    assert result.stdout == ""


def test_since_forms() -> None:
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert parse_since("15m", now) == now - timedelta(minutes=15)
    assert parse_since("2w", now) == now - timedelta(weeks=2)
    assert parse_since("2026-12-01", now) == datetime(2026, 12, 1, tzinfo=UTC)
    assert parse_since("2026-12-01 09:30", now) == datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
    assert parse_since("2026-12-01T10:00:00+01:00", now) == datetime(2026, 12, 1, 9, tzinfo=UTC)
    assert parse_since("2026-12-01T09:00:00.5Z", now).microsecond == 500_000


# --- the rest of item 5 -------------------------------------------------------------------


def test_version_is_the_installed_packages() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout == f"toolrelay {metadata.version('toolrelay')}\n"


def test_enable_and_disable_round_trip(cli_owner: str) -> None:
    make_tool("w.get")
    run("agent", "create", "bot")
    run("assign", "bot", "w.get")
    assert "disabled w.get" in run("tool", "disable", "w.get")
    assert as_json("tool", "show", "w.get")["status"] == "disabled"
    refused = invoke("invoke", "bot", "w.get")
    assert refused.exit_code == 1 and "Traceback" not in refused.output
    assert "enabled w.get" in run("tool", "enable", "w.get")
    assert as_json("tool", "show", "w.get")["status"] == "active"
    assert UUID_RE.fullmatch(run("invoke", "bot", "w.get").strip())
    assert invoke("tool", "enable", "no.such").exit_code == 1


def test_text_in_tables_cannot_drive_the_terminal() -> None:
    name = render.TOOL.field("name")
    assert render.cell(name, "a\x1b[31mred\nline\u202e") == "a\ufffd[31mred line\ufffd"
    assert render.cell(name, "") == '""' and render.cell(name, None) == "-"

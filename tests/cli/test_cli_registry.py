"""The CLI as an owner: apply the Postiz tool file, invoke, approve, inspect, and clear errors."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from toolrelay.cli import context
from toolrelay.cli.main import app

TOOL_FILE = Path(__file__).parents[2] / "examples/postiz/tool.yaml"
runner = CliRunner()


@pytest.fixture
def cli_owner(database_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    owner = str(uuid.uuid4())
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("TOOLRELAY_OWNER", owner)
    context.database.cache_clear()
    return owner


def run(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout.strip()


def test_apply_invoke_approve_show(cli_owner: str) -> None:
    assert run("tool", "apply", str(TOOL_FILE)) == "created postiz.create_post"
    assert run("tool", "apply", str(TOOL_FILE)) == "unchanged postiz.create_post"  # idempotent
    assert "postiz.create_post" in run("tool", "show", "postiz.create_post")
    agent_id = run("agent", "create", "social-bot")
    uuid.UUID(agent_id)
    run("assign", "social-bot", "postiz.create_post")
    inv = run("invoke", "social-bot", "postiz.create_post", "-i",
              '{"integrationId": "abc", "content": "hi"}')  # fmt: skip
    uuid.UUID(inv)
    assert '"status": "pending"' in run("invocations", "show", inv)
    run("approve", inv)
    shown = run("invocations", "show", inv)
    assert '"status": "running"' in shown and '"approval_status": "approved"' in shown


def test_errors_are_one_line_and_exit_non_zero(cli_owner: str) -> None:
    run("agent", "create", "bot")
    result = runner.invoke(app, ["invoke", "bot", "no.such.tool"])
    assert result.exit_code == 1
    assert result.stderr.strip() == "error: tool no.such.tool not found"
    bad = runner.invoke(app, ["tool", "register", "x.y", "--name", "X", "--method", "TRACE",
                              "--endpoint-url", "https://api.example.com/"])  # fmt: skip
    assert bad.exit_code == 1
    assert bad.stderr.count("\n") == 1 and "http_method 'TRACE' is not allowed" in bad.stderr
    assert "Traceback" not in bad.output


def test_apply_writes_every_tool_of_the_file_or_none(cli_owner: str, tmp_path: Path) -> None:
    """A file whose third tool is refused changed nothing: not the first tool's update,
    not the second tool's creation (each used to be written before the refusal)."""
    first = tmp_path / "first.yaml"
    first.write_text(
        "tools:\n  - {key: a.one, name: One, endpoint_url: 'https://api.example.com/1'}\n"
    )
    run("tool", "apply", str(first))
    for bad_tool, said in (
        ("{key: c.three, name: Three, endpoint_url: 'ftp://api.example.com/3'}",
         "tool c.three: endpoint_url 'ftp://api.example.com/3' is not allowed"),
        # refused by the database itself (no such credential), after the others were sent
        (f"{{key: c.three, name: Three, endpoint_url: 'https://api.example.com/3',"
         f" auth_method: api_key, credential_ref: '{uuid.uuid4()}'}}",
         "tool c.three: "),
    ):  # fmt: skip
        changed = tmp_path / "changed.yaml"
        changed.write_text(
            "tools:\n"
            "  - {key: a.one, name: One v2, endpoint_url: 'https://api.example.com/1'}\n"
            "  - {key: b.two, name: Two, endpoint_url: 'https://api.example.com/2'}\n"
            f"  - {bad_tool}\n"
        )
        refused = runner.invoke(app, ["tool", "apply", str(changed)])
        assert refused.exit_code == 1, refused.output
        assert said in refused.stderr and not refused.stdout
        listed = run("tool", "list", "--output", "jsonl")
        assert '"key":"b.two"' not in listed and '"key":"c.three"' not in listed
        assert '"name":"One"' in listed and "One v2" not in listed
    changed.write_text(changed.read_text().rsplit("  - ", 1)[0])  # the good two alone
    assert run("tool", "apply", str(changed)) == "updated a.one: name\ncreated b.two"


def test_apply_keeps_gating_the_file_does_not_mention(cli_owner: str, tmp_path: Path) -> None:
    """A file that says nothing of approval leaves an owner's `requires_approval=true` as it
    is (applying it again used to ungate the tool); a file that says false means it."""
    path = tmp_path / "read.yaml"
    path.write_text("tools:\n  - {key: r.read, name: Read, http_method: GET, egress_class: "
                    "read_only, endpoint_url: 'https://api.example.com/r'}\n")  # fmt: skip
    run("tool", "apply", str(path))
    run("tool", "update", "r.read", "--set", "requires_approval=true")
    path.write_text(path.read_text().replace("name: Read,", "name: Read it,"))
    kept = runner.invoke(app, ["tool", "apply", str(path)]).output
    assert "r.read keeps requires_approval=true (set on the tool; the file does not say)" in kept
    shown = run("tool", "show", "r.read")
    assert '"requires_approval": true' in shown and '"name": "Read it"' in shown
    path.write_text(
        path.read_text().replace("name: Read it,", "name: Read, requires_approval: false,")
    )
    run("tool", "apply", str(path))
    assert '"requires_approval": false' in run("tool", "show", "r.read")

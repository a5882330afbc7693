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
    assert "applied postiz.create_post" in run("tool", "apply", str(TOOL_FILE))
    assert "applied postiz.create_post" in run("tool", "apply", str(TOOL_FILE))  # idempotent
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

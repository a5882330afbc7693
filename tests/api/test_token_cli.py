"""`toolrelay token create / list / revoke` through typer's CliRunner."""

from __future__ import annotations

import uuid

import pytest
from typer.testing import CliRunner

from toolrelay.cli.main import app
from toolrelay.db import Database
from toolrelay.tokens import TOKEN_PREFIX, Authenticator, Unauthenticated

runner = CliRunner()


def run(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def test_token_create_prints_the_token_alone_and_revoke_stops_it(
    cli_owner: uuid.UUID, db: Database
) -> None:
    auth = Authenticator(db)
    owner_out = run("token", "create", "--owner", "--name", "laptop")
    token = owner_out.strip()
    assert owner_out == token + "\n" and token.startswith(TOKEN_PREFIX)
    assert auth.authenticate(token).owner == cli_owner

    agent_id = uuid.UUID(run("agent", "create", "helper").strip())
    agent_token = run("token", "create", "--agent", "helper").strip()
    caller = auth.authenticate(agent_token)
    assert (caller.owner, caller.agent_id) == (cli_owner, agent_id)

    listed = run("token", "list")
    assert "laptop" in listed and "agent" in listed and token not in listed
    token_id = str(auth.authenticate(token).token_id)
    assert f"revoked {token_id}" in run("token", "revoke", token_id)
    with pytest.raises(Unauthenticated):
        auth.authenticate(token)
    assert "already revoked" in run("token", "revoke", token_id)
    assert auth.authenticate(agent_token).agent_id == agent_id


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["token", "create"], "exactly one of --owner, --agent ID and --member ID"),
        (
            ["token", "create", "--owner", "--agent", "x"],
            "exactly one of --owner, --agent ID and --member ID",
        ),
        (["token", "create", "--agent", "nobody"], "agent nobody not found"),
        (["token", "revoke", "nope"], "not a token id"),
        (["token", "revoke", str(uuid.UUID(int=1))], "not found"),
    ],
)
def test_token_errors_are_one_line(cli_owner: uuid.UUID, args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1

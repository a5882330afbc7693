"""`toolrelay credential ...` through typer's CliRunner: secrets on stdin, never printed."""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from typer.testing import CliRunner

from tests.credentials.conftest import keyring_text, make_keyring
from tests.credentials.helpers import api_key, register_tool
from toolrelay.cli import context
from toolrelay.cli.credentials import credential_app
from toolrelay.credentials import CredentialResolver, CredentialStore, Keyring, keyring_from_env
from toolrelay.db import Database

UUID_LINE = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\n$"


# One key for the session's database, as one installation has: a new key under the same id
# is another installation's, which the CLI refuses (keycheck.py).
CLI_KEYS = keyring_text(make_keyring("cli1"))


@pytest.fixture
def cli_env(cred_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Environment for one owner on the test database; yields the owner's uuid."""
    owner = str(uuid.uuid4())
    monkeypatch.setenv("DATABASE_URL", cred_db)
    monkeypatch.setenv("TOOLRELAY_HOME", str(tmp_path))
    monkeypatch.setenv("TOOLRELAY_OWNER", owner)
    monkeypatch.setenv("TOOLRELAY_MASTER_KEY", CLI_KEYS)
    monkeypatch.delenv("TOOLRELAY_MASTER_KEY_FILE", raising=False)
    context.database.cache_clear()  # it caches the first DATABASE_URL it saw
    yield owner
    context.database.cache_clear()


runner = CliRunner()


def test_add_prints_only_the_uuid_and_list_hides_secret(cli_env: str) -> None:
    secret = api_key()
    result = runner.invoke(
        credential_app,
        ["add", "--kind", "api_key", "--name", "postiz", "--host", "api.example.com"],
        input=secret + "\n",
    )
    assert result.exit_code == 0, result.stderr
    assert re.fullmatch(UUID_LINE, result.stdout)
    new_id = uuid.UUID(result.stdout.strip())

    listed = runner.invoke(credential_app, ["list"])
    assert listed.exit_code == 0
    assert "postiz" in listed.stdout and secret not in listed.stdout
    assert secret not in result.stderr + listed.stderr
    store = CredentialStore(Database(), keyring_from_env(False))
    assert store.get(uuid.UUID(cli_env), new_id).allowed_hosts == ["api.example.com"]


async def test_trailing_newline_dropped(
    cli_env: str, service_pool: Any, http: aiohttp.ClientSession
) -> None:
    secret = api_key()
    result = runner.invoke(
        credential_app,
        ["add", "--kind", "api_key", "--name", "nl", "--host", "h.example"],
        input=secret + "\n",
    )
    resolver = CredentialResolver(service_pool, keyring_from_env(False))
    assert (
        await resolver.resolve(uuid.UUID(result.stdout.strip()), "h.example", 443, http) == secret
    )


def test_rotate_and_delete(cli_env: str) -> None:
    added = runner.invoke(
        credential_app, ["add", "--kind", "oauth", "--name", "o"],
        input=json.dumps({"access_token": "tok", "client_id": "c"}),
    )  # fmt: skip
    cid = added.stdout.strip()
    rotated = runner.invoke(
        credential_app, ["rotate", cid], input=json.dumps({"access_token": "t2", "client_id": "c"})
    )
    assert rotated.exit_code == 0, rotated.stderr
    assert rotated.stdout == ""

    register_tool(Database(), uuid.UUID(cli_env), "cli.tool", auth_method="oauth",
                  credential=uuid.UUID(cid))  # fmt: skip
    refused = runner.invoke(credential_app, ["delete", cid])
    assert refused.exit_code == 1
    # (rich wraps long lines at 80 columns when stderr is not a terminal)
    assert refused.stderr.startswith("error: ") and "cli.tool" in refused.stderr
    assert "Traceback" not in refused.stderr
    forced = runner.invoke(credential_app, ["delete", cid, "--force"])
    assert forced.exit_code == 0 and "cli.tool" in forced.stderr


def test_rewrap_prints_count(
    isolated_db: str, cli_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", isolated_db)
    context.database.cache_clear()
    for name in ("a", "b"):
        assert (
            runner.invoke(
                credential_app, ["add", "--kind", "api_key", "--name", name], input=api_key()
            ).exit_code
            == 0
        )
    old = os.environ["TOOLRELAY_MASTER_KEY"]
    monkeypatch.setenv("TOOLRELAY_MASTER_KEY", f"{old},{keyring_text(make_keyring('cli2'))}")
    result = runner.invoke(credential_app, ["rewrap"])
    assert (result.exit_code, result.stdout) == (0, "2\n")
    assert runner.invoke(credential_app, ["rewrap"]).stdout == "0\n"


def test_bad_input_is_one_line_exit_1(cli_env: str) -> None:
    secret = "leaky-" + uuid.uuid4().hex
    result = runner.invoke(
        credential_app, ["add", "--kind", "oauth", "--name", "bad"],
        input=json.dumps({"refresh_token": secret}),
    )  # fmt: skip
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith("error: oauth: missing field")
    assert secret not in result.stderr
    missing = runner.invoke(credential_app, ["rotate", str(uuid.uuid4())], input="x")
    assert missing.exit_code == 1 and "not found" in missing.stderr


def test_missing_master_key_is_an_instruction(
    cli_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TOOLRELAY_MASTER_KEY")
    result = runner.invoke(credential_app, ["add", "--kind", "api_key", "--name", "n"], input="x")
    assert result.exit_code == 1
    assert "set TOOLRELAY_MASTER_KEY" in result.stderr and "Traceback" not in result.stderr
    # Listing needs no key at all.
    assert runner.invoke(credential_app, ["list"]).exit_code == 0


def test_keygen_output_is_a_valid_entry(cli_env: str) -> None:
    result = runner.invoke(credential_app, ["keygen", "--id", "k2"])
    assert Keyring.parse(result.stdout).ids == ["k2"]

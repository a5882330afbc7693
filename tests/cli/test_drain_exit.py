"""`toolrelay worker --drain` does not exit 0 over calls it could not send.

A worker without the master key a call's credential is sealed with hands the call back for a
worker that has it (never failing it). A drain that did so exited 0, the same as a drain that
sent everything: `worker --drain && next-step` read calls left behind as success. Now it
exits 3 and says how many it left, and why.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.pgtest import own_database_url, own_db  # noqa: F401 (fixtures: a database of its own)
from tests.registry.helpers import add_tool, agent_with_tool
from toolrelay.cli import context
from toolrelay.cli.main import app
from toolrelay.credentials import CredentialStore, Keyring, MasterKey
from toolrelay.db import Database
from toolrelay.registry import Registry

runner = CliRunner()


def test_a_drain_that_left_calls_for_a_worker_with_the_key_exits_3(
    db: Database, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = Registry(db, uuid.uuid4())
    keyring = Keyring([MasterKey(f"k-{uuid.uuid4().hex[:8]}", os.urandom(32))])
    cred = CredentialStore(db, keyring).add(owner.owner, "api_key", "svc", "s3cret-" + "4" * 8)
    agent, tool = agent_with_tool(
        owner, key="keyed.drain", endpoint_url="http://127.0.0.1:9/keyed",
        auth_method="api_key", credential_ref=cred,
    )  # fmt: skip
    left = [owner.invoke(agent, tool["key"], {}) for _ in range(2)]
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("TOOLRELAY_HOME", str(tmp_path))
    monkeypatch.setenv("TOOLRELAY_EGRESS_ALLOW", "127.0.0.1")
    for name in ("TOOLRELAY_MASTER_KEY", "TOOLRELAY_MASTER_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    context.database.cache_clear()

    result = runner.invoke(app, ["worker", "--drain", "--lease-seconds", "5"])
    assert result.exit_code == 3, result.output
    assert "2 call(s) left" in result.output and "master key" in result.output
    assert {owner.get_invocation(i)["status"] for i in left} == {"running"}

    # Nothing left behind: 0, as before.
    add_tool(owner, key="plain.drain", endpoint_url="http://127.0.0.1:9/plain")
    with db.as_dispatcher() as conn:
        conn.execute("DELETE FROM agents.tool_invocations WHERE id = ANY(%s)", (left,))
    assert runner.invoke(app, ["worker", "--drain"]).exit_code == 0

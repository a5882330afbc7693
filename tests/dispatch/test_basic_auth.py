"""HTTP basic end to end (issue 15): a credential of kind ``basic`` ({username, password}),
sealed like every other, placed by the worker as ``Authorization: Basic base64(u:p)``;
recorded masked, shown masked on the approvals page, and scrubbed from what comes back
in every form (the header, ``u:p``, the password alone)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web

from tests.dispatch.upstream import Upstream
from tests.pgtest import create_database, drop_database
from tests.registry.helpers import agent_with_tool
from toolrelay import errors
from toolrelay.credentials import CredentialStore, Keyring, generate_master_key
from toolrelay.db import Database, migrate
from toolrelay.dispatch.worker import Worker
from toolrelay.registry import Registry
from toolrelay.registry.preview import preview_request

Drain = Callable[..., Awaitable[Worker]]
USER, PASSWORD = "alice", "pa:ss/wörd+=&" + os.urandom(4).hex()
SECRET = json.dumps({"username": USER, "password": PASSWORD})
EXPECTED = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


def keyed(db: Database) -> tuple[Keyring, CredentialStore]:
    keyring = Keyring.parse(generate_master_key())
    return keyring, CredentialStore(db, keyring)


def echoing(upstream: Upstream) -> list[str]:
    """The route answers with what it got, so whatever leaks comes back to the agent."""
    got: list[str] = []

    async def handler(request: web.Request, _hit: int) -> web.Response:
        header = request.headers.get("Authorization", "")
        got.append(header)
        decoded = base64.b64decode(header.removeprefix("Basic ")).decode()
        return web.json_response(
            {"header": header, "pair": decoded, "password": decoded.partition(":")[2]}
        )

    upstream.routes["/basic"] = handler
    return got


async def test_the_worker_sends_basic_and_nothing_of_it_comes_back(
    registry: Registry, db: Database, upstream: Upstream, drain: Drain
) -> None:
    keyring, store = keyed(db)
    cred = store.add(registry.owner, "basic", "svc", SECRET)
    got = echoing(upstream)
    agent, _tool = agent_with_tool(
        registry, key="basic.get", endpoint_url=f"{upstream.base_url}/basic",
        auth_method="basic", credential_ref=cred,
    )  # fmt: skip
    inv = registry.invoke(agent, "basic.get", {})
    await drain(keyring=keyring)
    assert got == [EXPECTED]
    row = registry.get_invocation(inv)
    assert row["status"] == "completed", row["error"]
    shown = json.dumps(row, default=str)
    for leaked in (EXPECTED, base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode(),
                   f"{USER}:{PASSWORD}", PASSWORD):  # fmt: skip
        assert leaked not in shown
    [attempt] = row["attempts"]
    assert attempt["request_headers"]["Authorization"] == "Basic ••••"


def test_the_secret_is_sealed_and_checked(registry: Registry, db: Database) -> None:
    _keyring, store = keyed(db)
    cred = store.add(registry.owner, "basic", "svc", SECRET)
    with db.connect(autocommit=True) as conn:
        stored = conn.execute(
            "SELECT ciphertext FROM agents.credentials WHERE id = %s", (cred,)
        ).fetchone()
    assert stored is not None and PASSWORD.encode() not in bytes(stored["ciphertext"])
    for bad, why in (
        ({"username": "a:b", "password": "x"}, "must not contain ':'"),
        ({"username": "a", "password": ""}, "password not empty"),
        ({"username": "a", "password": "x\r\nInjected: 1"}, "line break"),
        ({"username": "a", "password": "x", "realm": "r"}, "unknown field"),
    ):
        with pytest.raises(errors.InvalidArgument, match=why) as caught:
            store.add(registry.owner, "basic", "bad", json.dumps(bad))
        assert "x\r\n" not in caught.value.message  # never the value


def test_basic_is_a_header_scheme_of_its_own_kind(registry: Registry, db: Database) -> None:
    _keyring, store = keyed(db)
    cred = store.add(registry.owner, "basic", "svc", SECRET)
    with pytest.raises(errors.ToolrelayError, match="auth_placement must be header"):
        agent_with_tool(
            registry, key="basic.query", auth_method="basic", credential_ref=cred,
            auth_placement="query", auth_param_name="auth",
        )  # fmt: skip
    api_key = store.add(registry.owner, "api_key", "k", "sk-1")
    with pytest.raises(errors.ToolrelayError, match="is of kind api_key, but auth_method is basic"):
        agent_with_tool(registry, key="basic.mixed", auth_method="basic", credential_ref=api_key)


def test_the_approvals_page_masks_it(registry: Registry, db: Database) -> None:
    _keyring, store = keyed(db)
    cred = store.add(registry.owner, "basic", "svc", SECRET)
    agent, _tool = agent_with_tool(
        registry, key="basic.write", http_method="POST", egress_class="write",
        endpoint_url="https://api.example.com/x", auth_method="basic", credential_ref=cred,
    )  # fmt: skip
    registry.invoke(agent, "basic.write", {"text": "hi"})
    [row] = registry.review_queue()
    shown = preview_request(row)
    assert ("Authorization", "Basic ••••") in shown.headers
    assert shown.has_secret


def test_the_cli_takes_it_from_stdin_never_argv(admin_url: str) -> None:
    # A database of its own: the CLI refuses one holding credentials sealed by keys it has
    # not got (other tests' keys, in the shared one).
    url = create_database(admin_url)
    try:
        migrate(url)
        owner = uuid.uuid4()
        env = os.environ | {
            "DATABASE_URL": url,
            "TOOLRELAY_OWNER": str(owner),
            "TOOLRELAY_MASTER_KEY": generate_master_key(),
        }
        done = subprocess.run(
            [sys.executable, "-m", "toolrelay.cli", "credential", "add", "--kind", "basic",
             "--name", "svc"],
            input=SECRET, env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert PASSWORD not in done.stdout + done.stderr
        db = Database(url)
        try:
            [info] = [c for c in CredentialStore(db).list(owner) if c.name == "svc"]
            assert info.kind == "basic"
        finally:
            db.close()
    finally:
        drop_database(admin_url, url)

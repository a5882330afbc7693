"""Nothing lost by accident: a lost master key is never replaced, and against a shared
database a lost TOOLRELAY_HOME never turns the CLI into a brand-new owner (issue 13, items 1 and 2)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.cliproc import CLI
from tests.credentials.conftest import keyring_text, make_keyring
from tests.pgtest import create_database, drop_database
from tests.registry.helpers import add_tool
from toolrelay.cli import context
from toolrelay.cli.main import app
from toolrelay.credentials import CredentialStore, MissingMasterKey, load_keyring
from toolrelay.db import Database, migrate
from toolrelay.errors import ConfigurationError
from toolrelay.notify.subscriptions import Webhooks
from toolrelay.registry import Registry

TOOLRELAY = str(Path(os.environ.get("VIRTUAL_ENV", ".venv")) / "bin" / "toolrelay")
runner = CliRunner()


def cli(home: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """The real command, as a new user runs it: embedded database, nothing else set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLRELAY_", "DATABASE_"))}
    env["TOOLRELAY_HOME"] = str(home)
    return subprocess.run(
        [TOOLRELAY, *args], input=stdin, capture_output=True, text=True, env=env, timeout=120
    )


@pytest.fixture
def embedded_home() -> Iterator[Path]:
    # Not under pytest's tmp: the embedded server runs as its own user and must reach it.
    home = Path(tempfile.mkdtemp(prefix="toolrelay-home-"))
    home.chmod(0o755)
    yield home
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver

        if (home / "pgdata").exists():
            pgserver.get_server(home / "pgdata", cleanup_mode="stop").cleanup()  # type: ignore[attr-defined]
    shutil.rmtree(home, ignore_errors=True)


def test_a_deleted_local_key_is_never_replaced(embedded_home: Path) -> None:
    added = cli(embedded_home, "credential", "add", "--kind", "api_key", "--name", "postiz",
                "--host", "api.example.com", stdin="s3cret-value\n")  # fmt: skip
    assert added.returncode == 0, added.stderr
    key_file = embedded_home / "master.key"
    backup = key_file.read_bytes()
    key_file.unlink()

    for command in (["worker", "--drain"], ["credential", "rotate", added.stdout.strip()]):
        refused = cli(embedded_home, *command, stdin="new-secret\n")
        assert refused.returncode != 0, command
        [line] = refused.stderr.strip().splitlines()
        assert "'local' (1 credential)" in line and str(key_file) in line
        assert "restore it from your backup" in line and "s3cret" not in line
        assert not key_file.exists()  # no new key was generated

    status = cli(embedded_home, "credential", "keys")
    assert status.returncode == 1
    assert "local" in status.stdout and "MISSING" in status.stdout

    key_file.write_bytes(backup)  # the backup brings everything back
    key_file.chmod(0o600)
    assert cli(embedded_home, "credential", "keys").returncode == 0
    assert cli(embedded_home, "worker", "--drain").returncode == 0


@pytest.fixture
def own_database(admin_url: str) -> Iterator[str]:
    """A database of this test's own: key usage counts every credential in it."""
    url = create_database(admin_url)
    migrate(url)
    yield url
    drop_database(admin_url, url)


def test_a_key_id_in_use_but_not_configured_refuses_naming_ids_and_source(
    own_database: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TOOLRELAY_HOME", str(tmp_path))
    old, new = make_keyring("k-old"), make_keyring("k-new")
    db = Database(own_database)
    CredentialStore(db, old).add(uuid.uuid4(), "api_key", "one", "s3cret", ["a.example"])
    with pytest.raises(MissingMasterKey) as raised:
        load_keyring(db, embedded=False, environ={"TOOLRELAY_MASTER_KEY": keyring_text(new)})
    message = raised.value.message
    assert "'k-old' (1 credential)" in message and "TOOLRELAY_MASTER_KEY" in message
    assert "'k-new'" in message  # what is configured, by id; never key material
    assert keyring_text(new).split(":")[1] not in message
    both = f"{keyring_text(old)},{keyring_text(new)}"
    assert load_keyring(db, embedded=False, environ={"TOOLRELAY_MASTER_KEY": both}).ids == [
        "k-old",
        "k-new",
    ]


@pytest.fixture
def shared_db(database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("TOOLRELAY_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TOOLRELAY_MASTER_KEY", keyring_text(make_keyring("shared")))
    context.database.cache_clear()
    yield tmp_path
    context.database.cache_clear()


def test_against_a_shared_database_a_missing_owner_is_an_error_not_a_new_owner(
    shared_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    me = str(uuid.uuid4())
    monkeypatch.setenv("TOOLRELAY_OWNER", me)
    tool = shared_db / "tool.yaml"
    tool.write_text("tools:\n  - {key: weather.get, name: Weather}\n")
    assert runner.invoke(app, ["tool", "apply", str(tool)]).exit_code == 0
    assert runner.invoke(app, ["agent", "create", "social-bot"]).exit_code == 0

    monkeypatch.delenv("TOOLRELAY_OWNER")  # a new machine: TOOLRELAY_HOME is empty too
    for command in (
        ["tool", "list"],
        ["tool", "apply", str(tool)],
        ["agent", "create", "social-bot"],
    ):
        result = runner.invoke(app, command)
        assert result.exit_code == 1, command
        [line] = result.stderr.strip().splitlines()
        assert "no owner chosen" in line and "TOOLRELAY_OWNER" in line and "owner list" in line
    assert not (shared_db / "home" / "owner").exists()

    owners = runner.invoke(app, ["owner", "list"])
    assert owners.exit_code == 0 and me in owners.stdout
    with Database(os.environ["DATABASE_URL"]).as_dispatcher() as conn:
        tools = conn.execute("SELECT owner, key FROM agents.tools_registry").fetchall()
        agents = conn.execute("SELECT owner FROM agents.agents").fetchall()
    mine = [(str(t["owner"]), t["key"]) for t in tools if str(t["owner"]) == me]
    assert mine == [(me, "weather.get")]  # no duplicate tool, under no new owner
    assert [str(a["owner"]) for a in agents].count(me) == 1  # one social-bot
    monkeypatch.setenv("TOOLRELAY_OWNER", me)
    assert runner.invoke(app, ["owner", "show"]).stdout.startswith(me)


def test_the_old_owner_file_is_named_in_the_error(shared_db: Path) -> None:
    home = shared_db / "home"
    home.mkdir(parents=True, exist_ok=True)
    known = str(uuid.uuid4())
    (home / "owner").write_text(known + "\n")
    result = runner.invoke(app, ["tool", "list"])
    assert result.exit_code == 1
    assert f"TOOLRELAY_OWNER={known}" in result.stderr


def test_another_installations_key_under_the_same_id_is_refused(
    own_database: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Every bare base64 key is id 'default': an env file copied from another installation
    # passes a check of ids. Accepted, its worker failed every credentialed call
    # `credential_error` (a missing id hands the call back instead) and new secrets were
    # sealed under a key the rest of the fleet does not have.
    monkeypatch.setenv("TOOLRELAY_HOME", str(tmp_path))
    mine, theirs = make_keyring("default"), make_keyring("default")
    db = Database(own_database)
    CredentialStore(db, mine).add(uuid.uuid4(), "api_key", "one", "s3cret", ["a.example"])
    with pytest.raises(MissingMasterKey) as raised:
        load_keyring(db, embedded=False, environ={"TOOLRELAY_MASTER_KEY": keyring_text(theirs)})
    message = raised.value.message
    assert "'default' (1 credential)" in message and "TOOLRELAY_MASTER_KEY" in message
    assert "not the key" in message
    for keyring in (mine, theirs):
        assert keyring_text(keyring).split(":")[1] not in message
    assert load_keyring(db, embedded=False, environ={"TOOLRELAY_MASTER_KEY": keyring_text(mine)})


def test_a_deleted_local_key_is_never_replaced_while_webhook_secrets_use_it(
    own_database: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Webhook signing secrets are sealed under the master key like credentials. With no
    # credential sealed, a deleted local key file was silently replaced by a new key of the
    # same id ('local'), and every webhook's secret could never be read again.
    monkeypatch.setenv("TOOLRELAY_HOME", str(tmp_path))
    db = Database(own_database)
    keyring = load_keyring(db, embedded=True, environ={})
    Webhooks(db, str(uuid.uuid4()), keyring).add("https://hooks.example.com/in", ["pending"])
    key_file = tmp_path / "master.key"
    backup = key_file.read_bytes()
    key_file.unlink()
    with pytest.raises(MissingMasterKey) as raised:
        load_keyring(db, embedded=True, environ={})
    assert "'local' (1 webhook secret)" in raised.value.message
    assert "restore it from your backup" in raised.value.message
    assert not key_file.exists()  # no new key was generated
    # An external database without any key configured says the same of webhook secrets.
    with pytest.raises(ConfigurationError, match=r"'local' \(1 webhook secret\)"):
        load_keyring(db, embedded=False, environ={})
    key_file.write_bytes(backup)
    assert load_keyring(db, embedded=True, environ={}).ids == ["local"]


def test_removing_a_key_that_still_seals_webhook_secrets_is_refused(
    own_database: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A rotation that ran `credential rewrap` but not `webhook rewrap`, then dropped the old
    # key: every credential is under the new key, so a check of credentials alone passed and
    # each webhook's secret could no longer be read.
    monkeypatch.setenv("TOOLRELAY_HOME", str(tmp_path))
    old, new = make_keyring("k-old"), make_keyring("k-new")
    db = Database(own_database)
    owner = uuid.uuid4()
    CredentialStore(db, old).add(owner, "api_key", "one", "s3cret", ["a.example"])
    Webhooks(db, str(owner), old).add("https://hooks.example.com/in", ["pending"])
    both = f"{keyring_text(old)},{keyring_text(new)}"
    CredentialStore(db, load_keyring(db, False, {"TOOLRELAY_MASTER_KEY": both})).rewrap()
    with pytest.raises(MissingMasterKey) as raised:
        load_keyring(db, embedded=False, environ={"TOOLRELAY_MASTER_KEY": keyring_text(new)})
    assert "'k-old' (1 webhook secret)" in raised.value.message
    assert "'k-new'" in raised.value.message and "credential)" not in raised.value.message


def test_a_worker_with_a_malformed_key_refuses_instead_of_failing_every_call(
    own_database: str, tmp_path: Path
) -> None:
    # A key pasted short (a character lost, 16 bytes instead of 32) or the two variables
    # both set: the keyring is refused with a clear error, but worker and serve took any
    # such error for "no key at all" and ran without one; every call needing a credential
    # then failed credential_error for good, where a key that is missing refuses the start.
    keyring = make_keyring("k1")
    db = Database(own_database)
    registry = Registry(db, uuid.uuid4())
    credential = CredentialStore(db, keyring).add(
        registry.owner, "api_key", "k", "s3cret", ["127.0.0.1"]
    )
    add_tool(registry, "k.get", auth_method="api_key", credential_ref=credential,
             endpoint_url="http://127.0.0.1:9/x")  # fmt: skip
    registry.create_agent("bot")
    registry.assign("bot", "k.get")
    call = registry.invoke("bot", "k.get", {})
    good = keyring_text(keyring)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLRELAY_", "DATABASE_"))}
    env |= {"DATABASE_URL": own_database, "TOOLRELAY_HOME": str(tmp_path)}
    short = "k1:" + base64.b64encode(keyring.get("k1").key[:16]).decode()
    for wrong in ({"TOOLRELAY_MASTER_KEY": short},
                  {"TOOLRELAY_MASTER_KEY": good, "TOOLRELAY_MASTER_KEY_FILE": "/dev/null"}):  # fmt: skip
        ran = subprocess.run([str(CLI), "worker", "--drain"], env=env | wrong, text=True,
                             capture_output=True, timeout=120)  # fmt: skip
        assert ran.returncode == 1, ran.stderr
        [line] = ran.stderr.strip().splitlines()
        assert line.startswith("error: ") and "'k1' (1 credential)" in line, line
        assert good.split(":")[1] not in line and short.split(":")[1] not in line
    row = registry.get_invocation(call)
    assert (row["status"], row["attempt"], row["error_code"]) == ("running", 0, None)


def test_credential_keys_says_what_the_start_check_says(
    own_database: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`credential keys` is the operator's check before dropping a key: it counts webhook
    secrets beside credentials and tries each key on what it seals, so it fails exactly
    where worker and serve would refuse to start."""
    monkeypatch.setenv("TOOLRELAY_HOME", str(tmp_path))
    monkeypatch.setenv("DATABASE_URL", own_database)
    old, new, theirs = make_keyring("k-old"), make_keyring("k-new"), make_keyring("k-new")
    db = Database(own_database)
    owner = uuid.uuid4()
    CredentialStore(db, new).add(owner, "api_key", "one", "s3cret", ["a.example"])
    Webhooks(db, str(owner), old).add("https://hooks.example.com/in", ["pending"])

    def keys(*keyrings: Any) -> Any:
        monkeypatch.setenv("TOOLRELAY_MASTER_KEY", ",".join(map(keyring_text, keyrings)))
        context.database.cache_clear()
        return runner.invoke(app, ["credential", "keys", "-o", "json"])

    dropped = keys(new)  # the webhook secret is still under k-old
    assert dropped.exit_code == 1, dropped.output
    rows = {r["key_id"]: r for r in json.loads(dropped.stdout)["items"]}
    assert (rows["k-old"]["webhook_secrets"], rows["k-old"]["configured"]) == (1, False)
    assert (rows["k-new"]["credentials"], rows["k-new"]["opens"]) == (1, True)

    wrong = keys(old, theirs)  # the right id, another installation's bytes
    assert wrong.exit_code == 1, wrong.output
    rows = {r["key_id"]: r for r in json.loads(wrong.stdout)["items"]}
    assert (rows["k-new"]["configured"], rows["k-new"]["opens"]) == (True, False)
    assert rows["k-old"]["opens"] is True
    for keyring in (old, new, theirs):
        assert keyring_text(keyring).split(":")[1] not in wrong.output

    assert keys(old, new).exit_code == 0
    context.database.cache_clear()

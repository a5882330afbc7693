"""Owner operations, row-level security, grants and the credential_ref trigger."""

from __future__ import annotations

import uuid
from uuid import UUID

import psycopg
import pytest

from tests.credentials.helpers import allowed_hosts, api_key, register_tool
from toolrelay.credentials import CredentialStore, Keyring
from toolrelay.db import Database
from toolrelay.errors import Conflict, InvalidArgument, NotFound


def test_add_list_metadata_only(store: CredentialStore, owner_a: UUID) -> None:
    cid = store.add(owner_a, "api_key", "postiz", api_key(), ["API.example.com", "x.io:8443"])
    [info] = store.list(owner_a)
    assert (info.id, info.name, info.kind, info.status) == (cid, "postiz", "api_key", "active")
    assert info.allowed_hosts == ["api.example.com", "x.io:8443"]
    assert not hasattr(info, "ciphertext")


def test_add_rejects_bad_input(store: CredentialStore, owner_a: UUID) -> None:
    with pytest.raises(InvalidArgument, match="unknown credential kind"):
        store.add(owner_a, "password", "n", "x")
    with pytest.raises(InvalidArgument, match="allowed host"):
        store.add(owner_a, "api_key", "n", "x", ["https://x.io/"])
    store.add(owner_a, "api_key", "dup", api_key())
    with pytest.raises(Conflict, match="already exists"):
        store.add(owner_a, "api_key", "dup", api_key())
    assert [i.name for i in store.list(owner_a)] == ["dup"]


def test_owner_b_cannot_see_or_change_a(
    store: CredentialStore, database: Database, owner_a: UUID, owner_b: UUID
) -> None:
    cid = store.add(owner_a, "api_key", "a-key", api_key())
    assert store.list(owner_b) == []
    with database.as_owner(owner_b) as conn:
        rows = conn.execute("SELECT id, name FROM agents.credentials").fetchall()
        assert cid not in [r["id"] for r in rows]
        cur = conn.execute("UPDATE agents.credentials SET name = 'stolen' WHERE id = %s", (cid,))
        assert cur.rowcount == 0
        assert conn.execute("DELETE FROM agents.credentials WHERE id = %s", (cid,)).rowcount == 0
    for action in (
        lambda: store.get(owner_b, cid),
        lambda: store.rotate(owner_b, cid, api_key()),
        lambda: store.delete(owner_b, cid, force=True),
        lambda: store.set_hosts(owner_b, cid, ["evil.io"]),
    ):
        with pytest.raises(NotFound):
            action()
    assert store.get(owner_a, cid).name == "a-key"


def test_owner_cannot_select_ciphertext_even_own(
    store: CredentialStore, database: Database, owner_a: UUID, keyring: Keyring
) -> None:
    cid = store.add(owner_a, "api_key", "mine", api_key())
    for column in ("ciphertext", "wrapped_key", "nonce", "key_id", "*"):
        with (
            pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"),
            database.as_owner(owner_a) as conn,
        ):
            conn.execute(f"SELECT {column} FROM agents.credentials WHERE id = %s", (cid,))
    with database.as_dispatcher() as conn:
        row = conn.execute(
            "SELECT ciphertext, wrapped_key, key_id FROM agents.credentials WHERE id = %s", (cid,)
        ).fetchone()
    assert row is not None and row["key_id"] == keyring.newest.id
    assert len(row["ciphertext"]) > 16


def test_rotate_keeps_id_and_reactivates(
    store: CredentialStore, database: Database, owner_a: UUID
) -> None:
    cid = store.add(owner_a, "api_key", "rot", api_key())
    with database.as_owner(owner_a) as conn:
        conn.execute("UPDATE agents.credentials SET status = 'revoked' WHERE id = %s", (cid,))
    store.rotate(owner_a, cid, api_key())
    info = store.get(owner_a, cid)
    assert info.status == "active" and info.rotated_at is not None
    with pytest.raises(InvalidArgument, match="api_key"):
        store.rotate(owner_a, cid, "")


def test_delete_refused_while_used_unless_force(
    store: CredentialStore, database: Database, owner_a: UUID
) -> None:
    cid = store.add(owner_a, "api_key", "used", api_key())
    tool = register_tool(database, owner_a, "t.used", credential=cid)
    with pytest.raises(Conflict, match=r"used by tool\(s\) t\.used"):
        store.delete(owner_a, cid)
    assert store.get(owner_a, cid).id == cid
    assert store.delete(owner_a, cid, force=True) == ["t.used"]
    with database.as_owner(owner_a) as conn:
        row = conn.execute(
            "SELECT credential_ref FROM agents.tools_registry WHERE id = %s", (tool["id"],)
        ).fetchone()
    assert row == {"credential_ref": None}
    with pytest.raises(NotFound):
        store.get(owner_a, cid)
    unused = store.add(owner_a, "api_key", "unused", api_key())
    assert store.delete(owner_a, unused) == []


def _expect_db_error(db: Database, owner: UUID, sql: str, params: tuple[object, ...]) -> str:
    with pytest.raises(psycopg.errors.IntegrityError) as info, db.as_owner(owner) as conn:
        conn.execute(sql, params)
    return str(info.value)


def test_credential_ref_other_owner_refused(
    store: CredentialStore, database: Database, owner_a: UUID, owner_b: UUID
) -> None:
    a_cred = store.add(owner_a, "api_key", "a", api_key())
    # Through the function...
    msg = _expect_db_error(
        database, owner_b,
        "SELECT fn_register_tool(p_key => 'b.tool', p_name => 'b', p_auth_method => 'api_key',"
        " p_endpoint_url => 'https://api.example.com/', p_credential_ref => %s)",
        (a_cred,),
    )  # fmt: skip
    assert "not found for this owner" in msg
    # ...and by the RFC's plain UPDATE on B's own tool.
    register_tool(database, owner_b, "b.tool2")
    msg = _expect_db_error(
        database, owner_b,
        "UPDATE agents.tools_registry SET credential_ref = %s WHERE key = 'b.tool2'",
        (a_cred,),
    )  # fmt: skip
    assert "not found for this owner" in msg
    assert allowed_hosts(database, owner_a, a_cred) == []  # nothing leaked into A's row


def test_credential_ref_wrong_kind_and_none_refused(
    store: CredentialStore, database: Database, owner_a: UUID
) -> None:
    cred = store.add(owner_a, "api_key", "k", api_key())
    msg = _expect_db_error(
        database, owner_a,
        "SELECT fn_register_tool(p_key => 'o.tool', p_name => 'o', p_auth_method => 'oauth',"
        " p_endpoint_url => 'https://api.example.com/', p_credential_ref => %s)",
        (cred,),
    )  # fmt: skip
    assert "is of kind api_key, but auth_method is oauth" in msg
    msg = _expect_db_error(
        database, owner_a,
        "SELECT fn_register_tool(p_key => 'n.tool', p_name => 'n', p_auth_method => 'none',"
        " p_endpoint_url => 'https://api.example.com/', p_credential_ref => %s)",
        (cred,),
    )  # fmt: skip
    assert "auth_method 'none' cannot have a credential_ref" in msg
    register_tool(database, owner_a, "k.tool", credential=cred)
    msg = _expect_db_error(
        database, owner_a,
        "UPDATE agents.tools_registry SET auth_method = 'none' WHERE key = 'k.tool'", (),
    )  # fmt: skip
    assert "cannot have a credential_ref" in msg
    msg = _expect_db_error(
        database, owner_a,
        "UPDATE agents.tools_registry SET auth_method = 'service_account' WHERE key = 'k.tool'",
        (),
    )  # fmt: skip
    assert "is of kind api_key" in msg


def test_rfc_update_binds_and_sets_default_host(
    store: CredentialStore, database: Database, owner_a: UUID
) -> None:
    cred = store.add(owner_a, "api_key", "postiz", api_key())
    register_tool(database, owner_a, "postiz.create_post", endpoint=None)
    with database.as_owner(owner_a) as conn:
        conn.execute(
            "UPDATE agents.tools_registry SET endpoint_url = %s, http_method = 'POST',"
            " auth_method = 'api_key', credential_ref = %s WHERE key = 'postiz.create_post'",
            ("https://Postiz.Example.org:5000/public/v1/posts", cred),
        )
    assert allowed_hosts(database, owner_a, cred) == ["postiz.example.org"]
    # The first tool decides; a second tool elsewhere does not widen the binding.
    register_tool(
        database, owner_a, "other", endpoint="https://other.example.net/x", credential=cred
    )
    assert allowed_hosts(database, owner_a, cred) == ["postiz.example.org"]


def test_explicit_hosts_are_not_overridden(
    store: CredentialStore, database: Database, owner_a: UUID
) -> None:
    cred = store.add(owner_a, "api_key", "bound", api_key(), ["api.example.com:8443"])
    register_tool(database, owner_a, "t", endpoint="https://elsewhere.example/x", credential=cred)
    assert allowed_hosts(database, owner_a, cred) == ["api.example.com:8443"]
    store.set_hosts(owner_a, cred, ["a.example", "A.example", "b.example:1"])
    assert allowed_hosts(database, owner_a, cred) == ["a.example", "b.example:1"]


def test_unknown_credential_ref_refused(database: Database, owner_a: UUID) -> None:
    msg = _expect_db_error(
        database, owner_a,
        "SELECT fn_register_tool(p_key => 'x', p_name => 'x', p_auth_method => 'api_key',"
        " p_endpoint_url => 'https://api.example.com/', p_credential_ref => %s)",
        (uuid.uuid4(),),
    )  # fmt: skip
    assert "not found for this owner" in msg

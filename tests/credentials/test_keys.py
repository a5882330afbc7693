"""Master key configuration: formats, ids, clear errors without key material."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest

from toolrelay.credentials import (
    Keyring,
    MasterKey,
    ensure_local_master_key,
    generate_master_key,
    keyring_from_env,
)
from toolrelay.errors import ConfigurationError, CredentialError


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def test_bare_value_gets_default_id() -> None:
    raw = os.urandom(32)
    ring = keyring_from_env(False, {"TOOLRELAY_MASTER_KEY": b64(raw)})
    assert ring.ids == ["default"]
    assert ring.newest.key == raw


def test_several_keys_with_ids_newest_last() -> None:
    k1, k2 = os.urandom(32), os.urandom(32)
    ring = keyring_from_env(False, {"TOOLRELAY_MASTER_KEY": f"old:{b64(k1)}, new:{b64(k2)}"})
    assert ring.ids == ["old", "new"]
    assert ring.newest.id == "new"
    assert ring.get("old").key == k1


def test_urlsafe_base64_accepted() -> None:
    raw = b"\xfb\xff" * 16
    ring = Keyring.parse(f"k:{base64.urlsafe_b64encode(raw).decode()}")
    assert ring.get("k").key == raw


def test_key_file_one_per_line_with_comments(tmp_path: Path) -> None:
    k1, k2 = os.urandom(32), os.urandom(32)
    path = tmp_path / "keys"
    path.write_text(f"# rotated 2025-01\nk1:{b64(k1)}\n\nk2:{b64(k2)}\n")
    ring = keyring_from_env(False, {"TOOLRELAY_MASTER_KEY_FILE": str(path)})
    assert ring.ids == ["k1", "k2"]


def test_missing_key_gives_instruction() -> None:
    with pytest.raises(ConfigurationError) as info:
        keyring_from_env(False, {})
    assert "set TOOLRELAY_MASTER_KEY" in info.value.message
    assert "generate one with" in info.value.message


def test_wrong_length_names_id_not_material() -> None:
    short = b64(b"0123456789abcdef")
    with pytest.raises(ConfigurationError) as info:
        Keyring.parse(f"mine:{short}")
    assert "'mine'" in info.value.message and "16 bytes" in info.value.message
    assert short not in info.value.message


def test_invalid_base64_and_duplicate_ids() -> None:
    with pytest.raises(ConfigurationError, match="'k' is not valid base64"):
        Keyring.parse("k:not base64!!")
    raw = b64(os.urandom(32))
    with pytest.raises(ConfigurationError, match="given twice"):
        Keyring.parse(f"{raw},{raw}")


def test_both_env_vars_is_an_error(tmp_path: Path) -> None:
    env = {"TOOLRELAY_MASTER_KEY": b64(os.urandom(32)), "TOOLRELAY_MASTER_KEY_FILE": "x"}
    with pytest.raises(ConfigurationError, match="only one"):
        keyring_from_env(False, env)


def test_unreadable_key_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read master key file"):
        keyring_from_env(False, {"TOOLRELAY_MASTER_KEY_FILE": str(tmp_path / "nope")})


def test_unknown_key_id_fails_closed_naming_ids_only() -> None:
    ring = Keyring([MasterKey("k2", os.urandom(32))])
    with pytest.raises(CredentialError) as info:
        ring.get("k1")
    assert "'k1'" in info.value.message and "'k2'" in info.value.message
    assert b64(ring.get("k2").key) not in info.value.message


def test_repr_hides_material() -> None:
    key = MasterKey("k", os.urandom(32))
    assert repr(key.key) not in repr(key)
    assert "k" in repr(Keyring([key]))


def test_generate_master_key_round_trips() -> None:
    entry = generate_master_key("2025-06")
    assert Keyring.parse(entry).ids == ["2025-06"]


def test_local_master_key_created_once_with_mode_0600(tmp_path: Path) -> None:
    path = ensure_local_master_key(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    first = path.read_text()
    assert ensure_local_master_key(tmp_path) == path
    assert path.read_text() == first
    assert Keyring.parse(first).ids == ["local"]
    assert [p.name for p in tmp_path.iterdir()] == ["master.key"]  # no temp file left


def test_embedded_mode_uses_local_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLRELAY_HOME", str(tmp_path))
    ring = keyring_from_env(True, {})
    assert ring.ids == ["local"]
    assert keyring_from_env(True, {}).newest.key == ring.newest.key
    # An explicit key wins over the local file, embedded or not.
    assert keyring_from_env(True, {"TOOLRELAY_MASTER_KEY": b64(os.urandom(32))}).ids == ["default"]

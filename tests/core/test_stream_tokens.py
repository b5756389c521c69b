"""Stream tokens carry their grant, and nothing else passes for one."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.core.stream_tokens import (
    ExpiredToken,
    InvalidToken,
    StreamGrant,
    sign,
    verify,
)

SECRET = b"a server secret of some length"
GRANT = StreamGrant("tenant-1", "session", "9b2f0c6e-3a41-4d7e-8f57-1c2d3e4f5a6b", 1_000)


@given(
    tenant=st.text(min_size=1),
    kind=st.sampled_from(["session", "run"]),
    scope_id=st.text(min_size=1),
    expires_at=st.integers(min_value=1, max_value=2**40),
)
def test_a_token_carries_its_grant(tenant: str, kind: str, scope_id: str, expires_at: int) -> None:
    grant = StreamGrant(tenant, kind, scope_id, expires_at)  # type: ignore[arg-type]
    token = sign(SECRET, grant)
    assert verify(SECRET, token, now=expires_at - 1) == grant
    assert token.isascii() and all(c.isalnum() or c in "-_." for c in token)  # URL-safe


def test_an_expired_token_is_refused() -> None:
    token = sign(SECRET, GRANT)
    assert verify(SECRET, token, now=999.5) == GRANT
    for now in (1_000, 5_000):
        with pytest.raises(ExpiredToken):
            verify(SECRET, token, now=now)


def test_another_secret_or_any_change_is_refused() -> None:
    token = sign(SECRET, GRANT)
    prefix, payload, signature = token.split(".")
    other = sign(SECRET, StreamGrant("tenant-2", "session", GRANT.id, 1_000)).split(".")[1]
    forged = [
        sign(b"another secret entirely", GRANT),
        f"{prefix}.{other}.{signature}",  # another tenant's grant under this signature
        f"{prefix}.{payload}.{signature[:-2]}",
        f"{prefix}.{payload}x.{signature}",
        f"tls0.{payload}.{signature}",
        f"{prefix}.{payload}",
        "",
        "tl_an-api-key",
        "....",
    ]
    for token in forged:
        with pytest.raises(InvalidToken):
            verify(SECRET, token, now=0)

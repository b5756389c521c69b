"""Stream tokens: short-lived, signed permissions to read one session's or one run's stream.

A browser's EventSource cannot send an Authorization header, and an API key must never sit in
a URL (logs, history, referrers keep it). So an authenticated call issues a token naming the
tenant, one session or one run, and an expiry, signed with HMAC-SHA256 under a server secret;
the stream endpoints take it as `?token=`. Nothing is stored: any API instance sharing the
secret verifies it, and it is worthless after it expires.

Format: `tls1.<payload>.<signature>`, both base64url without padding; the payload is JSON
`{"t": tenant, "k": "session" | "run", "id": id, "exp": unix seconds}`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Literal

PREFIX = "tls1"
ScopeKind = Literal["session", "run"]


@dataclass(frozen=True)
class StreamGrant:
    """What a valid token allows: the streams of one session, or of one run, of a tenant."""

    tenant_id: str
    kind: ScopeKind
    id: str
    expires_at: int  # unix seconds


class InvalidToken(ValueError):
    """Not a token this server signed (malformed, or signed with another secret)."""


class ExpiredToken(ValueError):
    """A token this server signed, past its expiry."""


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signature(secret: bytes, payload: str) -> str:
    return _b64(hmac.new(secret, f"{PREFIX}.{payload}".encode(), hashlib.sha256).digest())


def sign(secret: bytes, grant: StreamGrant) -> str:
    """The token carrying `grant`."""
    body = {"t": grant.tenant_id, "k": grant.kind, "id": grant.id, "exp": grant.expires_at}
    payload = _b64(json.dumps(body, separators=(",", ":")).encode())
    return f"{PREFIX}.{payload}.{_signature(secret, payload)}"


def verify(secret: bytes, token: str, now: float) -> StreamGrant:
    """The grant of a token signed with `secret`; InvalidToken or ExpiredToken otherwise."""
    prefix, _, rest = token.partition(".")
    payload, _, signature = rest.partition(".")
    if prefix != PREFIX or not payload or not signature:
        raise InvalidToken("not a stream token")
    if not hmac.compare_digest(_signature(secret, payload), signature):
        raise InvalidToken("the stream token's signature does not match")
    try:
        body = json.loads(_unb64(payload))
        grant = StreamGrant(str(body["t"]), body["k"], str(body["id"]), int(body["exp"]))
    except (ValueError, KeyError, TypeError) as exc:  # signed by us, so never in practice
        raise InvalidToken("the stream token's payload is malformed") from exc
    if grant.kind not in ("session", "run"):
        raise InvalidToken("the stream token's scope is unknown")
    if now >= grant.expires_at:
        raise ExpiredToken("the stream token has expired")
    return grant

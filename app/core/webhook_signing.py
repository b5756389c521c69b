"""Standard Webhooks signatures: `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, keyed
by the bytes a `whsec_<base64>` secret encodes (https://www.standardwebhooks.com)."""

from __future__ import annotations

import base64
import hashlib
import hmac

SECRET_PREFIX = "whsec_"


def secret_key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def signature(secret: str, message_id: str, timestamp: int, body: str) -> str:
    signed = f"{message_id}.{timestamp}.{body}".encode()
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(secret: str, message_id: str, timestamp: int, body: str) -> dict[str, str]:
    """The headers of a delivery: its id (the same on every retry), when it was signed, and
    the signature of exactly the body sent."""
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(secret, message_id, timestamp, body),
    }

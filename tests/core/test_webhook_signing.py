"""Our Standard Webhooks signatures are the ones the reference implementation computes and
verifies, for any secret, message id and (JSON) body."""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from standardwebhooks import Webhook, WebhookVerificationError

from app.core.webhook_signing import SECRET_PREFIX, headers, signature

secrets = st.binary(min_size=16, max_size=64).map(
    lambda raw: SECRET_PREFIX + base64.b64encode(raw).decode()
)
message_ids = st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=64
)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
bodies = st.dictionaries(st.text(), values, max_size=5).map(
    lambda data: json.dumps(data, separators=(",", ":"))
)
times = st.integers(min_value=0, max_value=253_402_300_799)  # up to 9999-12-31


@given(secrets, message_ids, times, bodies)
def test_signatures_match_the_reference(secret: str, message_id: str, at: int, body: str) -> None:
    when = datetime.fromtimestamp(at, UTC)
    assert signature(secret, message_id, at, body) == Webhook(secret).sign(message_id, when, body)


@given(secrets, message_ids, bodies)
def test_the_reference_verifies_what_we_send_and_refuses_a_changed_body(
    secret: str, message_id: str, body: str
) -> None:
    sent = headers(secret, message_id, int(time.time()), body)
    assert Webhook(secret).verify(body, sent) == json.loads(body)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body + " ", sent)
    other = SECRET_PREFIX + base64.b64encode(b"another key, 32 bytes long......").decode()
    with pytest.raises(WebhookVerificationError):
        Webhook(other).verify(body, sent)

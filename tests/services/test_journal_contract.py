"""The journal contract: dense seqs under concurrency, optimistic revs, idempotent ids, and
append-only storage enforced by the database itself (DESIGN invariants 1 and 2)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.entries import EntryKind, NewEntry
from app.services.errors import Invalid
from app.services.journal import append_in
from testkit.api import append, append_texts, history, message, new_session, texts


async def test_seq_is_dense_under_50_concurrent_appenders_with_expected_rev(
    client: httpx.AsyncClient,
) -> None:
    session = await new_session(client)
    sid = session["id"]
    conflicts: list[dict[str, int]] = []

    async def writer(n: int) -> int:
        rev = 0
        while True:
            response = await append(client, sid, message(f"w{n}"), expected_rev=rev)
            if response.status_code == 201:
                (entry,) = response.json()["entries"]
                assert entry["seq"] == rev + 1
                return int(entry["seq"])
            assert response.status_code == 409, response.text
            error = response.json()["error"]
            assert error["code"] == "rev_conflict"
            assert error["details"]["expected_rev"] == rev
            assert error["details"]["current_rev"] > rev
            conflicts.append(error["details"])
            rev = error["details"]["current_rev"]

    seqs = await asyncio.gather(*(writer(n) for n in range(50)))
    assert sorted(seqs) == list(range(1, 51))
    assert conflicts, "50 writers starting at rev 0 must collide"
    stored = await history(client, sid)
    assert [e["seq"] for e in stored] == list(range(1, 51))
    assert sorted(texts(stored)) == sorted(f"w{n}" for n in range(50))
    assert (await client.get(f"/v1/sessions/{sid}")).json()["rev"] == 50


async def test_seq_is_dense_under_50_concurrent_unconditional_batches(
    client: httpx.AsyncClient,
) -> None:
    sid = (await new_session(client))["id"]

    async def writer(n: int) -> list[int]:
        response = await append(client, sid, message(f"{n}a"), message(f"{n}b"))
        assert response.status_code == 201, response.text
        return [e["seq"] for e in response.json()["entries"]]

    batches = await asyncio.gather(*(writer(n) for n in range(50)))
    for batch in batches:  # a batch is contiguous: nothing interleaves inside it
        assert batch == [batch[0], batch[0] + 1]
    assert sorted(s for b in batches for s in b) == list(range(1, 101))


async def test_stale_expected_rev_is_409_with_current_rev_and_writes_nothing(
    client: httpx.AsyncClient,
) -> None:
    sid = (await new_session(client))["id"]
    await append_texts(client, sid, "one", "two")
    response = await append(client, sid, message("late"), expected_rev=1)
    assert response.status_code == 409
    assert response.json()["error"]["details"] == {"current_rev": 2, "expected_rev": 1}
    assert texts(await history(client, sid)) == ["one", "two"]


async def test_retry_with_same_entry_id_returns_original_seq_and_writes_nothing(
    client: httpx.AsyncClient,
) -> None:
    sid = (await new_session(client))["id"]
    first = await append(client, sid, message("hello", entry_id="m-1"), expected_rev=0)
    assert first.status_code == 201
    await append_texts(client, sid, "after")
    # The retry carries the stale expected_rev of the original attempt: still a replay.
    retry = await append(client, sid, message("hello", entry_id="m-1"), expected_rev=0)
    assert retry.status_code == 200, retry.text
    assert retry.json()["replayed"] is True
    assert retry.json()["entries"][0]["seq"] == first.json()["entries"][0]["seq"] == 1
    assert retry.json()["rev"] == 2
    stored = await history(client, sid)
    assert [e["id"] for e in stored[:1]] == ["m-1"] and len(stored) == 2


async def test_retry_of_a_batch_where_only_some_entries_have_ids(client: httpx.AsyncClient) -> None:
    sid = (await new_session(client))["id"]
    await append_texts(client, sid, "before")
    batch = [message("q", entry_id="q-1"), message("a", role="assistant"), message("b")]
    first = await append(client, sid, *batch)
    assert first.status_code == 201
    retry = await append(client, sid, *batch)
    assert retry.status_code == 200 and retry.json()["replayed"] is True
    assert retry.json()["entries"] == first.json()["entries"]
    # Same ids, but the batch around them differs: not a replay.
    changed = await append(client, sid, batch[0], message("a", role="assistant"), message("c"))
    assert changed.status_code == 409
    assert changed.json()["error"]["code"] == "entry_id_conflict"
    assert texts(await history(client, sid)) == ["before", "q", "a", "b"]


async def test_concurrent_retries_of_one_entry_id_store_it_once(client: httpx.AsyncClient) -> None:
    sid = (await new_session(client))["id"]
    responses = await asyncio.gather(
        *(append(client, sid, message("once", entry_id="dup")) for _ in range(20))
    )
    assert sorted(r.status_code for r in responses) == [200] * 19 + [201]
    assert {r.json()["entries"][0]["seq"] for r in responses} == {1}
    assert len(await history(client, sid)) == 1


async def test_reused_entry_id_with_other_content_is_a_conflict(client: httpx.AsyncClient) -> None:
    sid = (await new_session(client))["id"]
    await append(client, sid, message("original", entry_id="x"))
    response = await append(client, sid, message("different", entry_id="x"))
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "entry_id_conflict"
    mixed = await append(client, sid, message("original", entry_id="x"), message("new"))
    assert mixed.status_code == 409
    assert texts(await history(client, sid)) == ["original"]


async def test_a_batch_is_atomic(client: httpx.AsyncClient) -> None:
    sid = (await new_session(client))["id"]
    bad = {"kind": "tool_call", "payload": {"name": "f", "arguments": {}}, "refs": {}}
    response = await append(client, sid, message("fine"), bad)
    assert response.status_code == 422
    assert response.json()["error"]["details"]["errors"][0]["loc"][:3] == ["entries", 1, "refs"]
    assert await history(client, sid) == []
    assert (await client.get(f"/v1/sessions/{sid}")).json()["rev"] == 0


async def _seed(client: httpx.AsyncClient) -> str:
    sid = (await new_session(client))["id"]
    await append_texts(client, sid, "kept")
    return str(sid)


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE entries SET payload = '{}'::jsonb WHERE session_id = :sid",
        "UPDATE entries SET seq = seq + 100 WHERE session_id = :sid",
        "DELETE FROM entries WHERE session_id = :sid",
        "TRUNCATE entries",
    ],
)
async def test_the_database_refuses_to_rewrite_history(
    client: httpx.AsyncClient, engine: AsyncEngine, statement: str
) -> None:
    sid = await _seed(client)
    with pytest.raises(DBAPIError, match="append-only"):
        async with engine.begin() as conn:
            await conn.execute(text(statement), {"sid": sid} if ":sid" in statement else {})
    assert texts(await history(client, sid)) == ["kept"]


async def test_deleting_a_session_deletes_its_entries(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    sid = await _seed(client)
    assert (await client.delete(f"/v1/sessions/{sid}")).status_code == 204
    async with engine.connect() as conn:
        left = await conn.scalar(
            text("SELECT count(*) FROM entries WHERE session_id = :sid"), {"sid": sid}
        )
    assert left == 0


async def test_token_count_is_stored_at_write(client: httpx.AsyncClient) -> None:
    from app.llm.tokenizers import stored_counter

    sid = (await new_session(client))["id"]
    response = await append(client, sid, message("x" * 400), message("y" * 40))
    counts = [e["token_count"] for e in response.json()["entries"]]
    assert counts == [stored_counter().count("x" * 400), stored_counter().count("y" * 40)]
    session = (await client.get(f"/v1/sessions/{sid}")).json()
    assert session["rev"] == 2


# --- ranges name entries that exist (issue 12, point 1) ---------------------------------------


def ranged(kind: str, from_seq: object, to_seq: object) -> dict[str, object]:
    payload: dict[str, object] = {"from_seq": from_seq, "to_seq": to_seq}
    if kind == "summary":
        payload["content"] = "so far"
    return {"kind": kind, "payload": payload}


def error_locs(response: httpx.Response) -> list[list[object]]:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] in ("invalid_entries", "validation_error"), error
    return [e["loc"] for e in error["details"]["errors"]]


@pytest.mark.parametrize("kind", ["summary", "rollback"])
async def test_a_range_past_the_end_is_refused_and_writes_nothing(
    client: httpx.AsyncClient, kind: str
) -> None:
    sid = (await new_session(client))["id"]
    await append_texts(client, sid, "one", "two")
    before = await history(client, sid)
    for to_seq in (1_000_000, 3):  # 3 would be the entry itself: it must name earlier ones
        response = await append(client, sid, message("three"), ranged(kind, 1, to_seq + 1))
        assert error_locs(response) == [["entries", 1, "payload", "to_seq"]]
        assert await history(client, sid) == before  # no half-written batch
        assert (await client.get(f"/v1/sessions/{sid}")).json()["rev"] == 2
    # The session still works: a later question reaches the model.
    await append_texts(client, sid, "a later question")
    sent = (await client.post(f"/v1/sessions/{sid}/projection", json={})).json()
    assert sent["request"]["messages"][-1]["content"] == "a later question"


@pytest.mark.parametrize("kind", ["summary", "rollback"])
@pytest.mark.parametrize(
    ("from_seq", "to_seq", "field"),
    [(2, 1, "to_seq"), (0, 1, "from_seq"), (-3, 1, "from_seq"), (1, -1, "to_seq")],
)
async def test_a_range_out_of_order_or_below_one_names_its_field(
    client: httpx.AsyncClient, kind: str, from_seq: int, to_seq: int, field: str
) -> None:
    sid = (await new_session(client))["id"]
    await append_texts(client, sid, "one", "two")
    response = await append(client, sid, ranged(kind, from_seq, to_seq))
    assert [loc[-1] for loc in error_locs(response)] == [field]
    assert (await client.get(f"/v1/sessions/{sid}")).json()["rev"] == 2


async def test_a_range_may_name_earlier_entries_of_its_own_batch(
    client: httpx.AsyncClient,
) -> None:
    """An import brings a history with its summaries and rollbacks in one append."""
    sid = (await new_session(client))["id"]
    response = await append(
        client,
        sid,
        message("old"),
        message("older answer", role="assistant"),
        ranged("summary", 1, 2),
        message("oops"),
        ranged("rollback", 4, 4),
        message("now"),
    )
    assert response.status_code == 201, response.text
    sent = (await client.post(f"/v1/sessions/{sid}/projection", json={})).json()
    contents = [m["content"] for m in sent["request"]["messages"]]
    assert contents[-1] == "now" and "oops" not in contents
    # Not a later one, though: a range reaching into its own batch's future is refused.
    ahead = await append(client, sid, ranged("summary", 1, 8), message("later"))
    assert error_locs(ahead) == [["entries", 0, "payload", "to_seq"]]


async def test_a_fork_may_name_its_inherited_prefix_but_not_beyond_it(
    client: httpx.AsyncClient,
) -> None:
    parent = (await new_session(client))["id"]
    await append_texts(client, parent, "p1", "p2", "p3", "p4")
    fork = (await client.post(f"/v1/sessions/{parent}/fork", json={"at_seq": 2})).json()["id"]
    # The parent's seq 3 exists, but not in the fork's thread (its rev is 2).
    beyond = await append(client, fork, ranged("summary", 1, 3))
    assert error_locs(beyond) == [["entries", 0, "payload", "to_seq"]]
    assert (await append(client, fork, ranged("summary", 1, 2))).status_code == 201


async def test_internal_appends_check_ranges_too(
    engine: AsyncEngine, client: httpx.AsyncClient
) -> None:
    """The check is in the shared append mechanism, not the route: a use case appending inside
    its own transaction gets the same refusal, and its transaction writes nothing."""
    sid = (await new_session(client))["id"]
    async with engine.connect() as conn:
        query = text("SELECT tenant_id FROM sessions WHERE id = :sid")
        tenant = str((await conn.execute(query, {"sid": sid})).scalar_one())
    await append_texts(client, sid, "one")
    with pytest.raises(Invalid) as refused:
        async with engine.begin() as conn:
            await append_in(
                conn,
                tenant,
                sid,
                [
                    NewEntry(EntryKind.MESSAGE, {"role": "user", "content": "two"}, {}),
                    NewEntry(EntryKind.ROLLBACK, {"from_seq": 1, "to_seq": 9}, {}),
                ],
            )
    assert refused.value.details["errors"][0]["loc"] == ["entries", 1, "payload", "to_seq"]
    assert texts(await history(client, sid)) == ["one"]

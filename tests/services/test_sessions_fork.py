"""Forks: O(1) children that read the parent's prefix, and deletes that never break a child
(DESIGN invariant 6)."""

from __future__ import annotations

import asyncio

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from testkit.api import append, append_texts, history, message, new_session, texts


async def fork(client: httpx.AsyncClient, sid: str, **body: object) -> dict[str, object]:
    response = await client.post(f"/v1/sessions/{sid}/fork", json=body)
    assert response.status_code == 201, response.text
    child: dict[str, object] = response.json()
    return child


async def test_fork_at_head_shares_history_and_continues_seq(client: httpx.AsyncClient) -> None:
    parent = await new_session(
        client, title="root", metadata={"k": "v"}, config={"model": "openai:gpt-4o"}
    )
    await append_texts(client, parent["id"], "a", "b", "c")
    child = await fork(client, parent["id"])
    assert (child["parent_id"], child["fork_seq"], child["rev"]) == (parent["id"], 3, 3)
    assert (child["title"], child["metadata"], child["config"]) == (
        "root",
        {"k": "v"},
        {"model": "openai:gpt-4o"},
    )
    assert await append_texts(client, str(child["id"]), "d") == [4]
    assert texts(await history(client, str(child["id"]))) == ["a", "b", "c", "d"]
    assert [e["seq"] for e in await history(client, str(child["id"]))] == [1, 2, 3, 4]


async def test_fork_copies_no_entries(client: httpx.AsyncClient, engine: AsyncEngine) -> None:
    parent = await new_session(client)
    await append_texts(client, parent["id"], *[f"m{i}" for i in range(30)])
    child = await fork(client, parent["id"])
    async with engine.connect() as conn:
        stored = await conn.scalar(
            text("SELECT count(*) FROM entries WHERE session_id = :sid"), {"sid": child["id"]}
        )
    assert stored == 0
    assert len(await history(client, str(child["id"]))) == 30


async def test_fork_at_earlier_seq(client: httpx.AsyncClient) -> None:
    parent = await new_session(client)
    await append_texts(client, parent["id"], "a", "b", "c", "d")
    child = await fork(client, parent["id"], at_seq=2, title="what if")
    assert (child["fork_seq"], child["rev"], child["title"]) == (2, 2, "what if")
    assert texts(await history(client, str(child["id"]))) == ["a", "b"]
    assert await append_texts(client, str(child["id"]), "x") == [3]
    assert texts(await history(client, str(child["id"]))) == ["a", "b", "x"]
    assert texts(await history(client, parent["id"])) == ["a", "b", "c", "d"]


async def test_fork_at_zero_and_beyond_rev(client: httpx.AsyncClient) -> None:
    parent = await new_session(client)
    await append_texts(client, parent["id"], "a")
    empty = await fork(client, parent["id"], at_seq=0)
    assert await history(client, str(empty["id"])) == []
    assert await append_texts(client, str(empty["id"]), "fresh") == [1]
    beyond = await client.post(f"/v1/sessions/{parent['id']}/fork", json={"at_seq": 2})
    assert beyond.status_code == 422
    assert beyond.json()["error"]["details"] == {"at_seq": 2, "rev": 1}


async def test_appends_after_fork_stay_separate(client: httpx.AsyncClient) -> None:
    parent = await new_session(client)
    await append_texts(client, parent["id"], "shared")
    child = await fork(client, parent["id"])
    await append_texts(client, parent["id"], "parent only")
    await append_texts(client, str(child["id"]), "child only")
    assert texts(await history(client, parent["id"])) == ["shared", "parent only"]
    assert texts(await history(client, str(child["id"]))) == ["shared", "child only"]
    # both continue at seq 2, independently
    assert [e["seq"] for e in await history(client, str(child["id"]))] == [1, 2]


async def test_fork_of_fork(client: httpx.AsyncClient) -> None:
    a = await new_session(client)
    await append_texts(client, a["id"], "a1", "a2", "a3")
    b = await fork(client, a["id"], at_seq=2)
    await append_texts(client, str(b["id"]), "b3", "b4")
    c = await fork(client, str(b["id"]), at_seq=3)
    await append_texts(client, str(c["id"]), "c4")
    d = await fork(client, str(c["id"]), at_seq=1)
    assert texts(await history(client, str(c["id"]))) == ["a1", "a2", "b3", "c4"]
    assert texts(await history(client, str(d["id"]))) == ["a1"]
    assert texts(await history(client, str(b["id"]))) == ["a1", "a2", "b3", "b4"]


async def test_history_pages_across_lineage(client: httpx.AsyncClient) -> None:
    a = await new_session(client)
    await append_texts(client, a["id"], *[f"a{i}" for i in range(1, 6)])
    b = await fork(client, a["id"], at_seq=3)
    await append_texts(client, str(b["id"]), *[f"b{i}" for i in range(4, 9)])
    bid = str(b["id"])
    page = (
        await client.get(f"/v1/sessions/{bid}/entries", params={"order": "desc", "limit": 3})
    ).json()
    assert [e["seq"] for e in page["data"]] == [8, 7, 6] and page["has_more"]
    window = await client.get(
        f"/v1/sessions/{bid}/entries", params={"after_seq": 2, "before_seq": 6, "limit": 10}
    )
    assert texts(window.json()["data"]) == ["a3", "b4", "b5"]
    desc = await client.get(
        f"/v1/sessions/{bid}/entries", params={"before_seq": 5, "order": "desc", "limit": 2}
    )
    assert [e["seq"] for e in desc.json()["data"]] == [4, 3]


async def test_deleting_parent_keeps_every_descendant_whole(client: httpx.AsyncClient) -> None:
    a = await new_session(client)
    await append_texts(client, a["id"], "a1", "a2")
    p = await fork(client, a["id"])
    await append_texts(client, str(p["id"]), "p3", "p4", "p5")
    c = await fork(client, str(p["id"]), at_seq=4)
    await append_texts(client, str(c["id"]), "c5")
    g = await fork(client, str(c["id"]))  # grandchild reads a, p and c
    await append_texts(client, str(g["id"]), "g6")
    early = await fork(client, str(p["id"]), at_seq=1)  # reads only a's range
    before = {str(s["id"]): await history(client, str(s["id"])) for s in (a, c, g, early)}

    assert (await client.delete(f"/v1/sessions/{p['id']}")).status_code == 204
    assert (await client.get(f"/v1/sessions/{p['id']}")).status_code == 404
    for sid, entries in before.items():
        assert await history(client, sid) == entries  # seqs, ids, payloads, timestamps
    assert (await client.get(f"/v1/sessions/{c['id']}")).json()["parent_id"] is None

    # Delete the root too: the remaining chain still reads whole, and still grows.
    assert (await client.delete(f"/v1/sessions/{a['id']}")).status_code == 204
    for sid, entries in before.items():
        if sid != a["id"]:
            assert await history(client, sid) == entries
    assert await append_texts(client, str(g["id"]), "g7") == [7]
    assert texts(await history(client, str(g["id"]))) == ["a1", "a2", "p3", "p4", "c5", "g6", "g7"]


async def test_idempotent_ids_are_checked_across_lineage(client: httpx.AsyncClient) -> None:
    parent = await new_session(client)
    await append(client, parent["id"], message("hi", entry_id="shared-1"))
    child = await fork(client, parent["id"])
    retry = await append(client, str(child["id"]), message("hi", entry_id="shared-1"))
    assert retry.status_code == 200 and retry.json()["entries"][0]["seq"] == 1
    assert len(await history(client, str(child["id"]))) == 1


async def test_concurrent_forks_and_deletes_never_orphan_a_child(client: httpx.AsyncClient) -> None:
    root = await new_session(client)
    await append_texts(client, root["id"], "r1", "r2")
    middle = await fork(client, root["id"])
    await append_texts(client, str(middle["id"]), "m3")

    async def fork_middle() -> httpx.Response:
        return await client.post(f"/v1/sessions/{middle['id']}/fork", json={})

    results = await asyncio.gather(
        *(fork_middle() for _ in range(10)), client.delete(f"/v1/sessions/{root['id']}")
    )
    children = [r.json() for r in results[:-1] if r.status_code == 201]
    assert results[-1].status_code == 204
    assert children, "forks that ran before or after the delete must succeed"
    for child in children:
        assert texts(await history(client, child["id"])) == ["r1", "r2", "m3"]

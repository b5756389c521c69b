"""History search: ranked excerpts over the whole thread, across fork lineage."""

from __future__ import annotations

import httpx
import pytest

from testkit.api import append, append_texts, message, new_session


async def search(
    client: httpx.AsyncClient, sid: str, q: str, **params: str | int
) -> list[dict[str, object]]:
    response = await client.get(f"/v1/sessions/{sid}/search", params={"q": q, **params})
    assert response.status_code == 200, response.text
    hits: list[dict[str, object]] = response.json()["data"]
    return hits


# The fuzzer found it: an empty thread built `or_()` with no clause, which SQLAlchemy deprecates.
@pytest.mark.filterwarnings("error::sqlalchemy.exc.SADeprecationWarning")
async def test_a_new_session_searches_to_nothing(client: httpx.AsyncClient) -> None:
    sid = (await new_session(client))["id"]
    assert await search(client, sid, "anything") == []


async def test_finds_facts_anywhere_in_the_thread(client: httpx.AsyncClient) -> None:
    sid = (await new_session(client))["id"]
    await append_texts(client, sid, "My cat is called Whiskers.", "Nice weather today.")
    tool = {
        "kind": "tool_call",
        "payload": {"name": "weather", "arguments": {"city": "Trondheim"}},
        "refs": {"tool_call_id": "t1"},
    }
    await append(client, sid, tool, message("The forecast says snow", role="assistant"))
    hits = await search(client, sid, "whiskers")
    assert [h["seq"] for h in hits] == [1]
    assert "<b>Whiskers</b>" in str(hits[0]["excerpt"])
    assert [h["seq"] for h in await search(client, sid, "Trondheim")] == [3]
    assert [h["kind"] for h in await search(client, sid, "trondheim", kinds="message")] == []
    assert await search(client, sid, "penguins") == []
    assert (await client.get(f"/v1/sessions/{sid}/search", params={"q": ""})).status_code == 422


async def test_a_fork_searches_its_parents_prefix_only(client: httpx.AsyncClient) -> None:
    parent = (await new_session(client))["id"]
    await append_texts(client, parent, "The vault code is 4321.")
    fork = (await client.post(f"/v1/sessions/{parent}/fork", json={})).json()["id"]
    await append_texts(client, parent, "The backup vault is in Bergen.")
    await append_texts(client, fork, "We moved the vault to Tromsø.")
    fork_hits = {h["seq"] for h in await search(client, fork, "vault")}
    parent_hits = {h["seq"] for h in await search(client, parent, "vault")}
    assert fork_hits == {1, 2} and parent_hits == {1, 2}
    assert [h["seq"] for h in await search(client, fork, "Bergen")] == []
    assert [h["seq"] for h in await search(client, parent, "Tromsø")] == []

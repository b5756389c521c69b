"""Persistent memory over HTTP: CRUD, ETag preconditions under races, find/replace, limits,
tenant isolation (DESIGN invariant 9), and memory in the prompt of a real ask."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app.core.memory import MAX_MEMORY_BYTES, MEMORY_LINES
from testkit.api import new_session
from testkit.sse_client import collect
from testkit.upstream import FakeUpstream, Text, ToolCall
from tests.conftest import ClientFactory


async def put(
    client: httpx.AsyncClient, namespace: str, content: str, **headers: str
) -> httpx.Response:
    return await client.put(
        f"/v1/memory/{namespace}", json={"content": content}, headers=_headers(headers)
    )


async def patch(
    client: httpx.AsyncClient, namespace: str, old: str, new: str, **rest: Any
) -> httpx.Response:
    headers = _headers({k: v for k, v in rest.items() if k.startswith("if_")})
    body = {"old_string": old, "new_string": new}
    body |= {k: v for k, v in rest.items() if not k.startswith("if_")}
    return await client.patch(f"/v1/memory/{namespace}", json=body, headers=headers)


def _headers(given: dict[str, str]) -> dict[str, str]:
    return {k.replace("_", "-").title(): v for k, v in given.items()}


def error(response: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = response.json()["error"]
    return body


ETAG = re.compile(r'"v([1-9][0-9]*)-([0-9a-z]+)"')


def etag(response: httpx.Response, version: int | None = None) -> str:
    """The response's ETag header, checked against its body's `etag` (and `version`) and, when
    given, against the version it should carry."""
    tag = response.headers["etag"]
    match = ETAG.fullmatch(tag)
    assert match is not None, tag
    assert response.json()["etag"] == tag
    assert int(match[1]) == response.json()["version"]
    if version is not None:
        assert int(match[1]) == version, tag
    return tag


def generation(tag: str) -> str:
    """The incarnation part of an ETag: the same for every version of one memory."""
    match = ETAG.fullmatch(tag)
    assert match is not None, tag
    return match[2]


def at_version(tag: str, version: int) -> str:
    """The ETag this memory's incarnation would have at another version (a stale one)."""
    return f'"v{version}-{generation(tag)}"'


async def test_create_read_replace_list_delete(client: httpx.AsyncClient) -> None:
    created = await put(client, "agent:main", "# Notes\n- likes tea\n")
    assert created.status_code == 201, created.text
    first = etag(created, 1)
    body = created.json()
    assert (body["namespace"], body["version"], body["etag"]) == ("agent:main", 1, first)
    assert (body["lines"], body["bytes"]) == (2, len(b"# Notes\n- likes tea\n"))

    read = await client.get("/v1/memory/agent:main")
    assert read.status_code == 200 and etag(read) == first
    assert read.json()["content"] == "# Notes\n- likes tea\n"

    replaced = await put(client, "agent:main", "- likes coffee")
    assert replaced.status_code == 200 and etag(replaced, 2) == at_version(first, 2)
    assert replaced.json()["created_at"] == body["created_at"]
    assert replaced.json()["updated_at"] >= body["updated_at"]

    listed = (await client.get("/v1/memory")).json()
    assert listed["has_more"] is False
    assert [(m["namespace"], m["version"], m["etag"], m["lines"]) for m in listed["data"]] == [
        ("agent:main", 2, replaced.headers["etag"], 1)
    ]

    assert (await client.delete("/v1/memory/agent:main")).status_code == 204
    missing = await client.get("/v1/memory/agent:main")
    assert missing.status_code == 404 and error(missing)["code"] == "memory_not_found"
    assert (await client.delete("/v1/memory/agent:main")).status_code == 404
    assert (await client.get("/v1/memory")).json()["data"] == []
    # A new memory under the same name starts over at version 1, under a new ETag.
    again = await put(client, "agent:main", "again")
    assert again.status_code == 201 and etag(again, 1) != first


async def test_if_match_guards_every_write(client: httpx.AsyncClient) -> None:
    v1 = etag(await put(client, "n", "alpha beta"), 1)
    stale = await put(client, "n", "lost", if_match=at_version(v1, 0))
    assert stale.status_code == 412
    assert error(stale)["code"] == "precondition_failed"
    assert error(stale)["details"] == {"namespace": "n", "etag": v1, "version": 1}
    second = await put(client, "n", "second", if_match=v1)
    v2 = etag(second, 2)
    assert v2 == at_version(v1, 2)
    # Strong comparison: a weak tag never matches; a list matches any of its tags.
    assert (await put(client, "n", "x", if_match=f"W/{v2}")).status_code == 412
    third = await put(client, "n", "third", if_match=f"{at_version(v1, 9)}, {v2}")
    assert third.status_code == 200
    v3 = etag(third, 3)
    v4 = etag(await put(client, "n", "fourth", if_match="*"), 4)

    assert (await patch(client, "n", "fourth", "5th", if_match=v3)).status_code == 412
    assert (await client.delete("/v1/memory/n", headers={"If-Match": v3})).status_code == 412
    assert (await client.get("/v1/memory/n")).json()["content"] == "fourth"  # all refused
    ok = await patch(client, "n", "fourth", "5th", if_match=v4)
    assert ok.status_code == 200 and ok.json()["content"] == "5th"
    v5 = etag(ok, 5)
    assert (await client.delete("/v1/memory/n", headers={"If-Match": v5})).status_code == 204

    # If-Match on a memory that does not exist fails (it matches no current version)...
    absent = await put(client, "n", "x", if_match="*")
    assert absent.status_code == 412 and error(absent)["details"]["etag"] is None
    # ...but a PATCH or DELETE of nothing is simply not found.
    assert (await patch(client, "n", "a", "b", if_match=v1)).status_code == 404
    assert (await client.delete("/v1/memory/n", headers={"If-Match": "*"})).status_code == 404


async def test_if_none_match_star_creates_only(client: httpx.AsyncClient) -> None:
    first = await put(client, "fresh", "one", if_none_match="*")
    assert first.status_code == 201
    again = await put(client, "fresh", "two", if_none_match="*")
    assert again.status_code == 412 and error(again)["details"]["etag"] == etag(first, 1)
    assert (await client.get("/v1/memory/fresh")).json()["content"] == "one"


async def test_concurrent_patches_with_one_etag_exactly_one_wins(
    client: httpx.AsyncClient,
) -> None:
    v1 = etag(await put(client, "race", "counter: X"), 1)
    responses = await asyncio.gather(
        *(patch(client, "race", "X", "XY", if_match=v1) for _ in range(12))
    )
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] + [412] * 11, [r.text for r in responses]
    read = await client.get("/v1/memory/race")
    v2 = etag(read, 2)
    assert all(error(r)["details"]["etag"] == v2 for r in responses if r.status_code == 412)
    final = read.json()
    assert (final["content"], final["version"]) == ("counter: XY", 2)  # one replacement


async def test_concurrent_unconditional_writes_lose_no_update(client: httpx.AsyncClient) -> None:
    await put(client, "log", "end")
    responses = await asyncio.gather(*(patch(client, "log", "end", "+end") for _ in range(10)))
    assert [r.status_code for r in responses] == [200] * 10
    final = (await client.get("/v1/memory/log")).json()
    assert (final["content"], final["version"]) == ("+" * 10 + "end", 11)
    # Racing first writes: the unconditional ones all land (an upsert), create-only ones once.
    creates = await asyncio.gather(*(put(client, "new", f"{i}") for i in range(8)))
    assert sorted(r.status_code for r in creates) == [200] * 7 + [201]
    assert (await client.get("/v1/memory/new")).json()["version"] == 8
    only = await asyncio.gather(*(put(client, "once", f"{i}", if_none_match="*") for i in range(8)))
    assert sorted(r.status_code for r in only) == [201] + [412] * 7


async def test_patch_is_find_and_replace(client: httpx.AsyncClient) -> None:
    v1 = etag(await put(client, "p", "- a: 1\n- b: 1\n- c: 2\n"), 1)
    missing = await patch(client, "p", "- d:", "- e:")
    assert missing.status_code == 422 and error(missing)["code"] == "no_match"
    ambiguous = await patch(client, "p", ": 1", ": 3")
    assert ambiguous.status_code == 422 and error(ambiguous)["code"] == "ambiguous_match"
    assert error(ambiguous)["details"]["count"] == 2
    assert (await client.get("/v1/memory/p")).json()["version"] == 1  # nothing written

    one = await patch(client, "p", "- c: 2", "- c: 20")
    assert one.status_code == 200 and etag(one, 2) == at_version(v1, 2)
    assert one.json()["content"] == "- a: 1\n- b: 1\n- c: 20\n"
    every = await patch(client, "p", ": 1\n", ": 9\n", replace_all=True)
    assert every.json()["content"] == "- a: 9\n- b: 9\n- c: 20\n"
    deleted = await patch(client, "p", "- b: 9\n", "")
    assert deleted.json()["content"] == "- a: 9\n- c: 20\n"
    empty = await patch(client, "p", "", "x")
    assert empty.status_code == 422 and error(empty)["code"] == "validation_error"
    nowhere = await patch(client, "nowhere", "a", "b")
    assert nowhere.status_code == 404 and error(nowhere)["code"] == "memory_not_found"


async def test_a_recreated_memory_never_matches_an_old_etag(client: httpx.AsyncClient) -> None:
    # Versions restart at 1 when a memory is deleted and created again; its ETag does not:
    # a client still holding the earlier memory's ETag must not overwrite the later one.
    assert (await put(client, "reborn", "first life")).status_code == 201
    old = etag(await client.get("/v1/memory/reborn"), 1)
    assert (await client.delete("/v1/memory/reborn")).status_code == 204
    recreated = await put(client, "reborn", "second life")
    assert recreated.status_code == 201 and recreated.json()["version"] == 1
    new = etag(recreated, 1)
    assert new != old and generation(new) != generation(old)
    assert etag(await client.get("/v1/memory/reborn")) == new
    listed = (await client.get("/v1/memory", params={"prefix": "reborn"})).json()["data"]
    assert [(m["version"], m["etag"]) for m in listed] == [(1, new)]

    # The old ETag matches nothing: every conditional write with it is refused...
    refused = [
        await patch(client, "reborn", "second", "third", if_match=old),
        await put(client, "reborn", "overwritten", if_match=old),
        await client.delete("/v1/memory/reborn", headers={"If-Match": old}),
    ]
    for response in refused:
        assert response.status_code == 412, response.text
        assert error(response)["code"] == "precondition_failed"
        assert error(response)["details"] == {"namespace": "reborn", "etag": new, "version": 1}
    assert (await client.get("/v1/memory/reborn")).json()["content"] == "second life"

    # ...while the new one's ETag (then each response's) succeeds.
    patched = await patch(client, "reborn", "second", "third", if_match=new)
    assert patched.status_code == 200 and patched.json()["content"] == "third life"
    assert etag(patched, 2) == at_version(new, 2)  # one incarnation, one generation
    # As If-None-Match, the old ETag stops nothing either: the new memory is none of it.
    replaced = await put(client, "reborn", "fourth life", if_match=etag(patched), if_none_match=old)
    assert replaced.status_code == 200 and etag(replaced, 3) == at_version(new, 3)
    deleted = await client.delete("/v1/memory/reborn", headers={"If-Match": etag(replaced)})
    assert deleted.status_code == 204
    assert (await client.get("/v1/memory/reborn")).status_code == 404


@pytest.mark.parametrize(
    "namespace", ["bad%20name", ".hidden", "..", "a" * 129, "caf%C3%A9", "a%2Fb", "star*"]
)
async def test_bad_namespaces_are_422(client: httpx.AsyncClient, namespace: str) -> None:
    for response in (
        await client.get(f"/v1/memory/{namespace}"),
        await client.put(f"/v1/memory/{namespace}", json={"content": "x"}),
    ):
        assert response.status_code in (404, 422), response.text
        if namespace not in ("..", "a%2Fb"):  # clients resolve these to other paths
            assert response.status_code == 422 and error(response)["code"] == "validation_error"


async def test_good_namespaces(client: httpx.AsyncClient) -> None:
    for namespace in ("a", "user:42", "agent.support-v2_x", "A" * 128, "x..y", "-:_"):
        assert (await put(client, namespace, "ok")).status_code == 201, namespace
        assert (await client.get(f"/v1/memory/{namespace}")).json()["namespace"] == namespace


async def test_content_limit_is_256_kib_of_utf8(client: httpx.AsyncClient) -> None:
    assert (await put(client, "big", "x" * MAX_MEMORY_BYTES)).status_code == 201
    over = await put(client, "big", "x" * (MAX_MEMORY_BYTES + 1))
    assert over.status_code == 422 and error(over)["code"] == "memory_too_large"
    assert error(over)["details"] == {
        "limit_bytes": MAX_MEMORY_BYTES,
        "bytes": MAX_MEMORY_BYTES + 1,
    }
    # Bytes, not characters: half as many two-byte characters plus one is over.
    wide = await put(client, "wide", "é" * (MAX_MEMORY_BYTES // 2 + 1))
    assert wide.status_code == 422 and error(wide)["details"]["bytes"] == MAX_MEMORY_BYTES + 2
    # A find/replace that would outgrow the limit is refused too, and writes nothing.
    grown = await patch(client, "big", "x", "yy")
    assert grown.status_code == 422 and error(grown)["code"] == "ambiguous_match"
    grown = await patch(client, "big", "x", "yy", replace_all=True)
    assert grown.status_code == 422 and error(grown)["code"] == "memory_too_large"
    assert (await client.get("/v1/memory/big")).json()["version"] == 1
    # Refused from the sizes alone, before the text is built: replacing each of the 256 Ki
    # characters by a long string would make hundreds of gigabytes.
    huge = "y" * 1_000_000
    grown = await patch(client, "big", "x", huge, replace_all=True)
    assert grown.status_code == 422 and error(grown)["code"] == "memory_too_large", grown.text
    assert error(grown)["details"] == {
        "limit_bytes": MAX_MEMORY_BYTES,
        "bytes": MAX_MEMORY_BYTES * len(huge),
    }
    assert (await client.get("/v1/memory/big")).json()["version"] == 1
    nul = await put(client, "nul", "a\x00b")
    assert nul.status_code == 422


async def test_list_pages_prefix_and_sizes(client: httpx.AsyncClient) -> None:
    contents = {
        "user:1": "one\ntwo\n",
        "user:2": "één\ntwee",
        "user_3": "",
        "agent:a": "\n\n",
        "userx": "x",
    }
    for namespace, content in contents.items():
        assert (await put(client, namespace, content)).status_code == 201
    seen: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = (await client.get("/v1/memory", params=params)).json()
        seen += page["data"]
        if not page["has_more"]:
            break
        cursor = page["next_cursor"]
    assert [m["namespace"] for m in seen] == sorted(contents)  # byte order
    for summary in seen:
        full = (await client.get(f"/v1/memory/{summary['namespace']}")).json()
        assert (summary["bytes"], summary["lines"]) == (full["bytes"], full["lines"])
        assert full["bytes"] == len(contents[summary["namespace"]].encode())
    assert {m["namespace"]: m["lines"] for m in seen} == {
        "agent:a": 2,
        "user:1": 2,
        "user:2": 2,
        "user_3": 0,
        "userx": 1,
    }
    # The prefix is literal: "_" is no wildcard.
    prefixed = (await client.get("/v1/memory", params={"prefix": "user:"})).json()["data"]
    assert [m["namespace"] for m in prefixed] == ["user:1", "user:2"]
    underscored = (await client.get("/v1/memory", params={"prefix": "user_"})).json()["data"]
    assert [m["namespace"] for m in underscored] == ["user_3"]


async def test_session_config_names_a_namespace(client: httpx.AsyncClient) -> None:
    session = await new_session(client, config={"memory_namespace": "agent:main"})
    assert session["config"]["memory_namespace"] == "agent:main"
    bad = await client.post("/v1/sessions", json={"config": {"memory_namespace": "no way"}})
    assert bad.status_code == 422
    patched = await client.patch(
        f"/v1/sessions/{session['id']}", json={"config": {"memory_namespace": None}}
    )
    assert "memory_namespace" not in patched.json()["config"]


# Every memory route, with a body that would succeed for its owner.
MEMORY_ROUTES: dict[tuple[str, str], dict[str, Any] | None] = {
    ("GET", "/v1/memory/{namespace}"): None,
    ("PUT", "/v1/memory/{namespace}"): {"content": "stolen"},
    ("PATCH", "/v1/memory/{namespace}"): {"old_string": "secret", "new_string": "stolen"},
    ("DELETE", "/v1/memory/{namespace}"): None,
}


def test_every_memory_route_is_covered(app: FastAPI) -> None:
    routes = {
        (method.upper(), path)
        for path, operations in app.openapi()["paths"].items()
        if path.startswith("/v1/memory/")
        for method in operations
    }
    assert routes == set(MEMORY_ROUTES), "add new memory routes to MEMORY_ROUTES"


async def test_tenants_never_see_each_others_memory(
    make_client: ClientFactory, new_key: Callable[[], Awaitable[str]]
) -> None:
    owner, other = make_client(await new_key()), make_client(await new_key())
    await put(owner, "shared-name", "owner's secret")
    await put(owner, "owner-only", "secret")
    for (method, path), body in MEMORY_ROUTES.items():
        if method == "PUT":
            continue  # a PUT creates the other tenant's own memory: checked below
        url = path.format(namespace="owner-only")
        response = await other.request(method, url, json=body)
        assert response.status_code == 404, (method, path, response.text)
        assert error(response)["code"] == "memory_not_found"
    # The same name is a separate memory per tenant.
    theirs = await put(other, "shared-name", "other's notes", if_none_match="*")
    assert theirs.status_code == 201 and theirs.json()["version"] == 1
    assert (await owner.get("/v1/memory/shared-name")).json()["content"] == "owner's secret"
    assert (await other.get("/v1/memory/shared-name")).json()["content"] == "other's notes"
    assert [m["namespace"] for m in (await other.get("/v1/memory")).json()["data"]] == [
        "shared-name"
    ]
    owned = {m["namespace"] for m in (await owner.get("/v1/memory")).json()["data"]}
    assert owned == {"shared-name", "owner-only"}
    assert (await owner.get("/v1/memory/owner-only")).json()["version"] == 1  # untouched


async def test_context_counts_the_memory(client: httpx.AsyncClient) -> None:
    session = await new_session(
        client, config={"system_prompt": "Be brief.", "memory_namespace": "ctx"}
    )
    before = (await client.get(f"/v1/sessions/{session['id']}/context")).json()
    assert before["breakdown"]["memory"] == 0  # nothing remembered yet
    await put(client, "ctx", "The user's name is Ada.\n" * 10)
    after = (await client.get(f"/v1/sessions/{session['id']}/context")).json()
    assert after["breakdown"]["memory"] > 0
    assert after["breakdown"]["system"] == before["breakdown"]["system"]
    tools = after["breakdown"]["tools"]
    assert tools > 0  # the memory tools are offered
    assert after["tokens"] > before["tokens"]


async def test_an_ask_sends_the_memory_in_its_system_message(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    notes = "".join(f"fact {i}\n" for i in range(MEMORY_LINES + 5))
    assert (await put(api, "user:ada", notes)).status_code == 201
    sid = (
        await new_session(
            api, config={"system_prompt": "Be brief.", "memory_namespace": "user:ada"}
        )
    )["id"]
    upstream.script(Text("Hi Ada"))
    events = await collect(api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "hello"})
    assert events[-1].type == "run.completed"
    first = upstream.requests[-1].body
    system = first["messages"][0]
    assert system["role"] == "system" and system["content"].startswith("Be brief.\n\n# Memory")
    assert f"fact {MEMORY_LINES - 1}\n" in system["content"]
    assert f"fact {MEMORY_LINES}\n" not in system["content"]  # the first 200 lines only
    offered = {t["function"]["name"] for t in first["tools"]}
    assert {"read_memory", "write_memory", "update_memory"} <= offered

    # The next ask sends the same system bytes: the prompt prefix stays cacheable.
    upstream.script(Text("Still here"))
    await collect(api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "again"})
    assert upstream.requests[-1].body["messages"][0] == system


async def test_the_model_remembers_across_sessions(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    config = {"memory_namespace": "agent:e2e"}
    first = (await new_session(api, config=config))["id"]
    upstream.script(ToolCall("m1", "write_memory", '{"content": "- prefers metric units\\n"}'))
    upstream.script(Text("Noted."))
    events = await collect(
        api, "POST", f"/v1/sessions/{first}/ask", json={"input": "I prefer metric."}
    )
    assert events[-1].type == "run.completed"
    result = next(e for e in events if e.type == "tool_result")
    assert not result.data["is_error"], result.data
    # Within the run, the model's next turn already sees what it wrote.
    assert "- prefers metric units" in upstream.requests[-1].body["messages"][0]["content"]

    second = (await new_session(api, config=config))["id"]
    upstream.script(Text("In kilometres."))
    await collect(api, "POST", f"/v1/sessions/{second}/ask", json={"input": "How far?"})
    system = upstream.requests[-1].body["messages"][0]
    memory = "# Memory (agent:e2e)\n```\n- prefers metric units\n```"
    assert system == {"role": "system", "content": memory}
    stored = (await api.get("/v1/memory/agent:e2e")).json()
    assert (stored["content"], stored["version"]) == ("- prefers metric units\n", 1)

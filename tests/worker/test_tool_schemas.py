"""Built-in tools reach the model with their whole schema, on either provider's wire, however
briefly a session declares them."""

from __future__ import annotations

import httpx
import pytest

from app.core.builtin_tools import BUILTIN_TOOLS
from app.tools.registry import BUILTINS
from testkit.api import new_session
from testkit.sse_client import collect
from testkit.upstream import FakeUpstream, Text


def test_every_shipped_builtin_has_a_definition_and_every_definition_runs() -> None:
    shipped = {name for name, function in BUILTINS.items() if function.__module__.startswith("app")}
    assert shipped == set(BUILTIN_TOOLS)
    for definition in BUILTIN_TOOLS.values():
        assert definition["description"] and definition["parameters"]["type"] == "object"


@pytest.mark.parametrize("model", ["openai:gpt-4o-mini", "anthropic:claude-haiku-4-5"])
async def test_builtins_declared_by_name_are_offered_with_their_full_schema(
    api: httpx.AsyncClient, upstream: FakeUpstream, model: str
) -> None:
    # By name only: what a client writes when it trusts the service to know its own tools.
    # The memory built-ins come with the namespace; read_tool_output is declared like the rest.
    declared = [
        {"name": name, "kind": "builtin"} for name in BUILTIN_TOOLS if not name.endswith("memory")
    ]
    config = {"model": model, "tools": declared, "memory_namespace": "notes.schemas"}
    sid = (await new_session(api, config=config))["id"]
    upstream.script(Text("ok"))
    events = await collect(api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "hi"})
    assert events[-1].type == "run.completed"
    body = upstream.requests[-1].body
    if model.startswith("anthropic"):
        sent = {t["name"]: (t["description"], t["input_schema"]) for t in body["tools"]}
    else:
        functions = [t["function"] for t in body["tools"]]
        sent = {f["name"]: (f["description"], f["parameters"]) for f in functions}
    assert sent == {
        name: (definition["description"], definition["parameters"])
        for name, definition in BUILTIN_TOOLS.items()
    }
    assert sent["calculator"][1]["required"] == ["expression"]
    assert set(sent["search_history"][1]["properties"]) == {"query", "limit"}


async def test_a_declared_description_is_kept_but_never_a_declared_schema(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    tool = {
        "name": "calculator",
        "kind": "builtin",
        "description": "Do sums.",
        "parameters": {"type": "object", "properties": {"formula": {"type": "string"}}},
    }
    sid = (await new_session(api))["id"]
    upstream.script(Text("ok"))
    body = {"input": "hi", "tools": [tool]}
    assert (await collect(api, "POST", f"/v1/sessions/{sid}/ask", json=body))[-1].type == (
        "run.completed"
    )
    [sent] = [t["function"] for t in upstream.requests[-1].body["tools"]]
    assert sent["description"] == "Do sums."
    assert sent["parameters"] == BUILTIN_TOOLS["calculator"]["parameters"]

"""Compaction over a real uvicorn with the real SDKs: the /compact job (focus, incremental, forks,
failures) and a run compacting its own full context (auto, and its fallback to windowing)."""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.entries import EntryKind
from app.core.projection import SUMMARY_CUT_MARK
from app.core.tool_loop import thread_call_id
from app.db.tables import sessions
from app.services.journal import NewEntry, append_entries
from testkit.api import history, new_session
from testkit.long_session import is_summarization
from testkit.sse_client import collect
from testkit.upstream import (
    Fail,
    FakeUpstream,
    Hold,
    ReceivedRequest,
    Responder,
    Script,
    Stall,
    Text,
    ToolCall,
    Usage,
)


async def ask(api: httpx.AsyncClient, sid: str, text: str, **body: Any) -> dict[str, Any]:
    events = await collect(api, "POST", f"/v1/sessions/{sid}/ask", json={"input": text, **body})
    assert events[-1].type == "run.completed", events[-1]
    return events[-1].data


async def converse(
    api: httpx.AsyncClient, upstream: FakeUpstream, sid: str, turns: int, first: int = 0
) -> None:
    for i in range(first, first + turns):
        upstream.script(Text(f"answer {i}"))
        await ask(api, sid, f"question {i} about the billing API")


async def compact(api: httpx.AsyncClient, sid: str, **body: Any) -> dict[str, Any]:
    response = await api.post(f"/v1/sessions/{sid}/compact", json=body)
    assert response.status_code == 202, response.text
    run: dict[str, Any] = response.json()
    assert run["kind"] == "compaction"
    waited = await api.get(f"/v1/runs/{run['id']}", params={"wait": "true", "timeout": 20})
    ended: dict[str, Any] = waited.json()
    return ended


def summaries(journal: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in journal if e["kind"] == "summary"]


def user_text(request_body: dict[str, Any]) -> str:
    return str(request_body["messages"][-1]["content"])


async def test_compaction_with_focus_appends_a_checkpoint(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config={"system_prompt": "Be brief."}))["id"]
    await converse(api, upstream, sid, 4)
    before = await history(api, sid)
    upstream.script(Text("The user asked four billing questions."), Usage(300, 9))
    run = await compact(api, sid, focus="API changes", keep_last_turns=1)
    assert run["status"] == "completed", run
    assert run["result"] == "The user asked four billing questions."
    assert run["usage"]["input_tokens"] == 300

    sent = upstream.requests[-1].body
    assert sent["messages"][0]["role"] == "system"
    prompt = user_text(sent)
    assert "question 0 about the billing API" in prompt and "answer 2" in prompt
    assert "question 3" not in prompt  # the kept turn stays raw
    assert prompt.endswith("IMPORTANT: Focus the summary on: API changes")

    journal = await history(api, sid)
    assert journal[: len(before)] == before  # nothing rewritten
    [summary] = summaries(journal)
    last_answer = next(e["seq"] for e in before if e["payload"].get("content") == "answer 2")
    assert summary["payload"] == {
        "from_seq": 1,
        "to_seq": last_answer,  # the last model-visible entry before the kept turn
        "content": "The user asked four billing questions.",
        "model": "openai:gpt-4o-mini",
        "focus": "API changes",
    }
    assert summary["refs"] == {"run_id": run["id"]}
    kinds = [e["kind"] for e in journal[len(before) :]]
    assert kinds == ["run_start", "summary", "usage", "run_end"]

    projection = (await api.post(f"/v1/sessions/{sid}/projection", json={})).json()
    messages = projection["request"]["messages"]
    assert projection["meta"]["summary_seq"] == summary["seq"]
    assert [m["role"] for m in messages] == ["system", "system", "user", "assistant"]
    assert "The user asked four billing questions." in str(messages[1]["content"])
    assert messages[2]["content"] == "question 3 about the billing API"
    assert projection["meta"]["truncated"] is False

    context = (await api.get(f"/v1/sessions/{sid}/context")).json()
    assert context["summaries"] == 1
    [latest] = context["compactions"]
    assert latest["seq"] == summary["seq"] and latest["focus"] == "API changes"
    assert context["breakdown"]["summary"] > 0
    window = context["context_window"]
    assert context["shares"] == {
        name: round(100 * tokens / window, 2) for name, tokens in context["breakdown"].items()
    }


async def test_compaction_is_incremental(api: httpx.AsyncClient, upstream: FakeUpstream) -> None:
    sid = (await new_session(api))["id"]
    await converse(api, upstream, sid, 3)
    upstream.script(Text("FIRST SUMMARY"))
    first = await compact(api, sid, keep_last_turns=1)
    assert first["status"] == "completed"
    await converse(api, upstream, sid, 3, first=3)
    upstream.script(Text("SECOND SUMMARY"))
    second = await compact(api, sid, keep_last_turns=1)
    assert second["status"] == "completed"
    prompt = user_text(upstream.requests[-1].body)
    assert prompt.startswith("The summary so far:\nFIRST SUMMARY")
    assert "question 0" not in prompt  # already in the first summary
    assert "question 2" in prompt and "question 4" in prompt and "question 5" not in prompt
    old, new = summaries(await history(api, sid))
    assert new["payload"]["from_seq"] == old["payload"]["from_seq"] == 1
    assert new["payload"]["to_seq"] > old["payload"]["to_seq"]
    context = (await api.get(f"/v1/sessions/{sid}/context")).json()
    assert context["summaries"] == 2
    assert [c["seq"] for c in context["compactions"]] == [new["seq"], old["seq"]]


async def test_compaction_of_a_forked_session(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    parent = (await new_session(api))["id"]
    await converse(api, upstream, parent, 3)
    parent_before = await history(api, parent)
    child = (await api.post(f"/v1/sessions/{parent}/fork", json={})).json()["id"]
    await converse(api, upstream, child, 1, first=3)
    upstream.script(Text("CHILD SUMMARY"))
    run = await compact(api, child, keep_last_turns=1)
    assert run["status"] == "completed"
    prompt = user_text(upstream.requests[-1].body)
    assert "question 0" in prompt and "question 2" in prompt  # the parent's entries
    [summary] = summaries(await history(api, child))
    assert summary["payload"]["from_seq"] == 1
    assert await history(api, parent) == parent_before  # the parent is untouched
    upstream.script(Text("next"))
    await ask(api, child, "and now?")
    sent = upstream.requests[-1].body["messages"]
    assert "CHILD SUMMARY" in str(sent[0]["content"])
    assert "question 0" not in str(sent)


async def test_a_failed_summarization_writes_no_summary(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api))["id"]
    await converse(api, upstream, sid, 3)
    upstream.script(Fail(400, "bad_request", "no such model"))
    run = await compact(api, sid, keep_last_turns=1)
    assert run["status"] == "failed"
    assert run["error"]["code"] == "provider_bad_request"
    journal = await history(api, sid)
    assert not summaries(journal)
    assert [e["kind"] for e in journal[-2:]] == ["run_start", "run_end"]
    upstream.script(Text("still fine"))
    assert (await ask(api, sid, "go on"))["text"] == "still fine"


async def test_compaction_streams_its_events(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api))["id"]
    await converse(api, upstream, sid, 3)
    upstream.script(Text("STREAMED"))
    events = await collect(
        api, "POST", f"/v1/sessions/{sid}/compact", json={"keep_last_turns": 2, "stream": True}
    )
    types = [e.type for e in events]
    assert types[0] == "run.created" and types[-1] == "run.completed"
    compacting = next(e.data for e in events if e.type == "context.compacting")
    compacted = next(e.data for e in events if e.type == "context.compacted")
    assert compacting["reason"] == "requested" and compacting["kept_turns"] == 2
    assert compacted["to_seq"] == compacting["to_seq"]
    assert compacted["tokens_after"] < compacted["tokens_before"]
    assert events[-1].data["text"] == "STREAMED"


async def refused_compaction(
    api: httpx.AsyncClient, upstream: FakeUpstream, summary: str
) -> tuple[list[Any], dict[str, Any]]:
    """A /compact whose summarizer answers `summary`: its events, and the failure it ends with."""
    sid = (await new_session(api))["id"]
    await converse(api, upstream, sid, 3)
    before = await history(api, sid)
    upstream.script(Text(summary))
    events = await collect(
        api, "POST", f"/v1/sessions/{sid}/compact", json={"keep_last_turns": 1, "stream": True}
    )
    types = [e.type for e in events]
    assert types[-1] == "run.failed" and "context.compacted" not in types
    failed = next(e.data for e in events if e.type == "context.compaction_failed")
    assert failed["fallback"] == "windowing"
    assert events[-1].data["error"] == failed["error"]
    journal = await history(api, sid)
    assert not summaries(journal)  # nothing committed
    assert [e["kind"] for e in journal[len(before) :]] == ["run_start", "run_end"]
    # The session goes on: the next ask is answered from the whole (windowed) history.
    upstream.script(Text("still fine"))
    assert (await ask(api, sid, "go on"))["text"] == "still fine"
    sent = str(upstream.requests[-1].body["messages"])
    assert "question 0 about the billing API" in sent and summary not in sent
    return events, failed["error"]


async def test_a_summary_longer_than_what_it_replaces_is_refused(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    """A small model's "summary" that grew the context (39 -> 192 tokens) was committed."""
    longer = " ".join(f"The user asked question {i} about the billing API." for i in range(12))
    _, error = await refused_compaction(api, upstream, longer)
    assert error["code"] == "summary_not_shorter"
    found = re.search(r"the summary has (\d+) tokens, no fewer than the (\d+)", error["message"])
    assert found is not None and int(found[1]) >= int(found[2]) > 0


async def test_a_summary_echoing_the_prompt_is_refused(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    """ "Here's the summary with only the requested 40 words:" and role markers were committed."""
    for leaked, said in (
        ("Here's the summary with only the requested 40 words: billing.", "preamble"),
        ("<|im_start|>assistant\nBilling.", "chat marker"),
        ("[#2] assistant: answer 0", "role label"),
        ("Billing questions. Use at most 40 words.", "instructions"),
    ):
        events, error = await refused_compaction(api, upstream, leaked)
        assert error["code"] == "summary_echoes_prompt"
        assert said in error["message"] and "windowing" in error["message"]
        progress = [e.data for e in events if e.type == "context.compaction_progress"]
        assert progress and progress[0] == {"call": 1, "calls": 1, "chars": 0}


async def test_compaction_refusals(api: httpx.AsyncClient, upstream: FakeUpstream) -> None:
    sid = (await new_session(api))["id"]
    await converse(api, upstream, sid, 1)
    nothing = await api.post(f"/v1/sessions/{sid}/compact", json={})
    assert nothing.status_code == 409
    assert nothing.json()["error"]["code"] == "nothing_to_compact"
    bad = await api.post(f"/v1/sessions/{sid}/compact", json={"keep_last_turns": -1})
    assert bad.status_code == 422
    missing = await api.post("/v1/sessions/00000000-0000-0000-0000-000000000000/compact", json={})
    assert missing.status_code == 404
    before = await history(api, sid)
    assert (await api.post(f"/v1/sessions/{sid}/compact", json={"model": "x"})).status_code == 422
    assert await history(api, sid) == before


async def test_a_short_chat_says_plainly_that_there_is_nothing_to_compact(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    """GET /context tells a client (the page, the terminal chat) before it asks, in the words
    the 409 uses: for a person, with the jargon in the details."""
    sid = (await new_session(api))["id"]

    async def context() -> dict[str, Any]:
        return (await api.get(f"/v1/sessions/{sid}/context")).json()  # type: ignore[no-any-return]

    empty = await context()
    assert empty["compactable"] is False and empty["not_compactable_reason"]
    await converse(api, upstream, sid, 2)
    short = await context()
    assert short["compactable"] is False
    reason = short["not_compactable_reason"]
    assert reason == (
        "Nothing to compact yet: the newest 3 turns always stay as written, and nothing "
        "before them is left to summarize."
    )
    refused = await api.post(f"/v1/sessions/{sid}/compact", json={"focus": "billing"})
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["code"] == "nothing_to_compact" and error["message"] == reason
    assert error["details"] == {"keep_last_turns": 3}
    upstream.script(Text("A billing question."))
    # Two turns, one kept: the first is summarized.
    assert (await compact(api, sid, keep_last_turns=1))["status"] == "completed"
    await converse(api, upstream, sid, 2, first=2)
    assert (await context())["not_compactable_reason"] == reason  # 3 turns since the summary
    await converse(api, upstream, sid, 1, first=4)
    longer = await context()
    assert longer["compactable"] is True and longer["not_compactable_reason"] is None
    upstream.script(Text("Billing questions."))
    assert (await compact(api, sid, keep_last_turns=2))["status"] == "completed"
    # After the checkpoint: two raw turns, fewer than the three the policy keeps.
    after = await context()
    assert after["summaries"] == 2 and after["compactable"] is False
    assert after["not_compactable_reason"] == reason


async def test_an_idempotent_compaction_is_queued_once(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api))["id"]
    await converse(api, upstream, sid, 4)  # the default keeps 3 turns
    upstream.script(Text("ONCE"))
    headers = {"Idempotency-Key": "compact-1"}
    first = await api.post(f"/v1/sessions/{sid}/compact", json={}, headers=headers)
    again = await api.post(f"/v1/sessions/{sid}/compact", json={}, headers=headers)
    assert first.status_code == again.status_code == 202
    assert first.json()["id"] == again.json()["id"]
    await api.get(f"/v1/runs/{first.json()['id']}", params={"wait": "true", "timeout": 20})
    assert len(summaries(await history(api, sid))) == 1
    reused = await api.post(
        f"/v1/sessions/{sid}/ask", json={"input": "hi", "stream": False}, headers=headers
    )
    assert reused.status_code == 409
    assert reused.json()["error"]["code"] == "idempotency_key_reused"


AUTO_POLICY = {
    "max_input_tokens": 1200,
    "reserve_output_tokens": 200,
    "summarization": "auto",
    "keep_last_turns": 1,
}


async def test_a_full_context_compacts_before_the_model_call(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config={"context_policy": AUTO_POLICY}))["id"]
    filler = "lorem ipsum dolor sit amet " * 25  # about 120 tokens a message
    for i in range(3):
        upstream.script(Text(f"noted {i}"))
        await ask(api, sid, f"fact {i}: {filler}")
    upstream.script(Text("AUTO SUMMARY"), Usage(500, 5))
    upstream.script(Text("answer after compaction"), Usage(100, 4))
    events = await collect(
        api, "POST", f"/v1/sessions/{sid}/ask", json={"input": f"fact 3: {filler} " * 6}
    )
    types = [e.type for e in events]
    assert types[-1] == "run.completed"
    warning = next(e.data for e in events if e.type == "context.warning")
    assert warning["level"] == "at_limit" and warning["history_dropped"]
    assert types.index("context.warning") < types.index("context.compacting")
    assert types.index("context.compacting") < types.index("context.compacted")
    assert types.index("context.compacted") < types.index("message.delta")
    compacted = next(e.data for e in events if e.type == "context.compacted")
    assert compacted["tokens_after"] < compacted["tokens_before"]
    summary_request, answer_request = upstream.requests[-2:]
    assert "fact 0" in user_text(summary_request.body)
    assert "fact 3" not in user_text(summary_request.body)  # the run's own turn stays raw
    sent = answer_request.body["messages"]
    assert "AUTO SUMMARY" in str(sent[0]["content"])
    assert sent[-1]["content"].startswith("fact 3")
    # The summarizer's tokens are part of the run's usage.
    assert events[-1].data["usage"]["input_tokens"] == 600
    [summary] = summaries(await history(api, sid))
    assert summary["refs"]["run_id"] == events[0].data["run_id"]


async def test_a_failed_auto_compaction_falls_back_to_windowing(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config={"context_policy": AUTO_POLICY}))["id"]
    filler = "lorem ipsum dolor sit amet " * 25
    for i in range(3):
        upstream.script(Text(f"noted {i}"))
        await ask(api, sid, f"fact {i}: {filler}")
    upstream.script(Fail(400, "bad_request", "summarizer refused"))
    upstream.script(Text("answered anyway"))
    events = await collect(
        api, "POST", f"/v1/sessions/{sid}/ask", json={"input": f"fact 3: {filler} " * 6}
    )
    types = [e.type for e in events]
    assert types[-1] == "run.completed" and events[-1].data["text"] == "answered anyway"
    failed = next(e.data for e in events if e.type == "context.compaction_failed")
    assert failed["fallback"] == "windowing"
    assert failed["error"]["code"] == "provider_bad_request"
    assert "context.compacted" not in types
    assert not summaries(await history(api, sid))
    sent = upstream.requests[-1].body["messages"]
    assert sent[-1]["content"].startswith("fact 3")
    assert "fact 0" not in str(sent)  # windowed out instead


async def test_a_retried_job_finds_the_summary_its_first_attempt_committed(
    api: httpx.AsyncClient, upstream: FakeUpstream, e2e_engine: AsyncEngine
) -> None:
    # Stands in for a worker that died between committing the summary and ending the run: the
    # job's summary entry (its id derives from the run) exists before the job runs.
    sid = (await new_session(api))["id"]
    await converse(api, upstream, sid, 4)
    upstream.script(*[Text(f"{i} ") for i in range(20)], token_delay=0.05)
    asked = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "slow one", "stream": False})
    run = (await api.post(f"/v1/sessions/{sid}/compact", json={"keep_last_turns": 1})).json()
    assert run["status"] == "queued"  # behind the ask, on the session's job lock
    summary = {"from_seq": 1, "to_seq": 3, "content": "ALREADY WRITTEN", "model": "openai:m"}
    summary_id = f"run:{run['id']}:summary"
    entry = {"kind": "summary", "id": summary_id, "payload": summary}
    refused = await api.post(f"/v1/sessions/{sid}/entries", json={"entries": [entry]})
    assert refused.status_code == 422  # clients may not write the ids runs use
    async with e2e_engine.connect() as conn:
        tenant = await conn.execute(select(sessions.c.tenant_id).where(sessions.c.id == sid))
        tenant_id = str(tenant.scalar_one())
    written = NewEntry(EntryKind.SUMMARY, summary, {"run_id": run["id"]}, summary_id)
    await append_entries(e2e_engine, tenant_id, sid, [written], expected_rev=None)
    await api.get(f"/v1/runs/{asked.json()['id']}", params={"wait": "true", "timeout": 20})
    ended = (await api.get(f"/v1/runs/{run['id']}", params={"wait": "true", "timeout": 20})).json()
    assert ended["status"] == "completed" and ended["result"] == "ALREADY WRITTEN"
    assert not any(is_summarization(r.body) for r in upstream.requests)
    assert len(summaries(await history(api, sid))) == 1


async def test_a_run_waiting_for_tool_outputs_keeps_its_turn_raw(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    locate = {"name": "get_location", "kind": "client", "description": "Where the user is"}
    sid = (await new_session(api, config={"tools": [locate]}))["id"]
    await converse(api, upstream, sid, 3)
    upstream.script(ToolCall("call_loc", "get_location", "{}"))
    waiting = (
        await api.post(f"/v1/sessions/{sid}/ask", json={"input": "where am I?", "stream": False})
    ).json()
    await collect(api, "GET", f"/v1/runs/{waiting['id']}/events", until="run.requires_action")
    # Even "summarize everything" leaves the unanswered turn raw: its answer is still to come.
    upstream.script(Text("EARLIER TURNS"))
    run = await compact(api, sid, keep_last_turns=0)
    assert run["status"] == "completed"
    assert "where am I" not in user_text(upstream.requests[-1].body)
    upstream.script(Text("You are in Oslo."))
    call_id = thread_call_id(waiting["user_entry_seq"], 1, 0)  # the call as it was journaled
    body = {"tool_outputs": [{"tool_call_id": call_id, "output": {"city": "Oslo"}}]}
    assert (await api.post(f"/v1/runs/{waiting['id']}/tool_outputs", json=body)).is_success
    done = await api.get(f"/v1/runs/{waiting['id']}", params={"wait": "true", "timeout": 20})
    assert done.json()["status"] == "completed"
    sent = upstream.requests[-1].body["messages"]
    assert "EARLIER TURNS" in str(sent[0]["content"])
    assert [m["role"] for m in sent[1:]] == ["user", "assistant", "tool"]
    assert sent[1]["content"] == "where am I?"


async def test_a_rollback_appended_meanwhile_voids_the_summary(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api))["id"]
    await converse(api, upstream, sid, 4)
    upstream.script(Stall(1.0), Text("STALE SUMMARY"))
    response = await api.post(f"/v1/sessions/{sid}/compact", json={"keep_last_turns": 1})
    run_id = response.json()["id"]
    await collect(api, "GET", f"/v1/runs/{run_id}/events", until="context.compacting")
    rollback = {"kind": "rollback", "payload": {"from_seq": 1, "to_seq": 5}}
    assert (await api.post(f"/v1/sessions/{sid}/entries", json={"entries": [rollback]})).is_success
    ended = (await api.get(f"/v1/runs/{run_id}", params={"wait": "true", "timeout": 20})).json()
    assert ended["status"] == "failed"
    assert ended["error"]["code"] == "compaction_superseded"
    assert not summaries(await history(api, sid))


async def test_a_summary_cut_off_at_its_length_limit_keeps_what_it_said_completely(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    """A small model rambling to its limit still compacts (it used to fail summary_truncated,
    for good): the summary keeps its complete sentences and says it was cut."""
    sid = (await new_session(api))["id"]
    await converse(api, upstream, sid, 4)
    upstream.script(
        Text("The user likes tea and lives in Oslo. They asked about"), stop_reason="length"
    )
    run = await compact(api, sid, keep_last_turns=1)
    assert run["status"] == "completed", run
    [summary] = summaries(await history(api, sid))
    assert (
        summary["payload"]["content"] == "The user likes tea and lives in Oslo." + SUMMARY_CUT_MARK
    )
    # A short conversation is asked for a short summary, not for the cap's ~900 words.
    cap = re.search(r"Use at most (\d+) words", user_text(upstream.requests[-1].body))
    assert cap is not None
    asked = int(cap[1])
    assert asked < 100


SMALL_POLICY = {"max_input_tokens": 1000, "reserve_output_tokens": 100}


async def test_a_summary_larger_than_the_budget_is_cut_and_an_oversized_ask_refused(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config={"context_policy": SMALL_POLICY}))["id"]
    await converse(api, upstream, sid, 2)
    # A checkpoint far larger than the budget (a client's import, or written for a model with a
    # larger window): every later ask was refused with context_overflow.
    content = "".join(f"Decision {i}: keep the billing API stable. " for i in range(800))
    summary = {"kind": "summary", "payload": {"from_seq": 1, "to_seq": 4, "content": content}}
    appended = await api.post(f"/v1/sessions/{sid}/entries", json={"entries": [summary]})
    assert appended.is_success, appended.text
    upstream.script(Text("still here"))
    answered = await ask(api, sid, "what did we decide?")
    assert answered["text"] == "still here"
    sent = upstream.requests[-1].body["messages"]
    assert sent[0]["role"] == "system" and "Decision 0: keep" in str(sent[0]["content"])
    assert "cut to fit the context window" in str(sent[0]["content"])
    assert "Decision 799" not in str(sent)
    assert sent[-1]["content"] == "what did we decide?"
    dry = (await api.post(f"/v1/sessions/{sid}/projection", json={})).json()
    assert dry["meta"]["summary_truncated"] and dry["meta"]["summary_used"]
    # A newest turn larger than the budget is refused at the door, naming its size and the
    # budget, and nothing is written.
    rev = (await api.get(f"/v1/sessions/{sid}")).json()["rev"]
    refused = await api.post(
        f"/v1/sessions/{sid}/ask", json={"input": "word " * 3000, "stream": False}
    )
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "context_overflow"
    assert error["details"]["budget"] == 900 and error["details"]["tokens"] > 3000
    assert str(error["details"]["tokens"]) in error["message"]
    assert (await api.get(f"/v1/sessions/{sid}")).json()["rev"] == rev


async def test_a_summary_over_its_cap_is_cut_to_fit_the_reading_model(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config={"context_policy": SMALL_POLICY}))["id"]
    # Long enough turns that a summary cut to its cap is still shorter than what it replaces.
    for i in range(4):
        upstream.script(Text(f"answer {i}: " + "the billing API is stable. " * 8))
        await ask(api, sid, f"question {i}: " + "what about the billing API? " * 8)
    # An upstream that ignores max_tokens and answers at length (a finish reason of "stop").
    rambling = "".join(f"Point {i}: the user asked about billing. " for i in range(600))
    upstream.script(Text(rambling))
    run = await compact(api, sid, keep_last_turns=1)
    assert run["status"] == "completed", run
    assert (
        upstream.requests[-1].body["max_completion_tokens"] == 100
    )  # the cap it was asked to keep
    [summary] = summaries(await history(api, sid))
    content = summary["payload"]["content"]
    assert content.endswith(SUMMARY_CUT_MARK) and content.startswith("Point 0: the user")
    assert summary["token_count"] <= 100
    # The next ask reads it whole: it fits the budget next to the turns after it.
    dry = (await api.post(f"/v1/sessions/{sid}/projection", json={})).json()
    assert dry["meta"]["summary_used"] and not dry["meta"]["summary_truncated"]


async def test_a_previous_summary_too_large_for_the_summarizer_is_folded_in_cut(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    policy = {**SMALL_POLICY, "summarization": "use_existing"}  # only /compact summarizes
    sid = (await new_session(api, config={"context_policy": policy}))["id"]
    await converse(api, upstream, sid, 2)
    content = "".join(f"Decision {i}: keep the billing API stable. " for i in range(800))
    summary = {"kind": "summary", "payload": {"from_seq": 1, "to_seq": 4, "content": content}}
    assert (await api.post(f"/v1/sessions/{sid}/entries", json={"entries": [summary]})).is_success
    await converse(api, upstream, sid, 3, first=2)
    upstream.script(Text("A SMALLER SUMMARY"))
    run = await compact(api, sid, keep_last_turns=1)
    assert run["status"] == "completed", run  # was: summarizer_window_too_small, at every try
    prompt = user_text(upstream.requests[-1].body)
    assert prompt.startswith("The summary so far:\nDecision 0: keep")
    assert SUMMARY_CUT_MARK in prompt and "question 3" in prompt
    newest = summaries(await history(api, sid))[-1]
    assert newest["payload"]["content"] == "A SMALLER SUMMARY"


def held_summarizer(release: threading.Event, summary: str, answer: str) -> Responder:
    """A summarizer that answers only once `release` is set; any other request is answered
    at once (so the order in which the two reach the upstream does not matter)."""

    def respond(request: ReceivedRequest) -> Script:
        if is_summarization(request.body):
            return Script((Hold(release), Text(summary)))
        return Script((Text(answer),))

    return respond


async def landed_summary(api: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    """The summary a background compaction commits (no run event announces it)."""
    for _ in range(600):  # up to 30 s on a loaded machine
        if found := summaries(await history(api, sid)):
            return found[-1]
        await asyncio.sleep(0.05)
    raise AssertionError("the background summary never landed")


async def test_an_ask_waits_for_its_auto_compaction_at_most_the_bound(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    policy = {**AUTO_POLICY, "compaction_wait_seconds": 0.5}
    sid = (await new_session(api, config={"context_policy": policy}))["id"]
    filler = "lorem ipsum dolor sit amet " * 25
    for i in range(3):
        upstream.script(Text(f"noted {i}"))
        await ask(api, sid, f"fact {i}: {filler}")
    release = threading.Event()
    upstream.respond_with(held_summarizer(release, "LATE SUMMARY", "answered from windowing"))
    try:
        body = {"input": f"fact 3: {filler} " * 6}
        events = await asyncio.wait_for(
            collect(api, "POST", f"/v1/sessions/{sid}/ask", json=body), timeout=60
        )
        # The run completed while the summarizer was still held.
        assert not release.is_set()
        types = [e.type for e in events]
        assert types[-1] == "run.completed", events[-1]
        assert events[-1].data["text"] == "answered from windowing"
        assert types.index("context.compacting") < types.index("context.compaction_pending")
        assert types.index("context.compaction_pending") < types.index("message.delta")
        pending = next(e.data for e in events if e.type == "context.compaction_pending")
        assert pending["fallback"] == "windowing" and pending["waited_seconds"] == 0.5
        assert "context.compacted" not in types and "context.compaction_failed" not in types
        summarizing, answering = upstream.requests[-2:]
        assert is_summarization(summarizing.body) and not is_summarization(answering.body)
        assert "fact 0" not in str(answering.body["messages"])  # windowed out
        assert not summaries(await history(api, sid))
        # The next ask joins the compaction under way (one summarizer call, not two).
        again = await asyncio.wait_for(
            collect(api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "fact 4?"}), timeout=60
        )
        assert not release.is_set()
        assert again[-1].type == "run.completed", again[-1]
        assert "context.compaction_pending" in [e.type for e in again]
        assert sum(is_summarization(r.body) for r in upstream.requests) == 1
    finally:
        release.set()
    summary = await landed_summary(api, sid)
    assert summary["payload"]["content"] == "LATE SUMMARY"
    assert summary["refs"]["run_id"] == events[0].data["run_id"]
    # Later asks use it.
    await ask(api, sid, "and fact 5?", context_policy={"summarization": "use_existing"})
    sent = upstream.requests[-1].body["messages"]
    assert "LATE SUMMARY" in str(sent[0]["content"])


async def test_an_ask_behind_a_slow_compaction_job_is_answered_from_windowing(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config={"context_policy": {"compaction_wait_seconds": 0.5}}))[
        "id"
    ]
    await converse(api, upstream, sid, 4)
    release = threading.Event()
    upstream.respond_with(held_summarizer(release, "JOB SUMMARY", "answered meanwhile"))
    try:
        job = (await api.post(f"/v1/sessions/{sid}/compact", json={"keep_last_turns": 1})).json()
        await collect(api, "GET", f"/v1/runs/{job['id']}/events", until="context.compacting")
        events = await asyncio.wait_for(
            collect(api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "question 4"}),
            timeout=60,
        )
        # The ask completed while the summarizer was still held.
        assert not release.is_set()
        assert events[-1].type == "run.completed", events[-1]
        assert events[-1].data["text"] == "answered meanwhile"
        pending = next(e.data for e in events if e.type == "context.compaction_pending")
        assert pending["run_id"] == job["id"] and pending["fallback"] == "windowing"
        assert "context.compacting" not in [e.type for e in events]  # no second summarizer
        assert (await api.get(f"/v1/runs/{job['id']}")).json()["status"] == "running"
    finally:
        release.set()
    ended = (await api.get(f"/v1/runs/{job['id']}", params={"wait": "true", "timeout": 20})).json()
    assert ended["status"] == "completed" and ended["result"] == "JOB SUMMARY"
    await ask(api, sid, "question 5")
    sent = upstream.requests[-1].body["messages"]
    assert "JOB SUMMARY" in str(sent[0]["content"])

"""A long session through the service: each answer records where its context started
(refs.context_from), and the next asks keep that window start while it fits, so consecutive
requests repeat the previous one as their prefix (what a provider's prompt cache serves)."""

from __future__ import annotations

from typing import Any

import httpx

from testkit.api import history, new_session
from testkit.upstream import FakeUpstream, Text

POLICY = {
    "max_input_tokens": 1200,
    "reserve_output_tokens": 200,
    "keep_last_turns": 1,
    "summarization": "none",  # windowing alone
}


async def test_asks_keep_the_window_start_their_previous_answer_recorded(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config={"system_prompt": "Be brief.", "context_policy": POLICY}))[
        "id"
    ]
    upstream.clear()
    sent: list[list[dict[str, Any]]] = []
    for turn in range(30):
        upstream.script(Text(f"answer {turn}: " + "ipsum " * 50))
        asked = await api.post(
            f"/v1/sessions/{sid}/ask",
            json={"input": f"question {turn}: " + "lorem " * 25, "stream": False},
        )
        assert asked.status_code == 202, asked.text
        done = await api.get(f"/v1/runs/{asked.json()['id']}", params={"wait": "true"})
        assert done.json()["status"] == "completed", done.text
        sent.append(upstream.requests[-1].body["messages"])

    journal = {e["seq"]: e for e in await history(api, sid)}
    answers = [e for e in journal.values() if e["payload"].get("role") == "assistant"]
    assert len(answers) == 30
    for answer, messages in zip(answers, sent, strict=True):
        # The answer names the oldest entry of the context it was written from.
        start = journal[answer["refs"]["context_from"]]
        assert start["payload"] == {"role": "user", "content": messages[1]["content"]}

    truncated = [i for i, m in enumerate(sent) if "question 0:" not in m[1]["content"]]
    assert len(truncated) > 15, "the window must have dropped history"
    pairs = [(sent[i - 1], sent[i]) for i in truncated if i - 1 in truncated]
    kept = sum(after[: len(before)] == before for before, after in pairs)
    jumps = len(pairs) - kept
    # About one jump per 512 tokens (the default chunk of a 1,000 budget) of ~100-token turns.
    assert jumps >= 2 and kept >= 3 * jumps, (kept, jumps)

"""The bare relay: the baseline bench/streams.py measures Threadline against.

A minimal Starlette app on uvicorn that relays the same (fake) OpenAI upstream to SSE through
the same openai SDK, with nothing else: no database, no auth, no queue, no journal. It answers
the two requests the benchmark's client sends, in Threadline's shapes: POST /v1/sessions (an id)
and POST /v1/sessions/{id}/ask (an SSE stream of `message.delta` events, then `run.completed`).

Run as its own process: `python -m bench.relay --port P --upstream http://127.0.0.1:Q/v1`.

With `--journal <postgres url>`, the relay also makes the two durable commits an ask of
Threadline must make before its first token reaches the client, and nothing else: the user's
message, before anything is sent upstream, and the first delta, before the client gets it
(each one single-row INSERT on an autocommit connection: its own fsync'd commit). That relay's
ask overhead is the floor any design keeping those promises has on this machine.
"""

from __future__ import annotations

import argparse
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import openai
import uvicorn
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

_JOURNAL = "CREATE TABLE IF NOT EXISTS relay_journal (id bigserial PRIMARY KEY, body text)"
_COMMIT = "INSERT INTO relay_journal (body) VALUES ($1)"


def relay_app(
    upstream_url: str, model: str = "gpt-4o-mini", journal_url: str | None = None
) -> Starlette:
    # Retries as Threadline's default (THREADLINE_LLM_MAX_RETRIES=3): a connect timeout to a
    # busy upstream is retried by both, or the relay would fail streams Threadline completes.
    client = openai.AsyncOpenAI(api_key="sk-relay", base_url=upstream_url, max_retries=3)
    pools: list[asyncpg.Pool] = []

    async def commit(body: str) -> None:
        if pools:
            await pools[0].execute(_COMMIT, body)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        if journal_url is None:
            yield
            return
        pool = await asyncpg.create_pool(journal_url, min_size=2, max_size=20)
        await pool.execute(_JOURNAL)
        pools.append(pool)
        try:
            yield
        finally:
            await pool.close()

    async def create_session(_request: Request) -> JSONResponse:
        return JSONResponse({"id": str(uuid.uuid4())}, status_code=201)

    async def ask(request: Request) -> EventSourceResponse:
        body = await request.json()
        content = str(body["input"])
        await commit(content)  # the user's message, before anything is sent upstream

        async def events() -> AsyncIterator[ServerSentEvent]:
            seq = 0
            stream = await client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": content}],
                stream=True,
            )
            async for chunk in stream:
                text = chunk.choices[0].delta.content if chunk.choices else None
                if text:
                    seq += 1
                    if seq == 1:
                        await commit(text)  # the first event, before the client has it
                    data = json.dumps({"text": text}, separators=(",", ":"))
                    yield ServerSentEvent(data=data, event="message.delta", id=str(seq))
            yield ServerSentEvent(data="{}", event="run.completed", id=str(seq + 1))

        return EventSourceResponse(events(), ping=15)

    return Starlette(
        routes=[
            Route("/v1/sessions", create_session, methods=["POST"]),
            Route("/v1/sessions/{session_id}/ask", ask, methods=["POST"]),
            Route("/readyz", lambda _r: JSONResponse({"status": "ready"}), methods=["GET"]),
        ],
        lifespan=lifespan,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the OpenAI base URL to relay")
    parser.add_argument("--journal", help="a Postgres URL: commit as an ask must (see above)")
    args = parser.parse_args()
    app = relay_app(args.upstream, journal_url=args.journal)
    # uvicorn's defaults, as `threadline serve` has them (uvloop and httptools when installed).
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()

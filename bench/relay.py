"""The bare relay: the baseline bench/streams.py measures Threadline against.

A minimal Starlette app on uvicorn that relays the same (fake) OpenAI upstream to SSE through
the same openai SDK, with nothing else: no database, no auth, no queue, no journal. It answers
the two requests the benchmark's client sends, in Threadline's shapes: POST /v1/sessions (an id)
and POST /v1/sessions/{id}/ask (an SSE stream of `message.delta` events, then `run.completed`).

Run as its own process: `python -m bench.relay --port P --upstream http://127.0.0.1:Q/v1`.
"""

from __future__ import annotations

import argparse
import json
import uuid
from collections.abc import AsyncIterator

import openai
import uvicorn
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


def relay_app(upstream_url: str, model: str = "gpt-4o-mini") -> Starlette:
    # Retries as Threadline's default (THREADLINE_LLM_MAX_RETRIES=3): a connect timeout to a
    # busy upstream is retried by both, or the relay would fail streams Threadline completes.
    client = openai.AsyncOpenAI(api_key="sk-relay", base_url=upstream_url, max_retries=3)

    async def create_session(_request: Request) -> JSONResponse:
        return JSONResponse({"id": str(uuid.uuid4())}, status_code=201)

    async def ask(request: Request) -> EventSourceResponse:
        body = await request.json()
        content = str(body["input"])

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
                    data = json.dumps({"text": text}, separators=(",", ":"))
                    yield ServerSentEvent(data=data, event="message.delta", id=str(seq))
            yield ServerSentEvent(data="{}", event="run.completed", id=str(seq + 1))

        return EventSourceResponse(events(), ping=15)

    return Starlette(
        routes=[
            Route("/v1/sessions", create_session, methods=["POST"]),
            Route("/v1/sessions/{session_id}/ask", ask, methods=["POST"]),
            Route("/readyz", lambda _r: JSONResponse({"status": "ready"}), methods=["GET"]),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the OpenAI base URL to relay")
    args = parser.parse_args()
    # uvicorn's defaults, as `threadline serve` has them (uvloop and httptools when installed).
    uvicorn.run(relay_app(args.upstream), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()

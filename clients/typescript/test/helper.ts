// The streaming helper against answers a live service gives only by chance (heartbeats inside a
// stream, a stream ended early, a proxy's HTML error): `node dist/test/helper.js`, with a
// client whose `fetch` answers from a script and records the requests.
import assert from "node:assert/strict";

import { createClient, StreamRefused, streaming, type RunEvent } from "threadline-client";

type Answer = { status: number; body?: string; open?: boolean; type?: string };

/** A client whose fetch answers the given answers in order, recording each request. */
function scripted(...answers: Answer[]) {
  const requests: Request[] = [];
  const fetch = async (input: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
    const request = new Request(input, init);
    requests.push(request);
    const answer = answers.shift();
    assert.ok(answer, `unexpected request ${request.method} ${request.url}`);
    const { status, body, open } = answer;
    const type = answer.type ?? (status === 200 ? "text/event-stream" : "application/json");
    if (status === 204) return new Response(null, { status });
    const stream = new ReadableStream<Uint8Array>({
      start(controller) {
        if (body) controller.enqueue(new TextEncoder().encode(body));
        if (!open) controller.close(); // open: the stream stays open until cancelled
      },
    });
    return new Response(stream, { status, headers: { "content-type": type } });
  };
  const client = createClient({ baseUrl: "http://threadline.test", auth: "sk-test", fetch });
  return { client, requests };
}

const completed = JSON.stringify({
  run_id: "r",
  status: "completed",
  model: "openai:gpt-4o-mini",
  text: "Hi there",
  usage: null,
  finish_reason: "stop",
});

async function collect(stream: AsyncIterable<RunEvent>): Promise<RunEvent[]> {
  const events: RunEvent[] = [];
  for await (const event of stream) events.push(event);
  return events;
}

async function heartbeatsAreNotEvents(): Promise<void> {
  const { client, requests } = scripted({
    status: 200,
    body:
      'id: 1\nevent: message.delta\ndata: {"text":"Hi"}\n\n' +
      ": ping\n\n" +
      `id: 2\nevent: run.completed\ndata: ${completed}\n\n`,
  });
  const events = await collect(streaming.runEvents("r", { client }));
  assert.deepEqual(
    events.map((e) => e.event),
    ["message.delta", "run.completed"],
  );
  const [request] = requests;
  assert.equal(request?.url, "http://threadline.test/v1/runs/r/events");
  assert.equal(request?.headers.get("last-event-id"), "0");
  assert.equal(request?.headers.get("authorization"), "Bearer sk-test");
}

async function aStreamEndedEarlyIsResumed(): Promise<void> {
  // the server went away after event 2 (no terminal event): the helper asks for what follows
  const { client, requests } = scripted(
    {
      status: 200,
      body:
        'id: 1\nevent: run.created\ndata: {"run_id":"r","user_entry_seq":1}\n\n' +
        'id: 2\nevent: message.delta\ndata: {"text":"Hi"}\n\n',
    },
    {
      status: 200,
      body:
        'id: 3\nevent: message.delta\ndata: {"text":" there"}\n\n' +
        `id: 4\nevent: run.completed\ndata: ${completed}\n\n`,
    },
  );
  const events = await collect(streaming.ask("s", { input: "Hello" }, { client }));
  assert.deepEqual(
    events.map((e) => e.id),
    ["1", "2", "3", "4"],
  );
  assert.equal(requests[0]?.method, "POST");
  assert.deepEqual(JSON.parse(await requests[0]!.text()), { input: "Hello", stream: true });
  assert.equal(requests[1]?.url, "http://threadline.test/v1/runs/r/events");
  assert.equal(requests[1]?.headers.get("last-event-id"), "2");
}

async function errorsAreThrownWithTheServersError(): Promise<void> {
  const error = { error: { code: "run_not_found", message: "No such run.", details: {} } };
  const json = scripted({ status: 404, body: JSON.stringify(error) });
  await assert.rejects(collect(streaming.runEvents("r", { client: json.client })), (e: unknown) => {
    assert.ok(e instanceof StreamRefused);
    assert.equal(e.status, 404);
    assert.deepEqual(e.error, error.error);
    return true;
  });
  // a proxy's page rather than the API's JSON error
  const html = scripted({ status: 502, body: "<html>Bad Gateway</html>", type: "text/html" });
  await assert.rejects(collect(streaming.runEvents("r", { client: html.client })), (e: unknown) => {
    assert.ok(e instanceof StreamRefused);
    assert.equal(e.error.code, "http_502");
    assert.equal(e.error.message, "<html>Bad Gateway</html>");
    return true;
  });
}

async function aFinishedRunWithNothingLeftIsNoEvents(): Promise<void> {
  const { client } = scripted({ status: 204 });
  assert.deepEqual(await collect(streaming.runEvents("r", { client, after: 9 })), []);
}

async function abortingEndsTheIteration(): Promise<void> {
  const { client } = scripted({
    status: 200,
    body: 'id: 1\nevent: message.delta\ndata: {"text":"Hi"}\n\n',
    open: true,
  });
  const controller = new AbortController();
  const events: RunEvent[] = [];
  for await (const event of streaming.runEvents("r", { client, signal: controller.signal })) {
    events.push(event);
    controller.abort(); // the stream stays open: only the abort ends this loop
  }
  assert.equal(events.length, 1);
}

for (const check of [
  heartbeatsAreNotEvents,
  aStreamEndedEarlyIsResumed,
  errorsAreThrownWithTheServersError,
  aFinishedRunWithNothingLeftIsNoEvents,
  abortingEndsTheIteration,
]) {
  await check();
  console.log(`ok: ${check.name}`);
}

// Driven by tests/clients/test_typescript.py against a live service whose fake upstream it
// scripts: `node dist/test/conversation.js MODE` with API (the service's URL) and KEY set.
// Prints `step: ...` lines as it goes (the Python side acts on some); exits non-zero on a
// failed assertion.
import assert from "node:assert/strict";

import { EventSource } from "eventsource";

import {
  createClient,
  createSession,
  createStreamToken,
  forkSession,
  getRun,
  listEntries,
  searchHistory,
  StreamRefused,
  streaming,
  type RunEvent,
} from "threadline-client";

const api = process.env.API ?? "";
const key = process.env.KEY ?? "";
const client = createClient({ baseUrl: api, auth: key });

function step(name: string): void {
  console.log(`step: ${name}`);
}

function text(events: RunEvent[]): string {
  return events.map((e) => (e.event === "message.delta" ? e.data.text : "")).join("");
}

function assertConsecutive(events: RunEvent[]): void {
  assert.deepEqual(
    events.map((e) => Number(e.id)),
    events.map((_, i) => i + 1),
  );
}

async function collect(stream: AsyncIterable<RunEvent>): Promise<RunEvent[]> {
  const events: RunEvent[] = [];
  for await (const event of stream) events.push(event);
  return events;
}

async function newSession(title: string): Promise<string> {
  const { data } = await createSession({ client, body: { title }, throwOnError: true });
  assert.equal(data.title, title);
  return data.id;
}

async function conversation(): Promise<void> {
  // create
  const sid = await newSession("typescript client");
  step("created");

  // ask and stream: typed events, to the terminal one
  const events = await collect(streaming.ask(sid, { input: "Weather in Oslo?" }, { client }));
  const first = events[0];
  const last = events.at(-1);
  assert.equal(first?.event, "run.created");
  assert.equal(last?.event, "run.completed");
  if (last?.event === "run.completed") assert.equal(last.data.text, "Oslo is rainy.");
  assert.equal(text(events), "Oslo is rainy.");
  assertConsecutive(events);
  step("asked");

  // disconnect mid-answer (leave the loop), then resume after the last event seen
  const seen: RunEvent[] = [];
  for await (const event of streaming.ask(sid, { input: "And tomorrow?" }, { client })) {
    seen.push(event);
    if (event.event === "message.delta") break; // the connection closes; the run goes on
  }
  const created = seen[0];
  assert.ok(created?.event === "run.created");
  const runId = created.data.run_id;
  // the run is still going (held upstream): another ask is refused with the server's error
  await assert.rejects(
    collect(streaming.ask(sid, { input: "Hello?" }, { client })),
    (error: unknown) =>
      error instanceof StreamRefused && error.status === 409 && error.error.code === "session_busy",
  );
  step("left"); // the Python side now lets the upstream finish the answer
  const after = Number(seen.at(-1)?.id);
  const rest = await collect(streaming.runEvents(runId, { client, after }));
  assertConsecutive([...seen, ...rest]);
  const end = rest.at(-1);
  assert.ok(end?.event === "run.completed");
  assert.equal(end.data.text, "Bring an umbrella.");
  // read again from the start: the same run, event for event
  const again = await collect(streaming.runEvents(runId, { client }));
  assert.deepEqual(again, [...seen, ...rest]);
  step("resumed");

  // fork at the first answer
  const fork = await forkSession({
    client,
    path: { session_id: sid },
    body: { at_seq: 2 },
    throwOnError: true,
  });
  assert.equal(fork.data.parent_id, sid);
  assert.equal(fork.data.fork_seq, 2);
  step("forked");

  // compact without streaming: 202 with its run, then wait for it
  const queued = await streaming.submitCompaction(sid, { keep_last_turns: 1 }, { client });
  assert.equal(queued.kind, "compaction");
  const done = await getRun({
    client,
    path: { run_id: queued.id },
    query: { wait: true },
    throwOnError: true,
  });
  assert.equal(done.data.status, "completed", JSON.stringify(done.data));
  step("compacted");

  // history
  const page = await listEntries({
    client,
    path: { session_id: sid },
    query: { limit: 100 },
    throwOnError: true,
  });
  const kinds = page.data.data.map((e) => e.kind);
  assert.ok(kinds.includes("summary"), JSON.stringify(kinds));
  assert.equal(kinds.filter((k) => k === "message").length, 4);
  step("history");

  // search
  const found = await searchHistory({
    client,
    path: { session_id: sid },
    query: { q: "umbrella" },
    throwOnError: true,
  });
  assert.ok(found.data.data.some((hit) => hit.excerpt.includes("umbrella")));
  step("searched");
}

async function dropped(): Promise<void> {
  // API is a proxy that cuts the stream after its first delta: one stream all the same
  const sid = await newSession("dropped");
  const events = await collect(streaming.ask(sid, { input: "Rain tomorrow?" }, { client }));
  assertConsecutive(events);
  const end = events.at(-1);
  assert.ok(end?.event === "run.completed");
  assert.equal(end.data.text, "Bring an umbrella.");
  step("resumed");
}

async function browser(): Promise<void> {
  // the backend: a run without streaming, and a token for its stream
  const sid = await newSession("browser");
  const run = await streaming.submitAsk(sid, { input: "Hello!" }, { client });
  const token = await createStreamToken({ client, body: { run_id: run.id }, throwOnError: true });
  assert.ok(token.data.stream_url.includes("token="));
  // the page: an EventSource with the token alone (no Authorization header)
  const received: { type: string; id: string; data: string }[] = [];
  await new Promise<void>((resolve, reject) => {
    const source = new EventSource(`${api}${token.data.stream_url}`);
    const listen = (type: string) =>
      source.addEventListener(type, (e: MessageEvent<string>) => {
        received.push({ type, id: e.lastEventId, data: e.data });
        if (streaming.TERMINAL.has(type as RunEvent["event"])) {
          source.close();
          resolve();
        }
      });
    for (const type of ["run.created", "message.delta", "run.completed", "run.failed"]) {
      listen(type);
    }
    source.onerror = (e) => {
      source.close();
      reject(new Error(`EventSource failed: ${JSON.stringify(e)}`));
    };
  });
  assert.equal(received[0]?.type, "run.created");
  assert.equal(received.at(-1)?.type, "run.completed");
  const answer = received
    .filter((e) => e.type === "message.delta")
    .map((e) => (JSON.parse(e.data) as { text: string }).text)
    .join("");
  assert.equal(answer, "Hello from the model.");
  // without the token the stream is refused, with the server's JSON error
  await assert.rejects(
    collect(streaming.runEvents(run.id, { client: createClient({ baseUrl: api }) })),
    (error: unknown) => error instanceof StreamRefused && error.status === 401,
  );
  step("streamed");
}

const modes: Record<string, () => Promise<void>> = { conversation, dropped, browser };
const mode = modes[process.argv[2] ?? ""];
if (mode === undefined) throw new Error(`usage: conversation.js ${Object.keys(modes).join("|")}`);
await mode();
step("done");

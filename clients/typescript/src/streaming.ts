/**
 * Typed, resumable run streams for the generated client (on eventsource-parser).
 *
 *     import { createClient } from "./generated/client/index.js";
 *     import { ask } from "./streaming.js";
 *
 *     const client = createClient({ baseUrl: "http://127.0.0.1:8000", auth: API_KEY });
 *     for await (const event of ask(sessionId, { input: "Hello!" }, { client })) {
 *       if (event.event === "message.delta") process.stdout.write(event.data.text);
 *       if (event.event === "run.completed") console.log(`\n(${event.data.finish_reason})`);
 *     }
 *
 * Every item is a `RunEvent`, the generated union of the event types, discriminated by
 * `event`: narrowing on it types `data`. A dropped connection is resumed from the last event
 * received (`Last-Event-ID`, on `GET /v1/runs/{id}/events`, served by any API instance), and
 * each event still arrives once; iteration ends after the run's terminal event
 * (`run.completed`, `run.failed` or `run.cancelled`). Leaving a `for await` loop early (or
 * aborting `signal`) closes the connection; the run goes on: resume it later with
 * `runEvents(runId, { after: lastId })`. An error answer instead of a stream (e.g. 409
 * `session_busy`) throws `StreamRefused` with the server's JSON error.
 *
 * The generated `ask`, `compactSession` and `streamRunEvents` cannot do this: their generic SSE
 * client yields each event's `data` alone, retries an error answer without end, reconnects by
 * resending the POST (a second ask), and cannot read a 202. `submitAsk` and
 * `submitCompaction` start a run without streaming and return it.
 */

import { createParser, type EventSourceMessage } from "eventsource-parser";

import { client as defaultClient } from "./generated/client.gen.js";
import { type Client, mergeHeaders } from "./generated/client/index.js";
import { getAuthToken } from "./generated/core/auth.gen.js";
import type {
  AskRequest,
  CompactRequest,
  ErrorBody,
  Run,
  RunEvent,
} from "./generated/types.gen.js";

export type { RunEvent };

export const TERMINAL: ReadonlySet<RunEvent["event"]> = new Set([
  "run.completed",
  "run.failed",
  "run.cancelled",
]);

/** Heartbeats come every 15 s by default: a minute of silence is a dead connection. */
export const READ_TIMEOUT_MS = 60_000;

export interface StreamOptions {
  /** The generated client to use (its baseUrl, auth, headers and fetch); default: `client`. */
  client?: Client;
  /** Aborting it closes the connection and ends the iteration (the run goes on). */
  signal?: AbortSignal;
  /** Failed reconnections in a row before giving up (the last error is thrown). */
  reconnects?: number;
}

export interface AskOptions extends StreamOptions {
  /** A retried ask with the same key gets the run the first one created. */
  idempotencyKey?: string;
}

export interface RunEventsOptions extends StreamOptions {
  /** The id of the last event already received: 0 (the default) reads from the first. */
  after?: number;
}

/** The server answered with an error instead of a stream (or a run): its JSON error. */
export class StreamRefused extends Error {
  constructor(
    readonly status: number,
    readonly error: ErrorBody,
  ) {
    super(`${status} ${error.code}: ${error.message}`);
    this.name = "StreamRefused";
  }
}

/** A connection that failed (network error, reset, silence): worth reconnecting. */
class Dropped extends Error {
  override name = "Dropped";
}

/** Ask and stream the run's events to its end, resuming the stream if the connection drops. */
export async function* ask(
  sessionId: string,
  body: Omit<AskRequest, "stream">,
  options: AskOptions = {},
): AsyncGenerator<RunEvent, void, undefined> {
  const headers: Record<string, string> = {};
  if (options.idempotencyKey) headers["Idempotency-Key"] = options.idempotencyKey;
  yield* startAndFollow(
    `/v1/sessions/${encodeURIComponent(sessionId)}/ask`,
    { ...body, stream: true },
    headers,
    options,
  );
}

/** Compact and stream the compaction's events (`context.compacting`, ...) to its end. */
export async function* compact(
  sessionId: string,
  body: Omit<CompactRequest, "stream"> = {},
  options: StreamOptions = {},
): AsyncGenerator<RunEvent, void, undefined> {
  yield* startAndFollow(
    `/v1/sessions/${encodeURIComponent(sessionId)}/compact`,
    { ...body, stream: true },
    {},
    options,
  );
}

/**
 * A run's events after event `after`, to its terminal event; a dropped connection is
 * resumed with Last-Event-ID. Nothing when the run is over and nothing is left to send (204).
 */
export async function* runEvents(
  runId: string,
  options: RunEventsOptions = {},
): AsyncGenerator<RunEvent, void, undefined> {
  const path = `/v1/runs/${encodeURIComponent(runId)}/events`;
  let after = options.after ?? 0;
  let failures = 0;
  while (!options.signal?.aborted) {
    try {
      const response = await open(options, "GET", path, undefined, {
        "Last-Event-ID": String(after),
      });
      if (response === null) return; // 204
      for await (const event of read(response, options.signal)) {
        after = Number(event.id);
        failures = 0;
        yield event;
        if (TERMINAL.has(event.event)) return;
      }
      if (options.signal?.aborted) return;
      // the server ended the stream before the run ended (e.g. it shut down): go on elsewhere
    } catch (error) {
      if (options.signal?.aborted) return;
      if (!(error instanceof Dropped)) throw error;
      failures += 1;
      if (failures > (options.reconnects ?? 5)) throw unwrap(error);
      await sleep(Math.min(200 * 2 ** failures, 5_000));
    }
  }
}

/** Ask without streaming: the run, queued (202); follow it with `runEvents` or `getRun`. */
export async function submitAsk(
  sessionId: string,
  body: Omit<AskRequest, "stream">,
  options: AskOptions = {},
): Promise<Run> {
  const headers: Record<string, string> = {};
  if (options.idempotencyKey) headers["Idempotency-Key"] = options.idempotencyKey;
  const path = `/v1/sessions/${encodeURIComponent(sessionId)}/ask`;
  return await submit(options, path, { ...body, stream: false }, headers);
}

/** Compact without streaming: the compaction run, queued (202). */
export async function submitCompaction(
  sessionId: string,
  body: Omit<CompactRequest, "stream"> = {},
  options: StreamOptions = {},
): Promise<Run> {
  const path = `/v1/sessions/${encodeURIComponent(sessionId)}/compact`;
  return await submit(options, path, { ...body, stream: false }, {});
}

async function* startAndFollow(
  path: string,
  body: object,
  headers: Record<string, string>,
  options: StreamOptions,
): AsyncGenerator<RunEvent, void, undefined> {
  let runId: string | undefined;
  let last = 0;
  try {
    const response = await open(options, "POST", path, body, headers);
    if (response === null) return;
    if (response.status === 202) {
      // a repeated Idempotency-Key's run, over and its events gone: nothing to stream
      await response.body?.cancel();
      return;
    }
    for await (const event of read(response, options.signal)) {
      last = Number(event.id);
      if (event.event === "run.created") runId = event.data.run_id;
      yield event;
      if (TERMINAL.has(event.event)) return;
    }
    if (options.signal?.aborted) return;
  } catch (error) {
    if (options.signal?.aborted) return;
    // before run.created nothing says which run: the caller asks again (same Idempotency-Key)
    if (!(error instanceof Dropped) || runId === undefined) throw unwrap(error);
  }
  if (runId !== undefined) yield* runEvents(runId, { ...options, after: last });
}

/** The response of a stream request: null for 204; throws StreamRefused for an error. */
async function open(
  options: StreamOptions,
  method: "GET" | "POST",
  path: string,
  body: object | undefined,
  extraHeaders: Record<string, string>,
): Promise<Response | null> {
  const client = options.client ?? defaultClient;
  const config = client.getConfig();
  const headers = mergeHeaders(config.headers, extraHeaders);
  headers.set("Accept", "text/event-stream");
  await authorize(client, headers);
  if (body !== undefined) headers.set("Content-Type", "application/json");
  const fetchFn = config.fetch ?? globalThis.fetch;
  let response: Response;
  try {
    response = await fetchFn(`${config.baseUrl ?? ""}${path}`, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: options.signal,
    });
  } catch (error) {
    throw new Dropped("the connection failed", { cause: error });
  }
  if (response.status === 204) return null;
  if (response.status === 200 || response.status === 202) return response;
  throw await refusal(response);
}

async function submit(
  options: StreamOptions,
  path: string,
  body: object,
  extraHeaders: Record<string, string>,
): Promise<Run> {
  const client = options.client ?? defaultClient;
  const config = client.getConfig();
  const headers = mergeHeaders(config.headers, extraHeaders);
  headers.set("Content-Type", "application/json");
  await authorize(client, headers);
  const fetchFn = config.fetch ?? globalThis.fetch;
  const response = await fetchFn(`${config.baseUrl ?? ""}${path}`, {
    method: "POST",
    headers,
    body: JSON.stringify(body),
    signal: options.signal,
  });
  if (response.status !== 202) throw await refusal(response);
  return (await response.json()) as Run;
}

async function authorize(client: Client, headers: Headers): Promise<void> {
  const token = await getAuthToken({ scheme: "bearer", type: "http" }, client.getConfig().auth);
  if (token !== undefined && !headers.has("Authorization")) headers.set("Authorization", token);
}

async function refusal(response: Response): Promise<StreamRefused> {
  const text = await response.text();
  try {
    const parsed = JSON.parse(text) as { error?: ErrorBody };
    if (parsed.error?.code) return new StreamRefused(response.status, parsed.error);
  } catch {
    // not JSON: described below
  }
  return new StreamRefused(response.status, {
    code: `http_${response.status}`,
    message: text,
  } as ErrorBody);
}

/**
 * The events of one response, as they arrive. Ends when the server ends the stream or
 * `signal` aborts; a failed read or a minute of silence throws Dropped. Leaving the loop
 * early cancels the body, which closes the connection.
 */
async function* read(
  response: Response,
  signal: AbortSignal | undefined,
): AsyncGenerator<RunEvent, void, undefined> {
  if (response.body === null) throw new Dropped("a stream without a body");
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  const pending: RunEvent[] = [];
  const parser = createParser({
    // comments (`: ping` heartbeats) never reach onEvent
    onEvent(message: EventSourceMessage) {
      pending.push(parse(message));
    },
  });
  const cancel = () => void reader.cancel().catch(() => undefined);
  signal?.addEventListener("abort", cancel, { once: true });
  try {
    for (;;) {
      let chunk: ReadableStreamReadResult<string>;
      let timer: ReturnType<typeof setTimeout> | undefined;
      try {
        chunk = await Promise.race([
          reader.read(),
          new Promise<never>((_, reject) => {
            timer = setTimeout(() => reject(new Dropped("no data for a minute")), READ_TIMEOUT_MS);
          }),
        ]);
      } catch (error) {
        if (signal?.aborted) return;
        throw error instanceof Dropped ? error : new Dropped("the stream broke", { cause: error });
      } finally {
        clearTimeout(timer);
      }
      if (chunk.done) return;
      parser.feed(chunk.value);
      while (pending.length > 0) yield pending.shift() as RunEvent;
    }
  } finally {
    signal?.removeEventListener("abort", cancel);
    cancel();
  }
}

/** One SSE message as the generated event type its `event:` names. */
export function parse(message: EventSourceMessage): RunEvent {
  return {
    id: message.id ?? "",
    event: message.event ?? "message",
    data: JSON.parse(message.data) as unknown,
  } as RunEvent;
}

function unwrap(error: unknown): unknown {
  return error instanceof Dropped && error.cause !== undefined ? error.cause : error;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

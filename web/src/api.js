// The public API, as the page uses it: every call carries the user's key as a Bearer token.

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// The API's address, from the page's own: the page is served at <root>/ui/ and the API at
// <root>/v1/, so a reverse proxy serving Threadline under a path (/chat/ui/) reaches both.
export function apiUrl(path) {
  return new URL(`..${path}`, document.baseURI).href;
}

export function makeApi(key) {
  const auth = { Authorization: `Bearer ${key}` };

  async function call(method, path, body, headers = {}) {
    const response = await fetch(apiUrl(path), {
      method,
      headers: { ...auth, ...(body === undefined ? {} : { "Content-Type": "application/json" }), ...headers },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (response.status === 204) return null;
    const data = await response.json().catch(() => null);
    if (!response.ok) {
      const error = data?.error ?? {};
      throw new ApiError(response.status, error.code ?? "http_error", error.message ?? `HTTP ${response.status}`);
    }
    return data;
  }

  const query = (params) => {
    const search = new URLSearchParams();
    for (const [name, value] of Object.entries(params)) {
      if (value !== undefined && value !== null && value !== "") search.append(name, String(value));
    }
    const text = search.toString();
    return text ? `?${text}` : "";
  };

  return {
    auth,
    models: () => call("GET", "/v1/models"),
    agents: () => call("GET", "/v1/agents"),
    sessions: (params) => call("GET", `/v1/sessions${query(params)}`),
    session: (id) => call("GET", `/v1/sessions/${id}`),
    createSession: (body) => call("POST", "/v1/sessions", body),
    updateSession: (id, body) => call("PATCH", `/v1/sessions/${id}`, body),
    fork: (id, atSeq, title) => call("POST", `/v1/sessions/${id}/fork`, { at_seq: atSeq, title }),
    async entries(id) {
      // Every page, oldest first: the page shows the whole thread.
      const all = [];
      let after = 0;
      for (;;) {
        const page = await call("GET", `/v1/sessions/${id}/entries${query({ after_seq: after, limit: 500 })}`);
        all.push(...page.data);
        if (!page.has_more || page.data.length === 0) return all;
        after = page.data[page.data.length - 1].seq;
      }
    },
    context: (id) => call("GET", `/v1/sessions/${id}/context`),
    search: (id, q) => call("GET", `/v1/sessions/${id}/search${query({ q, limit: 20 })}`),
    compact: (id, focus) =>
      call("POST", `/v1/sessions/${id}/compact`, focus ? { focus } : {}, {
        "Idempotency-Key": `ui-compact-${crypto.randomUUID()}`,
      }),
    waitRun: (id) => call("GET", `/v1/runs/${id}?wait=true&timeout=600`),
    // A ruling on a call the run waits on: {tool_call_id, decision, arguments?, reason?}.
    rule: (runId, ruling) => call("POST", `/v1/runs/${runId}/approvals`, { approvals: [ruling] }),
    steer: (sessionId, message) => call("POST", `/v1/ui/chat/${sessionId}/steer`, { message }),
    // A run's events (SSE) to onEvent(type, data) as they come, up to its terminal one; then the
    // run. Without a stream (events already pruned), the run once it has ended.
    async followRun(id, onEvent) {
      const response = await fetch(apiUrl(`/v1/runs/${id}/events`), { headers: { ...auth, Accept: "text/event-stream" } });
      if (response.ok && response.body) {
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer = (buffer + value).replace(/\r\n/g, "\n");
          let end;
          while ((end = buffer.indexOf("\n\n")) >= 0) {
            const frame = buffer.slice(0, end);
            buffer = buffer.slice(end + 2);
            let type = "message";
            let data = "";
            for (const line of frame.split("\n")) {
              if (line.startsWith("event:")) type = line.slice(6).trim();
              else if (line.startsWith("data:")) data += line.slice(5).trim();
            }
            if (data) onEvent(type, JSON.parse(data));
            if (["run.completed", "run.failed", "run.cancelled"].includes(type)) {
              reader.cancel().catch(() => {});
              return call("GET", `/v1/runs/${id}?wait=true&timeout=600`);
            }
          }
        }
      }
      return call("GET", `/v1/runs/${id}?wait=true&timeout=600`);
    },
    cancelRun: (id) => call("POST", `/v1/runs/${id}/cancel`),
    memories: () => call("GET", "/v1/memory?limit=100"),
    memory: (namespace) => call("GET", `/v1/memory/${encodeURIComponent(namespace)}`),
  };
}

// The journal as chat messages: user and assistant messages, with the tool calls and results
// between them folded into the assistant's turn. Entries a rollback took out of the context
// are left out (the journal keeps them); a summary shows where a compaction replaced history.
export function entriesToMessages(entries) {
  const rolledBack = new Set();
  for (const entry of entries) {
    if (entry.kind === "rollback") {
      for (let seq = entry.payload.from_seq; seq <= entry.payload.to_seq; seq++) rolledBack.add(seq);
    }
  }
  const messages = [];
  let turn = null; // the assistant message being put together
  const assistant = (entry) => {
    if (!turn) {
      // Its id is the run's, as the stream names it: a rejoined stream replaces it.
      const runId = entry.refs.run_id;
      const id = runId && !messages.some((m) => m.id === runId) ? runId : entry.id;
      turn = { id, role: "assistant", parts: [], metadata: { seq: entry.seq } };
      messages.push(turn);
    }
    turn.metadata.seq = entry.seq;
    return turn;
  };
  const toolParts = new Map();
  for (const entry of entries) {
    if (rolledBack.has(entry.seq)) continue;
    const { kind, payload } = entry;
    if (kind === "message" && payload.role === "user" && entry.refs.steer_id && turn && turn.id === entry.refs.run_id) {
      // Sent while the run worked: where the model read it, as the stream showed it.
      turn.parts.push({ type: "steering-message", id: entry.refs.steer_id, parts: contentParts(payload.content) });
    } else if (kind === "message" && payload.role === "user") {
      turn = null;
      messages.push({ id: entry.id, role: "user", parts: contentParts(payload.content), metadata: { seq: entry.seq } });
    } else if (kind === "message" && payload.role === "assistant") {
      const parts = contentParts(payload.content).filter((p) => p.type !== "text" || p.text);
      if (parts.length) assistant(entry).parts.push(...parts);
      if (payload.status === "incomplete") assistant(entry).metadata.incomplete = true;
    } else if (kind === "tool_call") {
      const part = {
        type: "dynamic-tool",
        toolName: payload.name,
        toolCallId: entry.refs.tool_call_id,
        state: "input-available",
        input: payload.arguments,
      };
      toolParts.set(entry.refs.tool_call_id, part);
      assistant(entry).parts.push(part);
    } else if (kind === "tool_result") {
      const part = toolParts.get(entry.refs.tool_call_id);
      assistant(entry);
      if (part) Object.assign(part, { state: "output-available", output: payload.content });
    } else if (kind === "summary") {
      turn = null;
      messages.push({ id: entry.id, role: "system", parts: [{ type: "text", text: textOf(payload.content) }], metadata: { seq: entry.seq, summary: payload } });
    } else if (kind === "error") {
      assistant(entry).parts.push({ type: "data-error", data: payload });
    }
  }
  return messages;
}

// What a reasoning part that the provider redacted (encrypted: no text) carries, as the AI SDK
// stream marks it.
export const REDACTED = { threadline: { redacted: true } };

// A message's stored content as UI message parts, in order: its text, the model's reasoning
// (as app/core/content.py's reasoning_text reads it; a redacted block as an empty part marked
// so), images and documents as file parts.
export function contentParts(content) {
  if (!Array.isArray(content)) return [{ type: "text", text: textOf(content), state: "done" }];
  return content.map(uiPart).filter(Boolean);
}

function uiPart(part) {
  switch (part?.type) {
    case "text":
      return { type: "text", text: part.text, state: "done" };
    case "thinking":
      return { type: "reasoning", text: part.thinking, state: "done" };
    case "redacted_thinking":
      return { type: "reasoning", text: "", state: "done", providerMetadata: REDACTED };
    case "reasoning": // an OpenAI Responses reasoning item: its summary is what can be read
      return { type: "reasoning", text: (part.summary ?? []).map((s) => s.text).filter(Boolean).join("\n\n"), state: "done" };
    case "reasoning_text": // an OpenAI-compatible server's reasoning_content
      return { type: "reasoning", text: part.text, state: "done" };
    case "image_url":
    case "document":
      return { type: "file", mediaType: mediaTypeOf(part.url), filename: part.filename, url: part.url };
    default:
      return null;
  }
}

function mediaTypeOf(url) {
  const match = /^data:([^;,]*)[;,]/.exec(url ?? "");
  return match ? match[1] : "image/*"; // a web URL: only images are given by address
}

function textOf(content) {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content.map((part) => (part.type === "text" ? part.text : part.type === "image" ? "[image]" : "")).join("");
  }
  return content == null ? "" : JSON.stringify(content);
}

// A search excerpt with its <b> marks (from Postgres' ts_headline) as text pieces.
export function excerptPieces(excerpt) {
  return excerpt.split(/(<b>.*?<\/b>)/g).filter(Boolean).map((piece) =>
    piece.startsWith("<b>") ? { mark: true, text: piece.slice(3, -4) } : { mark: false, text: piece },
  );
}

// The run the journal shows started and not ended (an ask or a compaction in progress), or
// null: only then is there an answer for a reloaded page to rejoin.
export function openRun(entries) {
  const open = new Set();
  let last = null;
  for (const entry of entries) {
    if (entry.kind === "run_start") open.add((last = entry.payload.run_id));
    else if (entry.kind === "run_end") open.delete(entry.payload.run_id);
  }
  return last !== null && open.has(last) ? last : null;
}

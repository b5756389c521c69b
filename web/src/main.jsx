import { useChat } from "@ai-sdk/react";
import { DefaultChatTransport, lastAssistantMessageIsCompleteWithApprovalResponses } from "ai";
import { useCallback, useEffect, useMemo, useRef, useState } from "react";
import { createRoot } from "react-dom/client";
import { ApiError, apiUrl, entriesToMessages, excerptPieces, makeApi, openRun } from "./api.js";

// What the composer takes as attachments (sent as file parts; the service reads them as documents).
const ATTACHABLE = ["application/pdf", "text/plain"];

// A picked or dropped file as the AI SDK's file part (its bytes as a data URL).
function filePart(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve({ type: "file", mediaType: file.type, filename: file.name, url: reader.result });
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

const KEY_NAME = "threadline.key";

function storedKey() {
  return sessionStorage.getItem(KEY_NAME) ?? localStorage.getItem(KEY_NAME);
}

function App() {
  const [key, setKey] = useState(storedKey);
  const signOut = () => {
    sessionStorage.removeItem(KEY_NAME);
    localStorage.removeItem(KEY_NAME);
    setKey(null);
  };
  if (!key) return <Login onKey={setKey} />;
  return <Shell apiKey={key} onSignOut={signOut} />;
}

function Login({ onKey }) {
  const [value, setValue] = useState("");
  const [remember, setRemember] = useState(false);
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  const submit = async (event) => {
    event.preventDefault();
    const key = value.trim();
    setBusy(true);
    setError(null);
    try {
      await makeApi(key).models(); // any authenticated call tells a good key from a bad one
      (remember ? localStorage : sessionStorage).setItem(KEY_NAME, key);
      onKey(key);
    } catch (error) {
      setError(error instanceof ApiError && error.status === 401 ? "That key was not accepted." : String(error.message));
    } finally {
      setBusy(false);
    }
  };
  return (
    <main className="login">
      <form onSubmit={submit} aria-labelledby="login-title">
        <h1 id="login-title">Threadline</h1>
        <p>
          Sign in with an API key. <code>make run</code> prints a development key when it starts and keeps it in{" "}
          <code>.threadline/dev-key</code>; <code>threadline keys create --tenant NAME</code> makes others.
        </p>
        <label htmlFor="key">API key</label>
        <input id="key" type="password" autoComplete="off" required value={value} onChange={(e) => setValue(e.target.value)} />
        <label className="check">
          <input type="checkbox" checked={remember} onChange={(e) => setRemember(e.target.checked)} />
          Remember on this device (otherwise until this tab closes)
        </label>
        {error && <p role="alert" className="error">{error}</p>}
        <button type="submit" disabled={busy || !value.trim()}>Sign in</button>
      </form>
    </main>
  );
}

function sessionFromHash() {
  const match = /session=([0-9a-f-]{36})/.exec(location.hash);
  return match ? match[1] : null;
}

function Shell({ apiKey, onSignOut }) {
  const api = useMemo(() => makeApi(apiKey), [apiKey]);
  const [models, setModels] = useState(null);
  const [sessionId, setSessionId] = useState(sessionFromHash);
  const [session, setSession] = useState(null);
  const [listVersion, setListVersion] = useState(0);
  const [version, setVersion] = useState(0); // bumps when the open session's journal changed
  const [rewritten, setRewritten] = useState(0); // bumps when the conversation must be re-read
  const [panel, setPanel] = useState(null); // at phone width: "sessions" or "details" open
  const [error, setError] = useState(null);

  const fail = useCallback(
    (error) => {
      if (error instanceof ApiError && error.status === 401) onSignOut();
      else setError(String(error.message ?? error));
    },
    [onSignOut],
  );

  useEffect(() => {
    api.models().then(setModels, fail);
  }, [api, fail]);
  useEffect(() => {
    // A link to #session=<id> (or the address bar) opens that session.
    const follow = () => setSessionId(sessionFromHash());
    window.addEventListener("hashchange", follow);
    return () => window.removeEventListener("hashchange", follow);
  }, []);

  const open = useCallback((id) => {
    setSessionId(id);
    setPanel(null);
    history.replaceState(null, "", id ? `#session=${id}` : "#");
  }, []);

  useEffect(() => {
    if (!sessionId) return setSession(null);
    let live = true;
    api.session(sessionId).then((s) => live && setSession(s), (e) => {
      if (e instanceof ApiError && e.status === 404) open(null);
      else fail(e);
    });
    return () => {
      live = false;
    };
  }, [api, sessionId, version, fail, open]);

  const quickStart = async () => {
    try {
      const created = await api.createSession({ config: { model: models.default_model } });
      setListVersion((v) => v + 1);
      open(created.id);
    } catch (error) {
      fail(error);
    }
  };

  const changed = useCallback(() => {
    setVersion((v) => v + 1);
    setListVersion((v) => v + 1);
  }, []);

  return (
    <div className={`shell ${panel ? `show-${panel}` : ""}`}>
      <header className="bar">
        <button type="button" className="narrow-only" aria-expanded={panel === "sessions"} aria-controls="sessions" onClick={() => setPanel(panel === "sessions" ? null : "sessions")}>
          Sessions
        </button>
        <h1 className="brand">Threadline</h1>
        <span className="title" aria-live="polite">{session ? session.title || "Untitled session" : ""}</span>
        {session && (
          <button type="button" className="narrow-only" aria-expanded={panel === "details"} aria-controls="details" onClick={() => setPanel(panel === "details" ? null : "details")}>
            Details
          </button>
        )}
        <button type="button" className="quiet" onClick={onSignOut}>Sign out</button>
      </header>
      {error && (
        <p role="alert" className="error banner">
          {error} <button type="button" className="quiet" onClick={() => setError(null)}>Dismiss</button>
        </p>
      )}
      <Sessions api={api} models={models} current={sessionId} onOpen={open} version={listVersion} fail={fail} />
      <main className="chat-area" id="chat">
        {sessionId && session?.id === sessionId ? (
          <Chat key={`${sessionId}:${rewritten}`} api={api} apiKey={apiKey} session={session} onChanged={changed} onOpen={open} fail={fail} />
        ) : (
          <div className="empty">
            {sessionId ? (
              <p>Loading…</p>
            ) : (
              <>
                <p>Choose a session, or start a new one.</p>
                <button type="button" disabled={!models} onClick={quickStart}>
                  New session with the default model
                </button>
              </>
            )}
          </div>
        )}
      </main>
      {session && session.id === sessionId && (
        <Details
          api={api}
          session={session}
          version={version}
          onOpen={open}
          onCompacted={() => {
            setRewritten((v) => v + 1);
            changed();
          }}
          fail={fail}
        />
      )}
    </div>
  );
}

function Sessions({ api, models, current, onOpen, version, fail }) {
  const [q, setQ] = useState("");
  const [list, setList] = useState([]);
  const [cursor, setCursor] = useState(null);
  const [model, setModel] = useState("");
  const [title, setTitle] = useState("");
  const [agents, setAgents] = useState([]);
  const [agent, setAgent] = useState("");

  // The tenant's agents: a session started from one is pinned to its latest version.
  useEffect(() => {
    let live = true;
    api.agents().then((page) => live && setAgents(page.data), fail);
    return () => {
      live = false;
    };
  }, [api, version, fail]);

  useEffect(() => {
    let live = true;
    const timer = setTimeout(() => {
      api.sessions({ q: q.trim(), limit: 30 }).then((page) => {
        if (!live) return;
        setList(page.data);
        setCursor(page.next_cursor);
      }, fail);
    }, q ? 200 : 0);
    return () => {
      live = false;
      clearTimeout(timer);
    };
  }, [api, q, version, fail]);

  const more = async () => {
    try {
      const page = await api.sessions({ q: q.trim(), limit: 30, cursor });
      setList((list) => [...list, ...page.data]);
      setCursor(page.next_cursor);
    } catch (error) {
      fail(error);
    }
  };

  const create = async (event) => {
    event.preventDefault();
    try {
      const chosen = model || models?.default_model;
      const body = agent
        ? { title: title.trim() || null, agent } // the agent's own model and instructions
        : { title: title.trim() || null, config: chosen ? { model: chosen } : {} };
      const created = await api.createSession(body);
      setTitle("");
      setList((list) => [created, ...list]);
      onOpen(created.id);
    } catch (error) {
      fail(error);
    }
  };

  return (
    <aside className="sessions" id="sessions" aria-label="Sessions">
      <form className="new-session" onSubmit={create}>
        <h2>New session</h2>
        <label htmlFor="new-title">Title (optional)</label>
        <input id="new-title" value={title} onChange={(e) => setTitle(e.target.value)} placeholder="From the first message" />
        <label htmlFor="new-agent">Agent</label>
        <select id="new-agent" value={agent} onChange={(e) => setAgent(e.target.value)}>
          <option value="">None: choose a model</option>
          {agents.map((a) => (
            <option key={a.id} value={a.name}>
              {a.name} (v{a.version})
            </option>
          ))}
        </select>
        <label htmlFor="new-model">Model</label>
        {models && <p className="meta hint">The default: {models.default_model}</p>}
        <select id="new-model" disabled={Boolean(agent)} value={model || models?.default_model || ""} onChange={(e) => setModel(e.target.value)}>
          {(models?.data ?? []).map((m) => (
            <option key={m.id} value={m.id}>
              {m.id}
            </option>
          ))}
        </select>
        <button type="submit" disabled={!models}>Start session</button>
      </form>
      <div className="session-list">
        <label htmlFor="session-search">Search sessions</label>
        <input id="session-search" type="search" value={q} onChange={(e) => setQ(e.target.value)} placeholder="Title contains…" />
        <ul>
          {list.map((s) => (
            <li key={s.id}>
              <button type="button" className={`session ${s.id === current ? "current" : ""}`} aria-current={s.id === current ? "page" : undefined} onClick={() => onOpen(s.id)}>
                <span className="session-title">{s.title || "Untitled session"}</span>
                <span className="meta">
                  {s.parent_id ? "branch · " : ""}
                  {new Date(s.created_at).toLocaleString()} · {s.rev} {s.rev === 1 ? "entry" : "entries"}
                </span>
              </button>
            </li>
          ))}
        </ul>
        {list.length === 0 && <p className="meta">{q ? "No session has that in its title." : "No sessions yet."}</p>}
        {cursor && <button type="button" className="quiet" onClick={more}>Older sessions</button>}
      </div>
    </aside>
  );
}

function Chat({ api, apiKey, session, onChanged, onOpen, fail }) {
  const [initial, setInitial] = useState(null);
  useEffect(() => {
    let live = true;
    const loaded = (entries) => live && setInitial({ messages: entriesToMessages(entries), running: openRun(entries) !== null });
    api.entries(session.id).then(loaded, fail);
    return () => {
      live = false;
    };
  }, [api, session.id, fail]);
  if (initial === null) return <div className="empty"><p>Loading the conversation…</p></div>;
  return <Conversation api={api} apiKey={apiKey} session={session} initial={initial.messages} rejoin={initial.running} onChanged={onChanged} onOpen={onOpen} fail={fail} />;
}

function Conversation({ api, apiKey, session, initial, rejoin, onChanged, onOpen, fail }) {
  const transport = useMemo(
    () =>
      new DefaultChatTransport({
        api: apiUrl("/v1/ui/chat"),
        headers: { Authorization: `Bearer ${apiKey}` },
        // The run goes on when the page goes away (a reload rejoins it); Stop cancels it.
        body: { on_disconnect: "continue" },
        // The journal holds the conversation and only the new message is read: the request
        // stays small however long the session is.
        prepareSendMessagesRequest: ({ id, messages, body, trigger, messageId }) => ({
          body: { ...body, id, messages: messages.slice(-1), trigger, messageId },
        }),
      }),
    [apiKey],
  );
  const reload = useRef(null);
  // A message sent while a run streams steers it; one that started a run of its own (the run
  // had ended, or ended before its next turn) is followed once this stream is over.
  const follow = useRef(false);
  const { messages, sendMessage, setMessages, status, stop, error, regenerate, addToolApprovalResponse, resumeStream } = useChat({
    id: session.id,
    messages: initial,
    transport,
    // Once every call waiting for a person is ruled on, the rulings go back and the run goes on.
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
    resume: rejoin, // a run in progress (a reload left it): rejoin its stream
    // The journal's version once a run ends; not while it waits for a person's rulings (the
    // streamed message holds the approval requests).
    onFinish: ({ message }) => message?.parts?.some((p) => p.state === "approval-requested") || reload.current?.(),
    onData: (part) => {
      // The run has started: the user's message is in the journal (the meter, the list).
      if (part.type === "data-threadline-run") onChanged();
      if (part.type === "data-threadline-steered" && part.data?.nextRunId) follow.current = true;
    },
  });
  // A ruling: approve or reject through useChat (the rulings go back with its next request);
  // edited arguments through the API first (the protocol has no place for them), then the
  // same. Returns a problem to show (arguments the tool's schema refuses), or null.
  const rule = async (message, part, { approved, reason, arguments: edited }) => {
    if (edited !== undefined) {
      const runId = message.parts.find((p) => p.type === "data-threadline-run")?.data.runId ?? message.id;
      try {
        await api.rule(runId, { tool_call_id: part.toolCallId, decision: "approve", arguments: edited });
      } catch (error) {
        if (error instanceof ApiError) return error.message;
        throw error;
      }
    }
    await addToolApprovalResponse({ id: part.approval.id, approved, reason });
    return null;
  };
  reload.current = async () => {
    try {
      setMessages(entriesToMessages(await api.entries(session.id)));
    } catch (error) {
      fail(error);
    }
    onChanged();
    if (follow.current) {
      follow.current = false;
      resumeStream(); // the run a steered message started
    }
  };
  const [text, setText] = useState("");
  const [files, setFiles] = useState([]); // attachments for the next message (file parts)
  const [refused, setRefused] = useState(null); // why a file was not attached
  const [dragging, setDragging] = useState(false);
  const picker = useRef(null); // the hidden file input the Attach button opens
  const [stopping, setStopping] = useState(false);
  const busy = status === "submitted" || status === "streaming";
  const end = useRef(null);
  useEffect(() => {
    end.current?.scrollIntoView?.({ block: "end" });
  }, [messages]);
  useEffect(() => {
    if (!busy) setStopping(false);
  }, [busy]);

  const send = async (event) => {
    event.preventDefault();
    const words = text.trim();
    if (!words) return;
    setText("");
    setFiles([]);
    setRefused(null);
    if (busy) {
      // While the answer streams: the run's next model turn sees the message (the stream
      // shows where it landed); with no run left to take it, it starts one.
      try {
        const steered = await api.steer(session.id, { role: "user", parts: [...files, { type: "text", text: words }] });
        if (steered.steer_id === null) follow.current = true;
      } catch (error) {
        fail(error);
      }
      return;
    }
    // An untitled session is named by the service from this first message (data-threadline-run
    // then refreshes the list and the bar).
    sendMessage(files.length ? { text: words, files } : { text: words });
  };

  const attach = async (list) => {
    const chosen = [...(list ?? [])];
    const wrong = chosen.filter((file) => !ATTACHABLE.includes(file.type));
    setRefused(wrong.length ? `Only PDF and plain text files can be attached (not ${wrong.map((f) => f.name).join(", ")}).` : null);
    try {
      const parts = await Promise.all(chosen.filter((file) => ATTACHABLE.includes(file.type)).map(filePart));
      setFiles((shown) => [...shown, ...parts]);
    } catch (error) {
      setRefused(`The file could not be read: ${error?.message ?? error}`);
    }
  };
  const drop = (event) => {
    event.preventDefault();
    setDragging(false);
    attach(event.dataTransfer?.files);
  };

  const runId = useMemo(() => {
    const last = messages[messages.length - 1];
    const part = last?.role === "assistant" ? last.parts.find((p) => p.type === "data-threadline-run") : null;
    return part?.data?.runId ?? null;
  }, [messages]);

  const halt = async () => {
    setStopping(true);
    if (runId) {
      try {
        await api.cancelRun(runId); // the stream then ends with the run's abort
        return;
      } catch {
        // fall through: at least stop listening
      }
    }
    stop();
  };

  const branch = async (seq) => {
    try {
      const fork = await api.fork(session.id, seq, `${session.title || "Untitled session"} (branch at ${seq})`);
      onChanged();
      onOpen(fork.id);
    } catch (error) {
      fail(error);
    }
  };

  const lastAssistant = [...messages].reverse().find((m) => m.role === "assistant");
  // History a compaction summarized: still in the journal, no longer in the model's context.
  const summarizedThrough = Math.max(0, ...messages.filter((m) => m.metadata?.summary).map((m) => m.metadata.summary.to_seq));
  return (
    <>
      <ol className="messages" aria-label="Conversation">
        {messages.length === 0 && <li className="empty"><p>Say something to start. Answers come from {session.config.model}{session.agent ? ` (agent ${session.agent.name}, version ${session.agent.version})` : ""}.</p></li>}
        {messages.map((message) => (
          <Message key={message.id} message={message} summarized={message.role !== "system" && message.metadata?.seq <= summarizedThrough} streaming={busy && message === messages[messages.length - 1] && message.role === "assistant"} onBranch={busy ? null : branch} onRule={rule} />
        ))}
        <li ref={end} aria-hidden="true" className="end" />
      </ol>
      <div className="status" aria-live="polite">
        {status === "submitted" && "Sending…"}
        {status === "streaming" && (stopping ? "Stopping…" : "Answering…")}
        {error && <span className="error">The answer failed: {error.message}</span>}
      </div>
      {(files.length > 0 || refused) && (
        <div className="attachments">
          {files.length > 0 && (
            <ul className="plain" aria-label="Attachments">
              {files.map((file, i) => (
                <li key={i}>
                  <span className="attachment">{file.filename}</span>{" "}
                  <button type="button" className="quiet" aria-label={`Remove ${file.filename}`} onClick={() => setFiles((shown) => shown.filter((_, j) => j !== i))}>
                    Remove
                  </button>
                </li>
              ))}
            </ul>
          )}
          {refused && <p role="alert" className="error">{refused}</p>}
        </div>
      )}
      <form
        className={`composer ${dragging ? "dragging" : ""}`}
        onSubmit={send}
        onDragOver={(e) => {
          e.preventDefault();
          setDragging(true);
        }}
        onDragLeave={() => setDragging(false)}
        onDrop={drop}
      >
        <label htmlFor="message" className="visually-hidden">Message</label>
        <textarea
          id="message"
          rows={2}
          value={text}
          placeholder={busy ? "Tell the running answer something (Enter sends)" : "Message (Enter sends, Shift+Enter for a new line)"}
          onChange={(e) => setText(e.target.value)}
          onKeyDown={(e) => {
            if (e.key === "Enter" && !e.shiftKey && !e.nativeEvent.isComposing) send(e);
          }}
        />
        <button type="button" className="quiet" onClick={() => picker.current?.click()} aria-label="Attach a PDF or text file">
          Attach
        </button>
        <input
          ref={picker}
          type="file"
          hidden
          aria-label="A PDF or text file to attach"
          accept={ATTACHABLE.join(",")}
          multiple
          onChange={(e) => {
            attach(e.target.files);
            e.target.value = "";
          }}
        />
        {busy ? (
          <>
            <button type="submit" disabled={!text.trim()} aria-label="Send to the running answer">Steer</button>
            <button type="button" className="stop" onClick={halt} disabled={stopping}>Stop</button>
          </>
        ) : (
          <>
            <button type="submit" disabled={!text.trim()}>Send</button>
            {lastAssistant && <button type="button" className="quiet" onClick={() => regenerate()}>Regenerate</button>}
          </>
        )}
      </form>
    </>
  );
}

function Message({ message, summarized, streaming, onBranch, onRule }) {
  const seq = message.metadata?.seq;
  const parts = message.parts;
  // A retried model turn: what came before the last reset was voided; the answer follows it.
  const lastReset = parts.findLastIndex((p) => p.type === "data-threadline-reset");
  const voided = lastReset >= 0 ? parts.slice(0, lastReset) : [];
  const shown = lastReset >= 0 ? parts.slice(lastReset + 1) : parts;
  const aborted = message.metadata?.incomplete;
  if (message.role === "system") {
    return (
      <li className="message summary" id={seq ? `msg-${seq}` : undefined}>
        <details>
          <summary>Compacted: entries {message.metadata.summary.from_seq}–{message.metadata.summary.to_seq} summarized{message.metadata.summary.focus ? ` (focus: ${message.metadata.summary.focus})` : ""}</summary>
          <p className="text">{parts[0].text}</p>
        </details>
      </li>
    );
  }
  return (
    <li className={`message ${message.role} ${summarized ? "summarized" : ""}`} id={seq ? `msg-${seq}` : undefined}>
      <div className="who">
        {message.role === "user" ? "You" : "Assistant"}
        {seq ? <span className="meta"> · #{seq}</span> : null}
        {summarized ? <span className="meta"> · summarized</span> : null}
      </div>
      {voided.some((p) => p.type === "text" && p.text) && (
        <details className="retried">
          <summary>Retried: an attempt was voided ({parts[lastReset].data?.reason ?? "retry"})</summary>
          <p className="text superseded">{voided.filter((p) => p.type === "text").map((p) => p.text).join("")}</p>
        </details>
      )}
      <div className="body" aria-live={streaming ? "polite" : undefined} aria-busy={streaming || undefined}>
        {shown.map((part, i) => (
          <Part key={i} part={part} onRule={(ruling) => onRule(message, part, ruling)} />
        ))}
        {aborted && <p className="meta">(stopped: the answer is incomplete)</p>}
      </div>
      {seq && onBranch && (
        <button type="button" className="branch" onClick={() => onBranch(seq)} aria-label={`Branch from message #${seq}`}>
          Branch from here
        </button>
      )}
    </li>
  );
}

// A call waiting for a person: approve, approve with edited arguments, or reject with a reason.
function Approval({ part, onRule }) {
  const [editing, setEditing] = useState(false);
  const [args, setArgs] = useState(JSON.stringify(part.input ?? {}, null, 2));
  const [reason, setReason] = useState("");
  const [problem, setProblem] = useState(null);
  const name = part.toolName ?? part.type.slice(5);
  const approveEdited = async () => {
    let parsed;
    try {
      parsed = JSON.parse(args);
    } catch {
      setProblem("The arguments are not JSON.");
      return;
    }
    setProblem(await onRule({ approved: true, arguments: parsed }));
  };
  return (
    <fieldset className="approval">
      <legend>
        Approve <code>{name}</code>?
      </legend>
      {editing ? (
        <>
          <label htmlFor={`args-${part.toolCallId}`}>Arguments (JSON)</label>
          <textarea id={`args-${part.toolCallId}`} rows={4} value={args} onChange={(e) => setArgs(e.target.value)} />
          <button type="button" onClick={approveEdited}>Approve with these arguments</button>
        </>
      ) : (
        <>
          <pre>{JSON.stringify(part.input, null, 2)}</pre>
          <button type="button" onClick={() => onRule({ approved: true })}>Approve</button>
          <button type="button" className="quiet" onClick={() => setEditing(true)}>Edit arguments</button>
        </>
      )}
      <label htmlFor={`reason-${part.toolCallId}`}>Reason to reject (optional)</label>
      <input id={`reason-${part.toolCallId}`} value={reason} onChange={(e) => setReason(e.target.value)} />
      <button type="button" className="quiet" onClick={() => onRule({ approved: false, reason: reason.trim() || undefined })}>Reject</button>
      {problem && <p role="alert" className="error">{problem}</p>}
    </fieldset>
  );
}

function Part({ part, onRule }) {
  if (part.type === "text") return part.text ? <p className="text">{part.text}</p> : null;
  if (part.type === "reasoning") {
    // The model's thinking, folded: it led to the answer but is not the answer.
    const redacted = part.providerMetadata?.threadline?.redacted;
    return (
      <details className="reasoning">
        <summary>{redacted ? "Reasoning (redacted by the provider)" : part.state === "streaming" ? "Thinking…" : "Reasoning"}</summary>
        {!redacted && <p className="text">{part.text}</p>}
      </details>
    );
  }
  if (part.type === "file") return <p className="attachment">{part.filename ?? part.mediaType}</p>;
  if ((part.type === "dynamic-tool" || part.type.startsWith("tool-")) && part.state === "approval-requested") {
    return <Approval part={part} onRule={onRule} />;
  }
  if (part.type === "dynamic-tool" || part.type.startsWith("tool-")) {
    const name = part.toolName ?? part.type.slice(5);
    const done = part.state === "output-available" || part.state === "output-error";
    return (
      <details className="tool">
        <summary>
          Tool <code>{name}</code> {done ? (part.state === "output-error" ? "failed" : "returned") : "called"}
        </summary>
        <h4>Input</h4>
        <pre>{JSON.stringify(part.input, null, 2)}</pre>
        {done && (
          <>
            <h4>{part.state === "output-error" ? "Error" : "Result"}</h4>
            <pre>{part.state === "output-error" ? part.errorText : JSON.stringify(part.output, null, 2)}</pre>
          </>
        )}
      </details>
    );
  }
  if (part.type === "steering-message") {
    // A message the user sent while the run worked, where the model read it.
    const said = part.parts.filter((p) => p.type === "text").map((p) => p.text).join("\n");
    return <p className="steer"><span className="meta">You, during the answer: </span>{said}</p>;
  }
  if (part.type === "data-error") return <p className="error">Error: {part.data?.message ?? JSON.stringify(part.data)}</p>;
  return null;
}

function Details({ api, session, version, onOpen, onCompacted, fail }) {
  // One reading of GET /context serves the meter and the Compact button (whether there is
  // anything to compact yet).
  const [context, setContext] = useState(null);
  useEffect(() => {
    let live = true;
    api.context(session.id).then((c) => live && setContext(c), fail);
    return () => {
      live = false;
    };
  }, [api, session.id, version, fail]);
  return (
    <aside className="details" id="details" aria-label="Session details">
      <ContextMeter context={context} />
      <Compact api={api} session={session} context={context} onCompacted={onCompacted} fail={fail} />
      <Branches api={api} session={session} version={version} onOpen={onOpen} fail={fail} />
      <HistorySearch api={api} session={session} fail={fail} />
      <MemoryView api={api} session={session} fail={fail} />
    </aside>
  );
}

// The breakdown's segments, which add up to the prompt's tokens: overhead is the reply's
// priming and, for a model counted approximately, the estimate margin.
const SEGMENTS = ["system", "memory", "summary", "tools", "history", "overhead"];

function ContextMeter({ context }) {
  if (!context) return <section aria-label="Context"><h2>Context</h2><p className="meta">Measuring…</p></section>;
  const share = (tokens) => `${Math.min(100, (100 * tokens) / context.budget)}%`;
  const percent = Math.round((100 * context.tokens) / context.budget);
  return (
    <section aria-labelledby="context-title">
      <h2 id="context-title">Context</h2>
      <p>
        The next prompt holds <strong>{context.tokens.toLocaleString()}</strong> of {context.budget.toLocaleString()} tokens ({percent}%) for{" "}
        <code>{context.model}</code>.
      </p>
      <div className="meter" role="img" aria-label={`${percent}% of the context budget used`}>
        {SEGMENTS.map((kind) => (context.breakdown[kind] ? <span key={kind} className={`seg seg-${kind}`} style={{ width: share(context.breakdown[kind]) }} /> : null))}
        <span className="threshold" style={{ left: share(context.threshold_tokens) }} title="Compaction threshold" />
      </div>
      <dl className="legend">
        {SEGMENTS.map((kind) => (
          <div key={kind}>
            <dt><span className={`swatch seg-${kind}`} aria-hidden="true" />{kind}</dt>
            <dd>{(context.breakdown[kind] ?? 0).toLocaleString()}</dd>
          </div>
        ))}
      </dl>
      <p className="meta">
        {context.messages} {context.messages === 1 ? "message" : "messages"} from {context.entries_included} of {context.entries_total} {context.entries_total === 1 ? "entry" : "entries"} · compacts itself past {context.threshold_tokens.toLocaleString()}
        {context.summary_used ? " · a summary stands in for older history" : ""}
      </p>
    </section>
  );
}

// What a compaction run's events say while it works: the Compact section's progress line.
function compactionStep(type, data) {
  const part = data.calls > 1 ? ` (part ${data.call} of ${data.calls})` : "";
  if (type === "context.compacting") return `Compacting entries ${data.from_seq}–${data.to_seq} with ${data.model}…`;
  if (type === "context.compaction_progress") return data.chars ? `Writing the summary${part}: ${data.chars.toLocaleString()} characters so far…` : `Writing the summary${part}…`;
  return null;
}

function Compact({ api, session, context, onCompacted, fail }) {
  const [focus, setFocus] = useState("");
  const [state, setState] = useState(null);
  const [progress, setProgress] = useState(null);
  // Nothing to compact yet (a short chat): the button says why instead of being refused.
  const reason = context && !context.compactable ? context.not_compactable_reason : null;
  const submit = async (event) => {
    event.preventDefault();
    if (reason) return;
    setState("Compacting…");
    try {
      const run = await api.compact(session.id, focus.trim());
      const done = await api.followRun(run.id, (type, data) => setProgress((shown) => compactionStep(type, data) ?? shown));
      setProgress(null);
      setState(done.status === "completed" ? "Compacted: a summary now stands in for older history." : `Compaction ${done.status}${done.error ? `: ${done.error.message}` : ""}`);
      setFocus("");
      onCompacted();
    } catch (error) {
      // A refusal (e.g. nothing to compact after all) is said here, in the service's words.
      if (error instanceof ApiError && error.status === 409) setState(error.message);
      else {
        setState(null);
        fail(error);
      }
    }
  };
  return (
    <section aria-labelledby="compact-title">
      <h2 id="compact-title">Compact</h2>
      <form onSubmit={submit} className="inline">
        <label htmlFor="compact-focus">Focus (optional)</label>
        <input id="compact-focus" value={focus} onChange={(e) => setFocus(e.target.value)} placeholder="What the summary should keep" />
        <button type="submit" disabled={state === "Compacting…" || Boolean(reason)} aria-describedby={reason ? "compact-reason" : undefined}>
          Compact
        </button>
      </form>
      {reason && <p className="meta" id="compact-reason">{reason}</p>}
      {state && <p className="meta" role="status">{state === "Compacting…" && progress ? progress : state}</p>}
    </section>
  );
}

function Branches({ api, session, version, onOpen, fail }) {
  const [children, setChildren] = useState([]);
  const [parent, setParent] = useState(null);
  const [siblings, setSiblings] = useState([]); // the parent's other forks
  useEffect(() => {
    let live = true;
    api.sessions({ parent_id: session.id, limit: 50 }).then((page) => live && setChildren(page.data), fail);
    if (session.parent_id) {
      api.session(session.parent_id).then((p) => live && setParent(p), () => live && setParent(null));
      api.sessions({ parent_id: session.parent_id, limit: 50 }).then((page) => live && setSiblings(page.data.filter((s) => s.id !== session.id)), fail);
    } else {
      setParent(null);
      setSiblings([]);
    }
    return () => {
      live = false;
    };
  }, [api, session.id, session.parent_id, version, fail]);
  return (
    <section aria-labelledby="branches-title">
      <h2 id="branches-title">Branches</h2>
      {parent && (
        <p>
          Branched at #{session.fork_seq} from{" "}
          <button type="button" className="link" onClick={() => onOpen(parent.id)}>{parent.title || "Untitled session"}</button>
        </p>
      )}
      {siblings.length > 0 && (
        <>
          <h3>Other branches of it</h3>
          <ul className="plain">
            {siblings.map((other) => (
              <li key={other.id}>
                <button type="button" className="link" onClick={() => onOpen(other.id)}>{other.title || "Untitled session"}</button>{" "}
                <span className="meta">at #{other.fork_seq}</span>
              </li>
            ))}
          </ul>
        </>
      )}
      {children.length > 0 && parent && <h3>Branches of this one</h3>}
      {children.length > 0 ? (
        <ul className="plain">
          {children.map((child) => (
            <li key={child.id}>
              <button type="button" className="link" onClick={() => onOpen(child.id)}>{child.title || "Untitled session"}</button>{" "}
              <span className="meta">at #{child.fork_seq}</span>
            </li>
          ))}
        </ul>
      ) : (
        !parent && <p className="meta">No branches. “Branch from here” on a message starts one.</p>
      )}
    </section>
  );
}

function HistorySearch({ api, session, fail }) {
  const [q, setQ] = useState("");
  const [hits, setHits] = useState(null);
  const submit = async (event) => {
    event.preventDefault();
    if (!q.trim()) return;
    try {
      setHits((await api.search(session.id, q.trim())).data);
    } catch (error) {
      fail(error);
    }
  };
  const jump = (seq) => {
    const shown = [...document.querySelectorAll(".messages [id^='msg-']")];
    const target = shown.find((el) => Number(el.id.slice(4)) >= seq);
    if (target) {
      target.scrollIntoView({ block: "center" });
      target.classList.add("found");
      setTimeout(() => target.classList.remove("found"), 2000);
    }
  };
  return (
    <section aria-labelledby="search-title">
      <h2 id="search-title">Search history</h2>
      <form onSubmit={submit} className="inline" role="search">
        <label htmlFor="history-q">Words, "a phrase", -not</label>
        <input id="history-q" type="search" value={q} onChange={(e) => setQ(e.target.value)} />
        <button type="submit">Search</button>
      </form>
      {hits && (
        <ul className="plain hits" aria-live="polite">
          {hits.length === 0 && <li className="meta">Nothing found.</li>}
          {hits.map((hit) => (
            <li key={hit.id}>
              <button type="button" className="hit" onClick={() => jump(hit.seq)}>
                <span className="meta">#{hit.seq} · {hit.kind}</span>
                <span>{excerptPieces(hit.excerpt).map((piece, i) => (piece.mark ? <mark key={i}>{piece.text}</mark> : <span key={i}>{piece.text}</span>))}</span>
              </button>
            </li>
          ))}
        </ul>
      )}
    </section>
  );
}

function MemoryView({ api, session, fail }) {
  const [list, setList] = useState(null);
  const [open, setOpen] = useState(session.config.memory_namespace ?? null);
  const [memory, setMemory] = useState(null);
  useEffect(() => {
    api.memories().then((page) => setList(page.data), fail);
  }, [api, fail]);
  useEffect(() => {
    if (!open) return setMemory(null);
    let live = true;
    api.memory(open).then((m) => live && setMemory(m), (e) => live && (e.status === 404 ? setMemory({ namespace: open, content: "" }) : fail(e)));
    return () => {
      live = false;
    };
  }, [api, open, fail]);
  return (
    <section aria-labelledby="memory-title">
      <h2 id="memory-title">Memory</h2>
      <p className="meta">
        {session.config.memory_namespace ? <>This session reads <code>{session.config.memory_namespace}</code>.</> : "This session has no memory namespace."}
      </p>
      {list && list.length > 0 ? (
        <ul className="plain">
          {list.map((m) => (
            <li key={m.namespace}>
              <button type="button" className="link" aria-pressed={open === m.namespace} onClick={() => setOpen(open === m.namespace ? null : m.namespace)}>{m.namespace}</button>{" "}
              <span className="meta">v{m.version} · {m.lines} lines</span>
            </li>
          ))}
        </ul>
      ) : (
        list && <p className="meta">No memory yet.</p>
      )}
      {memory && <pre className="memory" aria-label={`Memory ${memory.namespace}`}>{memory.content || "(empty)"}</pre>}
    </section>
  );
}

createRoot(document.getElementById("root")).render(<App />);

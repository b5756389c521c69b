// Drives Threadline's AI SDK endpoint with the AI SDK's own DefaultChatTransport (what useChat
// uses) and readUIMessageStream (how the AI SDK turns chunks into a message). One scenario per
// run; its results are JSON lines on stdout, for tests/api/test_ui_messages.py to check.
//
//   node chat.mjs '{"api": ".../v1/ui/chat", "key": "...", "chatId": "...", "scenario": "send",
//                   "trigger": "submit-message", "messages": [...]}'
//
// The `ai` package is the one installed where node runs (its working directory): this
// directory's (the current major), or ../ui_chat_js_v5's (the `ai` 5 clients still in use).
import { createRequire } from "node:module";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const here = createRequire(join(process.cwd(), "package.json"));
const {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses, // `ai` 6 on
  lastAssistantMessageIsCompleteWithToolCalls,
  readUIMessageStream,
  validateUIMessages,
} = await import(pathToFileURL(here.resolve("ai")).href);

const args = JSON.parse(process.argv[2]);
const transport = new DefaultChatTransport({
  api: args.api,
  headers: { Authorization: `Bearer ${args.key}`, ...(args.headers ?? {}) },
  body: args.body ?? {},
});

function emit(value) {
  process.stdout.write(`${JSON.stringify(value)}\n`);
}

// Reads a chunk stream to its end: the chunks as sent, and every message snapshot the AI SDK
// rendered from them (the last is the final message).
async function render(stream, onChunk = () => {}) {
  const [forChunks, forMessages] = stream.tee();
  const chunks = [];
  const errors = [];
  const reading = (async () => {
    for await (const chunk of forChunks) {
      chunks.push(chunk);
      onChunk(chunk);
    }
  })();
  const messages = [];
  for await (const message of readUIMessageStream({
    stream: forMessages,
    onError: (error) => errors.push(String(error.message ?? error)),
  })) {
    messages.push(structuredClone(message));
  }
  await reading;
  return { chunks, messages, errors };
}

const send = (signal) =>
  transport.sendMessages({
    chatId: args.chatId,
    messages: args.messages ?? [],
    trigger: args.trigger ?? "submit-message",
    messageId: args.messageId,
    abortSignal: signal,
  });

// useChat's state, without React: @ai-sdk/react's ChatState does the same (a snapshot of each
// message as it is replaced), and its Chat is AbstractChat with that state.
class ChatState {
  messages = [];
  status = "ready";
  error = undefined;
  onChange = () => {};
  pushMessage = (message) => {
    this.messages = this.messages.concat(message);
    this.onChange();
  };
  popMessage = () => {
    this.messages = this.messages.slice(0, -1);
    this.onChange();
  };
  replaceMessage = (index, message) => {
    this.messages = [
      ...this.messages.slice(0, index),
      this.snapshot(message),
      ...this.messages.slice(index + 1),
    ];
    this.onChange();
  };
  snapshot = (value) => structuredClone(value);
}

class Chat extends AbstractChat {
  constructor(options) {
    const state = new ChatState();
    state.messages = options.messages ?? []; // as @ai-sdk/react's state starts
    super({ ...options, state });
    this.chatState = state;
  }
}

// A conversation through the Chat class useChat wraps: `actions` run in order
// ({send: text}, {regenerate: true}, {resume: true}, {send: text, stopOnText: true},
// {edit: text, userIndex: n}).
async function converse(actions) {
  const errors = [];
  // Client-side tools: each call gets args.toolOutputs[name], and useChat sends the outputs
  // back on its own (sendAutomaticallyWhen), as an app would set it up.
  const chat = new Chat({
    id: args.chatId,
    transport,
    onToolCall: ({ toolCall }) => {
      // addToolOutput from `ai` 6 on; `ai` 5 calls it addToolResult.
      (chat.addToolOutput ?? chat.addToolResult).call(chat, {
        tool: toolCall.toolName,
        toolCallId: toolCall.toolCallId,
        output: args.toolOutputs[toolCall.toolName],
      });
    },
    sendAutomaticallyWhen: args.toolOutputs
      ? lastAssistantMessageIsCompleteWithToolCalls
      : args.approvals
        ? lastAssistantMessageIsCompleteWithApprovalResponses
        : undefined,
  });
  // Tool approvals (`ai` 6 on): each call waiting for one gets args.approvals[toolName]
  // ({approved, reason}), as a person clicking approve or reject would; useChat then sends the
  // rulings on its own (sendAutomaticallyWhen).
  async function rule() {
    const waiting = (chat.lastMessage?.parts ?? []).filter((p) => p.state === "approval-requested");
    for (const part of waiting) {
      const ruling = args.approvals[part.type.slice("tool-".length)];
      await chat.addToolApprovalResponse({ id: part.approval.id, ...ruling });
    }
  }
  for (const action of actions) {
    if (action.send !== undefined) {
      if (action.stopOnText) {
        let stopping = false;
        chat.chatState.onChange = () => {
          const last = chat.chatState.messages.at(-1);
          const text = last?.role === "assistant" && last.parts.some((p) => p.type === "text" && p.text !== "");
          if (text && !stopping) {
            stopping = true;
            chat.stop();
          }
        };
      }
      await chat.sendMessage(action.files ? { text: action.send, files: action.files } : { text: action.send });
      chat.chatState.onChange = () => {};
      if (args.approvals && chat.addToolApprovalResponse) await rule();
    } else if (action.edit !== undefined) {
      // useChat's sendMessage({text, messageId}): the user edits one of their messages.
      const edited = chat.messages.filter((m) => m.role === "user")[action.userIndex];
      await chat.sendMessage({ text: action.edit, messageId: edited.id });
    } else if (action.regenerate) {
      await chat.regenerate();
    } else if (action.resume) {
      let told = false;
      chat.chatState.onChange = () => {
        if (!told) {
          told = true;
          emit({ connected: true });
        }
      };
      await chat.resumeStream();
      chat.chatState.onChange = () => {};
    }
    if (action.until !== undefined) {
      // The automatic request runs after sendMessage returns: wait for the text it brings.
      const text = () => (chat.lastMessage?.parts ?? []).filter((p) => p.type === "text");
      while (!(chat.status === "ready" && text().some((p) => p.text === action.until))) {
        if (chat.error) break;
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    }
    if (chat.error) errors.push(String(chat.error.message ?? chat.error));
  }
  return { messages: chat.messages, status: chat.status, errors };
}

switch (args.scenario) {
  case "chat": {
    emit(await converse(args.actions));
    break;
  }
  case "send": {
    emit(await render(await send(undefined)));
    break;
  }
  case "stop": {
    // The user presses stop as soon as the answer starts: useChat's stop() aborts the fetch.
    const controller = new AbortController();
    const stream = await send(controller.signal);
    const chunks = [];
    try {
      for await (const chunk of stream) {
        chunks.push(chunk);
        if (chunk.type === "text-delta") controller.abort();
      }
    } catch (error) {
      if (error.name !== "AbortError") throw error;
    }
    emit({ chunks, aborted: controller.signal.aborted });
    break;
  }
  case "resume": {
    // What useChat({resume: true}) does on load: GET {api}/{chatId}/stream; null is a 204.
    const stream = await transport.reconnectToStream({ chatId: args.chatId });
    if (stream === null) {
      emit({ resumed: false });
      break;
    }
    let told = false;
    const result = await render(stream, () => {
      if (!told) {
        told = true;
        emit({ connected: true });
      }
    });
    emit({ resumed: true, ...result });
    break;
  }
  case "steer": {
    // The user sends a message while the answer streams: once the first tool result shows,
    // the page posts it to {api}/{chatId}/steer (useChat's stream goes on), and says so.
    let steering = null;
    const result = await render(await send(undefined), (chunk) => {
      if (steering === null && chunk.type === "tool-output-available") {
        steering = fetch(`${args.api}/${encodeURIComponent(args.chatId)}/steer`, {
          method: "POST",
          headers: { Authorization: `Bearer ${args.key}`, "Content-Type": "application/json", ...(args.headers ?? {}) },
          body: JSON.stringify({ message: { role: "user", parts: [{ type: "text", text: args.steer }] } }),
        }).then(async (response) => {
          const steered = { status: response.status, body: await response.json() };
          emit({ steered });
          return steered;
        });
      }
    });
    const history = await fetch(`${args.api}/${encodeURIComponent(args.chatId)}/messages`, {
      headers: { Authorization: `Bearer ${args.key}`, ...(args.headers ?? {}) },
    });
    const { messages } = await history.json();
    emit({ ...result, steered: await steering, stored: await validateUIMessages({ messages }) });
    break;
  }
  case "history": {
    // A page's load: the chat's stored messages, checked by the AI SDK as the UI messages it
    // takes (useChat({messages})), then continued with one more message through its Chat.
    const response = await fetch(`${args.api}/${encodeURIComponent(args.chatId)}/messages`, {
      headers: { Authorization: `Bearer ${args.key}` },
    });
    const { messages } = await response.json();
    const valid = await validateUIMessages({ messages });
    const chat = new Chat({ id: args.chatId, transport, messages: valid });
    await chat.sendMessage({ text: args.send });
    const errors = chat.error ? [String(chat.error.message ?? chat.error)] : [];
    emit({ stored: valid, messages: chat.messages, errors });
    break;
  }
  default:
    throw new Error(`unknown scenario ${args.scenario}`);
}

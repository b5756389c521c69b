// The official `openai` package for Node against Threadline's /openai/v1: one scenario, its
// results printed as one JSON line (tests/openai_api/test_node_sdk.py reads it).
import OpenAI from "openai";

const { baseURL, apiKey, model } = JSON.parse(process.argv[2]);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });

const first = await client.responses.create({ model, instructions: "Be brief.", input: "Hi" });

const stream = await client.responses.create({
  model,
  previous_response_id: first.id,
  input: "And then?",
  stream: true,
});
const types = [];
const sequence = [];
let streamed = "";
let completed;
for await (const event of stream) {
  types.push(event.type);
  sequence.push(event.sequence_number);
  if (event.type === "response.output_text.delta") streamed += event.delta;
  if (event.type === "response.completed") completed = event.response;
}

const tools = [
  {
    type: "function",
    name: "get_weather",
    description: "The weather in a city.",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
    strict: false,
  },
];
const asking = await client.responses.create({
  model,
  previous_response_id: completed.id,
  input: "Weather in Oslo?",
  tools,
});
const call = asking.output.find((item) => item.type === "function_call");
const answered = await client.responses.create({
  model,
  previous_response_id: asking.id,
  input: [{ type: "function_call_output", call_id: call.call_id, output: "3 C" }],
  tools,
});

const conversation = await client.conversations.create({
  items: [{ type: "message", role: "user", content: "My name is Ada." }],
});
const inConversation = await client.responses.create({
  model,
  conversation: conversation.id,
  input: "Who am I?",
});
const items = [];
for await (const item of client.conversations.items.list(conversation.id, { order: "asc" })) {
  items.push([item.role, item.content[0].text]);
}

let refused;
try {
  await client.responses.create({ model, input: "Hi", top_p: 0.5 });
} catch (error) {
  refused = { status: error.status, param: error.param, code: error.code };
}

console.log(
  JSON.stringify({
    first: first.output_text,
    types,
    sequence,
    streamed,
    // output_text is the SDK's own convenience on create's result; a streamed response is raw.
    completed: completed.output
      .filter((item) => item.type === "message")
      .flatMap((item) => item.content.map((part) => part.text))
      .join(""),
    call: { name: call.name, arguments: JSON.parse(call.arguments) },
    answered: answered.output_text,
    answeredOutput: answered.output.map((item) => item.type),
    conversation: inConversation.conversation.id === conversation.id,
    items,
    refused,
  }),
);

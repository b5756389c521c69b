// The official `openai` package for Node: a streamed response with reasoning, its reasoning
// events and items printed as one JSON line (tests/openai_api/test_node_sdk.py reads it).
import OpenAI from "openai";

const { baseURL, apiKey, model } = JSON.parse(process.argv[2]);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });

const stream = await client.responses.create({
  model,
  input: "Is 1021 prime?",
  reasoning: { effort: "low", summary: "auto" },
  include: ["reasoning.encrypted_content"],
  stream: true,
});
const types = [];
let summary = "";
let completed;
for await (const event of stream) {
  types.push(event.type);
  if (event.type === "response.reasoning_summary_text.delta") summary += event.delta;
  if (event.type === "response.completed") completed = event.response;
}
const read = await client.responses.retrieve(completed.id);

console.log(
  JSON.stringify({
    types,
    summary,
    output: completed.output.map((item) => item.type),
    reasoning: completed.output[0].summary.map((part) => part.text),
    encrypted: typeof completed.output[0].encrypted_content,
    readBack: read.output.map((item) => [item.type, item.encrypted_content ?? null]),
    answer: read.output_text,
  }),
);

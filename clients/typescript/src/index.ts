// The package: the generated operations and types, the generated client, and the streaming
// helper as `streaming` (its `ask` streams; the generated `ask` is the raw operation).
export * from "./generated/index.js";
export { createClient, createConfig } from "./generated/client/index.js";
export type { Client, Config, Options as RequestOptions } from "./generated/client/index.js";
export { client } from "./generated/client.gen.js";
export * as streaming from "./streaming.js";
export { StreamRefused } from "./streaming.js";

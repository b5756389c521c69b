// `npm run generate` (`make client-typescript` runs it): the client, from the service's OpenAPI document,
// into src/generated (not committed). OPENAPI_DOCUMENT overrides the document's path.
import { fileURLToPath } from "node:url";

import { defineConfig } from "@hey-api/openapi-ts";

export default defineConfig({
  input:
    process.env.OPENAPI_DOCUMENT ??
    fileURLToPath(new URL("../../openapi/openapi.json", import.meta.url)),
  output: "src/generated",
  plugins: ["@hey-api/client-fetch", "@hey-api/typescript", "@hey-api/sdk"],
});

// Builds the page into app/web/static (or the directory given as the first argument):
// index.html, app.css, favicon.svg and app.js, the one bundle. esbuild's output depends only on the
// sources and its version (pinned by package-lock.json): the test rebuilds and compares bytes.
import { build } from "esbuild";
import { copyFileSync, mkdirSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = resolve(process.argv[2] ?? join(here, "..", "app", "web", "static"));
mkdirSync(out, { recursive: true });
await build({
  entryPoints: [join(here, "src", "main.jsx")],
  outfile: join(out, "app.js"),
  bundle: true,
  minify: true,
  format: "iife",
  target: "es2020",
  jsx: "automatic",
  legalComments: "none",
  charset: "utf8",
  define: { "process.env.NODE_ENV": '"production"' },
  logLevel: "warning",
});
for (const name of ["index.html", "app.css", "favicon.svg"]) copyFileSync(join(here, "src", name), join(out, name));

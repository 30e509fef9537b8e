// Copies the built package (dist/*.js), each under a banner saying it is
// generated (scripts/banner.js), into the server's demo assets, where
// `idemgate serve` embeds it for the checkout page (crates/idemgate-server/src/demo/).
// Run with `npm run embed` after changing src/; test/embedded.test.ts fails while
// the copy differs from a fresh build.

import { mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { embedded as copy } from "./banner.js";

const here = dirname(fileURLToPath(import.meta.url));
const dist = resolve(here, "..", "dist");
const embedded = resolve(here, "..", "..", "..", "crates", "idemgate-server", "src", "demo", "idemgate-client");

mkdirSync(embedded, { recursive: true });
for (const stale of readdirSync(embedded)) rmSync(join(embedded, stale));
for (const file of readdirSync(dist).filter((name) => name.endsWith(".js")).sort()) {
  writeFileSync(join(embedded, file), copy(file, readFileSync(join(dist, file), "utf8")));
  console.log(`embedded ${file}`);
}

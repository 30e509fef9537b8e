// The checkout page that `idemgate serve` embeds runs this package as browser
// JavaScript: the generated ES modules are committed under
// crates/idemgate-server/src/demo/idemgate-client/ (so `cargo build` needs no npm).
// This fails while that copy differs from the build of these sources (`npm test`
// builds first): run `npm run embed` and commit the result.

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { embedded as copy } from "../scripts/banner.js";
import { REPO } from "./support.js";

test("the embedded browser build is the build of these sources", () => {
  const dist = join(REPO, "clients", "js", "dist");
  const embedded = join(REPO, "crates", "idemgate-server", "src", "demo", "idemgate-client");
  const built = readdirSync(dist).filter((name) => name.endsWith(".js")).sort();
  const copied = readdirSync(embedded).sort();
  assert.deepEqual(copied, built, "the embedded files are the built modules: run `npm run embed`");
  for (const file of built) {
    assert.equal(
      readFileSync(join(embedded, file), "utf8"),
      copy(file, readFileSync(join(dist, file), "utf8")),
      `${file} differs from a fresh build: run \`npm run embed\` in clients/js and commit the result`,
    );
  }
});

// What `npm pack` would publish: the built modules and their declarations, each
// with its source map, and the TypeScript sources those maps point at — so a
// debugger or an editor's "go to definition" lands in a file that shipped — and
// nothing of the tests or their build. (`npm test` builds dist/ first.)

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { dirname, join, normalize } from "node:path";
import { test } from "node:test";

import { REPO } from "./support.js";

const PACKAGE = join(REPO, "clients", "js");

/** The files `npm pack` would put in the tarball (scripts not run: dist/ is already built). */
function packed(): Set<string> {
  const out = execFileSync("npm", ["pack", "--dry-run", "--json", "--ignore-scripts", "--loglevel=error"], {
    cwd: PACKAGE,
    encoding: "utf8",
  });
  const [pack] = JSON.parse(out) as Array<{ files: Array<{ path: string }> }>;
  return new Set(pack!.files.map((file) => file.path));
}

test("the package ships each module with its map, and the sources the maps name", () => {
  const files = packed();
  const modules = [...files].filter((path) => path.startsWith("dist/") && (path.endsWith(".js") || path.endsWith(".d.ts")));
  assert.ok(modules.includes("dist/index.js") && modules.includes("dist/index.d.ts"), [...files].join(" "));
  for (const module of modules) {
    const map = `${module}.map`;
    assert.ok(files.has(map), `${module} ships without ${map}`);
    const text = readFileSync(join(PACKAGE, module), "utf8");
    assert.ok(text.includes(`sourceMappingURL=${map.slice("dist/".length)}`), `${module} names its map`);
    const { sources } = JSON.parse(readFileSync(join(PACKAGE, map), "utf8")) as { sources: string[] };
    for (const source of sources) {
      const shipped = normalize(join(dirname(module), source));
      assert.ok(files.has(shipped), `${map} points at ${shipped}, which does not ship`);
    }
  }
  const stray = [...files].filter((path) => /^(test|build|scripts|node_modules)\//.test(path) || path.startsWith("tsconfig"));
  assert.deepEqual(stray, [], "nothing of the tests, their build or the embed scripts ships");
});

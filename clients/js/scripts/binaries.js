// The `pretest` step: makes sure the binaries the suite drives exist before any
// test starts, so no test runs a cargo build inside its timeout. With
// IDEMGATE_BIN (and IDEMGATE_RELAY_BIN, or the relay beside IDEMGATE_BIN) it only
// checks them; without it, it builds the missing ones of
// `${CARGO_TARGET_DIR:-<repo>/target}/release` with cargo. test/support.ts then
// only locates them (the same rules) and fails loudly when one is absent.

import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const repo = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const server = process.env["IDEMGATE_BIN"];

if (server) {
  const relay = process.env["IDEMGATE_RELAY_BIN"] ?? join(dirname(server), "idemgate-relay");
  for (const [name, path] of [["IDEMGATE_BIN", server], ["the relay (IDEMGATE_RELAY_BIN)", relay]]) {
    if (!existsSync(path)) {
      console.error(`${name}: ${path} does not exist: build it (cargo build -p idemgate-server --bin idemgate; cargo build -p idemgate-testkit --bin idemgate-relay)`);
      process.exit(1);
    }
  }
} else {
  const release = join(process.env["CARGO_TARGET_DIR"] ? resolve(process.env["CARGO_TARGET_DIR"]) : join(repo, "target"), "release");
  for (const [pkg, name] of [["idemgate-server", "idemgate"], ["idemgate-testkit", "idemgate-relay"]]) {
    if (existsSync(join(release, name))) continue;
    console.error(`# ${join(release, name)} is missing: cargo build --release -p ${pkg} --bin ${name}`);
    const built = spawnSync("cargo", ["build", "--release", "-p", pkg, "--bin", name], { cwd: repo, stdio: "inherit" });
    if (built.status !== 0) {
      console.error(`cargo could not build ${name} (exit ${built.status ?? built.signal})`);
      process.exit(1);
    }
  }
}

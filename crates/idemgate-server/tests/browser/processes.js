// The real things the checkout page's tests drive, each the test's own on a free
// loopback port and killed when the test ends: `idemgate serve` (IDEMGATE_BIN, the
// binary scripts/clients.sh built or was given), the `idemgate-relay` fault relay
// of idemgate-testkit in front of it (IDEMGATE_RELAY_BIN, or beside IDEMGATE_BIN),
// and a counting mock payment gateway behind it.

import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import http from "node:http";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

/** The repository root (this file is crates/idemgate-server/tests/browser/processes.js). */
export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");

/** `${CARGO_TARGET_DIR:-<repo>/target}`. */
export const TARGET = process.env["CARGO_TARGET_DIR"] ? resolve(process.env["CARGO_TARGET_DIR"]) : join(REPO, "target");

const children = new Set();
process.on("exit", () => {
  for (const child of children) child.kill("SIGKILL");
});

/**
 * A built binary of the workspace; never built here (scripts/clients.sh builds
 * them before any suite starts), so a missing one fails the test.
 * @param {"idemgate" | "idemgate-relay"} name
 */
function binary(name) {
  const server = process.env["IDEMGATE_BIN"];
  const given =
    name === "idemgate"
      ? server
      : (process.env["IDEMGATE_RELAY_BIN"] ?? (server ? join(dirname(server), "idemgate-relay") : undefined));
  const path = given ?? join(TARGET, "release", name);
  if (!existsSync(path)) {
    throw new Error(`${path} does not exist: run scripts/clients.sh browser, or set IDEMGATE_BIN (and IDEMGATE_RELAY_BIN) to built binaries`);
  }
  return path;
}

/** A counting mock payment gateway: approves each `POST /charges`, after `delayMs`. */
export class MockGateway {
  /** @type {Array<string | undefined>} each call's Idempotency-Key */
  calls = [];
  delayMs = 0;

  /** @param {import("node:test").TestContext} t */
  static async start(t) {
    const gateway = new MockGateway();
    const server = http.createServer((request, response) => {
      request.resume();
      request.on("end", () => {
        const key = request.headers["idempotency-key"];
        gateway.calls.push(typeof key === "string" ? key : undefined);
        const id = `ch_${gateway.calls.length}`;
        setTimeout(() => {
          response.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ id, status: "succeeded" }));
        }, gateway.delayMs);
      });
    });
    await new Promise((done) => server.listen(0, "127.0.0.1", () => done(undefined)));
    t.after(() => {
      server.closeAllConnections();
      server.close();
    });
    const address = /** @type {import("node:net").AddressInfo} */ (server.address());
    gateway.url = `http://127.0.0.1:${address.port}`;
    return gateway;
  }

  /** @type {string} */
  url = "";
}

/** A running `idemgate serve` on a fresh SQLite file, paying through `gateway`. */
export class Server {
  /** @param {string} addr */
  constructor(addr) {
    this.addr = addr;
  }

  /**
   * @param {import("node:test").TestContext} t
   * @param {MockGateway} gateway
   * @param {string[]} [args] more flags
   */
  static async start(t, gateway, args = []) {
    const dir = mkdtempSync(join(tmpdir(), "idemgate-browser-"));
    const child = spawn(
      binary("idemgate"),
      ["serve", "--listen", "127.0.0.1:0", "--database", `sqlite://${join(dir, "orders.db")}`, "--wait-ms", "0", "--gateway-url", gateway.url, ...args],
      {
        env: { PATH: process.env["PATH"] ?? "", HOME: process.env["HOME"] ?? "/tmp", RUST_LOG: "info", NO_COLOR: "1" },
        stdio: ["ignore", "ignore", "pipe"],
      },
    );
    children.add(child);
    t.after(() => {
      child.kill("SIGKILL");
      children.delete(child);
      rmSync(dir, { recursive: true, force: true });
    });
    const marker = "listening on http://";
    const addr = await new Promise((resolveAddr, reject) => {
      const timer = setTimeout(() => reject(new Error("idemgate serve did not listen within 30 s")), 30_000);
      createInterface({ input: /** @type {import("node:stream").Readable} */ (child.stderr) }).on("line", (line) => {
        const at = line.indexOf(marker);
        if (at >= 0) {
          clearTimeout(timer);
          resolveAddr(line.slice(at + marker.length).split(/\s/)[0]);
        } else if (/ERROR|WARN/.test(line)) {
          console.error(`# [idemgate] ${line}`);
        }
      });
      child.on("exit", (code) => {
        clearTimeout(timer);
        reject(new Error(`idemgate serve exited with ${code} before listening`));
      });
    });
    return new Server(/** @type {string} */ (addr));
  }

  /**
   * The orders of `token`, straight from the server (not through the relay).
   * @param {string} token
   * @returns {Promise<Array<Record<string, unknown>>>}
   */
  async orders(token) {
    const get = () => fetch(`http://${this.addr}/api/v1/orders`, { headers: { authorization: `Bearer ${token}` } });
    // A GET is safe to send again: with a short --idle-timeout-ms the server may
    // close the kept-alive connection fetch is about to reuse ("fetch failed").
    const response = await get().catch(() => get());
    if (response.status !== 200) throw new Error(`listing orders: ${response.status}`);
    return (await response.json()).orders;
  }
}

/** The `idemgate-relay` process in front of a server, driven over its standard input. */
export class Relay {
  /**
   * @param {string} addr
   * @param {import("node:child_process").ChildProcess} child
   * @param {AsyncIterator<string>} answers
   */
  constructor(addr, child, answers) {
    this.addr = addr;
    this.child = child;
    this.answers = answers;
  }

  /**
   * @param {import("node:test").TestContext} t
   * @param {string} upstream
   */
  static async start(t, upstream) {
    const child = spawn(binary("idemgate-relay"), [upstream], { stdio: ["pipe", "pipe", "inherit"] });
    children.add(child);
    t.after(() => {
      child.stdin?.end(); // it exits when its input closes
      child.kill("SIGKILL");
      children.delete(child);
    });
    const answers = createInterface({ input: /** @type {import("node:stream").Readable} */ (child.stdout) })[Symbol.asyncIterator]();
    const first = await answers.next();
    const addr = first.done ? undefined : JSON.parse(first.value).listening;
    if (addr === undefined) throw new Error(`idemgate-relay did not start: ${JSON.stringify(first.value)}`);
    return new Relay(addr, child, answers);
  }

  /** @param {string} path */
  url(path) {
    return `http://${this.addr}${path}`;
  }

  /** @param {string} line */
  async command(line) {
    this.child.stdin?.write(`${line}\n`);
    const answer = await this.answers.next();
    if (answer.done) throw new Error("idemgate-relay exited");
    const parsed = JSON.parse(answer.value);
    if (parsed.error !== undefined) throw new Error(`idemgate-relay refused ${line}: ${parsed.error}`);
    return parsed;
  }

  /**
   * The next `count` requests of `method` get `fault` (`idemgate_testkit::relay::Fault`'s words).
   * @param {string} fault
   * @param {number} count
   * @param {string} method
   */
  async faultRequests(fault, count, method) {
    for (let i = 0; i < count; i++) await this.command(`request ${fault} ${method}`);
  }

  /** @returns {Promise<{ connections: number, forwarded: number, requests: number, open: number }>} */
  async stats() {
    return await this.command("stats");
  }
}

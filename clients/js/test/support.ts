// The real things the suite drives: the `idemgate` binary (`serve`, `proxy`), the
// `idemgate-relay` fault relay of idemgate-testkit between the client and the
// server, and a counting mock payment gateway (the one external party, so the one
// mock). Every process is the test's own, on a free loopback port, and is killed
// when the test ends.

import { spawn, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import type { TestContext } from "node:test";
import { fileURLToPath } from "node:url";

/** The repository root (this file runs from clients/js/build/test/). */
export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");

/** The order every test places unless it says otherwise. */
export const ORDER = { items: [{ id: 42, quantity: 1 }], currency: "RUB", amount: 1500 };

const children = new Set<ChildProcess>();
process.on("exit", () => {
  for (const child of children) child.kill("SIGKILL");
});

/**
 * A binary of the workspace: `IDEMGATE_BIN` for the server (the README's test
 * command sets it), `IDEMGATE_RELAY_BIN` or the relay beside `IDEMGATE_BIN` for the
 * relay; without them `${CARGO_TARGET_DIR:-target}/release/…`. The `pretest` step
 * (scripts/binaries.js) builds those; a test never does, it fails here instead.
 */
export function binary(name: "idemgate" | "idemgate-relay"): string {
  const server = process.env["IDEMGATE_BIN"];
  let chosen: string | undefined;
  if (name === "idemgate") {
    chosen = server;
  } else {
    chosen = process.env["IDEMGATE_RELAY_BIN"] ?? (server ? join(dirname(server), "idemgate-relay") : undefined);
  }
  if (chosen === undefined) {
    const target = process.env["CARGO_TARGET_DIR"] ? resolve(process.env["CARGO_TARGET_DIR"]) : join(REPO, "target");
    chosen = join(target, "release", name);
  }
  if (!existsSync(chosen)) {
    throw new Error(
      `${chosen} does not exist: run the suite with \`npm test\` (its pretest builds target/release), ` +
        "or set IDEMGATE_BIN (and IDEMGATE_RELAY_BIN) to built binaries",
    );
  }
  return chosen;
}

/** Spawns `command` and resolves with the address its stderr names after `marker` (`… listening on http://ADDR`). */
async function spawnListening(
  command: string,
  args: string[],
  marker: string,
  env: Record<string, string> = {},
): Promise<{ child: ChildProcess; addr: string }> {
  const child = spawn(command, args, {
    env: { PATH: process.env["PATH"] ?? "", HOME: process.env["HOME"] ?? "/tmp", RUST_LOG: "info", NO_COLOR: "1", ...env },
    stdio: ["ignore", "ignore", "pipe"],
  });
  children.add(child);
  child.on("exit", () => children.delete(child));
  const lines = createInterface({ input: child.stderr! });
  return await new Promise((resolvePromise, reject) => {
    const timer = setTimeout(() => reject(new Error(`${command} did not listen within 30 s`)), 30_000);
    let listening = false;
    lines.on("line", (line) => {
      const at = line.indexOf(marker);
      if (!listening && at >= 0) {
        listening = true;
        clearTimeout(timer);
        resolvePromise({ child, addr: line.slice(at + marker.length).split(/\s/)[0]! });
      } else if (/ERROR|WARN/.test(line)) {
        console.error(`# [${command.split("/").pop()}] ${line}`);
      }
    });
    child.on("exit", (code) => {
      if (!listening) {
        clearTimeout(timer);
        reject(new Error(`${command} exited with ${code} before listening`));
      }
    });
  });
}

/** One call as the mock gateway saw it. */
export interface Charge {
  readonly key: string | undefined;
  readonly body: unknown;
}

/**
 * A counting mock payment gateway: `POST /charges` approves (deduplicated by its
 * `Idempotency-Key`, as a real gateway does), after `delayMs`; `failNext(status)`
 * charges and then answers `status` anyway (the worst case).
 */
export class MockGateway {
  readonly calls: Charge[] = [];
  readonly #charges = new Map<string, string>();
  readonly #failures: number[] = [];
  delayMs = 0;
  #server: http.Server;

  private constructor(server: http.Server) {
    this.#server = server;
  }

  static async start(t: TestContext): Promise<MockGateway> {
    const server = http.createServer();
    const gateway = new MockGateway(server);
    server.on("request", (request, response) => gateway.#charge(request, response));
    await new Promise<void>((done) => server.listen(0, "127.0.0.1", done));
    t.after(() => {
      server.closeAllConnections();
      server.close();
    });
    return gateway;
  }

  get url(): string {
    return `http://127.0.0.1:${(this.#server.address() as AddressInfo).port}`;
  }

  /** Distinct charges made (calls with one Idempotency-Key count once). */
  get distinctCharges(): number {
    return this.#charges.size;
  }

  /** The next call charges, then answers `status`. */
  failNext(status: number): void {
    this.#failures.push(status);
  }

  #charge(request: http.IncomingMessage, response: http.ServerResponse): void {
    const chunks: Buffer[] = [];
    request.on("data", (chunk: Buffer) => chunks.push(chunk));
    request.on("end", () => {
      const header = request.headers["idempotency-key"];
      const key = typeof header === "string" ? header : undefined;
      this.calls.push({ key, body: JSON.parse(Buffer.concat(chunks).toString("utf8")) });
      const dedup = key ?? `no-key-${randomUUID()}`;
      if (!this.#charges.has(dedup)) this.#charges.set(dedup, `ch_${this.#charges.size + 1}`);
      const failure = this.#failures.shift();
      setTimeout(() => {
        if (failure !== undefined) {
          response.writeHead(failure).end("gateway trouble");
        } else {
          response.writeHead(200, { "content-type": "application/json" });
          response.end(JSON.stringify({ id: this.#charges.get(dedup), status: "succeeded" }));
        }
      }, this.delayMs);
    });
  }
}

/** One execution's streamed answer, written by the test as it goes. */
export interface Produced {
  /** Writes `text` as one chunk of the body (an event, say): it leaves at once. */
  send(text: string): void;
  /** Ends the stream cleanly (the last chunk). */
  end(): void;
  /** Breaks it off: the connection is destroyed mid-stream. */
  cut(): void;
}

/**
 * A mock of an external streaming API (an LLM's chat completions) with no
 * idempotency of its own: every request is one execution, counted, and answered
 * `200 text/event-stream`, chunked, with what the test writes on that
 * execution's {@link Produced}, when it writes it.
 */
export class StreamingApi {
  executions = 0;
  readonly #server: http.Server;
  /** Executions not yet taken by the test, and the test's waits for the next one. */
  readonly #started: Produced[] = [];
  readonly #waiting: Array<(produced: Produced) => void> = [];

  private constructor(server: http.Server) {
    this.#server = server;
  }

  static async start(t: TestContext): Promise<StreamingApi> {
    const server = http.createServer();
    const api = new StreamingApi(server);
    server.on("request", (request, response) => api.#execute(request, response));
    await new Promise<void>((done) => server.listen(0, "127.0.0.1", done));
    t.after(() => {
      server.closeAllConnections();
      server.close();
    });
    return api;
  }

  get url(): string {
    return `http://127.0.0.1:${(this.#server.address() as AddressInfo).port}`;
  }

  /** The next execution's answer (in arrival order), once its request arrived and its head left. */
  nextExecution(): Promise<Produced> {
    const started = this.#started.shift();
    if (started !== undefined) return Promise.resolve(started);
    return new Promise((resolvePromise) => this.#waiting.push(resolvePromise));
  }

  #execute(request: http.IncomingMessage, response: http.ServerResponse): void {
    request.resume();
    request.on("end", () => {
      this.executions += 1;
      response.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
      response.flushHeaders();
      const produced: Produced = {
        send: (text) => void response.write(text),
        end: () => void response.end(),
        cut: () => void response.socket?.destroy(),
      };
      const waiting = this.#waiting.shift();
      if (waiting !== undefined) waiting(produced);
      else this.#started.push(produced);
    });
  }
}

/** How to start `idemgate serve`. */
export interface ServerOptions {
  /** The mock gateway; without it the built-in simulated one. */
  readonly gateway?: MockGateway;
  /** `--lease` seconds (default 30). */
  readonly leaseSeconds?: number;
  /** More flags. */
  readonly args?: readonly string[];
}

/** A running `idemgate serve` on a fresh SQLite file. */
export class Server {
  readonly addr: string;

  private constructor(addr: string) {
    this.addr = addr;
  }

  static async start(t: TestContext, options: ServerOptions = {}): Promise<Server> {
    const dir = mkdtempSync(join(tmpdir(), "idemgate-js-"));
    const args = [
      "serve",
      "--listen",
      "127.0.0.1:0",
      "--database",
      `sqlite://${join(dir, "orders.db")}`,
      "--lease",
      String(options.leaseSeconds ?? 30),
      "--wait-ms",
      "0",
      ...(options.gateway ? ["--gateway-url", options.gateway.url] : []),
      ...(options.args ?? []),
    ];
    const { child, addr } = await spawnListening(binary("idemgate"), args, "listening on http://");
    t.after(() => {
      child.kill("SIGKILL");
      rmSync(dir, { recursive: true, force: true });
    });
    return new Server(addr);
  }

  url(path: string): string {
    return `http://${this.addr}${path}`;
  }

  /** The orders of `token`, straight from the server (not through the relay). */
  async orders(token: string): Promise<Array<Record<string, unknown>>> {
    const get = () => fetch(this.url("/api/v1/orders"), { headers: { authorization: `Bearer ${token}` } });
    // A GET is safe to send again: with a short --idle-timeout-ms the server may
    // close the kept-alive connection fetch is about to reuse ("fetch failed").
    const response = await get().catch(() => get());
    if (response.status !== 200) throw new Error(`listing orders: ${response.status}`);
    return ((await response.json()) as { orders: Array<Record<string, unknown>> }).orders;
  }
}

/** `idemgate proxy` in front of `upstream`, on a memory store; `args`: more flags (`--config`, …). */
export async function startProxy(t: TestContext, upstream: string, args: readonly string[] = []): Promise<string> {
  const { child, addr } = await spawnListening(
    binary("idemgate"),
    [
      "proxy",
      "--upstream",
      upstream,
      "--listen",
      "127.0.0.1:0",
      "--admin-listen",
      "127.0.0.1:0",
      "--idempotency-store",
      "memory",
      ...args,
    ],
    "proxy listening on http://",
    { IDEMGATE_PRINCIPAL_SECRET: "js-client-suite-secret" },
  );
  t.after(() => child.kill("SIGKILL"));
  return addr;
}

/** What the relay counted. */
export interface RelayStats {
  /** Connections accepted. */
  readonly connections: number;
  /** Connections whose request bytes reached the server. */
  readonly forwarded: number;
  /** Requests received, on new and reused connections: the attempts. */
  readonly requests: number;
  /** Client connections open now. */
  readonly open: number;
}

/**
 * A fault the relay applies: see `idemgate_testkit::relay::Fault`. `cutAfter`:
 * the answer's head and that many bytes of its body (the raw bytes, chunked
 * framing and all) pass as they arrive, then the connection closes.
 */
export type Fault =
  | "pass"
  | "lose-response"
  | "reset"
  | "cut-body"
  | { delayMs: number }
  | { trickleMs: number }
  | { cutAfter: number };

/** The `idemgate-relay` process in front of a server, driven over its standard input. */
export class Relay {
  readonly addr: string;
  readonly #child: ChildProcess;
  readonly #answers: AsyncIterator<string>;

  private constructor(addr: string, child: ChildProcess, answers: AsyncIterator<string>) {
    this.addr = addr;
    this.#child = child;
    this.#answers = answers;
  }

  static async start(t: TestContext, upstream: string): Promise<Relay> {
    const child = spawn(binary("idemgate-relay"), [upstream], { stdio: ["pipe", "pipe", "inherit"] });
    children.add(child);
    t.after(() => {
      child.stdin!.end(); // it exits when its input closes
      child.kill("SIGKILL");
    });
    const answers = createInterface({ input: child.stdout! })[Symbol.asyncIterator]();
    const first = await answers.next();
    const addr = first.done ? undefined : (JSON.parse(first.value) as { listening?: string }).listening;
    if (addr === undefined) throw new Error(`idemgate-relay did not start: ${JSON.stringify(first.value)}`);
    return new Relay(addr, child, answers);
  }

  url(path: string): string {
    return `http://${this.addr}${path}`;
  }

  async #command(line: string): Promise<unknown> {
    this.#child.stdin!.write(`${line}\n`);
    const answer = await this.#answers.next();
    if (answer.done) throw new Error("idemgate-relay exited");
    const parsed = JSON.parse(answer.value) as { error?: string };
    if (parsed.error !== undefined) throw new Error(`idemgate-relay refused ${line}: ${parsed.error}`);
    return parsed;
  }

  /** The next `count` requests (of `method`, if given) get `fault`, on any connection. */
  async faultRequests(fault: Fault, count = 1, method?: string): Promise<void> {
    for (let i = 0; i < count; i++) {
      await this.#command(`request ${faultWords(fault)}${method ? ` ${method}` : ""}`);
    }
  }

  /** The next new connection gets `fault`. */
  async faultConnection(fault: Fault): Promise<void> {
    await this.#command(`connection ${faultWords(fault)}`);
  }

  async stats(): Promise<RelayStats> {
    return (await this.#command("stats")) as RelayStats;
  }
}

function faultWords(fault: Fault): string {
  if (typeof fault === "string") return fault;
  if ("delayMs" in fault) return `delay ${fault.delayMs}`;
  if ("trickleMs" in fault) return `trickle ${fault.trickleMs}`;
  return `cut-after ${fault.cutAfter}`;
}

/** A fresh bearer token: a principal of its own, so tests share nothing. */
export function freshToken(): string {
  return `token-${randomUUID()}`;
}

/** The gateway, the server in front of it, the relay in front of that, and a token. */
export interface Setup {
  readonly gateway: MockGateway;
  readonly server: Server;
  readonly relay: Relay;
  readonly token: string;
}

export async function setup(t: TestContext, options: Omit<ServerOptions, "gateway"> = {}): Promise<Setup> {
  const gateway = await MockGateway.start(t);
  const server = await Server.start(t, { ...options, gateway });
  const relay = await Relay.start(t, server.addr);
  return { gateway, server, relay, token: freshToken() };
}

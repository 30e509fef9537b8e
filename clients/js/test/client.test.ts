// The package against the real `idemgate serve` binary, over real HTTP, through the
// fault relay: in-flight duplicates, changed bodies, resumed operations, a shed
// connection's 503, a replayed 5xx, aborts — with the orders (from the server) and
// the charges (the counting mock gateway) asserted after each. The scenarios one
// request and the relay's faults make are clients/scenarios.json's
// (test/scenarios.test.ts). Node's fetch pools its connections, so the relay
// counts requests, not connections.

import assert from "node:assert/strict";
import net from "node:net";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";

import {
  AbortedError,
  BodyNotReplayableError,
  Client,
  InProgressError,
  KeyReusedError,
  Operation,
  RejectedError,
  TransportError,
  operation,
  retryPolicy,
  type RetryPolicy,
} from "../src/index.js";
import { ORDER, Relay, setup, startProxy, type Setup } from "./support.js";

/** Short waits, so the suite stays fast; the rules are the defaults'. */
function quick(changes: Partial<RetryPolicy> = {}): RetryPolicy {
  return retryPolicy({ minBackoffMs: 20, maxBackoffMs: 200, ...changes });
}

function client(s: Setup, policy: RetryPolicy = quick()): Client {
  return new Client({ baseUrl: s.relay.url("/"), headers: { authorization: `Bearer ${s.token}` }, policy });
}

const TIMEOUT = { timeout: 60_000 };

/**
 * The first attempt of `pay`, sent straight to the server (not through the
 * relay) and still running when this returns, 300 ms later: its answer, read whole.
 */
async function firstAttempt(s: Setup, pay: Operation): Promise<{ answer: Promise<{ status: number; body: Uint8Array }> }> {
  const answer = fetch(s.server.url("/api/v1/orders"), {
    method: "POST",
    headers: { authorization: `Bearer ${s.token}`, "idempotency-key": pay.key, "content-type": "application/json" },
    body: JSON.stringify(ORDER),
  }).then(async (r) => ({ status: r.status, body: new Uint8Array(await r.arrayBuffer()) }));
  await new Promise((done) => setTimeout(done, 300));
  return { answer };
}

test("a duplicate while the first runs waits out the 409's Retry-After and gets the replay", TIMEOUT, async (t) => {
  // The gateway takes 1.5 s; a 2 s lease makes the 409's Retry-After short enough to honour here.
  const s = await setup(t, { leaseSeconds: 2 });
  s.gateway.delayMs = 1_500;
  const pay = operation();
  const { answer: first } = await firstAttempt(s, pay);
  const started = performance.now();
  const reports: Array<number | undefined> = [];
  const duplicate = await client(s).send(Operation.resume(pay.key), {
    url: "/api/v1/orders",
    json: ORDER,
    onAttempt: (a) => reports.push(a.status),
  });
  const waited = performance.now() - started;
  const original = await first;
  assert.equal(original.status, 201);
  assert.equal(duplicate.status, 201);
  assert.equal(duplicate.replayed, true);
  assert.deepEqual(duplicate.body, original.body, "the replay is the first's answer, byte for byte");
  assert.equal(reports[0], 409, "a 409 first");
  assert.equal(reports.at(-1), 201, "then the replay");
  assert.equal((await s.relay.stats()).requests, duplicate.attempts);
  assert.ok(waited >= 900, `Retry-After (at least 1 s) was honoured, not hammered: ${waited} ms`);
  assert.equal((await s.server.orders(s.token)).length, 1);
  assert.equal(s.gateway.calls.length, 1);
});

test("a 409 whose Retry-After ends past the deadline is InProgressError, without waiting", TIMEOUT, async (t) => {
  const s = await setup(t);
  s.gateway.delayMs = 3_000;
  const pay = operation();
  const { answer: first } = await firstAttempt(s, pay);
  const error = await client(s, quick({ deadlineMs: 800 }))
    .send(pay, { url: "/api/v1/orders", json: ORDER })
    .then(() => assert.fail("the first attempt still runs"), (e: unknown) => e);
  assert.ok(error instanceof InProgressError, String(error));
  assert.ok(error.retryAfter !== undefined && error.retryAfter >= 1_000, `${error.retryAfter}`);
  assert.equal(error.problem.type, "/problems/in-progress");
  assert.equal(error.mayHaveRun, true);
  assert.equal(error.attempts, 1, "a Retry-After past the deadline is not waited for");
  assert.equal((await s.relay.stats()).requests, 1);
  assert.equal((await first).status, 201);
  assert.equal((await s.server.orders(s.token)).length, 1);
});

test("a changed body under the same key is KeyReusedError, never retried", TIMEOUT, async (t) => {
  const s = await setup(t);
  const c = client(s);
  const pay = operation();
  assert.equal((await c.send(pay, { url: "/api/v1/orders", json: ORDER })).status, 201);
  const tampered = { items: [{ id: 42, quantity: 2 }], currency: "RUB", amount: 3000 };
  const error = await c.send(pay, { url: "/api/v1/orders", json: tampered }).then(
    () => assert.fail("same key, other body"),
    (e: unknown) => e,
  );
  assert.ok(error instanceof KeyReusedError, String(error));
  assert.equal(error.problem.status, 422);
  assert.equal(error.problem.type, "/problems/key-reused");
  assert.ok(error.problem.title && error.problem.detail);
  assert.equal(error.mayHaveRun, false, "this request was not run");
  assert.equal(error.attempts, 1);
  assert.equal((await s.relay.stats()).requests, 2, "one attempt each: a 422 is final");
  assert.equal((await s.server.orders(s.token)).length, 1);
  assert.equal(s.gateway.calls.length, 1);
});

test("maxRetries 0 is exactly one attempt, and the operation resumes later", TIMEOUT, async (t) => {
  const s = await setup(t);
  await s.relay.faultRequests("lose-response");
  const pay = operation();
  const saved = pay.key; // what a page keeps in sessionStorage
  const error = await client(s, quick({ maxRetries: 0 }))
    .send(pay, { url: "/api/v1/orders", json: ORDER })
    .then(() => assert.fail("one attempt, and its answer was lost"), (e: unknown) => e);
  assert.ok(error instanceof TransportError, String(error));
  assert.equal(error.mayHaveRun, true, "it was sent: it may have run (it did)");
  assert.equal((await s.relay.stats()).requests, 1, "maxRetries 0 is one attempt");
  const reply = await client(s).send(Operation.resume(saved), { url: "/api/v1/orders", json: ORDER });
  assert.equal(reply.replayed, true, "the resumed operation gets the first outcome");
  assert.equal((await s.server.orders(s.token)).length, 1);
  assert.equal(s.gateway.distinctCharges, 1);
});

test("a stream body is refused before anything is sent", TIMEOUT, async (t) => {
  const s = await setup(t);
  const stream = new ReadableStream<Uint8Array>({
    start(controller) {
      controller.enqueue(new TextEncoder().encode(JSON.stringify(ORDER)));
      controller.close();
    },
  });
  const error = await client(s)
    .send(operation(), { url: "/api/v1/orders", body: stream, headers: { "content-type": "application/json" } })
    .then(() => assert.fail("a stream cannot be replayed"), (e: unknown) => e);
  assert.ok(error instanceof BodyNotReplayableError, String(error));
  assert.equal(error.mayHaveRun, false);
  assert.equal((await s.relay.stats()).connections, 0, "refused before the first attempt");
});

test("a 503 with Retry-After is waited out, then retried", TIMEOUT, async (t) => {
  // One connection allowed: while the test holds it busy with a request (its
  // head sent, its body not), the client's connection gets an immediate 503
  // connection-limit, Retry-After: 1, and nothing runs. (An idle or head-less
  // holder would be evicted for the newcomer instead.)
  const s = await setup(t, { args: ["--max-connections", "1"] });
  const holder = net.connect(Number(s.server.addr.split(":")[1]), "127.0.0.1");
  await new Promise((done) => holder.once("connect", done));
  holder.write(
    "POST /api/v1/orders HTTP/1.1\r\nhost: idemgate\r\nauthorization: Bearer holder\r\n" +
      "content-type: application/json\r\ncontent-length: 1000\r\n\r\n{",
  );
  await new Promise((done) => setTimeout(done, 300));
  setTimeout(() => holder.destroy(), 500);
  const reports: Array<number | undefined> = [];
  const started = performance.now();
  const reply = await client(s).send(operation(), {
    url: "/api/v1/orders",
    json: ORDER,
    onAttempt: (a) => reports.push(a.status),
  });
  const waited = performance.now() - started;
  assert.equal(reply.status, 201);
  assert.equal(reply.replayed, false, "the 503 ran nothing; the retry ran it");
  assert.deepEqual(reports, [503, 201]);
  assert.ok(waited >= 950, `Retry-After: 1 was honoured: ${waited} ms`);
  // Connections are still scarce: the listing is a GET, which the client retries
  // past a 503 of its own without a key.
  const listing = await client(s).send(null, { method: "GET", url: "/api/v1/orders" });
  assert.equal(listing.json<{ orders: unknown[] }>().orders.length, 1);
  assert.equal(s.gateway.distinctCharges, 1);
});

test("a replayed 5xx is the outcome and is not retried", TIMEOUT, async (t) => {
  // The orders service releases its failures; idemgate proxy stores an upstream's
  // 500 as FAILED and replays it (PROTOCOL §8, §13).
  let executions = 0;
  const upstream = http.createServer((_, response) => {
    executions += 1;
    response.writeHead(500, { "content-type": "text/plain" }).end("upstream broke");
  });
  await new Promise<void>((done) => upstream.listen(0, "127.0.0.1", done));
  t.after(() => upstream.close());
  const proxy = await startProxy(t, `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`);
  const relay = await Relay.start(t, proxy);
  const error = await new Client({ baseUrl: relay.url("/"), headers: { authorization: "Bearer alice" }, policy: quick() })
    .send(operation(), { url: "/jobs", body: "{}" })
    .then(() => assert.fail("the upstream failed"), (e: unknown) => e);
  assert.ok(error instanceof RejectedError, String(error));
  assert.equal(error.status, 500);
  assert.equal(error.replayed, true, "the first 500 was retried once, and its replay is final");
  assert.equal(error.mayHaveRun, true);
  assert.equal(error.attempts, 2);
  assert.equal((await relay.stats()).requests, 2, "a fresh 500, then its replay: no third");
  assert.equal(executions, 1);
});

test("an abort during the wait ends the operation, saying it may have run", TIMEOUT, async (t) => {
  const s = await setup(t);
  await s.relay.faultRequests("lose-response");
  const controller = new AbortController();
  const pay = operation();
  const sending = client(s, retryPolicy({ minBackoffMs: 10_000, maxBackoffMs: 10_000 })).send(pay, {
    url: "/api/v1/orders",
    json: ORDER,
    signal: controller.signal,
    // Aborted as the wait begins: the jittered wait may be any length down to
    // 0 ms, so a timer could lose the race to the retry.
    onAttempt: (a) => {
      if (a.retryInMs !== undefined) controller.abort();
    },
  });
  const error = await sending.then(() => assert.fail("aborted"), (e: unknown) => e);
  assert.ok(error instanceof AbortedError, String(error));
  assert.equal(error.name, "AbortError");
  assert.equal(error.mayHaveRun, true, "the lost attempt had run");
  assert.equal((await s.relay.stats()).requests, 1, "no attempt after the abort");
  const before = new AbortController();
  before.abort();
  const early = await client(s)
    .send(operation(), { url: "/api/v1/orders", json: ORDER, signal: before.signal })
    .then(() => assert.fail("aborted before"), (e: unknown) => e);
  assert.ok(early instanceof AbortedError && !early.mayHaveRun, String(early));
  assert.equal((await s.relay.stats()).requests, 1, "nothing sent");
  assert.equal((await s.server.orders(s.token)).length, 1);
});

test("an abort mid-attempt ends it at once, saying it may have run, and the operation resumes", TIMEOUT, async (t) => {
  const s = await setup(t);
  await s.relay.faultRequests({ delayMs: 2_000 });
  const controller = new AbortController();
  const pay = operation();
  const reports: Array<number | undefined> = [];
  setTimeout(() => controller.abort(), 300);
  const error = await client(s)
    .send(pay, { url: "/api/v1/orders", json: ORDER, signal: controller.signal, onAttempt: (a) => reports.push(a.status) })
    .then(() => assert.fail("aborted while its answer was delayed"), (e: unknown) => e);
  assert.ok(error instanceof AbortedError, String(error));
  assert.equal(error.mayHaveRun, true, "the attempt was sent: it may have run (it did)");
  assert.equal((await s.relay.stats()).requests, 1);
  await new Promise((done) => setTimeout(done, 2_000)); // the delayed answer would have come by now
  assert.equal((await s.relay.stats()).requests, 1, "no attempt after the abort");
  assert.ok(reports.every((status) => status === undefined), `no answer was seen: ${JSON.stringify(reports)}`);
  assert.equal((await s.server.orders(s.token)).length, 1, "the aborted attempt had reached the server, which ran it");
  const resumed = await client(s).send(Operation.resume(pay.key), { url: "/api/v1/orders", json: ORDER });
  assert.equal(resumed.replayed, true, "resumed under its key: the first outcome");
  assert.equal((await s.server.orders(s.token)).length, 1);
  assert.equal(s.gateway.distinctCharges, 1);
});

test("a GET with a body is refused before anything is sent", TIMEOUT, async (t) => {
  const s = await setup(t);
  for (const request of [
    { method: "GET", url: "/api/v1/orders", json: ORDER },
    { method: "head", url: "/api/v1/orders", body: "{}" },
  ]) {
    const error = await client(s)
      .send(operation(), request)
      .then(() => assert.fail(`${request.method} with a body`), (e: unknown) => e);
    assert.ok(error instanceof TypeError, String(error));
  }
  assert.equal((await s.relay.stats()).connections, 0, "refused before the first attempt");
});

// Streamed answers against the real binaries: a mock streaming API (an LLM's
// chat completions, the one external party) behind `idemgate proxy`, the fault
// relay in front of the proxy. The client reads the events as they come, the
// relay cuts the connection mid-stream, and the client resumes it: each event
// handed on once, in order, and the API ran once. (The resumption rules event by
// event, on a scripted fetch: test/events.test.ts.)

import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import {
  Client,
  RejectedError,
  StreamRestartedError,
  operation,
  retryPolicy,
  type StreamEvent,
} from "../src/index.js";
import { freshToken, Relay, startProxy, StreamingApi } from "./support.js";

const TIMEOUT = { timeout: 60_000 };
const quick = retryPolicy({ minBackoffMs: 10, maxBackoffMs: 50 });

/** `promise`, or a failure saying what did not come within 10 s. */
function within<T>(promise: Promise<T>, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: nothing within 10 s`)), 10_000);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

/** The next event the iterator hands on (failing when the stream ends instead). */
async function nextEvent(events: AsyncIterator<StreamEvent>, what: string): Promise<StreamEvent> {
  const next = await within(events.next(), what);
  assert.ok(!next.done, `${what}: the stream ended`);
  return next.value;
}

for (const withIds of [true, false]) {
  test(`a dropped event stream is resumed and each event handed on once (${withIds ? "with" : "without"} ids)`, TIMEOUT, async (t) => {
    const event = (n: number) => `${withIds ? `id: ${n}\n` : ""}data: {"token":${n}}\n\n`;
    // Each event one chunk: its size line, the event, CRLF (all ASCII: bytes = length).
    const chunk = (n: number) => `${event(n).length.toString(16)}\r\n`.length + event(n).length + 2;
    const api = await StreamingApi.start(t);
    const proxy = await startProxy(t, api.url);
    const relay = await Relay.start(t, proxy);
    // The cut falls 8 bytes into the third event.
    await relay.faultRequests({ cutAfter: chunk(1) + chunk(2) + 8 }, 1, "POST");
    const client = new Client({ baseUrl: relay.url("/"), headers: { authorization: `Bearer ${freshToken()}` }, policy: quick });
    const opening = client.stream(operation(), { url: "/v1/chat/completions", json: { model: "m", stream: true } });
    const produced = await within(api.nextExecution(), "the request upstream");
    produced.send(event(1));
    produced.send(event(2));
    const events = await within(opening, "the answer's head");
    assert.equal(events.status, 200);
    assert.equal(events.replayed, false);
    const reading = events[Symbol.asyncIterator]();
    const received: StreamEvent[] = [];
    for (const n of [1, 2]) {
      received.push(await nextEvent(reading, `event ${n}`));
    }
    // The third event is cut on its way; the retry joins the stream.
    produced.send(event(3));
    received.push(await nextEvent(reading, "event 3, resumed"));
    produced.send(event(4));
    produced.send(event(5));
    produced.end();
    for (let next = await within(reading.next(), "the rest"); !next.done; next = await within(reading.next(), "the rest")) {
      received.push(next.value);
    }
    assert.deepEqual(
      received.map((e) => e.data),
      [1, 2, 3, 4, 5].map((n) => `{"token":${n}}`),
    );
    assert.equal(received[4]!.lastEventId, withIds ? "5" : undefined);
    assert.ok(received.every((e) => e.type === "message"));
    assert.equal(events.attempts, 2, "the cut and the resumption");
    assert.equal(api.executions, 1, "the upstream ran once");
    assert.equal((await relay.stats()).requests, 2);
  });
}

for (const released of [false, true]) {
  test(`a stream the upstream cuts is never handed on as complete (${released ? "released" : "kept failed"})`, TIMEOUT, async (t) => {
    const args: string[] = [];
    if (released) {
      const dir = mkdtempSync(join(tmpdir(), "idemgate-js-stream-"));
      t.after(() => rmSync(dir, { recursive: true, force: true }));
      const routes = join(dir, "routes.toml");
      writeFileSync(routes, '[[route]]\nmethod = "POST"\npath = "/v1/chat/completions"\nserver_errors = "release"\n');
      args.push("--config", routes);
    }
    const api = await StreamingApi.start(t);
    const proxy = await startProxy(t, api.url, args);
    const client = new Client({ baseUrl: `http://${proxy}/`, headers: { authorization: `Bearer ${freshToken()}` }, policy: quick });
    const opening = client.stream(operation(), { url: "/v1/chat/completions", json: { stream: true } });
    const produced = await within(api.nextExecution(), "the request upstream");
    produced.send("id: 1\ndata: 1\n\n");
    produced.send("id: 2\ndata: 2\n\n");
    const reading = (await within(opening, "the answer's head"))[Symbol.asyncIterator]();
    for (const n of [1, 2]) {
      assert.equal((await nextEvent(reading, `event ${n}`)).data, String(n));
    }
    if (released) {
      // The proxy runs the operation again for the resumption: let that run start streaming.
      void api.nextExecution().then((again) => {
        again.send("id: 1\ndata: other\n\n");
        again.end();
      });
    }
    produced.cut();
    const error = await within(reading.next(), "the cut").then(
      (next) => assert.fail(`the cut is not ${next.done ? "a clean end" : "an event"}`),
      (e: unknown) => e,
    );
    assert.ok(error instanceof (released ? StreamRestartedError : RejectedError), String(error));
    assert.equal((error as StreamRestartedError | RejectedError).mayHaveRun, true);
    if (error instanceof RejectedError) assert.equal(error.replayed, true, "the stored failure");
    assert.equal(api.executions, released ? 2 : 1, released ? "released: it ran again" : "kept failed: not run again");
    assert.equal((await reading.next()).done, true, "nothing after it");
  });
}

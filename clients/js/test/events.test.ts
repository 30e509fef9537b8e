// Client.stream's resumption rules, on a scripted `fetch`: each attempt's
// answer is written here, byte for byte, and so is where it breaks off. (The
// same against the real proxy and relay: test/streams.test.ts.)

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  AbortedError,
  Client,
  RejectedError,
  StreamRestartedError,
  TransportError,
  operation,
  retryPolicy,
  type AttemptReport,
  type Events,
  type StreamEvent,
} from "../src/index.js";

const utf8 = new TextEncoder();
const quick = retryPolicy({ minBackoffMs: 1, maxBackoffMs: 5 });

/** Where a scripted body breaks off: the connection drops. */
const CUT = Symbol("cut");

/** One scripted answer: its status, headers and body pieces (each read on its own), maybe ending in a cut. */
interface Scripted {
  readonly status?: number;
  readonly replayed?: boolean;
  readonly body: ReadonlyArray<string | typeof CUT>;
}

/** One request as the scripted fetch saw it. */
interface Seen {
  readonly headers: Headers;
  readonly body: string;
}

/** A `fetch` answering each call with the next scripted answer; `seen` records the requests. */
function scripted(answers: Scripted[]): { fetch: typeof fetch; seen: Seen[]; cancelled: () => number } {
  const seen: Seen[] = [];
  let cancelled = 0;
  const fake = async (_: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
    seen.push({ headers: new Headers(init?.headers), body: String(init?.body) });
    const answer = answers.shift();
    if (answer === undefined) throw new Error("no answer scripted for this attempt");
    const pieces = [...answer.body];
    const body = new ReadableStream<Uint8Array>({
      pull(controller) {
        const piece = pieces.shift();
        if (piece === undefined) controller.close();
        else if (piece === CUT) controller.error(new TypeError("terminated"));
        else controller.enqueue(utf8.encode(piece));
      },
      cancel() {
        cancelled += 1;
      },
    });
    const headers: Record<string, string> = { "content-type": "text/event-stream" };
    if (answer.replayed) headers["idempotent-replayed"] = "true";
    return new Response(body, { status: answer.status ?? 200, headers });
  };
  return { fetch: fake, seen, cancelled: () => cancelled };
}

/** Every event of `events`, or the error that ended them after `received`. */
async function drain(events: Events): Promise<{ received: StreamEvent[]; error: unknown }> {
  const received: StreamEvent[] = [];
  try {
    for await (const event of events) received.push(event);
    return { received, error: undefined };
  } catch (error) {
    return { received, error };
  }
}

const data = (events: StreamEvent[]) => events.map((event) => event.data);

test("a stream cut after an id resumes after it, each event handed on once", async () => {
  const { fetch, seen } = scripted([
    { body: ["id: 1\ndata: a\n\n", "id: 2\nevent: token\ndata: b\n\n: comment\n\n", "id: 3\nda", CUT] },
    // The server's replay starts just after the first block whose id is 2.
    { replayed: true, body: [": comment\n\nid: 3\ndata: c\n\n", "data: d\n\n"] },
  ]);
  const reports: AttemptReport[] = [];
  const events = await new Client({ fetch, policy: quick, baseUrl: "http://api.test" }).stream(operation(), {
    url: "/v1/chat",
    json: { stream: true },
    onAttempt: (report) => reports.push(report),
  });
  assert.equal(events.status, 200);
  assert.equal(events.replayed, false);
  const { received, error } = await drain(events);
  assert.equal(error, undefined);
  assert.deepEqual(data(received), ["a", "b", "c", "d"]);
  assert.deepEqual(
    received.map((event) => [event.type, event.lastEventId]),
    [["message", "1"], ["token", "2"], ["message", "3"], ["message", "3"]],
  );
  assert.equal(events.attempts, 2);
  assert.equal(seen[0]!.headers.get("last-event-id"), null);
  assert.equal(seen[0]!.headers.get("accept"), "text/event-stream");
  assert.equal(seen[1]!.headers.get("last-event-id"), "2");
  assert.equal(seen[1]!.headers.get("idempotency-key"), seen[0]!.headers.get("idempotency-key"));
  assert.equal(seen[1]!.body, seen[0]!.body, "the same bytes");
  assert.deepEqual(
    reports.map((r) => [r.attempt, r.status, r.replayed, r.error instanceof TypeError, r.retryInMs !== undefined]),
    [
      [1, 200, false, true, true],
      [2, 200, true, false, false],
    ],
    "each attempt told when its body ended: the cut one with its failure",
  );
});

test("a stream cut before any id is asked for whole, and what was read is passed over", async () => {
  const { fetch, seen } = scripted([
    { body: ["data: a\n\ndata: b\n", "\n", "data: c\r\n", CUT] },
    { replayed: true, body: ["data: a\n\ndata: b\n\ndata: c\r\n\r\n", "data: d\n\n"] },
  ]);
  const events = await new Client({ fetch, policy: quick }).stream(operation(), { url: "http://api.test/", body: "{}" });
  const { received, error } = await drain(events);
  assert.equal(error, undefined);
  assert.deepEqual(data(received), ["a", "b", "c", "d"]);
  assert.equal(received[0]!.lastEventId, undefined);
  assert.equal(seen[1]!.headers.get("last-event-id"), null);
});

test("an id a header cannot carry as is resumes from the first byte", async () => {
  const { fetch, seen } = scripted([
    { body: ["id: 1\ndata: a\n\nid:  padded\ndata: b\n\n", CUT] },
    { replayed: true, body: ["id: 1\ndata: a\n\nid:  padded\ndata: b\n\ndata: c\n\n"] },
  ]);
  const events = await new Client({ fetch, policy: quick }).stream(operation(), { url: "http://api.test/", body: "{}" });
  const { received } = await drain(events);
  assert.deepEqual(data(received), ["a", "b", "c"]);
  assert.equal(received[2]!.lastEventId, " padded");
  assert.equal(seen[1]!.headers.get("last-event-id"), null, "fetch would trim it: not sent");
});

test("a resumption the server answers with a new run is a StreamRestartedError", async () => {
  const { fetch, cancelled } = scripted([
    { body: ["id: 1\ndata: a\n\n", CUT] },
    { body: ["id: 1\ndata: other\n\n"] },
  ]);
  const events = await new Client({ fetch, policy: quick }).stream(operation(), { url: "http://api.test/", body: "{}" });
  const { received, error } = await drain(events);
  assert.deepEqual(data(received), ["a"]);
  assert.ok(error instanceof StreamRestartedError, String(error));
  assert.equal(error.mayHaveRun, true);
  assert.equal(error.attempts, 2);
  assert.equal(cancelled(), 1, "the new run's answer is not read");
});

test("a resumption's unsuccessful answers are judged by the retry rules", async () => {
  const { fetch } = scripted([
    { body: ["id: 1\ndata: a\n\n", CUT] },
    { status: 503, body: ["busy"] },
    { replayed: true, body: ["data: b\n\n"] },
  ]);
  const events = await new Client({ fetch, policy: quick }).stream(operation(), { url: "http://api.test/", body: "{}" });
  const { received, error } = await drain(events);
  assert.equal(error, undefined);
  assert.deepEqual(data(received), ["a", "b"]);
  assert.equal(events.attempts, 3);

  const refused = scripted([
    { body: ["id: 1\ndata: a\n\n", CUT] },
    { status: 404, body: ["gone"] },
  ]);
  const ended = await drain(
    await new Client({ fetch: refused.fetch, policy: quick }).stream(operation(), { url: "http://api.test/", body: "{}" }),
  );
  assert.ok(ended.error instanceof RejectedError && ended.error.status === 404, String(ended.error));
  assert.equal(ended.error.mayHaveRun, true, "the first attempt ran");
});

test("a stream without an operation is not asked for again", async () => {
  const { fetch, seen } = scripted([{ body: ["data: a\n\n", CUT] }]);
  const events = await new Client({ fetch, policy: quick }).stream(null, { url: "http://api.test/", body: "{}" });
  const { received, error } = await drain(events);
  assert.deepEqual(data(received), ["a"]);
  assert.ok(error instanceof TransportError, String(error));
  assert.equal(error.mayHaveRun, true);
  assert.equal(seen.length, 1);
});

test("a first answer that is not a success is thrown before any event, as send does", async () => {
  const { fetch } = scripted([{ status: 500, body: ["boom"] }, { status: 500, replayed: true, body: ["boom"] }]);
  const error = await new Client({ fetch, policy: quick })
    .stream(operation(), { url: "http://api.test/", body: "{}" })
    .then(() => assert.fail("a 500"), (e: unknown) => e);
  assert.ok(error instanceof RejectedError && error.replayed && error.attempts === 2, String(error));
});

test("breaking out of the loop releases the answer; an abort ends the reading", async () => {
  const { fetch, cancelled } = scripted([{ body: ["data: a\n\n", "data: b\n\n", "data: c\n\n"] }]);
  const events = await new Client({ fetch, policy: quick }).stream(operation(), { url: "http://api.test/", body: "{}" });
  for await (const event of events) {
    assert.equal(event.data, "a");
    break;
  }
  assert.equal(cancelled(), 1);
  assert.deepEqual(data((await drain(events)).received), [], "closed: nothing more");

  const controller = new AbortController();
  const slow = async (_: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
    const signal = init?.signal ?? undefined;
    const body = new ReadableStream<Uint8Array>({
      start(stream) {
        stream.enqueue(utf8.encode("data: a\n\n"));
        signal?.addEventListener("abort", () => stream.error(signal.reason));
      },
    });
    return new Response(body, { status: 200 });
  };
  const aborted = await new Client({ fetch: slow, policy: quick }).stream(operation(), {
    url: "http://api.test/",
    body: "{}",
    signal: controller.signal,
  });
  const received: string[] = [];
  const error = await (async () => {
    for await (const event of aborted) {
      received.push(event.data);
      controller.abort(new Error("the user left"));
    }
  })().then(() => assert.fail("aborted"), (e: unknown) => e);
  assert.deepEqual(received, ["a"]);
  assert.ok(error instanceof AbortedError, String(error));
  assert.equal(error.mayHaveRun, true);
  assert.equal(aborted.attempts, 1);
});

test("Last-Event-ID is the client's to send", async () => {
  const { fetch, seen } = scripted([]);
  const error = await new Client({ fetch })
    .stream(operation(), { url: "http://api.test/", body: "{}", headers: { "last-event-id": "3" } })
    .then(() => assert.fail("refused"), (e: unknown) => e);
  assert.ok(error instanceof TypeError, String(error));
  assert.equal(seen.length, 0);
});

// The retry rules and the operation handle, without a server: the same cases as
// the Rust client's unit tests, so the two cannot drift apart unnoticed.

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { test } from "node:test";

import { InvalidKeyError, Operation, operation, retryPolicy } from "../src/index.js";
import { Attempts, judgeResponse, mayHaveBeenDelivered, retryAfterMs } from "../src/policy.js";

const RETRY = { retry: true, afterMs: undefined } as const;

test("the documented response rules", () => {
  const none = new Headers();
  const after2 = new Headers({ "retry-after": "2" });
  const replayed = new Headers({ "idempotent-replayed": "true" });
  const cases: Array<[number, Headers, ReturnType<typeof judgeResponse>]> = [
    [409, after2, { retry: true, afterMs: 2_000 }],
    [409, none, { retry: false }], // an application's own conflict
    [503, after2, { retry: true, afterMs: 2_000 }],
    [503, none, { retry: true, afterMs: undefined }],
    [500, none, { retry: true, afterMs: undefined }],
    [502, none, { retry: true, afterMs: undefined }],
    [502, replayed, { retry: false }],
    [500, replayed, { retry: false }],
    [422, none, { retry: false }],
    [400, none, { retry: false }],
    [401, none, { retry: false }],
    [429, after2, { retry: false }],
    [201, none, { retry: false }],
    [201, replayed, { retry: false }],
  ];
  for (const [status, headers, expected] of cases) {
    assert.deepEqual(judgeResponse(status, headers), expected, `${status} ${[...headers].join(";")}`);
  }
});

test("Retry-After is read in seconds only", () => {
  assert.equal(retryAfterMs(new Headers({ "retry-after": " 7 " })), 7_000);
  assert.equal(retryAfterMs(new Headers({ "retry-after": "Wed, 21 Oct 2015 07:28:00 GMT" })), undefined);
  assert.equal(retryAfterMs(new Headers({ "retry-after": "-1" })), undefined);
  assert.equal(retryAfterMs(new Headers({ "retry-after": "1.5" })), undefined);
});

function firstAttempt(policy = retryPolicy(), method = "POST", keyed = true, random = Math.random): Attempts {
  const attempts = new Attempts(policy, method, keyed, { random });
  attempts.next();
  return attempts;
}

test("zero retries means one attempt", () => {
  assert.equal(firstAttempt(retryPolicy({ maxRetries: 0 })).waitFor(RETRY), undefined);
});

test("an unkeyed POST or PATCH is never retried; a keyed one and a GET are", () => {
  assert.equal(firstAttempt(retryPolicy(), "POST", false).waitFor(RETRY), undefined);
  assert.equal(firstAttempt(retryPolicy(), "patch", false).waitFor(RETRY), undefined);
  assert.notEqual(firstAttempt(retryPolicy(), "POST", true).waitFor(RETRY), undefined);
  assert.notEqual(firstAttempt(retryPolicy(), "GET", false).waitFor(RETRY), undefined);
});

test("backoff is bounded by full jitter, and Retry-After by its cap", () => {
  const policy = retryPolicy({ minBackoffMs: 100, maxBackoffMs: 400, maxRetryAfterMs: 3_000, maxRetries: 100 });
  const attempts = firstAttempt(policy, "POST", true, () => 1); // the top of each range
  for (let retry = 0; retry < 8; retry++) {
    assert.equal(attempts.waitFor(RETRY), Math.min(100 * 2 ** retry, 400), `retry ${retry}`);
    attempts.next();
  }
  assert.equal(attempts.waitFor({ retry: true, afterMs: 29_000 }), 3_000);
});

test("full jitter spreads the waits from zero", () => {
  const attempts = firstAttempt(retryPolicy({ minBackoffMs: 1_000, maxBackoffMs: 1_000 }));
  const waits = Array.from({ length: 200 }, () => attempts.waitFor(RETRY)!);
  assert.ok(waits.some((w) => w < 250) && waits.some((w) => w > 750), waits.join(","));
  assert.ok(waits.every((w) => w >= 0 && w <= 1_000));
});

test("no wait that ends past the deadline, and each attempt gets at most what is left", () => {
  const attempts = firstAttempt(retryPolicy({ deadlineMs: 2_000 }));
  assert.equal(attempts.waitFor({ retry: true, afterMs: 5_000 }), undefined);
  assert.equal(attempts.waitFor({ retry: true, afterMs: 1_000 }), 1_000);
  const short = new Attempts(retryPolicy({ deadlineMs: 300, attemptTimeoutMs: 10_000 }), "POST", true);
  assert.ok(short.next() <= 300);
});

test("only a refused connection is known not to have run", () => {
  const refused = new TypeError("fetch failed", { cause: Object.assign(new Error("connect"), { code: "ECONNREFUSED" }) });
  assert.equal(mayHaveBeenDelivered(refused), false);
  const closed = new TypeError("fetch failed", { cause: Object.assign(new Error("closed"), { code: "UND_ERR_SOCKET" }) });
  assert.equal(mayHaveBeenDelivered(closed), true);
  assert.equal(mayHaveBeenDelivered(new TypeError("Failed to fetch")), true, "a browser says nothing");
});

test("the policy refuses settings that are not non-negative numbers", () => {
  assert.throws(() => retryPolicy({ maxRetries: -1 }), RangeError);
  assert.throws(() => retryPolicy({ deadlineMs: Number.NaN }), RangeError);
  assert.throws(() => retryPolicy({ maxRetries: 1.5 }), RangeError);
  assert.equal(retryPolicy({ minBackoffMs: 500, maxBackoffMs: 100 }).maxBackoffMs, 500);
});

test("new operations have distinct UUID v4 keys", () => {
  const [a, b] = [operation(), Operation.create()];
  assert.ok(!a.equals(b));
  assert.match(a.key, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
});

test("resume keeps the key and refuses what the server would", () => {
  assert.equal(Operation.resume("order-42").key, "order-42");
  for (const bad of ["", "a,b", '"quoted"', " padded", "has space", "ключ", "k".repeat(256), "tab\there"]) {
    assert.throws(() => Operation.resume(bad), InvalidKeyError, JSON.stringify(bad));
  }
  assert.equal(Operation.resume("k".repeat(255)).key.length, 255);
});

test("an operation never shows its key, and its digest is the server's", async () => {
  const op = Operation.resume("secret-key-123");
  assert.ok(!`${op} ${JSON.stringify({ op })}`.includes("secret-key-123"));
  const expected = createHash("sha256").update("secret-key-123").digest("hex").slice(0, 12);
  assert.equal(await op.digest(), `sha256:${expected}`);
});

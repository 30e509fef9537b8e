// What of the retry rules and the operation handle is this package's own, without
// a server: its transport errors, its policy's number checks, its keys' making and
// hiding. The rules every client shares are the cases of clients/retry-rules.json
// (test/rules.test.ts).

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { test } from "node:test";

import { Operation, operation, retryPolicy } from "../src/index.js";
import { mayHaveBeenDelivered } from "../src/policy.js";

test("only a refused connection is known not to have run", () => {
  const refused = new TypeError("fetch failed", { cause: Object.assign(new Error("connect"), { code: "ECONNREFUSED" }) });
  assert.equal(mayHaveBeenDelivered(refused), false);
  const closed = new TypeError("fetch failed", { cause: Object.assign(new Error("closed"), { code: "UND_ERR_SOCKET" }) });
  assert.equal(mayHaveBeenDelivered(closed), true);
  assert.equal(mayHaveBeenDelivered(new TypeError("Failed to fetch")), true, "a browser says nothing");
});

test("the policy refuses a setting that is not a number", () => {
  assert.throws(() => retryPolicy({ deadlineMs: Number.NaN }), RangeError);
  assert.throws(() => retryPolicy({ maxRetries: "3" as unknown as number }), RangeError);
});

test("new operations have distinct UUID v4 keys", () => {
  const [a, b] = [operation(), Operation.create()];
  assert.ok(!a.equals(b));
  assert.match(a.key, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
});

test("an operation never shows its key, and its digest is the server's", async () => {
  const op = Operation.resume("secret-key-123");
  assert.ok(!`${op} ${JSON.stringify({ op })}`.includes("secret-key-123"));
  const expected = createHash("sha256").update("secret-key-123").digest("hex").slice(0, 12);
  assert.equal(await op.digest(), `sha256:${expected}`);
});

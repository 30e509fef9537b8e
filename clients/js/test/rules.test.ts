// The retry rules every client of this repository runs: the cases of
// clients/retry-rules.json (its `$comment` says what each section holds), which the
// Rust idemgate-client and clients/python load too. A rule or a case goes there,
// not here; test/policy.test.ts keeps what is this package's own.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { errorFromAnswer } from "../src/client.js";
import { InProgressError, KeyReusedError, RejectedError } from "../src/errors.js";
import { InvalidKeyError, Operation } from "../src/operation.js";
import { Attempts, judgeResponse, retryAfterMs, retryPolicy, type Verdict } from "../src/policy.js";
import { policyOf, SETTING_NAMES } from "./settings.js";
import { REPO } from "./support.js";

type HeaderCases = Record<string, string>;
type Settings = Record<string, number>;
interface Answer {
  status: number;
  headers: HeaderCases;
}

interface Rules {
  defaults: Settings;
  responses: Array<{ status: number; headers: HeaderCases; retry: boolean; after_ms?: number | null }>;
  retry_after: Array<{ value: string; ms: number | null }>;
  retryable: Array<{ method: string; keyed: boolean; retried: boolean }>;
  may_have_run: Array<{ status: number; may_have_run: boolean }>;
  waits: Array<{
    policy: Settings;
    method?: string;
    keyed?: boolean;
    attempts: number;
    answer: Answer | null;
    wait_ms?: number | null;
    backoff_up_to_ms?: number;
  }>;
  jitter: Array<{ policy: Settings; draws: number; some_below_ms: number; some_above_ms: number }>;
  timeouts: Array<{ policy: Settings; at_most_ms: number }>;
  policies: Array<{ settings: Settings; max_backoff_ms?: number; valid?: boolean }>;
  keys: Array<{ key: string; repeat?: number; valid: boolean; digest?: string }>;
  answers: Array<{
    status: number;
    status_text: string;
    headers: HeaderCases;
    body: string;
    ran_before: boolean;
    error: "key-reused" | "in-progress" | "rejected";
    retry_after_ms?: number | null;
    replayed?: boolean;
    may_have_run: boolean;
    problem: { type: string; title: string | null; detail: string | null };
  }>;
}

const RULES = JSON.parse(readFileSync(join(REPO, "clients", "retry-rules.json"), "utf8")) as Rules;

/** `made` attempts under `settings`, each backoff drawn at `random`'s point of its range. */
function attemptsMade(settings: Settings, method: string, keyed: boolean, made: number, random = Math.random): Attempts {
  const attempts = new Attempts(policyOf(settings), method, keyed, { random });
  for (let i = 0; i < made; i++) attempts.next();
  return attempts;
}

const TRANSPORT_FAILURE: Verdict = { retry: true, afterMs: undefined };

test("the default policy", () => {
  assert.deepEqual(policyOf(RULES.defaults), retryPolicy());
  assert.deepEqual(Object.keys(RULES.defaults).sort(), [...SETTING_NAMES].sort());
});

test("responses", () => {
  for (const c of RULES.responses) {
    const expected = c.retry ? { retry: true, afterMs: c.after_ms ?? undefined } : { retry: false };
    assert.deepEqual(judgeResponse(c.status, new Headers(c.headers)), expected, `${c.status} ${JSON.stringify(c.headers)}`);
  }
});

test("Retry-After values", () => {
  for (const c of RULES.retry_after) {
    assert.equal(retryAfterMs(new Headers({ "retry-after": c.value })), c.ms ?? undefined, JSON.stringify(c.value));
  }
});

test("retryable requests", () => {
  for (const c of RULES.retryable) {
    const attempts = attemptsMade({}, c.method, c.keyed, 1);
    assert.equal(attempts.waitFor(TRANSPORT_FAILURE) !== undefined, c.retried, `${c.method} keyed: ${c.keyed}`);
  }
});

test("which answers may have run", () => {
  for (const c of RULES.may_have_run) {
    const attempts = attemptsMade({}, "POST", true, 1);
    attempts.answered(c.status, new Headers());
    assert.equal(attempts.mayHaveRun, c.may_have_run, String(c.status));
  }
});

test("waits", () => {
  for (const c of RULES.waits) {
    const what = `${JSON.stringify(c)}`;
    const verdict: Verdict = c.answer === null ? TRANSPORT_FAILURE : judgeResponse(c.answer.status, new Headers(c.answer.headers));
    const waitAt = (random: number): number | undefined =>
      attemptsMade(c.policy, c.method ?? "POST", c.keyed ?? true, c.attempts, () => random).waitFor(verdict);
    if (c.backoff_up_to_ms !== undefined) {
      // Full jitter: the top of the range is the bound, its bottom no wait.
      assert.equal(waitAt(1), c.backoff_up_to_ms, what);
      assert.equal(waitAt(0), 0, what);
    } else {
      assert.ok(c.wait_ms !== undefined, `${what}: names wait_ms or backoff_up_to_ms`);
      assert.equal(waitAt(0.5), c.wait_ms ?? undefined, what);
    }
  }
});

test("full jitter spreads the waits from zero", () => {
  for (const c of RULES.jitter) {
    const attempts = attemptsMade(c.policy, "POST", true, 1);
    const waits = Array.from({ length: c.draws }, () => attempts.waitFor(TRANSPORT_FAILURE)!);
    assert.ok(waits.some((w) => w < c.some_below_ms) && waits.some((w) => w > c.some_above_ms), waits.join(","));
  }
});

test("each attempt gets at most what is left of the deadline", () => {
  for (const c of RULES.timeouts) {
    const timeout = new Attempts(policyOf(c.policy), "POST", true).next();
    assert.ok(timeout <= c.at_most_ms, `${JSON.stringify(c.policy)}: ${timeout}`);
  }
});

test("policies", () => {
  for (const c of RULES.policies) {
    if (c.valid === false) {
      assert.throws(() => policyOf(c.settings), RangeError, JSON.stringify(c.settings));
    } else {
      assert.equal(policyOf(c.settings).maxBackoffMs, c.max_backoff_ms, JSON.stringify(c.settings));
    }
  }
});

test("keys", async () => {
  for (const c of RULES.keys) {
    const key = c.key.repeat(c.repeat ?? 1);
    if (!c.valid) {
      assert.throws(() => Operation.resume(key), InvalidKeyError, JSON.stringify(key));
      continue;
    }
    const op = Operation.resume(key);
    assert.equal(op.key, key);
    if (c.digest !== undefined) assert.equal(await op.digest(), c.digest);
  }
});

test("answers", () => {
  for (const c of RULES.answers) {
    const answer = { status: c.status, statusText: c.status_text, headers: new Headers(c.headers), body: new TextEncoder().encode(c.body) };
    const error = errorFromAnswer(answer, c.ran_before, 1);
    const what = `${c.status} ${JSON.stringify(c.headers)} ${c.body}: ${String(error)}`;
    if (c.error === "key-reused") {
      assert.ok(error instanceof KeyReusedError, what);
    } else if (c.error === "in-progress") {
      assert.ok(error instanceof InProgressError, what);
      assert.equal(error.retryAfter, c.retry_after_ms ?? undefined, what);
    } else {
      assert.ok(error instanceof RejectedError, what);
      assert.equal(error.replayed, c.replayed, what);
    }
    assert.equal(error.mayHaveRun, c.may_have_run, what);
    const problem = (error as KeyReusedError | InProgressError | RejectedError).problem;
    assert.deepEqual({ type: problem.type, title: problem.title ?? null, detail: problem.detail ?? null }, c.problem, what);
  }
});

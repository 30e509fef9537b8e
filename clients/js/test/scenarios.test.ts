// The fault scenarios every client runs against the real `idemgate serve` through
// the relay: the cases of clients/scenarios.json (its `$comment` says what a case
// holds), which clients/python runs too. test/client.test.ts keeps the scenarios
// that need more than one request, a held connection or an abort.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { Client, RejectedError, TransportError, operation } from "../src/index.js";
import { policyOf } from "./settings.js";
import { ORDER, REPO, setup, type Fault } from "./support.js";

interface Scenario {
  name: string;
  faults?: Array<[string, number]>;
  gateway_failures?: number[];
  policy?: Record<string, number>;
  operation?: boolean;
  body?: unknown;
  settle_ms?: number;
  expect: {
    status?: number;
    replayed?: boolean;
    attempts?: number;
    error?: "transport" | "rejected";
    may_have_run?: boolean;
    problem_type?: string;
    statuses?: Array<number | null>;
    relay_requests?: number;
    relay_requests_between?: [number, number];
    orders?: number;
    gateway_calls?: number;
    distinct_charges?: number;
    elapsed_below_ms?: number;
  };
}

const FILE = JSON.parse(readFileSync(join(REPO, "clients", "scenarios.json"), "utf8")) as {
  base_policy: Record<string, number>;
  scenarios: Scenario[];
};

for (const scenario of FILE.scenarios) {
  test(scenario.name, { timeout: 60_000 }, async (t) => {
    const s = await setup(t);
    for (const [words, count] of scenario.faults ?? []) await s.relay.faultRequests(words as Fault, count);
    for (const status of scenario.gateway_failures ?? []) s.gateway.failNext(status);
    const client = new Client({
      baseUrl: s.relay.url("/"),
      headers: { authorization: `Bearer ${s.token}` },
      policy: policyOf({ ...FILE.base_policy, ...scenario.policy }),
    });
    const statuses: Array<number | null> = [];
    const started = performance.now();
    const sent = client.send(scenario.operation === false ? null : operation(), {
      url: "/api/v1/orders",
      json: scenario.body ?? ORDER,
      onAttempt: (a) => statuses.push(a.status ?? null),
    });
    const expect = scenario.expect;
    if (expect.error === undefined) {
      const reply = await sent;
      assert.equal(reply.status, expect.status);
      if (expect.replayed !== undefined) assert.equal(reply.replayed, expect.replayed);
      if (expect.attempts !== undefined) assert.equal(reply.attempts, expect.attempts);
    } else {
      const error = await sent.then(() => assert.fail(`expected a ${expect.error} error`), (e: unknown) => e);
      if (expect.error === "transport") {
        assert.ok(error instanceof TransportError, String(error));
      } else {
        assert.ok(error instanceof RejectedError, String(error));
        assert.equal(error.status, expect.status);
        assert.equal(error.problem.type, expect.problem_type);
        assert.ok(error.problem.title && error.problem.detail, JSON.stringify(error.problem));
        assert.equal(error.replayed, expect.replayed);
      }
      assert.equal(error.mayHaveRun, expect.may_have_run);
    }
    const elapsed = performance.now() - started;
    if (expect.elapsed_below_ms !== undefined) {
      assert.ok(elapsed < expect.elapsed_below_ms, `took ${elapsed} ms`);
    }
    if (expect.statuses !== undefined) assert.deepEqual(statuses, expect.statuses);
    const { requests } = await s.relay.stats();
    if (expect.relay_requests !== undefined) assert.equal(requests, expect.relay_requests, "attempts that reached the relay");
    if (expect.relay_requests_between !== undefined) {
      const [low, high] = expect.relay_requests_between;
      assert.ok(requests >= low && requests <= high, `attempts that reached the relay: ${requests}`);
    }
    if (scenario.settle_ms !== undefined) await new Promise((done) => setTimeout(done, scenario.settle_ms));
    if (expect.orders !== undefined) assert.equal((await s.server.orders(s.token)).length, expect.orders, "orders");
    if (expect.gateway_calls !== undefined) assert.equal(s.gateway.calls.length, expect.gateway_calls, "gateway calls");
    if (expect.distinct_charges !== undefined) assert.equal(s.gateway.distinctCharges, expect.distinct_charges, "charges");
  });
}

// GENERATED FILE: do not edit. The browser build of clients/js/src/index.ts
// (tsc, clients/js/tsconfig.json), copied here by `npm run embed` in clients/js;
// `idemgate serve` embeds it for the checkout page. clients/js's `npm test`
// (test/embedded.test.ts) fails while it differs from a fresh build.
/**
 * The client half of the `Idempotency-Key` protocol (PROTOCOL §14) on the
 * platform `fetch` — browsers, Node >= 18, Deno, Bun — with no dependencies.
 *
 * A request that timed out may have run. Sent again with the same key and the same
 * bytes, an idemgate server runs it at most once and answers the retry with the
 * first outcome (`Idempotent-Replayed: true`). This package makes sending it again
 * right by construction:
 *
 * - an {@link Operation} is one logical action ("Pay"): one `crypto.randomUUID()`
 *   key made once, sent on every attempt; {@link Operation.resume} picks it up
 *   after a reload or a restart;
 * - every attempt sends the same body bytes; a stream body, which cannot be sent
 *   twice, is refused before the first attempt ({@link BodyNotReplayableError});
 * - the {@link RetryPolicy} retries transport failures, `409` in progress (after
 *   its `Retry-After`, capped), and `5xx` that are not replays, with exponential
 *   backoff and full jitter under a total deadline — never `422`, other `4xx`, or a
 *   replayed outcome; `maxRetries: 0` is one attempt;
 * - a `POST`/`PATCH` without an operation is sent exactly once;
 * - a streamed answer (`text/event-stream`, {@link Client.stream}) is read event by
 *   event; a connection that drops mid-stream is resumed with the same key and
 *   `Last-Event-ID`, each event handed on once, in order;
 * - outcomes are typed: a {@link Reply} (`replayed`, `attempts`) or an
 *   {@link IdemgateError} — {@link KeyReusedError}, {@link InProgressError},
 *   {@link RejectedError}, {@link TransportError} — that tells whether the
 *   operation {@link IdemgateError.mayHaveRun | may have run}.
 *
 * ```ts
 * import { operation, send } from "idemgate-client";
 *
 * const pay = operation(); // when the user clicks "Pay"; keep pay.key to resume
 * const reply = await send(pay, {
 *   url: "/api/v1/orders",
 *   headers: { authorization: "Bearer alice" },
 *   json: { items: [{ id: 42, quantity: 1 }], currency: "RUB", amount: 1500 },
 * });
 * console.log(reply.status, reply.replayed, reply.json());
 * ```
 *
 * @module
 */
export { Client, Reply, send, stream, } from "./client.js";
export { AbortedError, BodyNotReplayableError, IdemgateError, InProgressError, isIdemgateProblem, KeyReusedError, PROBLEM_BASE, RejectedError, StreamRestartedError, TransportError, } from "./errors.js";
export { Events } from "./events.js";
export { InvalidKeyError, MAX_KEY_LENGTH, Operation, operation } from "./operation.js";
export { DEFAULT_POLICY, retryPolicy } from "./policy.js";

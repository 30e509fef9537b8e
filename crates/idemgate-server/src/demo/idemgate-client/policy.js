// GENERATED FILE: do not edit. The browser build of clients/js/src/policy.ts
// (tsc, clients/js/tsconfig.json), copied here by `npm run embed` in clients/js;
// `idemgate serve` embeds it for the checkout page. clients/js's `npm test`
// (test/embedded.test.ts) fails while it differs from a fresh build.
/**
 * When to send an attempt again, and how long to wait (PROTOCOL §14).
 *
 * {@link send} drives its attempts through one {@link Attempts} value, so the rules
 * below live here and nowhere else. They are those of the Rust `idemgate-client`.
 *
 * @module
 */
/** The defaults of the table above. */
export const DEFAULT_POLICY = Object.freeze({
    maxRetries: 4,
    minBackoffMs: 100,
    maxBackoffMs: 5_000,
    maxRetryAfterMs: 10_000,
    deadlineMs: 30_000,
    attemptTimeoutMs: 10_000,
});
/**
 * The default policy with some settings changed. A `maxBackoffMs` below
 * `minBackoffMs` is taken as `minBackoffMs`.
 *
 * ```ts
 * const once = retryPolicy({ maxRetries: 0 }); // exactly one attempt
 * ```
 *
 * @throws RangeError for a setting that is not a non-negative number.
 */
export function retryPolicy(changes = {}) {
    const policy = { ...DEFAULT_POLICY, ...changes };
    for (const [name, value] of Object.entries(policy)) {
        if (typeof value !== "number" || !(value >= 0)) {
            throw new RangeError(`retry policy: ${name} must be a non-negative number, not ${String(value)}`);
        }
    }
    if (!Number.isInteger(policy.maxRetries)) {
        throw new RangeError(`retry policy: maxRetries must be an integer, not ${policy.maxRetries}`);
    }
    return Object.freeze({ ...policy, maxBackoffMs: Math.max(policy.maxBackoffMs, policy.minBackoffMs) });
}
const FINAL = Object.freeze({ retry: false });
/**
 * The response rules, on the status and headers only:
 * - a replay (`Idempotent-Replayed: true`) is the operation's stored outcome: final;
 * - `409` with `Retry-After` (the first attempt still runs): retry after it;
 * - any other `5xx`: retry, after its `Retry-After` when it has one (`503`);
 * - everything else (`422`, other `4xx`, `2xx`, `3xx`): final.
 */
export function judgeResponse(status, headers) {
    if (isReplayed(headers)) {
        return FINAL;
    }
    const afterMs = retryAfterMs(headers);
    if (status === 409 && afterMs !== undefined) {
        return { retry: true, afterMs };
    }
    if (status >= 500 && status <= 599) {
        return { retry: true, afterMs };
    }
    return FINAL;
}
/** `Idempotent-Replayed: true`: the server's stored outcome, not a fresh run. */
export function isReplayed(headers) {
    return headers.get("idempotent-replayed")?.trim().toLowerCase() === "true";
}
/**
 * `Retry-After` in seconds (the form idemgate sends), as milliseconds. An
 * HTTP-date is not read: the retry then waits its backoff instead.
 */
export function retryAfterMs(headers) {
    const value = headers.get("retry-after")?.trim();
    if (value === undefined || !/^\d+$/.test(value)) {
        return undefined;
    }
    return Number(value) * 1000;
}
/**
 * Codes with which Node's `fetch` says no connection was made, so no byte of the
 * request left: the only transport failures known not to have run. Browsers say
 * nothing about a failure, so there every one may have run.
 */
const NOT_CONNECTED = new Set([
    "ECONNREFUSED",
    "ENOTFOUND",
    "EAI_AGAIN",
    "EHOSTUNREACH",
    "ENETUNREACH",
    "UND_ERR_CONNECT_TIMEOUT",
]);
/** Whether a failed `fetch` may have delivered the request (and so run it). */
export function mayHaveBeenDelivered(error) {
    let cause = error;
    for (let depth = 0; depth < 4 && cause !== null && typeof cause === "object"; depth++) {
        const code = cause.code;
        if (typeof code === "string" && NOT_CONNECTED.has(code)) {
            return false;
        }
        cause = cause.cause;
    }
    return true;
}
/** RFC 9110 §9.2.2: repeating these has the effect of one. */
const IDEMPOTENT_METHODS = new Set(["GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"]);
/**
 * The attempts of one request: counts them, keeps the deadline, and remembers
 * whether any may have run on the server.
 *
 * A request is retried when it carries an `Idempotency-Key` or its method is
 * idempotent; **a `POST`/`PATCH` without a key is sent exactly once**, whatever the
 * policy: the server cannot tell its retry from a second order.
 */
export class Attempts {
    policy;
    retryable;
    #started;
    #now;
    #random;
    #made = 0;
    #mayHaveRun = false;
    constructor(policy, method, keyed, clock = {}) {
        this.policy = policy;
        this.retryable = keyed || IDEMPOTENT_METHODS.has(method.toUpperCase());
        this.#now = clock.now ?? (() => performance.now());
        this.#random = clock.random ?? Math.random;
        this.#started = this.#now();
    }
    /** Starts the next attempt; returns its timeout: the attempt timeout, cut to what is left of the deadline. */
    next() {
        this.#made += 1;
        const left = this.policy.deadlineMs - (this.#now() - this.#started);
        return Math.max(0, Math.min(this.policy.attemptTimeoutMs, left));
    }
    /** Attempts made so far. */
    get made() {
        return this.#made;
    }
    /** Whether any attempt may have run the operation on the server. */
    get mayHaveRun() {
        return this.#mayHaveRun;
    }
    /** After an answer: notes whether it may have run, and judges it. */
    answered(status, headers) {
        // A 4xx is a refusal made before running, except 409: the first one runs.
        if (!(status >= 400 && status <= 499) || status === 409) {
            this.#mayHaveRun = true;
        }
        return judgeResponse(status, headers);
    }
    /** After a transport failure: notes whether it may have been delivered; always worth another attempt. */
    failed(error) {
        if (mayHaveBeenDelivered(error)) {
            this.#mayHaveRun = true;
        }
        return { retry: true, afterMs: undefined };
    }
    /** The attempt in flight was cut short (an abort): it may have been delivered. */
    interrupted() {
        this.#mayHaveRun = true;
    }
    /** How long to wait before the next attempt, or `undefined` for no next attempt. */
    waitFor(verdict) {
        if (!verdict.retry || !this.retryable) {
            return undefined;
        }
        const retries = this.#made - 1;
        if (retries >= this.policy.maxRetries) {
            return undefined;
        }
        const bound = Math.min(this.policy.minBackoffMs * 2 ** retries, this.policy.maxBackoffMs);
        const backoff = this.#random() * bound; // full jitter: uniform in [0, bound]
        const wait = verdict.afterMs === undefined ? backoff : Math.min(verdict.afterMs, this.policy.maxRetryAfterMs);
        // An attempt that would start at or past the deadline has no time to run.
        const elapsed = this.#now() - this.#started;
        return elapsed + wait < this.policy.deadlineMs ? wait : undefined;
    }
}

/**
 * The client: operations over the platform `fetch`, retried by the
 * {@link RetryPolicy}, ending in a {@link Reply} or an {@link IdemgateError}.
 *
 * @module
 */

import {
  AbortedError,
  BodyNotReplayableError,
  InProgressError,
  isIdemgateProblem,
  KeyReusedError,
  readProblem,
  RejectedError,
  TransportError,
  type IdemgateError,
} from "./errors.js";
import type { Operation } from "./operation.js";
import { Attempts, DEFAULT_POLICY, isReplayed, retryAfterMs, type RetryPolicy } from "./policy.js";

/** A body sent the same, byte for byte, on every attempt. */
export type ReplayableBody = string | Uint8Array | ArrayBuffer | ArrayBufferView | Blob | URLSearchParams;

/** What to send. */
export interface SendRequest {
  /** Absolute, or relative to the client's `baseUrl` (in a browser, to the page). */
  readonly url: string | URL;
  /** Default `POST`. */
  readonly method?: string;
  readonly headers?: HeadersInit;
  /** The body; a stream or a `FormData` is refused for a request that may be retried ({@link BodyNotReplayableError}). */
  readonly body?: ReplayableBody | ReadableStream<Uint8Array> | FormData | null;
  /** A JSON body instead: serialized once (with `Content-Type: application/json` unless set), so every attempt sends the same bytes. */
  readonly json?: unknown;
  /** Aborts the attempts and the waits between them ({@link AbortedError}). */
  readonly signal?: AbortSignal;
  /** This request's policy, if not the client's. */
  readonly policy?: RetryPolicy;
  /** Told about each attempt as it ends (for progress displays and logs). */
  readonly onAttempt?: (attempt: AttemptReport) => void;
  /** Passed to `fetch` as is (`redirect`, `credentials`, `mode`, …). */
  readonly init?: Omit<RequestInit, "method" | "headers" | "body" | "signal">;
}

/** How one attempt ended, as {@link SendRequest.onAttempt} hears it. */
export interface AttemptReport {
  /** 1 for the first attempt. */
  readonly attempt: number;
  /** The answer's status, or `undefined` when there was no answer. */
  readonly status: number | undefined;
  /** The answer was a replay of the stored outcome. */
  readonly replayed: boolean;
  /** The transport failure, when there was no answer. */
  readonly error: unknown;
  /** The wait before the next attempt, or `undefined` when this was the last. */
  readonly retryInMs: number | undefined;
}

/** The successful (`2xx`/`3xx`) outcome of an operation, read whole. */
export class Reply {
  /** The status. */
  readonly status: number;
  /** The status text (empty over HTTP/2). */
  readonly statusText: string;
  /** The headers. */
  readonly headers: Headers;
  /** The body bytes. */
  readonly body: Uint8Array;
  /**
   * The server replayed a stored outcome (`Idempotent-Replayed: true`) rather
   * than running the operation for this attempt: true after a lost response was
   * retried, or after a wait on a running duplicate.
   */
  readonly replayed: boolean;
  /** How many attempts it took (1 when the first was answered). */
  readonly attempts: number;

  /** @internal */
  constructor(status: number, statusText: string, headers: Headers, body: Uint8Array, attempts: number) {
    this.status = status;
    this.statusText = statusText;
    this.headers = headers;
    this.body = body;
    this.replayed = isReplayed(headers);
    this.attempts = attempts;
  }

  /** The body as text (UTF-8). */
  text(): string {
    return new TextDecoder().decode(this.body);
  }

  /** The body as JSON. */
  json<T = unknown>(): T {
    return JSON.parse(this.text()) as T;
  }
}

/** How a {@link Client} sends. */
export interface ClientOptions {
  /** The `fetch` to call; default the platform's. Give a wrapped one for tracing or auth: it runs on every attempt. */
  readonly fetch?: typeof fetch;
  /** Default {@link DEFAULT_POLICY}. */
  readonly policy?: RetryPolicy;
  /** Resolves relative request URLs (needed outside a browser). */
  readonly baseUrl?: string | URL;
  /** Sent on every request (an `Authorization`, say); a request's own headers win. */
  readonly headers?: HeadersInit;
}

/**
 * Sends requests, retrying the ones it safely can (see {@link RetryPolicy}).
 *
 * ```ts
 * const client = new Client({ baseUrl: "http://127.0.0.1:8080", headers: { authorization: "Bearer alice" } });
 * const pay = operation(); // on the click
 * const reply = await client.send(pay, { url: "/api/v1/orders", json: cart });
 * ```
 */
export class Client {
  readonly #fetch: typeof fetch;
  readonly #policy: RetryPolicy;
  readonly #baseUrl: string | URL | undefined;
  readonly #headers: HeadersInit | undefined;

  constructor(options: ClientOptions = {}) {
    // Called unbound, the platform fetch throws "Illegal invocation" in browsers.
    this.#fetch = options.fetch ?? ((input, init) => globalThis.fetch(input, init));
    this.#policy = options.policy ?? DEFAULT_POLICY;
    this.#baseUrl = options.baseUrl;
    this.#headers = options.headers;
  }

  /**
   * Sends `request` as an attempt of `operation` — with its key, retried — or,
   * with `null`, as a plain request (retried only when its method is idempotent).
   *
   * Each attempt reads the whole response body, so a response cut off halfway is
   * retried like any lost response.
   *
   * @returns the `2xx`/`3xx` outcome.
   * @throws {@link KeyReusedError}, {@link InProgressError}, {@link RejectedError},
   *   {@link TransportError}, {@link BodyNotReplayableError}, {@link AbortedError}
   *   (each an {@link IdemgateError} with `mayHaveRun`); a `TypeError` for a
   *   malformed URL or header, before anything is sent.
   */
  async send(operation: Operation | null, request: SendRequest): Promise<Reply> {
    const method = (request.method ?? "POST").toUpperCase();
    if ((method === "GET" || method === "HEAD") && (request.body != null || request.json !== undefined)) {
      // fetch refuses it on every attempt, which would read as transport failures
      // and be retried; it is the caller's mistake, said once, before any attempt.
      throw new TypeError(`a ${method} request has no body: send it as POST, or put it in the URL`);
    }
    const url = new URL(request.url, this.#baseUrl ?? globalThis.location?.href);
    const headers = new Headers(this.#headers);
    new Headers(request.headers).forEach((value, name) => headers.set(name, value));
    if (operation !== null) {
      headers.set("idempotency-key", operation.key);
    }
    const attempts = new Attempts(request.policy ?? this.#policy, method, headers.has("idempotency-key"));
    const body = await fixBody(request, headers, attempts.retryable);
    // Validates the method, URL and headers as fetch will, before any attempt.
    new Request(url, { method, headers });
    const signal = request.signal;
    for (;;) {
      if (signal?.aborted) {
        throw new AbortedError(signal.reason, attempts.mayHaveRun, attempts.made);
      }
      const timeout = attempts.next();
      const init: RequestInit = { ...request.init, method, headers };
      if (body !== undefined) {
        init.body = body;
        if (isStream(body)) {
          (init as { duplex?: string }).duplex = "half"; // sent once: see fixBody
        }
      }
      const outcome = await attempt(this.#fetch, url, init, timeout, signal);
      if (outcome.kind === "aborted") {
        attempts.interrupted();
        throw new AbortedError(outcome.reason, attempts.mayHaveRun, attempts.made);
      }
      const verdict =
        outcome.kind === "answer" ? attempts.answered(outcome.status, outcome.headers) : attempts.failed(outcome.error);
      const wait = attempts.waitFor(verdict);
      request.onAttempt?.({
        attempt: attempts.made,
        status: outcome.kind === "answer" ? outcome.status : undefined,
        replayed: outcome.kind === "answer" && isReplayed(outcome.headers),
        error: outcome.kind === "failure" ? outcome.error : undefined,
        retryInMs: wait,
      });
      if (wait !== undefined) {
        try {
          await sleep(wait, signal);
        } catch (reason) {
          throw new AbortedError(reason, attempts.mayHaveRun, attempts.made);
        }
        continue;
      }
      if (outcome.kind === "failure") {
        throw new TransportError(outcome.error, attempts.mayHaveRun, attempts.made);
      }
      if (outcome.status >= 400) {
        throw errorFromAnswer(outcome, attempts.mayHaveRun, attempts.made);
      }
      return new Reply(outcome.status, outcome.statusText, outcome.headers, outcome.body, attempts.made);
    }
  }
}

const defaultClient = new Client();

/**
 * {@link Client.send} on a client with the defaults: the platform `fetch`, the
 * default policy. In a browser, relative URLs are the page's.
 *
 * ```ts
 * const reply = await send(operation(), { url: "/api/v1/orders", json: cart, headers: { authorization } });
 * ```
 */
export function send(operation: Operation | null, request: SendRequest): Promise<Reply> {
  return defaultClient.send(operation, request);
}

type Outcome =
  | { kind: "answer"; status: number; statusText: string; headers: Headers; body: Uint8Array }
  | { kind: "failure"; error: unknown }
  | { kind: "aborted"; reason: unknown };

/** One attempt: the answer read whole, or why there was none. */
async function attempt(
  fetcher: typeof fetch,
  url: URL,
  init: RequestInit,
  timeoutMs: number,
  signal: AbortSignal | undefined,
): Promise<Outcome> {
  const controller = new AbortController();
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    controller.abort(new DOMException(`the attempt took longer than ${Math.round(timeoutMs)} ms`, "TimeoutError"));
  }, timeoutMs);
  const onAbort = () => controller.abort(signal?.reason);
  signal?.addEventListener("abort", onAbort, { once: true });
  try {
    const response = await fetcher(url, { ...init, signal: controller.signal });
    const body = new Uint8Array(await response.arrayBuffer());
    return {
      kind: "answer",
      status: response.status,
      statusText: response.statusText,
      headers: response.headers,
      body,
    };
  } catch (error) {
    if (signal?.aborted && !timedOut) {
      return { kind: "aborted", reason: signal.reason };
    }
    return { kind: "failure", error };
  } finally {
    clearTimeout(timer);
    signal?.removeEventListener("abort", onAbort);
  }
}

/** The body to send on every attempt, read once; sets its `Content-Type` when the caller did not. */
async function fixBody(
  request: SendRequest,
  headers: Headers,
  retryable: boolean,
): Promise<BodyInit | undefined> {
  const setType = (type: string) => {
    if (type !== "" && !headers.has("content-type")) headers.set("content-type", type);
  };
  if (request.json !== undefined) {
    if (request.body !== undefined && request.body !== null) {
      throw new TypeError("give a request either body or json, not both");
    }
    setType("application/json");
    return JSON.stringify(request.json);
  }
  const body = request.body;
  if (body === undefined || body === null) return undefined;
  if (typeof body === "string") {
    setType("text/plain;charset=UTF-8");
    return body;
  }
  if (body instanceof URLSearchParams) {
    setType("application/x-www-form-urlencoded;charset=UTF-8");
    return body.toString();
  }
  if (typeof Blob !== "undefined" && body instanceof Blob) {
    setType(body.type);
    return new Uint8Array(await body.arrayBuffer());
  }
  if (body instanceof ArrayBuffer) return new Uint8Array(body.slice(0));
  if (ArrayBuffer.isView(body)) {
    // A copy: the caller may reuse its buffer while the retries run.
    const copy = new Uint8Array(body.byteLength);
    copy.set(new Uint8Array(body.buffer, body.byteOffset, body.byteLength));
    return copy;
  }
  // A stream (read once) or a FormData (a new boundary on every send).
  if (retryable) throw new BodyNotReplayableError();
  return body as BodyInit; // sent exactly once, so its bytes need not repeat
}

function isStream(body: BodyInit): boolean {
  return typeof ReadableStream !== "undefined" && body instanceof ReadableStream;
}

/**
 * The error for a final, unsuccessful answer, after `attempts` attempts of which
 * any `mayHaveRun`.
 *
 * @internal
 */
export function errorFromAnswer(
  answer: { readonly status: number; readonly statusText: string; readonly headers: Headers; readonly body: Uint8Array },
  mayHaveRun: boolean,
  attempts: number,
): IdemgateError {
  const problem = readProblem(answer.status, answer.statusText, answer.headers, answer.body);
  const retryAfter = retryAfterMs(answer.headers);
  if (answer.status === 422 && isIdemgateProblem(problem, "key-reused")) {
    return new KeyReusedError(problem, attempts);
  }
  if (answer.status === 409 && (isIdemgateProblem(problem, "in-progress") || retryAfter !== undefined)) {
    return new InProgressError(problem, retryAfter, attempts);
  }
  return new RejectedError(problem, isReplayed(answer.headers), mayHaveRun || answer.status >= 500, attempts);
}

/** Waits `ms`, or rejects with the signal's reason when it fires first. */
function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

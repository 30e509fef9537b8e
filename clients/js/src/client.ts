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
  StreamRestartedError,
  TransportError,
  type IdemgateError,
} from "./errors.js";
import { LAST_EVENT_ID } from "./event-stream.js";
import { Events, type Chunk, type StreamSource } from "./events.js";
import type { Operation } from "./operation.js";
import { Attempts, DEFAULT_POLICY, isReplayed, retryAfterMs, type RetryPolicy, type Verdict } from "./policy.js";

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

/**
 * How one attempt ended, as {@link SendRequest.onAttempt} hears it.
 *
 * A streamed answer's attempt ({@link Client.stream}) ends with its body: it is
 * told about then, with the answer's status and, when the connection dropped
 * mid-stream, that failure as its `error`.
 */
export interface AttemptReport {
  /** 1 for the first attempt. */
  readonly attempt: number;
  /** The answer's status, or `undefined` when there was no answer. */
  readonly status: number | undefined;
  /** The answer was a replay of the stored outcome. */
  readonly replayed: boolean;
  /** The transport failure, when there was no answer (or a streamed answer's body broke off). */
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
    const sending = await this.#prepare(operation, request);
    const answer = await sending.until(false);
    return new Reply(answer.status, answer.statusText, answer.headers, answer.body, sending.attempts.made);
  }

  /**
   * Sends `request` as {@link Client.send} does, until an attempt is answered,
   * and returns that answer's body as an event stream (`text/event-stream`) to
   * read as it arrives: its {@link Events} hands on each event once, in order,
   * and resumes a stream whose connection dropped — asking again with the
   * operation's key and the `Last-Event-ID` of the last event received (PROTOCOL
   * §20) — under the request's policy: its retries, deadline and attempt timeout
   * count every attempt, the ones that resume included, and an attempt's timeout
   * runs until its last body byte. Give a long stream a policy with time for it.
   *
   * Without an operation (and for a method that is not idempotent) a dropped
   * stream is not asked for again: the loop throws a {@link TransportError}. The
   * `signal` aborts the reading too. Sends `Accept: text/event-stream` unless the
   * request has an `Accept`; `Last-Event-ID` is the client's to send.
   *
   * ```ts
   * const ask = operation();
   * const events = await client.stream(ask, { url: "/v1/chat/completions", json: { stream: true, messages } });
   * for await (const event of events) print(event.data);
   * ```
   *
   * @returns the stream of the `2xx`/`3xx` answer, once its head arrived.
   * @throws as {@link Client.send} does, for the attempts before an answer; the
   *   loop over the events throws the same errors, and {@link StreamRestartedError}
   *   when the server ran the operation again rather than resume its stream.
   */
  async stream(operation: Operation | null, request: SendRequest): Promise<Events> {
    if (new Headers(request.headers).has(LAST_EVENT_ID)) {
      // The client knows where a resumed answer starts only for the ids it sent.
      throw new TypeError("Last-Event-ID is sent by the client when it resumes a stream: do not set it");
    }
    const sending = await this.#prepare(operation, request);
    if (!sending.headers.has("accept")) {
      sending.headers.set("accept", "text/event-stream");
    }
    const answer = await sending.until(true);
    return new Events(new StreamAnswers(sending, answer), answer.status, answer.headers);
  }

  /** The attempts of `request`: its URL, headers and body checked and fixed once, for every attempt. */
  async #prepare(operation: Operation | null, request: SendRequest): Promise<Sending> {
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
    return new Sending(this.#fetch, request, url, method, headers, body, attempts);
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

/**
 * {@link Client.stream} on a client with the defaults: the platform `fetch`, the
 * default policy. In a browser, relative URLs are the page's.
 */
export function stream(operation: Operation | null, request: SendRequest): Promise<Events> {
  return defaultClient.stream(operation, request);
}

/** An answer read whole. */
interface WholeAnswer {
  readonly kind: "answer";
  readonly status: number;
  readonly statusText: string;
  readonly headers: Headers;
  readonly body: Uint8Array;
}

/** A `2xx`/`3xx` answer whose body is still to be read, its attempt still in flight. */
interface OpenAnswer {
  readonly kind: "open";
  readonly status: number;
  readonly statusText: string;
  readonly headers: Headers;
  /** The body's reader; `undefined` for an answer without a body. */
  readonly body: ReadableStreamDefaultReader<Uint8Array> | undefined;
  readonly flight: InFlight;
}

/** Why an attempt has no answer. */
type NoAnswer = { readonly kind: "failure"; readonly error: unknown } | { readonly kind: "aborted"; readonly reason: unknown };

type Outcome = WholeAnswer | OpenAnswer | NoAnswer;

/**
 * One attempt's `fetch` in flight, from sending to its answer's last body byte:
 * aborted by the attempt's timeout or by the caller's signal.
 */
class InFlight {
  readonly #controller = new AbortController();
  readonly #signal: AbortSignal | undefined;
  readonly #timer: ReturnType<typeof setTimeout>;
  readonly #onAbort = () => this.#controller.abort(this.#signal?.reason);
  #timedOut = false;

  constructor(timeoutMs: number, signal: AbortSignal | undefined) {
    this.#signal = signal;
    this.#timer = setTimeout(() => {
      this.#timedOut = true;
      this.#controller.abort(new DOMException(`the attempt took longer than ${Math.round(timeoutMs)} ms`, "TimeoutError"));
    }, timeoutMs);
    signal?.addEventListener("abort", this.#onAbort, { once: true });
  }

  /** The signal to give `fetch`. */
  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  /** What `error`, from the `fetch` or a read of its body, means: the caller's abort, or a failure (the timeout's included). */
  failed(error: unknown): NoAnswer {
    if (this.#signal?.aborted && !this.#timedOut) {
      return { kind: "aborted", reason: this.#signal.reason };
    }
    return { kind: "failure", error };
  }

  /** The attempt is over: no timeout, no listener. */
  end(): void {
    clearTimeout(this.#timer);
    this.#signal?.removeEventListener("abort", this.#onAbort);
  }
}

/**
 * One attempt: the answer read whole — or, `streaming`, a `2xx`/`3xx` answer's
 * head, its body left to read — or why there was none.
 */
async function attempt(
  fetcher: typeof fetch,
  url: URL,
  init: RequestInit,
  timeoutMs: number,
  signal: AbortSignal | undefined,
  streaming: boolean,
): Promise<Outcome> {
  const flight = new InFlight(timeoutMs, signal);
  let open = false;
  try {
    const response = await fetcher(url, { ...init, signal: flight.signal });
    const head = { status: response.status, statusText: response.statusText, headers: response.headers };
    if (streaming && response.status < 400) {
      open = true; // the flight ends with the body
      return { kind: "open", ...head, body: response.body?.getReader(), flight };
    }
    const body = new Uint8Array(await response.arrayBuffer());
    return { kind: "answer", ...head, body };
  } catch (error) {
    return flight.failed(error);
  } finally {
    if (!open) flight.end();
  }
}

/**
 * The attempts of one request, as {@link Client.send} and {@link Client.stream}
 * drive them: every one sends the same method, URL, headers and body, under one
 * {@link Attempts}.
 */
class Sending {
  readonly attempts: Attempts;
  /** The headers of every attempt; a streamed answer's resumption sets `Last-Event-ID` in them. */
  readonly headers: Headers;
  readonly #fetch: typeof fetch;
  readonly #request: SendRequest;
  readonly #url: URL;
  readonly #method: string;
  readonly #body: BodyInit | undefined;

  constructor(
    fetcher: typeof fetch,
    request: SendRequest,
    url: URL,
    method: string,
    headers: Headers,
    body: BodyInit | undefined,
    attempts: Attempts,
  ) {
    this.#fetch = fetcher;
    this.#request = request;
    this.#url = url;
    this.#method = method;
    this.headers = headers;
    this.#body = body;
    this.attempts = attempts;
  }

  /**
   * Sends attempts until one is the outcome, and returns it: a `2xx`/`3xx`
   * answer read whole or, `streaming`, its head (an attempt whose body is still
   * to be read: told about when it ends, {@link Sending.tell}).
   *
   * @throws the {@link IdemgateError} of a final unsuccessful answer, of no
   *   answer ({@link TransportError}) or of an abort.
   */
  async until(streaming: false): Promise<WholeAnswer>;
  async until(streaming: true): Promise<OpenAnswer>;
  async until(streaming: boolean): Promise<WholeAnswer | OpenAnswer> {
    const attempts = this.attempts;
    const signal = this.#request.signal;
    for (;;) {
      if (signal?.aborted) {
        throw new AbortedError(signal.reason, attempts.mayHaveRun, attempts.made);
      }
      const timeout = attempts.next();
      const outcome = await attempt(this.#fetch, this.#url, this.#init(), timeout, signal, streaming);
      if (outcome.kind === "aborted") {
        attempts.interrupted();
        throw new AbortedError(outcome.reason, attempts.mayHaveRun, attempts.made);
      }
      if (outcome.kind === "open") {
        attempts.answered(outcome.status, outcome.headers); // a 2xx/3xx: final
        return outcome;
      }
      const verdict =
        outcome.kind === "answer" ? attempts.answered(outcome.status, outcome.headers) : attempts.failed(outcome.error);
      const ended =
        outcome.kind === "answer"
          ? { status: outcome.status, replayed: isReplayed(outcome.headers), error: undefined }
          : { status: undefined, replayed: false, error: outcome.error };
      if (await this.again(verdict, ended)) {
        continue;
      }
      if (outcome.kind === "failure") {
        throw new TransportError(outcome.error, attempts.mayHaveRun, attempts.made);
      }
      if (outcome.status >= 400) {
        throw errorFromAnswer(outcome, attempts.mayHaveRun, attempts.made);
      }
      return outcome;
    }
  }

  /**
   * After the last attempt `ended` as `verdict` says: tells `onAttempt`, and when
   * another attempt is due (the verdict asks for one and the policy has it),
   * waits for it and returns `true`; `false` when there is none.
   *
   * @throws {@link AbortedError} when the caller's signal fires during the wait.
   */
  async again(verdict: Verdict, ended: AttemptEnd): Promise<boolean> {
    const wait = this.attempts.waitFor(verdict);
    this.tell(ended, wait);
    if (wait === undefined) {
      return false;
    }
    try {
      await sleep(wait, this.#request.signal);
    } catch (reason) {
      throw new AbortedError(reason, this.attempts.mayHaveRun, this.attempts.made);
    }
    return true;
  }

  /** Tells `onAttempt` how the last attempt ended, and the wait before the next, if any. */
  tell(ended: AttemptEnd, retryInMs: number | undefined): void {
    this.#request.onAttempt?.({ attempt: this.attempts.made, ...ended, retryInMs });
  }

  /** The `fetch` options of an attempt. */
  #init(): RequestInit {
    const init: RequestInit = { ...this.#request.init, method: this.#method, headers: this.headers };
    if (this.#body !== undefined) {
      init.body = this.#body;
      if (isStream(this.#body)) {
        (init as { duplex?: string }).duplex = "half"; // sent once: see fixBody
      }
    }
    return init;
  }
}

/** How an attempt ended, without its number and the wait after it. */
type AttemptEnd = Pick<AttemptReport, "status" | "replayed" | "error">;

/**
 * The answers of a streamed request, as its {@link Events} reads them: the
 * first, and each that resumes the stream after a cut, sent by the request's
 * attempts.
 */
class StreamAnswers implements StreamSource {
  readonly #sending: Sending;
  #answer: OpenAnswer;
  /** Why the current answer's body broke off. */
  #cut: unknown;
  #cancelled = false;

  constructor(sending: Sending, first: OpenAnswer) {
    this.#sending = sending;
    this.#answer = first;
  }

  get attempts(): number {
    return this.#sending.attempts.made;
  }

  async read(): Promise<Chunk> {
    const answer = this.#answer;
    let read: ReadableStreamReadResult<Uint8Array>;
    try {
      read = answer.body === undefined ? { done: true, value: undefined } : await answer.body.read();
    } catch (error) {
      answer.flight.end();
      if (this.#cancelled) {
        return { kind: "end" };
      }
      const failure = answer.flight.failed(error);
      if (failure.kind === "aborted") {
        throw new AbortedError(failure.reason, this.#sending.attempts.mayHaveRun, this.attempts);
      }
      this.#cut = failure.error;
      return { kind: "cut" };
    }
    if (!read.done) {
      return { kind: "bytes", bytes: read.value };
    }
    answer.flight.end();
    if (!this.#cancelled) {
      this.#sending.tell({ status: answer.status, replayed: isReplayed(answer.headers), error: undefined }, undefined);
    }
    return { kind: "end" };
  }

  async resume(lastEventId: string | undefined): Promise<void> {
    const sending = this.#sending;
    const attempts = sending.attempts;
    const cut = this.#cut;
    const broken = this.#answer;
    const ended = { status: broken.status, replayed: isReplayed(broken.headers), error: cut };
    if (!(await sending.again(attempts.failed(cut), ended))) {
      throw new TransportError(cut, attempts.mayHaveRun, attempts.made);
    }
    if (lastEventId === undefined) {
      sending.headers.delete(LAST_EVENT_ID);
    } else {
      sending.headers.set(LAST_EVENT_ID, lastEventId);
    }
    const answer = await sending.until(true);
    if (this.#cancelled || !isReplayed(answer.headers)) {
      await release(answer);
      if (this.#cancelled) return;
      // The operation ran again: its first run, whose events were handed on,
      // was not kept (a cut stream released, PROTOCOL §20).
      sending.tell({ status: answer.status, replayed: false, error: undefined }, undefined);
      throw new StreamRestartedError(attempts.made);
    }
    this.#answer = answer;
  }

  async cancel(): Promise<void> {
    this.#cancelled = true;
    await release(this.#answer);
  }
}

/** Stops reading `answer`: its connection is released, its attempt over. */
async function release(answer: OpenAnswer): Promise<void> {
  answer.flight.end();
  // A body that broke off rejects its cancel with the failure, already handled.
  await answer.body?.cancel().catch(() => undefined);
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

/**
 * Typed outcomes: what went wrong, and whether the operation may have run.
 *
 * @module
 */

/** The default base of idemgate's problem types (the operator may set another: `--problem-type-base`). */
export const PROBLEM_BASE = "/problems/";

/**
 * An `application/problem+json` answer (RFC 9457), as the server sent it.
 *
 * An answer that is not problem+json (a plain-text 502 from a load balancer) is
 * read as RFC 9457 says: type `about:blank`, the status text as the title.
 */
export interface Problem {
  /** The problem type URI (`/problems/…` for idemgate's own). */
  readonly type: string;
  /** Short, the same for every occurrence of the type. */
  readonly title: string | undefined;
  /** The HTTP status of the answer. */
  readonly status: number;
  /** What happened this time. */
  readonly detail: string | undefined;
  /** The whole problem object, for extension members; `undefined` when not problem+json. */
  readonly body: Readonly<Record<string, unknown>> | undefined;
}

/**
 * Whether `problem` is idemgate's problem with this slug (`key-reused`, …): the type URI decides, never the wording.
 * The operator may set the types' base (`--problem-type-base`), so the slug is compared: the type's last segment
 * after a `/`, `:` or `#`.
 */
export function isIdemgateProblem(problem: Problem, slug: string): boolean {
  const type = problem.type;
  return type.endsWith(slug) && ["/", ":", "#"].includes(type.charAt(type.length - slug.length - 1));
}

/** Reads the problem from an answer's parts. */
export function readProblem(status: number, statusText: string, headers: Headers, body: Uint8Array): Problem {
  const contentType = headers.get("content-type") ?? "";
  let parsed: Record<string, unknown> | undefined;
  if (contentType.startsWith("application/problem+json")) {
    try {
      const value: unknown = JSON.parse(new TextDecoder().decode(body));
      if (value !== null && typeof value === "object" && !Array.isArray(value)) {
        parsed = value as Record<string, unknown>;
      }
    } catch {
      // Not JSON after all: read as about:blank below.
    }
  }
  const text = (value: unknown) => (typeof value === "string" ? value : undefined);
  return {
    type: text(parsed?.["type"]) ?? "about:blank",
    title: text(parsed?.["title"]) ?? (statusText || undefined),
    status,
    detail: text(parsed?.["detail"]),
    body: parsed,
  };
}

/**
 * Why an operation did not end in a `2xx`/`3xx` {@link Reply}.
 *
 * Each says, through {@link IdemgateError.mayHaveRun}, whether the operation may
 * have taken effect on the server — the question an application must answer before
 * telling its user "not paid". When it is `true`, resume the same
 * {@link Operation} later to learn the outcome, never a new one.
 */
export abstract class IdemgateError extends Error {
  /** Whether the operation may have taken effect on the server. */
  readonly mayHaveRun: boolean;
  /** Attempts sent (0 when refused before the first). */
  readonly attempts: number;

  protected constructor(message: string, mayHaveRun: boolean, attempts: number, options?: { cause: unknown }) {
    super(message, options);
    this.mayHaveRun = mayHaveRun;
    this.attempts = attempts;
  }
}

/**
 * `422` `key-reused`: the key was used before for a *different* request (another
 * body, path or method). This request did not run, and is never retried. A bug in
 * the caller, usually: one key per action, and the action's body fixed once made.
 */
export class KeyReusedError extends IdemgateError {
  override name = "KeyReusedError";
  /** The server's answer. */
  readonly problem: Problem;

  /** @internal */
  constructor(problem: Problem, attempts: number) {
    super(`the Idempotency-Key was already used for a different request: ${describe(problem)}`, false, attempts);
    this.problem = problem;
  }
}

/**
 * `409` `in-progress` after the retries ran out (or the deadline left no time to
 * wait): the first attempt is still running on the server. It may well succeed;
 * ask again later with the same {@link Operation} to get its outcome.
 */
export class InProgressError extends IdemgateError {
  override name = "InProgressError";
  /** The server's last `Retry-After`, in milliseconds (as `setTimeout` takes it). */
  readonly retryAfter: number | undefined;
  /** The server's answer. */
  readonly problem: Problem;

  /** @internal */
  constructor(problem: Problem, retryAfter: number | undefined, attempts: number) {
    super(`the operation is still running on the server: ${describe(problem)}`, true, attempts);
    this.problem = problem;
    this.retryAfter = retryAfter;
  }
}

/**
 * Any other `4xx`/`5xx` that is the outcome: a refused request, a replayed
 * failure, or a `5xx` the retries did not get past.
 */
export class RejectedError extends IdemgateError {
  override name = "RejectedError";
  /** The server's answer: `type`, `title`, `status`, `detail`. */
  readonly problem: Problem;
  /** It was a replay (`Idempotent-Replayed: true`): the stored outcome of this operation. */
  readonly replayed: boolean;

  /** @internal */
  constructor(problem: Problem, replayed: boolean, mayHaveRun: boolean, attempts: number) {
    super(`the server answered ${describe(problem)}`, mayHaveRun, attempts);
    this.problem = problem;
    this.replayed = replayed;
  }

  /** The answer's HTTP status. */
  get status(): number {
    return this.problem.status;
  }
}

/**
 * No answer: every attempt failed in transport (refused, reset, cut off, timed
 * out), or the deadline cut the last. `cause` is the last attempt's failure.
 */
export class TransportError extends IdemgateError {
  override name = "TransportError";

  /** @internal */
  constructor(cause: unknown, mayHaveRun: boolean, attempts: number) {
    super("no answer from the server", mayHaveRun, attempts, { cause });
  }
}

/**
 * A streamed answer (`Client.stream`) broke off, and the retry that asked for it
 * again was answered by a new run of the operation, not the first one's stream:
 * the server did not keep that run (a cut stream is released by the route's
 * server-error policy, PROTOCOL §20). The events handed on so far were that run's;
 * the new run is now the operation's outcome — ask for it with the same
 * {@link Operation} to read its stream whole.
 */
export class StreamRestartedError extends IdemgateError {
  override name = "StreamRestartedError";

  /** @internal */
  constructor(attempts: number) {
    super(
      "the stream broke off and the server ran the operation again rather than resume it: the events so far were a run it did not keep",
      true,
      attempts,
    );
  }
}

/**
 * The request body is a stream (or a `FormData`, whose multipart boundary is new
 * on every send), which cannot be sent again byte for byte. Nothing was sent.
 * Buffer it: a string, bytes, a `Blob`, or `json`.
 */
export class BodyNotReplayableError extends IdemgateError {
  override name = "BodyNotReplayableError";

  /** @internal */
  constructor() {
    super(
      "the request body is a stream or FormData and cannot be replayed byte for byte on a retry; nothing was sent: buffer the body",
      false,
      0,
    );
  }
}

/**
 * The caller's `AbortSignal` fired. Named `AbortError`, like the platform's, so
 * code that ignores aborts keeps doing so; `cause` is the signal's reason, and
 * {@link IdemgateError.mayHaveRun} says whether an attempt was under way or sent.
 */
export class AbortedError extends IdemgateError {
  override name = "AbortError";

  /** @internal */
  constructor(reason: unknown, mayHaveRun: boolean, attempts: number) {
    super("the operation was aborted", mayHaveRun, attempts, { cause: reason });
  }
}

function describe(problem: Problem): string {
  let text = `${problem.status} ${problem.type}`;
  if (problem.title !== undefined) text += ` (${problem.title})`;
  if (problem.detail !== undefined) text += `: ${problem.detail}`;
  return text;
}

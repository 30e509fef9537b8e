/**
 * Streamed answers (PROTOCOL §20): an event stream read event by event as it
 * arrives and, when the connection drops mid-stream, asked for again with the
 * same key and the `Last-Event-ID` of the last event received — each event
 * handed to the caller once, in order.
 *
 * The server answers such a retry from the operation's one stream: joined while
 * it is produced, or replayed once it is stored, starting just after the first
 * block whose id is the `Last-Event-ID` (the whole stream when no id was
 * received). Both ends read the format the same way ({@link EventStreamReader}),
 * so the client knows the offset the answer starts at and passes over what it
 * already handed on.
 *
 * `Client.stream` makes an {@link Events}; its attempts are the client's (a
 * {@link StreamSource}).
 *
 * @module
 */

import { EventStreamReader, type EventBlock } from "./event-stream.js";
import { isReplayed } from "./policy.js";

/**
 * One event of a stream, as a browser's `EventSource` dispatches it. (Not named
 * `Event`: that is the DOM's.)
 */
export interface StreamEvent {
  /** Its type: the `event` field, `"message"` without one (or with an empty one). */
  readonly type: string;
  /** Its data: the `data` lines joined with LF. */
  readonly data: string;
  /**
   * The stream's last event id when it arrived (its own `id`, or the one an
   * earlier event set); `undefined` when none was set.
   */
  readonly lastEventId: string | undefined;
}

/** What the current answer's body gave: bytes, its clean end, or a cut (the connection dropped). */
export type Chunk = { readonly kind: "bytes"; readonly bytes: Uint8Array } | { readonly kind: "end" } | { readonly kind: "cut" };

/**
 * The answers of one streamed request's attempts, as {@link Events} reads them:
 * the client's attempts under its policy, deadline and signal (client.ts).
 *
 * @internal
 */
export interface StreamSource {
  /** Attempts made so far. */
  readonly attempts: number;
  /**
   * The current answer's next bytes, its end, or its cut.
   *
   * @throws {@link AbortedError} when the caller's signal fired.
   */
  read(): Promise<Chunk>;
  /**
   * After a cut: the attempts that ask again (with `Last-Event-ID: lastEventId`
   * when given, else without), under the policy, until one answers with the
   * operation's stream; the next {@link read} reads that answer.
   *
   * @throws the {@link IdemgateError} that ends the stream: no attempt left
   *   ({@link TransportError}), a final unsuccessful answer, a new run of the
   *   operation ({@link StreamRestartedError}), an abort.
   */
  resume(lastEventId: string | undefined): Promise<void>;
  /** Stops reading the current answer (releases its connection); the next {@link read} ends. */
  cancel(): Promise<void>;
}

/**
 * A streamed answer (`text/event-stream`), made by `Client.stream`: an
 * async iterable of its events, each handed on once, in order, however often the
 * connection dropped.
 *
 * ```ts
 * const events = await client.stream(ask, { url: "/v1/chat/completions", json: { stream: true, messages } });
 * for await (const event of events) {
 *   print(event.data);
 * }
 * ```
 *
 * Breaking out of the loop (or {@link Events.close}) stops reading and releases
 * the connection; so does an error, which the loop throws. Read it once.
 */
export class Events implements AsyncIterable<StreamEvent> {
  /** The first answer's status. */
  readonly status: number;
  /** The first answer's headers. */
  readonly headers: Headers;
  /**
   * Whether the first answer was the operation's stream replayed or joined
   * rather than produced for this request (`Idempotent-Replayed: true`).
   */
  readonly replayed: boolean;

  readonly #source: StreamSource;
  #reader = new EventStreamReader();
  /** Events read, not yet handed on. */
  readonly #ready: StreamEvent[] = [];
  /** The stream offset just after the last block handed on or passed over. */
  #readTo = 0;
  /** The stream's last event id so far. */
  #lastEventId: string | undefined;
  /** Where the first block with each id ended: a stream resumed after an id starts there. */
  readonly #firstEndOf = new Map<string, number>();
  #ended = false;

  /** @internal */
  constructor(source: StreamSource, status: number, headers: Headers) {
    this.#source = source;
    this.status = status;
    this.headers = headers;
    this.replayed = isReplayed(headers);
  }

  /** Attempts made so far, the ones that resumed the stream included. */
  get attempts(): number {
    return this.#source.attempts;
  }

  /**
   * The events, as they arrive. A dropped connection is resumed under the
   * request's {@link RetryPolicy} (its retries and deadline count every attempt);
   * when it cannot be, the loop throws the {@link IdemgateError} that says why,
   * and the events handed on so far stay the operation's first ones.
   */
  async *[Symbol.asyncIterator](): AsyncGenerator<StreamEvent, void, undefined> {
    try {
      for (let event = await this.#next(); event !== undefined; event = await this.#next()) {
        yield event;
      }
    } finally {
      await this.close();
    }
  }

  /** Stops reading: the events not yet handed on are dropped and the connection released. */
  async close(): Promise<void> {
    if (this.#ended && this.#ready.length === 0) {
      return;
    }
    this.#ended = true;
    this.#ready.length = 0;
    await this.#source.cancel();
  }

  /** The next event; `undefined` once the stream ended cleanly (or was closed). */
  async #next(): Promise<StreamEvent | undefined> {
    for (;;) {
      const event = this.#ready.shift();
      if (event !== undefined) {
        return event;
      }
      if (this.#ended) {
        return undefined;
      }
      let chunk: Chunk;
      try {
        chunk = await this.#source.read();
      } catch (error) {
        this.#ended = true;
        throw error;
      }
      if (this.#ended) {
        return undefined; // closed while reading
      }
      switch (chunk.kind) {
        case "bytes":
          this.#take(this.#reader.feed(chunk.bytes));
          break;
        case "end": {
          const last = this.#reader.finish();
          if (last !== undefined) this.#take([last]);
          this.#ended = true;
          break;
        }
        case "cut":
          await this.#resume();
          break;
      }
    }
  }

  /** Hands on the blocks past what was read before, as events. */
  #take(blocks: readonly EventBlock[]): void {
    for (const block of blocks) {
      if (block.end <= this.#readTo) {
        continue; // handed on before the connection dropped
      }
      this.#readTo = block.end;
      if (block.id !== undefined) {
        if (!this.#firstEndOf.has(block.id)) this.#firstEndOf.set(block.id, block.end);
        this.#lastEventId = block.id === "" ? undefined : block.id;
      }
      if (block.data !== undefined) {
        this.#ready.push(
          Object.freeze({
            type: block.event || "message",
            data: block.data,
            lastEventId: this.#lastEventId,
          }),
        );
      }
    }
  }

  /**
   * After the stream broke off: asks for it again, after the last event id when
   * there is one a header can carry as is (the answer then starts where the
   * first block with that id ended), else from its first byte.
   */
  async #resume(): Promise<void> {
    const id = this.#lastEventId;
    const sendable = id !== undefined && isHeaderSafe(id);
    try {
      await this.#source.resume(sendable ? id : undefined);
    } catch (error) {
      this.#ended = true;
      throw error;
    }
    this.#reader = new EventStreamReader(sendable ? this.#firstEndOf.get(id)! : 0);
  }
}

/**
 * Whether `id` reaches the server as a header value byte for byte: visible ASCII,
 * with spaces and tabs only inside (`fetch` trims them at the ends, and the server
 * reads a header's value as ASCII). Any other id is not sent: the answer is the
 * whole stream, whose offsets the client then knows.
 */
function isHeaderSafe(id: string): boolean {
  return /^[\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?$/.test(id);
}

// GENERATED FILE: do not edit. The browser build of clients/js/src/events.ts
// (tsc, clients/js/tsconfig.json), copied here by `npm run embed` in clients/js;
// `idemgate serve` embeds it for the checkout page. clients/js's `npm test`
// (test/embedded.test.ts) fails while it differs from a fresh build.
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
import { EventStreamReader } from "./event-stream.js";
import { isReplayed } from "./policy.js";
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
export class Events {
    /** The first answer's status. */
    status;
    /** The first answer's headers. */
    headers;
    /**
     * Whether the first answer was the operation's stream replayed or joined
     * rather than produced for this request (`Idempotent-Replayed: true`).
     */
    replayed;
    #source;
    #reader = new EventStreamReader();
    /** Events read, not yet handed on. */
    #ready = [];
    /** The stream offset just after the last block handed on or passed over. */
    #readTo = 0;
    /** The stream's last event id so far. */
    #lastEventId;
    /** Where the first block with each id ended: a stream resumed after an id starts there. */
    #firstEndOf = new Map();
    #ended = false;
    /** @internal */
    constructor(source, status, headers) {
        this.#source = source;
        this.status = status;
        this.headers = headers;
        this.replayed = isReplayed(headers);
    }
    /** Attempts made so far, the ones that resumed the stream included. */
    get attempts() {
        return this.#source.attempts;
    }
    /**
     * The events, as they arrive. A dropped connection is resumed under the
     * request's {@link RetryPolicy} (its retries and deadline count every attempt);
     * when it cannot be, the loop throws the {@link IdemgateError} that says why,
     * and the events handed on so far stay the operation's first ones.
     */
    async *[Symbol.asyncIterator]() {
        try {
            for (let event = await this.#next(); event !== undefined; event = await this.#next()) {
                yield event;
            }
        }
        finally {
            await this.close();
        }
    }
    /** Stops reading: the events not yet handed on are dropped and the connection released. */
    async close() {
        if (this.#ended && this.#ready.length === 0) {
            return;
        }
        this.#ended = true;
        this.#ready.length = 0;
        await this.#source.cancel();
    }
    /** The next event; `undefined` once the stream ended cleanly (or was closed). */
    async #next() {
        for (;;) {
            const event = this.#ready.shift();
            if (event !== undefined) {
                return event;
            }
            if (this.#ended) {
                return undefined;
            }
            let chunk;
            try {
                chunk = await this.#source.read();
            }
            catch (error) {
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
                    if (last !== undefined)
                        this.#take([last]);
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
    #take(blocks) {
        for (const block of blocks) {
            if (block.end <= this.#readTo) {
                continue; // handed on before the connection dropped
            }
            this.#readTo = block.end;
            if (block.id !== undefined) {
                if (!this.#firstEndOf.has(block.id))
                    this.#firstEndOf.set(block.id, block.end);
                this.#lastEventId = block.id === "" ? undefined : block.id;
            }
            if (block.data !== undefined) {
                this.#ready.push(Object.freeze({
                    type: block.event || "message",
                    data: block.data,
                    lastEventId: this.#lastEventId,
                }));
            }
        }
    }
    /**
     * After the stream broke off: asks for it again, after the last event id when
     * there is one a header can carry as is (the answer then starts where the
     * first block with that id ended), else from its first byte.
     */
    async #resume() {
        const id = this.#lastEventId;
        const sendable = id !== undefined && isHeaderSafe(id);
        try {
            await this.#source.resume(sendable ? id : undefined);
        }
        catch (error) {
            this.#ended = true;
            throw error;
        }
        this.#reader = new EventStreamReader(sendable ? this.#firstEndOf.get(id) : 0);
    }
}
/**
 * Whether `id` reaches the server as a header value byte for byte: visible ASCII,
 * with spaces and tabs only inside (`fetch` trims them at the ends, and the server
 * reads a header's value as ASCII). Any other id is not sent: the answer is the
 * whole stream, whose offsets the client then knows.
 */
function isHeaderSafe(id) {
    return /^[\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?$/.test(id);
}

// GENERATED FILE: do not edit. The browser build of clients/js/src/event-stream.ts
// (tsc, clients/js/tsconfig.json), copied here by `npm run embed` in clients/js;
// `idemgate serve` embeds it for the checkout page. clients/js's `npm test`
// (test/embedded.test.ts) fails while it differs from a fresh build.
/**
 * The `text/event-stream` format (the HTML standard's Server-Sent Events,
 * "Interpreting an event stream"), as far as resuming a stream needs it: where
 * each event block ends, what it carries, and the id it sets.
 *
 * The same reading as the server's (the Rust `idemgate_core::event_stream`): the
 * server resumes a stored stream just after the first block whose id is the
 * retry's `Last-Event-ID` (PROTOCOL §20), and a client that reconnects with that
 * id knows from the same reading where the replay starts, so it hands each event
 * to its caller once.
 *
 * Lines end in CRLF, LF or CR; an empty line ends a block; a line starting with
 * `:` is a comment; a field's value follows its first `:` without one leading
 * space. An `id` field whose value holds NUL is ignored. A last line without its
 * ending belongs to no block (the standard dispatches nothing for it).
 *
 * It reads bytes, not text: a block's {@link EventBlock.end} is a byte offset in
 * the stream, which is what the server counts (a JavaScript string's length
 * counts UTF-16 units). That is also why this is not `eventsource-parser` (nor
 * the platform's `EventSource`): they hand on events but not where in the byte
 * stream each ended, and resuming needs exactly that.
 *
 * @module
 */
/** The header a client reconnects with, carrying the last event id it received (the HTML standard's `Last-Event-ID`). */
export const LAST_EVENT_ID = "last-event-id";
const LF = 0x0a;
const CR = 0x0d;
const COLON = 0x3a;
/**
 * Reads an event stream's bytes as they arrive, block by block.
 *
 * ```ts
 * const utf8 = new TextEncoder();
 * const reader = new EventStreamReader();
 * reader.feed(utf8.encode("id: 1\ndata: a"));      // []: the block is not over
 * const [block] = reader.feed(utf8.encode("\n\n")); // { end: 15, id: "1", data: "a", event: undefined }
 * ```
 */
export class EventStreamReader {
    /** The bytes of the line not yet ended (`#length` of them; the rest is room to grow). */
    #buffer = new Uint8Array(1024);
    #length = 0;
    /** How many of the held bytes are known to hold no line ending (a CR at the end is not: an LF may follow). */
    #scanned = 0;
    /** The stream offset of the held bytes' first. */
    #at;
    /** The block being read, and whether any line of it was. */
    #event;
    #data;
    #id;
    #started = false;
    /**
     * Each line is decoded on its own, replacing what is not UTF-8 (as the
     * server's lossy reading does), keeping a byte order mark where it is: the
     * server's reading strips none.
     */
    #decoder = new TextDecoder("utf-8", { ignoreBOM: true });
    /**
     * A reader of a stream's bytes from its `offset`-th on (default the first),
     * which must be the end of a block (a resumed replay): the blocks it returns
     * carry their offsets in the whole stream.
     */
    constructor(offset = 0) {
        this.#at = offset;
    }
    /** The blocks `bytes`, the stream's next ones, complete, in order. */
    feed(bytes) {
        this.#append(bytes);
        const buffer = this.#buffer;
        const blocks = [];
        let start = 0; // the first byte of the line being looked at
        let at = this.#scanned;
        while (at < this.#length) {
            const byte = buffer[at];
            if (byte !== LF && byte !== CR) {
                at += 1;
                continue;
            }
            let next = at + 1;
            if (byte === CR) {
                if (next === this.#length)
                    break; // a CR at the end so far: an LF may still follow it
                if (buffer[next] === LF)
                    next += 1;
            }
            const block = this.#readLine(buffer.subarray(start, at), this.#at + next);
            if (block !== undefined)
                blocks.push(block);
            start = next;
            at = next;
        }
        buffer.copyWithin(0, start, this.#length);
        this.#length -= start;
        this.#at += start;
        this.#scanned = at - start;
        return blocks;
    }
    /** The stream ended: the block a last lone CR ends, if it does. */
    finish() {
        if (this.#length !== 1 || this.#buffer[0] !== CR) {
            return undefined;
        }
        this.#length = 0;
        this.#scanned = 0;
        this.#at += 1;
        return this.#readLine(new Uint8Array(0), this.#at);
    }
    /** Keeps `bytes` after the ones held, making room when they do not fit. */
    #append(bytes) {
        const needed = this.#length + bytes.length;
        if (needed > this.#buffer.length) {
            const grown = new Uint8Array(Math.max(needed, this.#buffer.length * 2));
            grown.set(this.#buffer.subarray(0, this.#length));
            this.#buffer = grown;
        }
        this.#buffer.set(bytes, this.#length);
        this.#length = needed;
    }
    /** Takes one line (without its ending), which ends at stream offset `end`; the block it ends. */
    #readLine(bytes, end) {
        if (bytes.length === 0) {
            if (!this.#started) {
                return undefined;
            }
            const block = { end, event: this.#event, data: this.#data?.join("\n"), id: this.#id };
            this.#started = false;
            this.#event = this.#data = this.#id = undefined;
            return block;
        }
        this.#started = true;
        if (bytes[0] === COLON) {
            return undefined; // a comment
        }
        const line = this.#decoder.decode(bytes);
        const colon = line.indexOf(":");
        const name = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" "))
            value = value.slice(1);
        switch (name) {
            case "event":
                this.#event = value;
                break;
            case "data":
                (this.#data ??= []).push(value);
                break;
            case "id":
                if (!value.includes("\0"))
                    this.#id = value;
                break;
            default:
                break; // `retry` and unknown fields: nothing resuming needs
        }
        return undefined;
    }
}

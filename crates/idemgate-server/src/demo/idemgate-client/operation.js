// GENERATED FILE: do not edit. The browser build of clients/js/src/operation.ts
// (tsc, clients/js/tsconfig.json), copied here by `npm run embed` in clients/js;
// `idemgate serve` embeds it for the checkout page. clients/js's `npm test`
// (test/embedded.test.ts) fails while it differs from a fresh build.
/**
 * One logical action, one key (PROTOCOL §14).
 *
 * @module
 */
/** The longest key an idemgate server accepts by default (PROTOCOL §2). */
export const MAX_KEY_LENGTH = 255;
/**
 * One logical action of the user — the "Pay" click — and the `Idempotency-Key`
 * every attempt of it carries.
 *
 * Make it when the user acts, not per HTTP attempt: every retry of the action must
 * carry the same key, or the server cannot tell a retry from a second purchase.
 * Store {@link Operation.key} beside the action (in `sessionStorage` for a page
 * that may be reloaded mid-payment, in an outbox row on a server) and
 * {@link Operation.resume} it.
 *
 * `toString()` and `JSON.stringify` show no key: keys are lookup handles and do not
 * belong in logs. {@link Operation.digest} is what to log or show.
 *
 * ```ts
 * const pay = Operation.create();           // on the click
 * sessionStorage.setItem("pay", pay.key);   // survives a reload
 * const resumed = Operation.resume(sessionStorage.getItem("pay")!);
 * ```
 */
export class Operation {
    #key;
    constructor(key) {
        this.#key = key;
    }
    /**
     * A new action under a fresh UUID v4 key from `crypto.randomUUID()`: the
     * platform's cryptographically strong generator, never `Math.random`, so keys
     * cannot be guessed or collide.
     *
     * @throws Error where the platform has no `crypto.randomUUID` (Node 18 without
     *   `--experimental-global-webcrypto`); there is no weaker fallback.
     */
    static create() {
        const crypto = globalThis.crypto;
        if (typeof crypto?.randomUUID !== "function") {
            throw new Error("crypto.randomUUID() is not available: idemgate-client needs the Web Crypto API " +
                "(any browser in a secure context, Node >= 19, or Node 18 with --experimental-global-webcrypto)");
        }
        return new Operation(crypto.randomUUID());
    }
    /**
     * The action a stored key names, to retry it after a reload or a restart.
     *
     * The key must be one the server accepts as a bare header value: 1 to 255
     * printable ASCII characters without `,`, `"` or spaces (PROTOCOL §2; a UUID
     * always is).
     *
     * @throws InvalidKeyError when it is not.
     */
    static resume(key) {
        const problem = keyProblem(key);
        if (problem !== undefined) {
            throw new InvalidKeyError(problem);
        }
        return new Operation(key);
    }
    /** The key, to persist. Do not log it: log {@link Operation.digest}. */
    get key() {
        return this.#key;
    }
    /**
     * `sha256:` and the first 12 hex digits of the key's SHA-256, the digest the
     * server's logs and traces show for it: enough to correlate, useless for
     * replaying someone's request.
     */
    async digest() {
        const bytes = new TextEncoder().encode(this.#key);
        const hash = new Uint8Array(await globalThis.crypto.subtle.digest("SHA-256", bytes));
        const hex = Array.from(hash.subarray(0, 6), (b) => b.toString(16).padStart(2, "0")).join("");
        return `sha256:${hex}`;
    }
    /** Whether both name the same action. */
    equals(other) {
        return this.#key === other.#key;
    }
    /** No key in logs. */
    toString() {
        return "Operation(<key hidden: use digest()>)";
    }
    /** No key in serialized logs either; persist {@link Operation.key} explicitly. */
    toJSON() {
        return this.toString();
    }
}
/** `Operation.create()`: a new action, when the user acts. */
export function operation() {
    return Operation.create();
}
/** A stored key the server would refuse, so it cannot name an operation. */
export class InvalidKeyError extends TypeError {
    name = "InvalidKeyError";
}
/** Why `key` is not a bare key the server accepts, or `undefined` when it is. */
function keyProblem(key) {
    if (typeof key !== "string" || key.length === 0) {
        return "the Idempotency-Key is empty";
    }
    if (key.length > MAX_KEY_LENGTH) {
        return `the Idempotency-Key is longer than ${MAX_KEY_LENGTH} characters`;
    }
    for (let i = 0; i < key.length; i++) {
        const code = key.charCodeAt(i);
        // Visible ASCII (0x21-0x7e), without the list separator and the quote.
        if (code < 0x21 || code > 0x7e || code === 0x2c || code === 0x22) {
            return "the Idempotency-Key contains a character that is not allowed";
        }
    }
    return undefined;
}

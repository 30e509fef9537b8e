// The reading of `text/event-stream` (src/event-stream.ts), the Rust
// `idemgate_core::event_stream` tests' cases: the blocks and their byte offsets,
// however the bytes arrive.

import assert from "node:assert/strict";
import { test } from "node:test";

import { EventStreamReader, type EventBlock } from "../src/event-stream.js";

const utf8 = new TextEncoder();

/** The blocks of `stream` fed in pieces of `piece` bytes, and the one its end ends. */
function readInPieces(stream: Uint8Array, piece: number): EventBlock[] {
  const reader = new EventStreamReader();
  const blocks: EventBlock[] = [];
  for (let at = 0; at < stream.length; at += piece) {
    blocks.push(...reader.feed(stream.subarray(at, at + piece)));
  }
  const last = reader.finish();
  if (last !== undefined) blocks.push(last);
  return blocks;
}

test("the blocks are the same however the bytes arrive", () => {
  const stream = utf8.encode(
    "event: start\r\nid: 7\r\ndata: one\r\ndata:two\r\n\r\n: keep-alive\n\nid\rdata\r\rdata: x\n\r",
  );
  const whole = readInPieces(stream, stream.length);
  for (let piece = 1; piece < stream.length; piece++) {
    assert.deepEqual(readInPieces(stream, piece), whole, `pieces of ${piece}`);
  }
  assert.equal(whole.length, 4, JSON.stringify(whole));
  assert.deepEqual(whole[0], { end: 44, event: "start", id: "7", data: "one\ntwo" });
  assert.equal(whole[1]!.data, undefined, "a comment: no data");
  // `id` alone clears the last event id; `data` alone is an empty event.
  assert.equal(whole[2]!.id, "");
  assert.equal(whole[2]!.data, "");
  // A stream's last lone CR ends its last line.
  assert.equal(whole[3]!.data, "x");
  assert.equal(whole[3]!.end, stream.length);
});

test("an unfinished last line ends no block, and an id holding NUL is ignored", () => {
  const reader = new EventStreamReader();
  const blocks = reader.feed(utf8.encode("id: a\0b\ndata: x\n\ndata: y\n"));
  assert.equal(blocks.length, 1);
  assert.equal(blocks[0]!.id, undefined);
  assert.equal(reader.finish(), undefined);
  // A CR that ends the stream's last line (not an empty one) ends no block either.
  const cr = new EventStreamReader();
  assert.deepEqual(cr.feed(utf8.encode("data: z\r")), []);
  assert.equal(cr.finish(), undefined);
});

test("offsets count bytes, not UTF-16 units, and one leading space is dropped", () => {
  const stream = utf8.encode("data:  ünï 🦀\n\nevent:\ndata:a:b\n\n");
  const blocks = readInPieces(stream, 1);
  assert.equal(blocks[0]!.data, " ünï 🦀", "one space dropped, the second kept");
  assert.equal(blocks[0]!.end, 19, "bytes (the text is 15 UTF-16 units)");
  assert.deepEqual(blocks[1], { end: stream.length, event: "", id: undefined, data: "a:b" });
});

test("a reader started at a block's end carries the whole stream's offsets", () => {
  const stream = utf8.encode("id: 1\ndata: a\n\nid: 2\ndata: b\n\n");
  const all = readInPieces(stream, 3);
  const from = all[0]!.end; // where the server resumes after `Last-Event-ID: 1`
  assert.equal(from, 15);
  const resumed = new EventStreamReader(from).feed(stream.subarray(from));
  assert.deepEqual(resumed, all.slice(1));
});

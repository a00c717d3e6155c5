// frameEnd finds where one MessagePack value ends, says when it needs more
// bytes, and refuses bytes that start no value and values over the cap.

import assert from "node:assert/strict";
import { it } from "node:test";
import { encode } from "@msgpack/msgpack";

import { frameEnd } from "../src/frame.js";

const VALUES = [
  0, -1, 127, 128, -33, 65535, 2 ** 32, -(2 ** 40), 1.5, null, true, false, "", "x".repeat(31),
  "x".repeat(32), "y".repeat(300), "z".repeat(70000), new Uint8Array(5), new Uint8Array(300),
  new Uint8Array(70000), [], [1, [2, [3, {}]]], new Array(20).fill(7), new Array(70000).fill(0),
  { a: 1, b: [null, "c"] }, Object.fromEntries(Array.from({ length: 20 }, (_, i) => [`k${i}`, i])),
  [1, 7, null, { allowed: true, remaining: 19, limit: 100, reset_after_ms: 600, retry_after_ms: 0, mode: "local" }],
];

it("frameEnd ends each value exactly where its encoding ends", () => {
  for (const value of VALUES) {
    const bytes = encode(value);
    const padded = new Uint8Array(bytes.length + 3);
    padded.set(bytes, 2);
    assert.equal(frameEnd(padded, 2, padded.length, 1 << 22), bytes.length + 2, JSON.stringify(value)?.slice(0, 40));
  }
});

it("frameEnd answers -1 for every strict prefix of a value", () => {
  for (const value of VALUES.filter((v) => encode(v).length < 400)) {
    const bytes = encode(value);
    for (let cut = 0; cut < bytes.length; cut++) {
      assert.equal(frameEnd(bytes, 0, cut, 1 << 22), -1, `${JSON.stringify(value)} cut at ${cut}`);
    }
  }
});

it("frameEnd finds frames one after another in a stream", () => {
  const frames = VALUES.map((v) => encode(v));
  const stream = Buffer.concat(frames);
  let pos = 0;
  for (const frame of frames) {
    const end = frameEnd(stream, pos, stream.length, 1 << 22);
    assert.equal(end - pos, frame.length);
    pos = end;
  }
  assert.equal(pos, stream.length);
});

it("frameEnd refuses 0xc1 with EPROTO and frames over the cap with ETOOLARGE", () => {
  assert.throws(() => frameEnd(Uint8Array.from([0x92, 0x01, 0xc1]), 0, 3, 100), { code: "EPROTO" });
  const big = encode("x".repeat(200));
  assert.throws(() => frameEnd(big, 0, big.length, 100), { code: "ETOOLARGE" });
  // A header declaring 4 GiB is refused before any of it arrives.
  assert.throws(() => frameEnd(Uint8Array.from([0xc6, 0xff, 0xff, 0xff, 0xff]), 0, 5, 1 << 22), { code: "ETOOLARGE" });
  assert.throws(() => frameEnd(Uint8Array.from([0xdd, 0xff, 0xff, 0xff, 0xff]), 0, 5, 1 << 22), { code: "ETOOLARGE" });
  assert.equal(frameEnd(encode("x".repeat(100)), 0, 102, 102), 102);
});

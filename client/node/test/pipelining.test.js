// Many calls in flight on one connection: 10,000 pipelined calls, some of
// which the daemon holds (they wait for their units), are each answered with
// their own result, out of order; msgids wrap within 32 bits.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { Client } from "../index.js";
import { Daemon } from "./daemon.js";

const RULES = `
[[rule]]
name = "wide"
algorithm = "fixed_window"
limit = 100
period = "1h"

# One token every 2 s: a drained key's waiting acquire is held until then.
[[rule]]
name = "slow"
algorithm = "token_bucket"
limit = 1
period = "2s"
burst = 1
`;

const CALLS = 10_000;
const HELD_EVERY = 100; // every 100th call waits on a drained key of "slow"
const MAX_WAIT_MS = 5_000;

// A distinct cost per call, so each answer shows which request it answers:
// a fresh key of "wide" has 100 - cost units left.
function costOf(i) {
  return (i % 50) + 1;
}

describe("pipelining", () => {
  let daemon;
  before(async () => {
    daemon = new Daemon(RULES);
    await daemon.start();
  });
  after(async () => {
    await daemon?.stop();
  });

  it("10,000 calls in flight at once are answered out of order, each with its own result", async () => {
    const client = new Client({ socketPath: daemon.socket, timeoutMs: 20_000, onUnreachable: "throw" });
    try {
      const held = [];
      const drains = [];
      const order = [];
      const calls = [];
      for (let i = 0; i < CALLS; i++) {
        let call;
        if (i % HELD_EVERY === 0) {
          // The key's one unit goes just before, in the same write, so this
          // call waits about 2 s however long the rest take.
          held.push(i);
          drains.push(client.acquire("slow", `held-${i}`));
          call = client.acquire("slow", `held-${i}`, { maxWaitMs: MAX_WAIT_MS });
        } else {
          call = client.acquire("wide", `key-${i}`, { cost: costOf(i) });
        }
        calls.push(call.then((decision) => {
          order.push(i);
          return decision;
        }));
      }
      assert.equal(client.inFlight, CALLS + drains.length);
      const decisions = await Promise.all(calls);
      assert.ok((await Promise.all(drains)).every((d) => d.allowed && d.remaining === 0));

      assert.equal(client.inFlight, 0);
      assert.equal(order.length, CALLS);
      decisions.forEach((d, i) => {
        if (i % HELD_EVERY === 0) {
          assert.equal(d.allowed, true, `call ${i}`);
          assert.ok(d.waitedMs > 0, `call ${i} waited ${d.waitedMs} ms`);
        } else {
          assert.deepEqual([d.allowed, d.remaining, d.limit], [true, 100 - costOf(i), 100], `call ${i}`);
          assert.equal(d.waitedMs, undefined);
        }
      });
      // The first call was held: the ones sent after it were answered first.
      assert.ok(order.indexOf(0) > order.indexOf(1), "answers came in the order sent");
      const lastHeldAt = Math.max(...held.map((i) => order.indexOf(i)));
      assert.ok(lastHeldAt > order.indexOf(CALLS - 1));
      assert.equal(client.counters.lateAnswers, 0);
    } finally {
      client.close();
    }
  });

  it("msgids wrap from 2^32-1 to 0 and answers still match their calls", async () => {
    const first = 2 ** 32 - 5;
    const client = new Client({ socketPath: daemon.socket, firstMsgid: first, onUnreachable: "throw" });
    try {
      assert.equal(client.nextMsgid, first);
      const calls = [];
      for (let i = 0; i < 12; i++) {
        calls.push(client.acquire("wide", `wrap-${i}`, { cost: i + 1 }));
      }
      // 4294967291 .. 4294967295, then 0 .. 6
      assert.equal(client.nextMsgid, 7);
      const decisions = await Promise.all(calls);
      assert.deepEqual(decisions.map((d) => d.remaining), Array.from({ length: 12 }, (_, i) => 99 - i));
      assert.equal((await client.peek("wide", "wrap-11")).remaining, 88);
      assert.equal(client.nextMsgid, 8);
      assert.equal(client.counters.lateAnswers, 0);
    } finally {
      client.close();
    }
  });
});

// Every method of the Client against a real sluiced: acquire, acquireAll,
// peek, release, reset, reserve, settle, cancel, health and call, their typed
// results and errors.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { performance } from "node:perf_hooks";
import { after, before, describe, it } from "node:test";

import { Client, ServerError, SluiceError, UnknownReservationError } from "../index.js";
import { Daemon } from "./daemon.js";

const RULES = `
[[rule]]
name = "hourly"
algorithm = "fixed_window"
limit = 3
period = "1h"

# A token every 500 ms: a drained key's waiting acquire is held that long.
[[rule]]
name = "paced"
algorithm = "token_bucket"
limit = 2
period = "1s"
burst = 1

[[rule]]
name = "uploads"
algorithm = "concurrency"
limit = 2
period = "10m"

# For reserve and settle: a window no test ends, so a refund or a debt shows
# in the next answer's remaining exactly.
[[rule]]
name = "budget"
algorithm = "fixed_window"
limit = 10
period = "366d"

# As budget, and a key owes at most CAPPED_DEBT: a settle's excess past it is unpaid.
[[rule]]
name = "capped"
algorithm = "fixed_window"
limit = 10
period = "366d"
max_debt = 2
`;
const BUDGET = 10;
const CAPPED_DEBT = 2;

describe("a Client against sluiced", () => {
  let daemon;
  let client;
  before(async () => {
    daemon = new Daemon(RULES);
    await daemon.start();
    client = new Client({ socketPath: daemon.socket, onUnreachable: "throw" });
  });
  after(async () => {
    client?.close();
    await daemon?.stop();
  });

  it("acquire spends a unit per call and denies past the limit", async () => {
    const seen = [];
    for (let i = 0; i < 4; i++) {
      seen.push(await client.acquire("hourly", "acquire-key"));
    }
    assert.deepEqual(seen.map((d) => [d.allowed, d.remaining, d.limit, d.mode]),
      [[true, 2, 3, "local"], [true, 1, 3, "local"], [true, 0, 3, "local"], [false, 0, 3, "local"]]);
    assert.equal(seen[0].retryAfterMs, 0);
    assert.ok(seen[3].retryAfterMs > 0 && seen[3].retryAfterMs <= 3_600_000, String(seen[3].retryAfterMs));
    assert.ok(seen[3].resetAfterMs > 0);
  });

  it("acquire with a cost spends that many units", async () => {
    const d = await client.acquire("hourly", "cost-key", { cost: 2 });
    assert.equal(d.allowed, true);
    assert.equal(d.remaining, 1);
  });

  it("acquire with maxWaitMs is held until its unit is due, past the client's timeout, which covers the wait", async () => {
    const quick = new Client({ socketPath: daemon.socket, timeoutMs: 300, onUnreachable: "throw" });
    try {
      const sent = performance.now();
      const [drain, held] = await Promise.all([
        quick.acquire("paced", "wait-key"),
        quick.acquire("paced", "wait-key", { maxWaitMs: 2_000 }),
      ]);
      // The unit is due 500 ms after the drain, which came after `sent`.
      const elapsedMs = performance.now() - sent;
      assert.deepEqual([drain.allowed, drain.remaining], [true, 0]);
      assert.equal(held.allowed, true);
      assert.ok(held.waitedMs > 0 && held.waitedMs <= 500, `waited ${held.waitedMs} ms`);
      assert.ok(elapsedMs >= 490, `answered after ${elapsedMs} ms`);
      assert.equal(quick.counters.timeouts, 0);
    } finally {
      quick.close();
    }
  });

  it("peek reports the state and spends nothing", async () => {
    await client.acquire("hourly", "peek-key");
    const first = await client.peek("hourly", "peek-key");
    const second = await client.peek("hourly", "peek-key");
    assert.equal(first.remaining, 2);
    // Only the time to the window's end moves on.
    assert.deepEqual({ ...second, resetAfterMs: 0 }, { ...first, resetAfterMs: 0 });
    assert.ok(second.resetAfterMs <= first.resetAfterMs);
  });

  it("keys are any bytes: a Uint8Array with NUL and non-UTF-8 bytes is one key", async () => {
    const key = Uint8Array.from([0x00, 0xff, 0xfe, 0x7b, 0x00]);
    await client.acquire("hourly", key);
    assert.equal((await client.peek("hourly", Buffer.from(key))).remaining, 2);
    assert.equal((await client.peek("hourly", Uint8Array.from([0x00, 0xff]))).remaining, 3);
  });

  it("acquireAll is all or nothing and answers each item", async () => {
    const denied = await client.acquireAll([
      { rule: "hourly", key: "all-a" },
      { rule: "hourly", key: "all-b", cost: 5 },
    ]);
    assert.equal(denied.allowed, false);
    assert.equal(denied.results.length, 2);
    assert.equal(denied.results[1].allowed, false);
    assert.equal((await client.peek("hourly", "all-a")).remaining, 3, "nothing spent on a denial");

    const allowed = await client.acquireAll([
      { rule: "hourly", key: "all-a" },
      { rule: "hourly", key: "all-b", cost: 2 },
    ]);
    assert.equal(allowed.allowed, true);
    assert.deepEqual(allowed.results.map((d) => d.remaining), [2, 1]);
  });

  it("release gives concurrency units back", async () => {
    assert.equal((await client.acquire("uploads", "u")).allowed, true);
    assert.equal((await client.acquire("uploads", "u")).allowed, true);
    assert.equal((await client.acquire("uploads", "u")).allowed, false);
    const released = await client.release("uploads", "u");
    assert.equal(released.allowed, true);
    assert.equal(released.remaining, 1);
    assert.equal((await client.acquire("uploads", "u")).allowed, true);
  });

  it("reset forgets a key's state (the test runs the daemon, so it is an admin)", async () => {
    await client.acquire("hourly", "reset-key", { cost: 3 });
    assert.equal((await client.peek("hourly", "reset-key")).remaining, 0);
    const fresh = await client.reset("hourly", "reset-key");
    assert.equal(fresh.remaining, 3);
    assert.equal((await client.acquire("hourly", "reset-key")).allowed, true);
  });

  it("health reports status ok and no Redis", async () => {
    const health = await client.health();
    assert.equal(health.status, "ok");
    assert.equal(health.redis, "none");
    assert.equal(typeof health.version, "string");
  });

  it("call reaches any method, here rules", async () => {
    const rules = await client.call("rules");
    assert.deepEqual(rules.map((r) => r.name).sort(), ["budget", "capped", "hourly", "paced", "uploads"]);
  });

  it("settle below the estimate refunds the difference: peek and acquire see the units back", async () => {
    const reserved = await client.reserve("budget", "refund", 8);
    assert.deepEqual([reserved.allowed, reserved.mode, reserved.remaining], [true, "local", BUDGET - 8]);
    assert.ok(Number.isSafeInteger(reserved.id) && reserved.id > 0, String(reserved.id));
    const settled = await client.settle(reserved.id, 3);
    assert.deepEqual([settled.id, settled.refunded, settled.debt, settled.remaining, settled.allowed],
      [reserved.id, 5, 0, BUDGET - 3, true]);
    assert.equal((await client.peek("budget", "refund")).remaining, BUDGET - 3);
    assert.equal((await client.acquire("budget", "refund", { cost: BUDGET - 3 })).allowed, true);
  });

  it("settle above the estimate charges the excess as debt: a negative remaining that admits nothing", async () => {
    const reserved = await client.reserve("budget", "debt", BUDGET, { ttlMs: 5_000 });
    const settled = await client.settle(reserved.id, BUDGET + 4);
    assert.deepEqual([settled.refunded, settled.debt, settled.remaining, settled.allowed], [0, 4, -4, false]);
    assert.equal((await client.peek("budget", "debt")).remaining, -4);
    assert.equal((await client.acquire("budget", "debt")).allowed, false);
    assert.equal(settled.unpaid, 0);
  });

  it("settle past the rule's max_debt charges up to it and reports the rest as unpaid", async () => {
    const reserved = await client.reserve("capped", "runaway", BUDGET);
    const settled = await client.settle(reserved.id, BUDGET + 5);
    assert.deepEqual([settled.debt, settled.unpaid, settled.remaining], [CAPPED_DEBT, 5 - CAPPED_DEBT, -CAPPED_DEBT]);
  });

  it("cancel gives the whole estimate back", async () => {
    const reserved = await client.reserve("budget", "cancel", 6);
    const cancelled = await client.cancel(reserved.id);
    assert.deepEqual([cancelled.id, cancelled.refunded, cancelled.debt, cancelled.remaining],
      [reserved.id, 6, 0, BUDGET]);
    assert.equal((await client.peek("budget", "cancel")).remaining, BUDGET);
  });

  it("settle or cancel of an id not open rejects with UnknownReservationError, code UNKNOWN_RESERVATION", async () => {
    const reserved = await client.reserve("budget", "unknown", 2);
    await client.settle(reserved.id, 2);
    for (const again of [client.settle(reserved.id, 1), client.cancel(reserved.id), client.settle(reserved.id + 1000, 1)]) {
      await assert.rejects(again, (error) => {
        assert.ok(error instanceof UnknownReservationError && error instanceof ServerError);
        assert.equal(error.code, "UNKNOWN_RESERVATION");
        return true;
      });
    }
    await assert.rejects(client.reserve("uploads", "k", 1), (error) =>
      !(error instanceof UnknownReservationError) && error.code === "BAD_REQUEST");
  });

  it("reserve on a key that cannot afford it is denied with no id, and its settle asks nothing", async () => {
    await client.reserve("budget", "denied", BUDGET - 1);
    const denied = await client.reserve("budget", "denied", 2);
    assert.deepEqual([denied.allowed, denied.id, denied.remaining], [false, null, 1]);
    assert.ok(denied.retryAfterMs > 0);
    const nothing = await client.settle(denied.id, 2);
    assert.deepEqual([nothing.allowed, nothing.id, nothing.refunded, nothing.debt, nothing.unpaid], [true, null, 0, 0, 0]);
    assert.equal((await client.peek("budget", "denied")).remaining, 1);
  });

  it("the daemon's errors reject as ServerError with its code, whatever the policy", async () => {
    const open = new Client({ socketPath: daemon.socket }); // fail_open
    try {
      await assert.rejects(open.acquire("no-such-rule", "k"), (error) => {
        assert.ok(error instanceof ServerError);
        assert.equal(error.code, "UNKNOWN_RULE");
        assert.match(error.serverMessage, /no-such-rule/);
        return true;
      });
      await assert.rejects(open.call("no_such_method"), { code: "UNKNOWN_METHOD" });
      await assert.rejects(open.acquire("hourly", "k", { cost: 2_000_000_000 }), { code: "BAD_REQUEST" });
      assert.equal(open.counters.failedOpen, 0);
    } finally {
      open.close();
    }
  });

  it("invalid arguments reject with EINVAL and send nothing", async () => {
    const cases = [
      () => client.acquire(1, "k"),
      () => client.acquire("hourly", 42),
      () => client.acquire("hourly", "k", { cost: -1 }),
      () => client.acquire("hourly", "k", { cost: 1.5 }),
      () => client.acquire("hourly", "k", { maxWaitMs: -5 }),
      () => client.acquire("hourly", "k", { timeoutMs: 0 }),
      () => client.acquireAll([]),
      () => client.acquireAll([{ rule: "hourly" }]),
      () => client.call(""),
      () => client.call("rules", [() => 1]),
      () => client.reserve("budget", "k", 0),
      () => client.reserve("budget", "k", 1, { ttlMs: 0 }),
      () => client.settle(-1, 1),
      () => client.settle(1.5, 1),
      () => client.settle(7, -1),
      () => client.cancel("7"),
    ];
    for (const make of cases) {
      await assert.rejects(make(), (error) => error instanceof SluiceError && error.code === "EINVAL");
    }
    assert.equal(client.inFlight, 0);
    assert.throws(() => new Client({ onUnreachable: "maybe" }), { code: "EINVAL" });
    assert.throws(() => new Client({ firstMsgid: 2 ** 32 }), { code: "EINVAL" });
  });

  it("an idle client that was never closed lets the process exit", () => {
    const script = `
      import { Client } from ${JSON.stringify(new URL("../index.js", import.meta.url).href)};
      const client = new Client({ socketPath: ${JSON.stringify(daemon.socket)}, onUnreachable: "throw" });
      await client.connect();
      const d = await client.peek("hourly", "idle");
      console.log(d.remaining);`;
    const out = execFileSync(process.execPath, ["--input-type=module", "-e", script],
      { encoding: "utf8", timeout: 10_000 });
    assert.equal(out, "3\n");
  });

  it("a closed client rejects calls in flight with ECLOSED and later ones with EINVAL", async () => {
    const c = new Client({ socketPath: daemon.socket });
    await c.connect();
    const pending = c.acquire("hourly", "closing", { cost: 0 });
    c.close();
    await assert.rejects(pending, { code: "ECLOSED" });
    await assert.rejects(c.peek("hourly", "closing"), { code: "EINVAL" });
    assert.equal(c.counters.failedOpen, 0);
  });
});

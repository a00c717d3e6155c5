// When the daemon is stopped, restarted or absent: per-call timeouts,
// libsluice's reconnection rule (reconnect once at the next call; never send
// again a request that reached a connection), and the unreachable-daemon
// policy (fail_open, fail_closed, throw), counted.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import path from "node:path";
import { performance } from "node:perf_hooks";

import { Client, SluiceError } from "../index.js";
import { Daemon } from "./daemon.js";

const RULES = `
[[rule]]
name = "wide"
algorithm = "fixed_window"
limit = 100
period = "1h"

# One token a minute: a drained key's waiting acquire is held.
[[rule]]
name = "minutely"
algorithm = "token_bucket"
limit = 1
period = "1m"
burst = 1
`;

const TIMEOUT_MS = 200;

describe("a stopped daemon", () => {
  let daemon;
  before(async () => {
    daemon = new Daemon(RULES);
    await daemon.start();
  });
  after(async () => {
    await daemon?.stop();
  });

  it("times calls out, and the connection serves again once it continues", async () => {
    const strict = new Client({ socketPath: daemon.socket, onUnreachable: "throw" });
    const open = new Client({ socketPath: daemon.socket }); // fail_open, the default
    try {
      await strict.acquire("wide", "stopped");
      await open.acquire("wide", "stopped");
      await daemon.pause();
      let elapsedMs;
      try {
        const started = performance.now();
        await assert.rejects(strict.acquire("wide", "stopped", { timeoutMs: TIMEOUT_MS }), (error) =>
          error instanceof SluiceError && error.code === "ETIMEDOUT" && error.status === -4);
        elapsedMs = performance.now() - started;
        const decision = await open.acquire("wide", "stopped", { timeoutMs: TIMEOUT_MS });
        assert.deepEqual([decision.allowed, decision.mode, decision.unreachable.code], [true, "open", "ETIMEDOUT"]);
      } finally {
        daemon.signal("SIGCONT");
      }
      assert.ok(elapsedMs >= TIMEOUT_MS - 1 && elapsedMs < TIMEOUT_MS + 1000, `timed out after ${elapsedMs} ms`);
      assert.deepEqual([strict.counters.timeouts, open.counters.timeouts, open.counters.failedOpen], [1, 1, 1]);

      // The daemon reads the timed-out requests when it continues and answers
      // each connection's in order, the late one first: discarded, and the
      // next call gets its own answer.
      await strict.peek("wide", "stopped");
      assert.equal(strict.counters.lateAnswers, 1);
      await open.peek("wide", "stopped");
      assert.equal(open.counters.lateAnswers, 1);
      assert.equal((await strict.peek("wide", "stopped")).remaining, 96,
        "the two timed-out acquires reached the daemon and spent");
      assert.equal(strict.counters.reconnects + open.counters.reconnects, 0);
    } finally {
      strict.close();
      open.close();
    }
  });
});

describe("a restarted daemon", () => {
  let daemon;
  before(async () => {
    daemon = new Daemon(RULES);
    await daemon.start();
  });
  after(async () => {
    await daemon?.stop();
  });

  it("gets one reconnection at the next call, and no request the old one was sent", async () => {
    const client = new Client({ socketPath: daemon.socket, timeoutMs: 5_000, onUnreachable: "throw" });
    try {
      assert.equal((await client.acquire("minutely", "held")).remaining, 0);
      // Held by the daemon for up to a minute; the peek behind it is answered
      // at once, so by then the daemon has read the held request.
      const held = client.acquire("minutely", "held", { maxWaitMs: 60_000, timeoutMs: 60_000 })
        .then(() => null, (error) => error);
      assert.equal((await client.peek("minutely", "held")).remaining, 0);

      await daemon.restart();
      assert.equal((await held)?.code, "ECLOSED");
      assert.equal(client.inFlight, 0);

      // A fresh daemon: had the held acquire been sent again, it would have
      // spent the key's one unit.
      const fresh = await client.peek("minutely", "held");
      assert.deepEqual([fresh.allowed, fresh.remaining], [true, 1]);
      assert.equal(client.counters.reconnects, 1);
    } finally {
      client.close();
    }
  });

  it("fails calls with ECONNECT while it is down, and reconnects once it is back", async () => {
    const client = new Client({ socketPath: daemon.socket, onUnreachable: "throw" });
    try {
      await client.connect();
      await daemon.kill();
      await assert.rejects(client.acquire("wide", "down"), { code: "ECONNECT" });
      await assert.rejects(client.health(), { code: "ECONNECT" });
      await daemon.restart();
      const [a, b] = await Promise.all([client.acquire("wide", "down"), client.acquire("wide", "down")]);
      assert.deepEqual([a.remaining, b.remaining].sort(), [98, 99]);
      // Each call while down tried once; the two calls after shared one connection.
      assert.equal(client.counters.reconnects, 1);
    } finally {
      client.close();
    }
  });
});

describe("an unreachable daemon", () => {
  const missing = path.join("/tmp", `sl-node-missing-${process.pid}.sock`);

  it("is allowed through by default (fail_open), counted", async () => {
    const client = new Client({ socketPath: missing });
    const decision = await client.acquire("api", "k");
    assert.deepEqual([decision.allowed, decision.mode, decision.unreachable.code], [true, "open", "ECONNECT"]);
    assert.equal((await client.peek("api", "k")).allowed, true);
    const all = await client.acquireAll([{ rule: "api", key: "a" }, { rule: "api", key: "b" }]);
    assert.deepEqual([all.allowed, all.results.length, all.results[1].mode], [true, 2, "open"]);
    assert.deepEqual(client.counters, { reconnects: 0, timeouts: 0, lateAnswers: 0, failedOpen: 3, failedClosed: 0 });
    client.close();
  });

  it("is denied with fail_closed, counted", async () => {
    const client = new Client({ socketPath: missing, onUnreachable: "fail_closed" });
    const decision = await client.acquire("api", "k");
    assert.deepEqual([decision.allowed, decision.mode, decision.unreachable.code], [false, "closed", "ECONNECT"]);
    const all = await client.acquireAll([{ rule: "api", key: "a" }]);
    assert.equal(all.allowed, false);
    assert.deepEqual([client.counters.failedOpen, client.counters.failedClosed], [0, 2]);
    client.close();
  });

  it("answers reserve by the policy with no id, whose settle and cancel ask nothing", async () => {
    const open = new Client({ socketPath: missing });
    const reserved = await open.reserve("api", "k", 5);
    assert.deepEqual([reserved.allowed, reserved.mode, reserved.id, reserved.unreachable.code],
      [true, "open", null, "ECONNECT"]);
    assert.deepEqual([(await open.settle(reserved.id, 9)).debt, (await open.cancel(reserved.id)).refunded], [0, 0]);
    assert.equal(open.counters.failedOpen, 1);
    await assert.rejects(open.settle(42, 1), { code: "ECONNECT" });
    const closed = new Client({ socketPath: missing, onUnreachable: "fail_closed" });
    assert.deepEqual(Object.values(await closed.reserve("api", "k", 5)).slice(0, 1), [false]);
    const strict = new Client({ socketPath: missing, onUnreachable: "throw" });
    await assert.rejects(strict.reserve("api", "k", 5), { code: "ECONNECT" });
    open.close();
    closed.close();
    strict.close();
  });

  it("rejects with ECONNECT under throw, and for calls that decide nothing under any policy", async () => {
    const strict = new Client({ socketPath: missing, onUnreachable: "throw" });
    await assert.rejects(strict.acquire("api", "k"), { code: "ECONNECT", status: -3 });
    await assert.rejects(strict.connect(), { code: "ECONNECT" });
    const open = new Client({ socketPath: missing });
    await assert.rejects(open.release("api", "k"), { code: "ECONNECT" });
    await assert.rejects(open.health(), { code: "ECONNECT" });
    assert.equal(open.counters.failedOpen, 0);
    strict.close();
    open.close();
  });
});

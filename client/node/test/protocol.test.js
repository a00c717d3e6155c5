// The client against a fake daemon that answers with chosen bytes: frames
// split anywhere, notifications, answers to no call, malformed results,
// bytes that are not MessagePack and frames over the cap. Nothing here needs
// sluiced; the server is a net.Server on a Unix socket in a temp dir.

import assert from "node:assert/strict";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { once } from "node:events";
import { after, before, beforeEach, describe, it } from "node:test";
import { Decoder, Encoder, encode } from "@msgpack/msgpack";

import { Client, MAX_RESPONSE_BYTES, ServerError } from "../index.js";

const DECISION = { allowed: true, remaining: 4, limit: 5, reset_after_ms: 200, retry_after_ms: 0, mode: "local" };

// A server that hands each request ([0, msgid, method, params]) and its
// connection to `respond`, which the test sets.
class FakeDaemon {
  constructor() {
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), "sl-node-fake."));
    this.socket = path.join(this.dir, "s.sock");
    this.connections = 0;
    this.received = []; // every chunk read, for tests that decode it themselves
    this.respond = () => {};
    this.server = net.createServer((conn) => {
      this.connections++;
      const decoder = new Decoder();
      let pending = Buffer.alloc(0);
      conn.on("data", (chunk) => {
        this.received.push(chunk);
        pending = Buffer.concat([pending, chunk]);
        // Requests from this client come whole within one write.
        for (const request of decoder.decodeMulti(pending)) {
          this.respond(request, conn);
        }
        pending = Buffer.alloc(0);
      });
      conn.on("error", () => {});
    });
  }

  async start() {
    this.server.listen(this.socket);
    await once(this.server, "listening");
  }

  async stop() {
    this.server.close();
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

const answer = (msgid, result, error = null) => encode([1, msgid, error, result]);

describe("a Client against a fake daemon", () => {
  const fake = new FakeDaemon();
  let client;
  before(() => fake.start());
  after(() => fake.stop());
  beforeEach(() => {
    client?.close();
    client = new Client({ socketPath: fake.socket, onUnreachable: "throw" });
  });

  it("keeps a reservation id past 2^53 exact, as a bigint, from reserve's answer to settle's request", async () => {
    const id = (1n << 60n) + 5n; // a worker index past 31 in the id's top 16 bits
    const big = new Encoder({ useBigInt64: true });
    const held = [];
    fake.respond = ([, msgid, method], conn) => {
      held.push([msgid, method]);
      if (held.length === 2) { // both answers in one write: the second frame is re-read alone
        conn.write(Buffer.concat(held.map(([m, name]) => name === "peek" ? answer(m, DECISION)
          : Buffer.from(big.encode([1, m, null, { ...DECISION, id }])))));
      } else if (method === "settle") {
        conn.write(Buffer.from(big.encode([1, msgid, null, { ...DECISION, id, refunded: 2, debt: 0 }])));
      }
    };
    const [peeked, reserved] = await Promise.all([client.peek("r", "k"), client.reserve("r", "k", 3)]);
    assert.equal(peeked.remaining, 4);
    assert.equal(reserved.id, id);
    fake.received.length = 0;
    const settled = await client.settle(reserved.id, 1);
    assert.deepEqual([settled.id, settled.refunded], [id, 2]);
    const [request] = new Decoder({ useBigInt64: true }).decodeMulti(Buffer.concat(fake.received));
    assert.deepEqual(request.slice(2), ["settle", [id, 1]]);
  });

  it("reads answers split into single bytes and answers joined in one write", async () => {
    fake.respond = ([, msgid], conn) => {
      const bytes = answer(msgid, { ...DECISION, remaining: msgid % 5 });
      bytes.forEach((byte, i) => setTimeout(() => conn.write(Uint8Array.of(byte)), i));
    };
    const id = client.nextMsgid;
    const split = await client.peek("r", "k");
    assert.deepEqual(split, { allowed: true, mode: "local", remaining: id % 5, limit: 5, resetAfterMs: 200, retryAfterMs: 0 });

    const held = [];
    fake.respond = (request, conn) => {
      held.push(request[1]);
      if (held.length === 3) {
        conn.write(Buffer.concat(held.reverse().map((id) => answer(id, { ...DECISION, remaining: id }))));
      }
    };
    const ids = [client.nextMsgid, client.nextMsgid + 1, client.nextMsgid + 2];
    const results = await Promise.all([client.peek("r", "a"), client.peek("r", "b"), client.peek("r", "c")]);
    assert.deepEqual(results.map((d) => d.remaining), ids);
  });

  it("skips notifications and discards answers to no call, counting them", async () => {
    fake.respond = ([, msgid], conn) => {
      conn.write(Buffer.concat([encode([2, "hello", []]), answer(msgid + 1000, DECISION), answer(msgid, DECISION)]));
    };
    assert.equal((await client.acquire("r", "k")).remaining, 4);
    assert.equal(client.counters.lateAnswers, 1);
  });

  it("rejects a malformed result with EPROTO and keeps the connection", async () => {
    fake.respond = ([, msgid, method], conn) => {
      conn.write(answer(msgid, method === "peek" ? { remaining: 3 } : DECISION));
    };
    await assert.rejects(client.peek("r", "k"), { code: "EPROTO" });
    assert.equal((await client.acquire("r", "k")).allowed, true);
    assert.equal(client.counters.reconnects, 0);
  });

  it("gives an error string as a ServerError with an empty code", async () => {
    fake.respond = ([, msgid], conn) => conn.write(answer(msgid, null, "it broke"));
    await assert.rejects(client.acquire("r", "k"), (error) =>
      error instanceof ServerError && error.code === "" && error.serverMessage === "it broke");
  });

  it("answers the calls before a byte that is not MessagePack, then fails the rest with EPROTO and reconnects", async () => {
    let requests = 0;
    fake.respond = ([, msgid], conn) => {
      requests++;
      if (requests === 2) {
        conn.write(Buffer.concat([answer(msgid - 1, DECISION), Uint8Array.of(0xc1)]));
      } else if (requests > 2) {
        conn.write(answer(msgid, DECISION));
      }
    };
    const first = client.acquire("r", "k");
    await new Promise((resolve) => setImmediate(resolve)); // the two go in two writes
    const second = client.acquire("r", "k");
    assert.equal((await first).allowed, true);
    await assert.rejects(second, { code: "EPROTO" });
    assert.equal((await client.acquire("r", "k")).allowed, true);
    assert.equal(client.counters.reconnects, 1);
  });

  it("fails a frame over MAX_RESPONSE_BYTES with ETOOLARGE as soon as its header says so", async () => {
    fake.respond = (request, conn) => {
      // A str 32 header declaring more than the cap, and none of the bytes.
      const header = Buffer.from([0x94, 0x01, 0xce, 0, 0, 0, 0, 0xc0, 0xdb, 0, 0, 0, 0]);
      header.writeUInt32BE(request[1], 3);
      header.writeUInt32BE(MAX_RESPONSE_BYTES + 1, 9);
      conn.write(header);
    };
    await assert.rejects(client.health(), { code: "ETOOLARGE" });
  });

  it("applies the unreachable policy to a decision call whose connection breaks", async () => {
    const open = new Client({ socketPath: fake.socket });
    fake.respond = (request, conn) => conn.write(Uint8Array.of(0xc1));
    const decision = await open.acquire("r", "k");
    assert.deepEqual([decision.allowed, decision.mode, decision.unreachable.code], [true, "open", "EPROTO"]);
    assert.equal(open.counters.failedOpen, 1);
    open.close();
  });
});

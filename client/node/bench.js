#!/usr/bin/env node
// bench.js: decisions per second of sluice-client against a running sluiced,
// on one connection: pipelined (batches of calls in flight), sequential (one
// call at a time), and raw_pipelined, the reference: the same batches over a
// raw socket with the same MessagePack library (@msgpack/msgpack), no client.
//
//   SLUICE_SOCKET=/path/to/sock BENCH_SECONDS=3 node bench.js
//
// Needs a rule `bench`, a token bucket with a limit no run can exhaust.
// Each mode runs BENCH_SECONDS in all, in ROUNDS turns taken in rotation, so
// that a machine whose load changes during the run weighs on every mode
// alike. Prints one line per mode:
//   client=node mode=<mode> decisions_per_s=<n>

import net from "node:net";
import { once } from "node:events";
import { performance } from "node:perf_hooks";
import { decodeMultiStream, encode } from "@msgpack/msgpack";

import { Client, DEFAULT_SOCKET } from "./index.js";

const SOCKET = process.env.SLUICE_SOCKET || DEFAULT_SOCKET;
const SECONDS = Number(process.env.BENCH_SECONDS || 3);
const ROUNDS = 3;
const RULE = "bench";
const KEYS = 1000;
const BATCH = 1024; // calls per batch; two batches are in flight when pipelined

const keys = Array.from({ length: KEYS }, (_, i) => `key-${i}`);

function check(decision) {
  if (!decision.allowed) {
    throw new Error(`denied: ${JSON.stringify(decision)}: the bench rule's limit is too low`);
  }
}

// Each returns the decisions made in `ms`.
async function pipelined(client, ms) {
  const endAt = performance.now() + ms;
  let decisions = 0;
  async function lane() {
    const calls = new Array(BATCH);
    while (performance.now() < endAt) {
      for (let i = 0; i < BATCH; i++) {
        calls[i] = client.acquire(RULE, keys[(decisions + i) % KEYS]);
      }
      (await Promise.all(calls)).forEach(check);
      decisions += BATCH;
    }
  }
  await Promise.all([lane(), lane()]);
  return decisions;
}

async function sequential(client, ms) {
  const endAt = performance.now() + ms;
  let decisions = 0;
  while (performance.now() < endAt) {
    check(await client.acquire(RULE, keys[decisions % KEYS]));
    decisions++;
  }
  return decisions;
}

// The reference: a batch of BATCH requests encoded with encode() and written
// at once, a new one each time a batch's worth of answers is decoded (two
// batches in flight), answers read with decodeMultiStream.
async function rawPipelined(ms) {
  const socket = net.createConnection(SOCKET);
  await once(socket, "connect");
  let msgid = 0;
  const sendBatch = () => {
    const frames = new Array(BATCH);
    for (let i = 0; i < BATCH; i++) {
      msgid = (msgid + 1) >>> 0;
      frames[i] = encode([0, msgid, "acquire", [RULE, keys[msgid % KEYS], 1]]);
    }
    socket.write(Buffer.concat(frames));
  };
  const endAt = performance.now() + ms;
  let decisions = 0;
  let sent = 2 * BATCH;
  sendBatch();
  sendBatch();
  for await (const response of decodeMultiStream(socket)) {
    if (response[2] !== null) {
      throw new Error(`unexpected answer ${JSON.stringify(response)}`);
    }
    check(response[3]);
    decisions++;
    if (decisions === sent) {
      break;
    }
    if (decisions % BATCH === 0 && performance.now() < endAt) {
      sendBatch();
      sent += BATCH;
    }
  }
  socket.destroy();
  return decisions;
}

const client = new Client({ socketPath: SOCKET, timeoutMs: 10_000, onUnreachable: "throw" });
await client.connect();
check(await client.acquire(RULE, "warm-up"));
const modes = {
  pipelined: (ms) => pipelined(client, ms),
  sequential: (ms) => sequential(client, ms),
  raw_pipelined: (ms) => rawPipelined(ms),
};
const totals = Object.fromEntries(Object.keys(modes).map((mode) => [mode, { decisions: 0, ms: 0 }]));
for (let round = 0; round < ROUNDS; round++) {
  for (const [mode, run] of Object.entries(modes)) {
    const started = performance.now();
    totals[mode].decisions += await run((SECONDS * 1000) / ROUNDS);
    totals[mode].ms += performance.now() - started;
  }
}
client.close();
for (const [mode, { decisions, ms }] of Object.entries(totals)) {
  console.log(`client=node mode=${mode} decisions_per_s=${Math.round(decisions / (ms / 1000))}`);
}

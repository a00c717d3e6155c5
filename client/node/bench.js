#!/usr/bin/env node
// bench.js: decisions per second of sluice-client against a running sluiced,
// on one connection: pipelined (many calls in flight), sequential (one call
// at a time), and raw_pipelined, the reference: a tight loop over a raw
// socket with the same MessagePack library (@msgpack/msgpack), no client.
//
//   SLUICE_SOCKET=/path/to/sock BENCH_SECONDS=3 node bench.js
//
// Needs a rule `bench`, a token bucket with a limit no run can exhaust.
// Prints one line per mode:
//   client=node mode=<mode> decisions_per_s=<n>

import net from "node:net";
import { once } from "node:events";
import { performance } from "node:perf_hooks";
import { decodeMultiStream, encode } from "@msgpack/msgpack";

import { Client, DEFAULT_SOCKET } from "./index.js";

const SOCKET = process.env.SLUICE_SOCKET || DEFAULT_SOCKET;
const SECONDS = Number(process.env.BENCH_SECONDS || 3);
const RULE = "bench";
const KEYS = 1000;
const WINDOW = 1024; // calls in flight when pipelined

const keys = Array.from({ length: KEYS }, (_, i) => `key-${i}`);

function report(mode, decisions, elapsedMs) {
  console.log(`client=node mode=${mode} decisions_per_s=${Math.round(decisions / (elapsedMs / 1000))}`);
}

async function pipelined(client) {
  const endAt = performance.now() + SECONDS * 1000;
  let decisions = 0;
  const started = performance.now();
  async function loop(lane) {
    let i = lane;
    while (performance.now() < endAt) {
      const d = await client.acquire(RULE, keys[i % KEYS]);
      if (!d.allowed) {
        throw new Error(`denied: ${JSON.stringify(d)}: the bench rule's limit is too low`);
      }
      decisions++;
      i += WINDOW;
    }
  }
  await Promise.all(Array.from({ length: WINDOW }, (_, lane) => loop(lane)));
  report("pipelined", decisions, performance.now() - started);
}

async function sequential(client) {
  const started = performance.now();
  const endAt = started + SECONDS * 1000;
  let decisions = 0;
  while (performance.now() < endAt) {
    const d = await client.acquire(RULE, keys[decisions % KEYS]);
    if (!d.allowed) {
      throw new Error(`denied: ${JSON.stringify(d)}`);
    }
    decisions++;
  }
  report("sequential", decisions, performance.now() - started);
}

// The reference: batches of WINDOW requests encoded with encode() and written
// at once, a new batch each time one batch's worth of answers is decoded
// (two batches in flight), answers read with decodeMultiStream.
async function rawPipelined() {
  const socket = net.createConnection(SOCKET);
  await once(socket, "connect");
  let msgid = 0;
  const sendBatch = () => {
    const frames = new Array(WINDOW);
    for (let i = 0; i < WINDOW; i++) {
      msgid = (msgid + 1) >>> 0;
      frames[i] = encode([0, msgid, "acquire", [RULE, keys[msgid % KEYS], 1]]);
    }
    socket.write(Buffer.concat(frames));
  };
  const started = performance.now();
  const endAt = started + SECONDS * 1000;
  let decisions = 0;
  let sent = 2 * WINDOW;
  sendBatch();
  sendBatch();
  for await (const response of decodeMultiStream(socket)) {
    if (response[2] !== null || !response[3].allowed) {
      throw new Error(`unexpected answer ${JSON.stringify(response)}`);
    }
    decisions++;
    if (decisions === sent) {
      break;
    }
    if (decisions % WINDOW === 0 && performance.now() < endAt) {
      sendBatch();
      sent += WINDOW;
    }
  }
  const elapsedMs = performance.now() - started;
  socket.destroy();
  report("raw_pipelined", decisions, elapsedMs);
}

const client = new Client({ socketPath: SOCKET, timeoutMs: 10_000, onUnreachable: "throw" });
await client.connect();
await client.acquire(RULE, "warm-up");
await pipelined(client);
await sequential(client);
client.close();
await rawPipelined();

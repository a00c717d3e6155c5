#!/usr/bin/env node
// acquire.js: one acquire against sluiced, answered the way an HTTP server
// would answer the request it guards: 200 with the rate-limit headers when
// allowed, 429 with Retry-After when denied.
//
// It speaks the wire protocol itself, MessagePack-RPC over the Unix socket,
// with @msgpack/msgpack from the npm registry (`npm ci` installs the version
// package-lock.json pins), and formats the headers as libsluice's
// sluice_format_headers does (client/include/sluice.h).
//
//   usage: node acquire.js [SOCKET [RULE [KEY]]]
//
// SOCKET defaults to $SLUICE_SOCKET, else /run/sluice/sluice.sock; RULE to
// "api"; KEY to "user:42". Exit status as sluicectl's: 0 allowed, 1 denied,
// 2 usage error, 3 connection or server error.

import net from "node:net";
import { once } from "node:events";
import { decodeMultiStream, encode } from "@msgpack/msgpack";

const DEFAULT_SOCKET = "/run/sluice/sluice.sock";
const CALL_TIMEOUT_MS = 1000; // bounds connecting, and then the whole call
const EXIT_ALLOWED = 0, EXIT_DENIED = 1, EXIT_USAGE = 2, EXIT_FAILED = 3;

const POLICY_NAME_MAX_BYTES = 64;
const SF_INTEGER_MAX = 999_999_999_999_999; // RFC 8941: at most 15 digits

// The daemon answered with an error map {code, message}.
class ServerError extends Error {}

// Sends [0, msgid, "acquire", [rule, key, cost]] and resolves to the result of
// its response [1, msgid, error, result]: the decision map.
async function acquire(path, rule, key, cost = 1) {
  const sock = net.createConnection(path);
  const timer = setTimeout(() => sock.destroy(new Error("timed out")), CALL_TIMEOUT_MS);
  try {
    await once(sock, "connect");
    const msgid = 1;
    sock.write(encode([0, msgid, "acquire", [rule, key, cost]]));
    for await (const message of decodeMultiStream(sock)) {
      // Notifications ([2, method, params]) are not answers.
      if (message[0] === 1 && message[1] === msgid) {
        const [, , error, result] = message;
        if (error !== null) {
          throw new ServerError(`${error.code}: ${error.message}`);
        }
        return result;
      }
    }
    throw new Error("sluiced closed the connection without answering");
  } finally {
    clearTimeout(timer);
    sock.destroy();
  }
}

// Whole seconds, rounded up, so a client told to wait never comes back early.
function ceilSeconds(ms) {
  return ms <= 0 ? 0 : Math.ceil(ms / 1000);
}

function sfInteger(value) {
  return Math.max(0, Math.min(value, SF_INTEGER_MAX));
}

// The header values of draft-ietf-httpapi-ratelimit-headers-10 for a
// decision, as [name, value] pairs: Retry-After (denials only), RateLimit and
// RateLimit-Policy (without w when windowS is 0).
function rateLimitHeaders(decision, policy, windowS = 0) {
  if (policy.length < 1 || policy.length > POLICY_NAME_MAX_BYTES || !/^[\x20-\x7e]+$/.test(policy)) {
    throw new RangeError(
      `rule name ${JSON.stringify(policy)} cannot name a policy (printable ASCII, 1 to 64 bytes)`);
  }
  const quoted = `"${policy.replace(/[\\"]/g, "\\$&")}"`;
  const headers = [];
  if (!decision.allowed) {
    // A denial always says to wait at least a second: "0" invites a hot loop.
    const seconds = Math.max(1, ceilSeconds(decision.retry_after_ms));
    headers.push(["Retry-After", String(sfInteger(seconds))]);
  }
  headers.push(["RateLimit",
    `${quoted};r=${sfInteger(decision.remaining)};t=${sfInteger(ceilSeconds(decision.reset_after_ms))}`]);
  let policyValue = `${quoted};q=${sfInteger(decision.limit)}`;
  if (windowS > 0) {
    policyValue += `;w=${sfInteger(windowS)}`;
  }
  headers.push(["RateLimit-Policy", policyValue]);
  return headers;
}

async function main(args) {
  if (args.length > 3 || (args.length > 0 && args[0].startsWith("-"))) {
    console.error("usage: node acquire.js [SOCKET [RULE [KEY]]]");
    return EXIT_USAGE;
  }
  const path = args[0] ?? (process.env.SLUICE_SOCKET || DEFAULT_SOCKET);
  const rule = args[1] ?? "api";
  const key = args[2] ?? "user:42";

  let decision;
  try {
    decision = await acquire(path, rule, key);
  } catch (e) {
    if (e instanceof ServerError) {
      console.error(`acquire.js: sluiced answered ${e.message}`);
    } else {
      console.error(`acquire.js: cannot reach sluiced at ${path}: ${e.message}`);
    }
    return EXIT_FAILED;
  }

  console.log(`decision: allowed=${decision.allowed} remaining=${decision.remaining} ` +
    `limit=${decision.limit} reset_after_ms=${decision.reset_after_ms} ` +
    `retry_after_ms=${decision.retry_after_ms} mode=${decision.mode}`);
  // The decision does not carry the rule's period, so RateLimit-Policy goes
  // without a window.
  let headers;
  try {
    headers = rateLimitHeaders(decision, rule);
  } catch (e) {
    console.error(`acquire.js: ${e.message}`);
    return EXIT_USAGE;
  }
  console.log(decision.allowed ? "HTTP/1.1 200 OK" : "HTTP/1.1 429 Too Many Requests");
  for (const [name, value] of headers) {
    console.log(`${name}: ${value}`);
  }
  console.log();
  return decision.allowed ? EXIT_ALLOWED : EXIT_DENIED;
}

process.exitCode = await main(process.argv.slice(2));

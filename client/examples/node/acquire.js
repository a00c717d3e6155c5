#!/usr/bin/env node
// acquire.js: one acquire against sluiced, answered the way an HTTP server
// would answer the request it guards: 200 with the rate-limit headers when
// allowed, 429 with Retry-After when denied.
//
// It uses sluice-client (client/node), installed from the repository by
// `npm ci` (package.json names it as file:../../node; .npmrc copies it into
// node_modules rather than linking it). A server would use the library's
// rateLimit middleware instead; this shows the calls underneath.
//
//   usage: node acquire.js [SOCKET [RULE [KEY]]]
//
// SOCKET defaults to $SLUICE_SOCKET, else /run/sluice/sluice.sock; RULE to
// "api"; KEY to "user:42". Exit status as sluicectl's: 0 allowed, 1 denied,
// 2 usage error, 3 connection or server error.

import { Client, DEFAULT_SOCKET, ServerError, formatHeaders } from "sluice-client";

const CALL_TIMEOUT_MS = 1000; // bounds connecting, and then the whole call
const EXIT_ALLOWED = 0, EXIT_DENIED = 1, EXIT_USAGE = 2, EXIT_FAILED = 3;

async function main(args) {
  if (args.length > 3 || (args.length > 0 && args[0].startsWith("-"))) {
    console.error("usage: node acquire.js [SOCKET [RULE [KEY]]]");
    return EXIT_USAGE;
  }
  const path = args[0] ?? (process.env.SLUICE_SOCKET || DEFAULT_SOCKET);
  const rule = args[1] ?? "api";
  const key = args[2] ?? "user:42";

  // "throw": an unreachable daemon is an error here, not a decision.
  const client = new Client({ socketPath: path, timeoutMs: CALL_TIMEOUT_MS, onUnreachable: "throw" });
  let decision;
  try {
    decision = await client.acquire(rule, key);
  } catch (e) {
    if (e instanceof ServerError) {
      console.error(`acquire.js: sluiced answered ${e.message}`);
    } else {
      console.error(`acquire.js: cannot reach sluiced at ${path}: ${e.message}`);
    }
    return EXIT_FAILED;
  } finally {
    client.close();
  }

  console.log(`decision: allowed=${decision.allowed} remaining=${decision.remaining} ` +
    `limit=${decision.limit} reset_after_ms=${decision.resetAfterMs} ` +
    `retry_after_ms=${decision.retryAfterMs} mode=${decision.mode}`);
  // The decision does not carry the rule's period, so RateLimit-Policy goes
  // without a window.
  let headers;
  try {
    headers = formatHeaders(decision, rule);
  } catch (e) {
    console.error(`acquire.js: ${e.message}`);
    return EXIT_USAGE;
  }
  console.log(decision.allowed ? "HTTP/1.1 200 OK" : "HTTP/1.1 429 Too Many Requests");
  if (!decision.allowed) {
    console.log(`Retry-After: ${headers.retryAfter}`);
  }
  console.log(`RateLimit: ${headers.ratelimit}`);
  console.log(`RateLimit-Policy: ${headers.ratelimitPolicy}`);
  console.log();
  return decision.allowed ? EXIT_ALLOWED : EXIT_DENIED;
}

process.exitCode = await main(process.argv.slice(2));

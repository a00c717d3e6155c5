// formatHeaders against libsluice's sluice_format_headers, byte for byte:
// every case of the table goes through FORMAT_HEADERS (the C formatter as a
// filter, tests/support/format_headers.c) and through formatHeaders, and the
// lines must be equal, refusals included.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { it } from "node:test";

import { formatHeaders, SluiceError } from "../index.js";

const FORMAT_HEADERS = process.env.FORMAT_HEADERS;

// allowed, remaining, limit, reset_after_ms, retry_after_ms, window_s, policy
const CASES = [
  [1, 19, 100, 600, 0, 0, "api"],
  [1, 19, 100, 600, 0, 60, "api"],
  [0, 0, 100, 12000, 600, 0, "api"],
  [0, 0, 100, 12000, 600, 60, "api"],
  [0, 0, 5, 0, 0, 0, "zero waits"], // a denial says 1 second at least
  [0, 0, 5, 1, 1, 1, "one ms"],
  [0, 0, 5, 999, 999, 1, "under a second"],
  [0, 0, 5, 1000, 1000, 1, "a second"],
  [0, 0, 5, 1001, 1001, 1, "just over"],
  [1, 5, 5, 0, 0, 0, "fresh"],
  [1, -3, -7, -1000, -5, -60, "negatives"],
  [0, 0, 10, 3_600_000, 3_599_999, 3600, "hourly"],
  [1, 999_999_999_999_999, 999_999_999_999_999, 999_999_999_999_000, 0, 999_999_999_999_999, "sf max"],
  [1, 1_000_000_000_000_000, 1_000_000_000_000_000, 999_999_999_999_999_001, 0, 1_000_000_000_000_000, "over sf max"],
  [0, 0, 1, 9_007_199_254_740_991, 9_007_199_254_740_991, 0, "2^53-1"],
  [1, 1, 2, 3, 4, 5, 'quote"and\\backslash'],
  [1, 1, 2, 3, 4, 5, "\"\\\"\\"],
  [1, 1, 2, 3, 4, 5, "spaces inside and trailing "],
  [1, 1, 2, 3, 4, 5, "~!@#$%^&*()_+{}|:<>?`-=[];',./"],
  [1, 1, 2, 3, 4, 5, "x".repeat(64)],
  [1, 1, 2, 3, 4, 5, "x".repeat(65)],
  [1, 1, 2, 3, 4, 5, "tab\tinside"],
  [1, 1, 2, 3, 4, 5, "del\x7f"],
  [1, 1, 2, 3, 4, 5, "caf\u00e9"],
  [1, 1, 2, 3, 4, 5, "snow\u2603"],
  [1, 1, 2, 3, 4, 5, "ctl\x01"],
];

function formatWithNode([allowed, remaining, limit, resetAfterMs, retryAfterMs, windowS, policy]) {
  try {
    const h = formatHeaders({ allowed: allowed !== 0, remaining, limit, resetAfterMs, retryAfterMs },
      policy, windowS);
    return `${h.ratelimit}\t${h.ratelimitPolicy}\t${h.retryAfter}`;
  } catch (error) {
    assert.ok(error instanceof SluiceError && error.code === "EINVAL", String(error));
    return `error ${error.status}`;
  }
}

it("formatHeaders writes what sluice_format_headers writes, for every case", () => {
  assert.ok(FORMAT_HEADERS, "FORMAT_HEADERS must name libsluice's formatter (ctest sets it)");
  // BigInt keeps values past 2^53 exact on their way to the C side.
  const input = CASES.map((c) => c.map((v) => (typeof v === "number" ? BigInt(v) : v)).join("\t")).join("\n") + "\n";
  const expected = execFileSync(FORMAT_HEADERS, { input, encoding: "utf8" }).split("\n");
  assert.equal(expected.pop(), "");
  assert.equal(expected.length, CASES.length);
  CASES.forEach((c, i) => {
    assert.equal(formatWithNode(c), expected[i], `case ${i}: ${JSON.stringify(c)}`);
  });
  // The table covers refusals and each kind of output, or it proves little.
  assert.ok(expected.filter((line) => line.startsWith("error")).length >= 5);
  assert.ok(expected.some((line) => line.endsWith("\t")) && expected.some((line) => /\t\d+$/.test(line)));
});

it("formatHeaders gives a denial Retry-After and an allowed decision none", () => {
  const denied = formatHeaders({ allowed: false, remaining: 0, limit: 100, resetAfterMs: 12000, retryAfterMs: 600 }, "api", 60);
  assert.deepEqual(denied, { ratelimit: '"api";r=0;t=12', ratelimitPolicy: '"api";q=100;w=60', retryAfter: "1" });
  const allowed = formatHeaders({ allowed: true, remaining: 19, limit: 100, resetAfterMs: 600, retryAfterMs: 0 }, "api");
  assert.deepEqual(allowed, { ratelimit: '"api";r=19;t=1', ratelimitPolicy: '"api";q=100', retryAfter: "" });
});

// headers.js: the HTTP header values for a decision, byte for byte those of
// libsluice's sluice_format_headers (client/include/sluice.h): the
// structured fields of draft-ietf-httpapi-ratelimit-headers-10.
//   RateLimit:        "api";r=20;t=30   (r = remaining, t = seconds to reset)
//   RateLimit-Policy: "api";q=100;w=60  (q = limit, w = window in seconds,
//                                        omitted when windowS <= 0)
//   Retry-After:      3                 (RFC 9110 delay-seconds, rounded up,
//                                        at least 1; "" when allowed)
// Times are rounded up to whole seconds, so a client never retries early.

import { SluiceError } from "./errors.js";

const POLICY_NAME_MAX_BYTES = 64;
const SF_INTEGER_MAX = 999_999_999_999_999; // RFC 8941 sf-integers have at most 15 digits

function sfInteger(value) {
  if (!(value > 0)) {
    return 0;
  }
  return value > SF_INTEGER_MAX ? SF_INTEGER_MAX : value;
}

// Whole seconds, rounded up; exact for every safe integer.
function ceilSeconds(ms) {
  if (!(ms > 0)) {
    return 0;
  }
  return Math.floor(ms / 1000) + (ms % 1000 !== 0 ? 1 : 0);
}

/**
 * The header values for `decision` under the policy name `policy` (usually
 * the rule's name: printable ASCII, 1 to 64 bytes; '"' and '\' are escaped).
 * Throws SluiceError EINVAL for any other policy name.
 * @param {{allowed: boolean, remaining: number, limit: number, resetAfterMs: number, retryAfterMs: number}} decision
 * @param {string} policy
 * @param {number} [windowS] the rule's window in whole seconds; 0 leaves w= out
 * @returns {{ratelimit: string, ratelimitPolicy: string, retryAfter: string}}
 */
export function formatHeaders(decision, policy, windowS = 0) {
  if (typeof policy !== "string" || policy.length < 1 || policy.length > POLICY_NAME_MAX_BYTES ||
      !/^[\x20-\x7e]+$/.test(policy)) {
    throw new SluiceError("EINVAL",
      `policy name ${JSON.stringify(policy)} is not 1 to 64 bytes of printable ASCII`);
  }
  const quoted = `"${policy.replace(/[\\"]/g, "\\$&")}"`;
  const ratelimit =
    `${quoted};r=${sfInteger(decision.remaining)};t=${sfInteger(ceilSeconds(decision.resetAfterMs))}`;
  const window = Math.trunc(windowS);
  const ratelimitPolicy = window > 0
    ? `${quoted};q=${sfInteger(decision.limit)};w=${sfInteger(window)}`
    : `${quoted};q=${sfInteger(decision.limit)}`;
  // A denial always says to wait at least a second: "0" invites a hot loop.
  const retryAfter = decision.allowed
    ? ""
    : String(sfInteger(Math.max(1, ceilSeconds(decision.retryAfterMs))));
  return { ratelimit, ratelimitPolicy, retryAfter };
}

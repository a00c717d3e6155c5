// middleware.js: rate limiting for HTTP servers, as Express/Connect-style
// middleware `(req, res, next)` or for the bare node:http module. Each
// request acquires `cost` units of `rule` for the key `key(req)` gives:
// allowed, the response carries RateLimit and RateLimit-Policy and the
// request goes on; denied, it is answered 429 with those headers,
// Retry-After and a small JSON body.
//
// When the daemon cannot be reached, the Client's unreachable policy
// decides: fail_open lets the request through without rate-limit headers
// (the daemon's state is unknown), fail_closed answers 429 with Retry-After: 1.

import { formatHeaders } from "./headers.js";
import { SluiceError } from "./errors.js";

// The peer's address: the client IP without a proxy in front.
function peerAddress(req) {
  return req.socket?.remoteAddress;
}

/**
 * @param {object} options
 * @param {import("./client.js").Client} options.client
 * @param {string} options.rule the rule to acquire from; also the policy name in the headers
 * @param {(req: any) => string|Uint8Array|null|undefined|Promise<string|Uint8Array|null|undefined>} [options.key]
 *   the key of a request (default: the peer's address); null or undefined lets the request through unlimited
 * @param {number|((req: any) => number)} [options.cost] units per request (default 1)
 * @param {number} [options.windowS] the rule's window in seconds, for RateLimit-Policy's w= (default: none)
 * @param {string} [options.policy] the policy name in the headers (default: the rule's name)
 * @returns {(req: any, res: any, next?: (error?: unknown) => void) => Promise<boolean>}
 *   With `next`: calls next() when allowed, next(error) on an error.
 *   Without: resolves true when allowed (headers set, the caller answers),
 *   false when it answered 429; rejects on an error.
 */
export function rateLimit(options) {
  const { client, rule, key = peerAddress, cost = 1, windowS = 0, policy = rule } = options ?? {};
  if (!client || typeof client.acquire !== "function") {
    throw new SluiceError("EINVAL", "rateLimit needs a client");
  }
  if (typeof rule !== "string" || rule.length === 0) {
    throw new SluiceError("EINVAL", "rateLimit needs a rule name");
  }
  if (typeof key !== "function") {
    throw new SluiceError("EINVAL", "key must be a function from the request to the key");
  }
  // Fails now, not at the first request, on a name headers cannot carry.
  formatHeaders({ allowed: true, remaining: 0, limit: 0, resetAfterMs: 0, retryAfterMs: 0 }, policy);

  async function decide(req, res) {
    const k = await key(req);
    if (k === null || k === undefined) {
      return true;
    }
    const units = typeof cost === "function" ? cost(req) : cost;
    const decision = await client.acquire(rule, k, { cost: units });
    if (decision.unreachable !== undefined) {
      if (decision.allowed) {
        return true;
      }
      deny(res, "1", rule);
      return false;
    }
    const headers = formatHeaders(decision, policy, windowS);
    res.setHeader("RateLimit", headers.ratelimit);
    res.setHeader("RateLimit-Policy", headers.ratelimitPolicy);
    if (decision.allowed) {
      return true;
    }
    deny(res, headers.retryAfter, rule);
    return false;
  }

  return function sluiceRateLimit(req, res, next) {
    const decided = decide(req, res);
    if (typeof next !== "function") {
      return decided;
    }
    return decided.then(
      (allowed) => {
        if (allowed) {
          next();
        }
        return allowed;
      },
      (error) => {
        next(error);
        return false;
      });
  };
}

function deny(res, retryAfterS, rule) {
  const body = JSON.stringify({ error: "too many requests", rule,
                                retry_after_s: Number(retryAfterS) });
  res.statusCode = 429;
  res.setHeader("Retry-After", retryAfterS);
  res.setHeader("Content-Type", "application/json");
  res.setHeader("Content-Length", Buffer.byteLength(body));
  res.end(body);
}

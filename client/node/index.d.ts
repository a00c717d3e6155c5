// Types of sluice-client, the Node.js client of the sluiced rate-limiting daemon.

/** How the daemon reached a decision; "open" and "closed" also when the
 *  Client's unreachable policy made it (then `unreachable` is set). */
export type Mode = "normal" | "fallback" | "open" | "closed" | "shadow" | "local" | "blocked" | "unknown";

export interface Decision {
  allowed: boolean;
  mode: Mode | string;
  /** Units left now. */
  remaining: number;
  /** The rule's limit. */
  limit: number;
  /** Until the key is back at its full limit. */
  resetAfterMs: number;
  /** Until a retry may pass; 0 when allowed. */
  retryAfterMs: number;
  /** How long the daemon held the answer (an acquire with maxWaitMs). */
  waitedMs?: number;
  /** Set when the cost can never pass, e.g. "cost exceeds limit". */
  reason?: string;
  /** The error, when the unreachable policy made this decision. */
  unreachable?: SluiceError;
}

/** A reservation's id: a number when exact in a double, a bigint beyond 2^53. */
export type ReservationId = number | bigint;

/** reserve's answer: the decision of the estimate and the reservation's id,
 *  null when none was opened (denied, or the unreachable policy decided). */
export interface Reservation extends Decision {
  id: ReservationId | null;
}

/** settle's and cancel's answer: the key's state afterwards (remaining below
 *  0 while it is in debt), the units given back, those charged past the
 *  estimate, and those of the excess past the rule's max_debt that nobody
 *  was charged. A settle of a null id asks nothing: id null, zeros. */
export interface Settlement extends Decision {
  id: ReservationId | null;
  refunded: number;
  debt: number;
  unpaid: number;
}

export interface ReserveOptions extends CallOptions {
  /** Until the reservation settles at its estimate (default 60000). */
  ttlMs?: number;
}

export interface Decisions {
  /** True only when every item passed (and then each was spent). */
  allowed: boolean;
  results: Decision[];
}

export interface Health {
  status: "ok" | "degraded";
  redis: "up" | "down" | "none";
  [field: string]: unknown;
}

export type Key = string | Uint8Array;

export interface CallOptions {
  /** Bounds the whole call; negative or Infinity: no bound. */
  timeoutMs?: number;
}

export interface AcquireOptions extends CallOptions {
  /** Units to spend, 0 to 2^32-1 (default 1). */
  cost?: number;
  /** Wait up to this long for the units (token bucket and GCRA rules). */
  maxWaitMs?: number;
}

export interface ClientOptions {
  /** Default $SLUICE_SOCKET, else /run/sluice/sluice.sock. */
  socketPath?: string;
  /** Each call's timeout unless it names one (default 1000). */
  timeoutMs?: number;
  /** What a decision call resolves to when the daemon gives no answer (default "fail_open"). */
  onUnreachable?: "fail_open" | "fail_closed" | "throw";
  /** The first msgid, 0 to 2^32-1 (default 1). */
  firstMsgid?: number;
}

export interface Counters {
  reconnects: number;
  timeouts: number;
  lateAnswers: number;
  failedOpen: number;
  failedClosed: number;
}

export class Client {
  constructor(options?: ClientOptions);
  readonly socketPath: string;
  readonly nextMsgid: number;
  readonly inFlight: number;
  readonly counters: Counters;
  connect(options?: CallOptions): Promise<void>;
  acquire(rule: string, key: Key, options?: AcquireOptions): Promise<Decision>;
  acquireAll(items: Array<{ rule: string; key: Key; cost?: number }>, options?: CallOptions): Promise<Decisions>;
  peek(rule: string, key: Key, options?: CallOptions): Promise<Decision>;
  release(rule: string, key: Key, options?: CallOptions & { cost?: number }): Promise<Decision>;
  reset(rule: string, key: Key, options?: CallOptions): Promise<Decision>;
  reserve(rule: string, key: Key, estimate: number, options?: ReserveOptions): Promise<Reservation>;
  settle(id: ReservationId | null, actual: number, options?: CallOptions): Promise<Settlement>;
  cancel(id: ReservationId | null, options?: CallOptions): Promise<Settlement>;
  health(options?: CallOptions): Promise<Health>;
  call(method: string, params?: unknown[], options?: CallOptions): Promise<unknown>;
  close(): void;
}

export type ErrorCode =
  | "EINVAL" | "ENOMEM" | "ECONNECT" | "ETIMEDOUT" | "ECLOSED" | "EIO" | "EPROTO" | "ETOOLARGE" | "ESERVER";

export const ERROR_STATUS: Readonly<Record<ErrorCode, number>>;

export class SluiceError extends Error {
  /** A code of the table (ServerError: the daemon's code). */
  code: string;
  /** The code's number in libsluice's table (sluice.h). */
  status: number;
  /** Whether the call got no answer, so the unreachable policy applies. */
  readonly unreachable: boolean;
}

/** The daemon's answer was an error map; `code` is the daemon's ("UNKNOWN_RULE", ...). */
export class ServerError extends SluiceError {
  serverMessage: string;
}

/** settle or cancel of an id that is not open: code "UNKNOWN_RESERVATION". */
export class UnknownReservationError extends ServerError {}

export interface RateLimitHeaders {
  /** RateLimit: "policy";r=remaining;t=seconds to reset */
  ratelimit: string;
  /** RateLimit-Policy: "policy";q=limit[;w=window seconds] */
  ratelimitPolicy: string;
  /** Retry-After in whole seconds, at least 1 when denied; "" when allowed. */
  retryAfter: string;
}

export function formatHeaders(
  decision: Pick<Decision, "allowed" | "remaining" | "limit" | "resetAfterMs" | "retryAfterMs">,
  policy: string,
  windowS?: number,
): RateLimitHeaders;

export interface RateLimitOptions<Req = any> {
  client: Client;
  rule: string;
  /** The request's key (default: the peer's address); null or undefined: not limited. */
  key?: (req: Req) => Key | null | undefined | Promise<Key | null | undefined>;
  cost?: number | ((req: Req) => number);
  /** The rule's window in seconds, for RateLimit-Policy's w=. */
  windowS?: number;
  /** The policy name in the headers (default: the rule). */
  policy?: string;
}

/** Express/Connect-style middleware, or, called without `next`, a check for
 *  the bare node:http module that resolves false once it has answered 429. */
export function rateLimit<Req = any, Res = any>(
  options: RateLimitOptions<Req>,
): (req: Req, res: Res, next?: (error?: unknown) => void) => Promise<boolean>;

export const DEFAULT_SOCKET: string;
export const DEFAULT_TIMEOUT_MS: number;
export const DEFAULT_TTL_MS: number;
export const MAX_RESPONSE_BYTES: number;
export const MAX_UNSENT_BYTES: number;

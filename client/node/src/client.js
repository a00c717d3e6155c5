// client.js: the sluice client, MessagePack-RPC over the daemon's Unix socket
// (the contract of libsluice, client/include/sluice.h, in Promises).
//
// Concurrency: one Client is one connection, shared by every caller in the
// process. Each call returns a Promise; any number may be in flight at once.
// Requests issued in the same turn of the event loop go out in one write;
// answers are matched to their calls by msgid, in whatever order the daemon
// sends them (a request that waits for its units is answered later than the
// ones behind it). Msgids count up from `firstMsgid` and wrap within 32 bits,
// skipping any still in flight.
//
// Time: every timeout is in milliseconds and bounds the whole call,
// connecting included. A call that times out is rejected with ETIMEDOUT; its
// answer, should it come later, is discarded (counted in lateAnswers). The
// connection stays open: the calls around it are unaffected. A request that
// timed out may still have reached the daemon and acted (an acquire spent).
// An idle Client (no call in flight) does not keep the process alive.
//
// Reconnection rule (libsluice's): a Client whose connection has died (the
// daemon restarted, or a connection error) connects again once, at the next
// call, before anything is written; calls made meanwhile share that one
// attempt, and if it fails they fail with ECONNECT (the next call tries once
// more). A request is written once at most: one handed to a connection that
// then dies is rejected with ECLOSED (or EIO) and never sent again, because
// the daemon may have acted on it (an acquire spends quota). Only requests
// that never reached any connection are sent on the new one.
//
// The unreachable-daemon policy: when a decision call (acquire, acquireAll,
// peek, reserve) gets no answer (ECONNECT, ETIMEDOUT, ECLOSED, EIO, EPROTO,
// ETOOLARGE), `onUnreachable` decides: "fail_open" (the default) resolves
// it allowed, with mode "open"; "fail_closed" resolves it denied, with mode
// "closed"; "throw" rejects with the error. Either decision carries the
// error as `unreachable` and is counted (failedOpen, failedClosed). The
// daemon's own errors (ServerError) and invalid arguments (EINVAL) always
// reject. A reserve the policy answers has `id` null: settle and cancel of
// a null id resolve at once without asking the daemon (nothing was
// reserved); those of a real id reject when the daemon cannot be asked.
//
// Reservation ids are the daemon's unsigned 64-bit integers: a number when
// it is exact in a double (always on a daemon of fewer than 32 workers), a
// bigint beyond; settle and cancel take either.

import net from "node:net";
import { Decoder, Encoder } from "@msgpack/msgpack";

import { SluiceError, ServerError, UnknownReservationError } from "./errors.js";
import { frameEnd } from "./frame.js";

export const DEFAULT_SOCKET = "/run/sluice/sluice.sock";
// The largest response frame accepted; a bigger one fails with ETOOLARGE
// and closes the connection.
export const MAX_RESPONSE_BYTES = 4 * 1024 * 1024;
// The timeout of a call that names none, when the Client names none either.
export const DEFAULT_TIMEOUT_MS = 1000;
// The TTL of a reservation that names none (libsluice's SLUICE_DEFAULT_TTL_MS).
export const DEFAULT_TTL_MS = 60000;
// Requests the socket has not taken yet, in bytes, beyond which the
// connection is closed (EIO): the daemon is not reading, and a caller that
// keeps asking would otherwise grow this buffer without bound.
export const MAX_UNSENT_BYTES = 16 * 1024 * 1024;

const POLICIES = new Set(["fail_open", "fail_closed", "throw"]);
const UINT32_MAX = 0xffffffff;

// What a call's result is turned into.
const DECISION = 0; // a decision map; the unreachable policy applies
const DECISIONS = 1; // acquire_all's {allowed, results}; the policy applies
const RELEASED = 2; // release: a decision map, or anything else as allowed
const RAW = 3; // the result as decoded
const RESERVED = 4; // reserve: a decision map with id; the policy applies
const SETTLED = 5; // settle, cancel: a decision map with id, refunded, debt, unpaid

class Call {
  constructor(msgid, kind, count, resolve, reject) {
    this.msgid = msgid;
    this.kind = kind;
    this.count = count; // acquire_all: the items, for a policy decision per item
    this.resolve = resolve;
    this.reject = reject;
    this.frameStart = 0; // the request's bytes in the output buffer, until a
    this.frameEnd = 0; //   socket is handed them
    this.written = false; // handed to a socket: never to be sent again
    this.done = false;
    this.timer = null;
  }
}

/** @typedef {import("../index.js").Decision} Decision */

export class Client {
  #path;
  #timeoutMs;
  #policy;
  #nextMsgid;
  #socket = null; // the connected socket, or null
  #connecting = null; // {socket, promise} of the attempt under way, or null
  #everConnected = false;
  #calls = new Map(); // msgid -> Call: requested and not yet answered
  #queue = []; // Calls whose frames no socket has been handed yet
  #out = null; // their encoded requests, in #queue's order: #out[0, #outBytes)
  #outBytes = 0;
  #lastFlushBytes = 0;
  #flushScheduled = false;
  #input = null; // received bytes that do not make a whole frame yet
  #referenced = true;
  #closed = false;
  #encoder = new Encoder();
  #decoder = new Decoder();
  #bigEncoder = null; // made for the first bigint reservation id
  #bigDecoder = null; // made for the first reservation id beyond 2^53
  #frameEnds = []; // #receive's frame boundaries, reused
  #flushNow = () => this.#flush();
  #timeOutNow = (call, timeoutMs) => this.#timeOut(call, timeoutMs);

  /**
   * Counters since the Client was made. reconnects: connections made after
   * the first; timeouts: calls rejected with ETIMEDOUT; lateAnswers:
   * answers to no call in flight (one that timed out), discarded;
   * failedOpen / failedClosed: decisions the unreachable policy made.
   */
  counters = { reconnects: 0, timeouts: 0, lateAnswers: 0, failedOpen: 0, failedClosed: 0 };

  /**
   * @param {object} [options]
   * @param {string} [options.socketPath] default $SLUICE_SOCKET, else /run/sluice/sluice.sock
   * @param {number} [options.timeoutMs] each call's timeout unless it names one (default 1000)
   * @param {"fail_open"|"fail_closed"|"throw"} [options.onUnreachable] default "fail_open"
   * @param {number} [options.firstMsgid] the first msgid, 0 to 2^32-1 (default 1)
   */
  constructor(options = {}) {
    const {
      socketPath = process.env.SLUICE_SOCKET || DEFAULT_SOCKET,
      timeoutMs = DEFAULT_TIMEOUT_MS,
      onUnreachable = "fail_open",
      firstMsgid = 1,
    } = options;
    if (typeof socketPath !== "string" || socketPath.length === 0) {
      throw new SluiceError("EINVAL", "socketPath must be a non-empty string");
    }
    if (!POLICIES.has(onUnreachable)) {
      throw new SluiceError("EINVAL",
        `onUnreachable must be "fail_open", "fail_closed" or "throw", not ${JSON.stringify(onUnreachable)}`);
    }
    if (!isUint32(firstMsgid)) {
      throw new SluiceError("EINVAL", "firstMsgid must be an integer from 0 to 2^32-1");
    }
    this.#path = socketPath;
    this.#timeoutMs = checkTimeout(timeoutMs);
    this.#policy = onUnreachable;
    this.#nextMsgid = firstMsgid;
  }

  /** The socket path this Client connects to. */
  get socketPath() {
    return this.#path;
  }

  /** The msgid the next request will carry (unless that one is still in flight). */
  get nextMsgid() {
    return this.#nextMsgid;
  }

  /** Calls requested and not yet answered, timed out or failed. */
  get inFlight() {
    return this.#calls.size;
  }

  /**
   * Connects now rather than at the first call. Resolves once connected
   * (at once when already connected); rejects with ECONNECT or ETIMEDOUT.
   * @param {{timeoutMs?: number}} [options]
   * @returns {Promise<void>}
   */
  async connect(options = {}) {
    if (this.#closed) {
      throw closedError();
    }
    const timeoutMs = checkTimeout(options.timeoutMs ?? this.#timeoutMs);
    if (this.#socket !== null) {
      return;
    }
    const attempt = this.#connecting ?? this.#connect();
    let timer = null;
    const expired = new Promise((resolve) => {
      if (Number.isFinite(timeoutMs)) {
        timer = setTimeout(resolve, timeoutMs, "timeout");
      }
    });
    try {
      const outcome = await Promise.race([attempt.promise, expired]);
      if (outcome === "timeout") {
        throw new SluiceError("ETIMEDOUT", `connecting to ${this.#path} timed out after ${timeoutMs} ms`);
      }
      if (outcome !== null) {
        throw outcome;
      }
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * May `key` spend `cost` units of `rule` now? Spends them when allowed. A
   * denial is not an error: it is `allowed: false`. With maxWaitMs (token
   * bucket and GCRA rules), the daemon answers "allowed" once the units are
   * due within that time instead of denying; the default timeout then covers
   * the wait.
   * @param {string} rule
   * @param {string|Uint8Array} key
   * @param {{cost?: number, maxWaitMs?: number, timeoutMs?: number}} [options]
   * @returns {Promise<Decision>}
   */
  acquire(rule, key, options) {
    const cost = options?.cost ?? 1;
    const maxWaitMs = options?.maxWaitMs;
    const problem = itemProblem(rule, key, cost) ??
      (maxWaitMs !== undefined && !isUint32(maxWaitMs) ? "maxWaitMs must be an integer from 0 to 2^32-1" : null);
    if (problem !== null) {
      return Promise.reject(new SluiceError("EINVAL", problem));
    }
    const params = maxWaitMs === undefined ? [rule, key, cost] : [rule, key, cost, maxWaitMs];
    const timeoutMs = options?.timeoutMs ??
      (maxWaitMs === undefined ? this.#timeoutMs : this.#timeoutMs + maxWaitMs);
    return this.#request("acquire", params, DECISION, 1, timeoutMs);
  }

  /**
   * All or nothing: `allowed` is true only when every item passed (and then
   * each was spent); results[i] is the decision for items[i].
   * @param {Array<{rule: string, key: string|Uint8Array, cost?: number}>} items
   * @param {{timeoutMs?: number}} [options]
   * @returns {Promise<{allowed: boolean, results: Decision[]}>}
   */
  acquireAll(items, options) {
    if (!Array.isArray(items) || items.length === 0) {
      return Promise.reject(new SluiceError("EINVAL", "items must be a non-empty array"));
    }
    const wire = new Array(items.length);
    for (let i = 0; i < items.length; i++) {
      const item = items[i];
      const cost = item?.cost ?? 1;
      const problem = itemProblem(item?.rule, item?.key, cost);
      if (problem !== null) {
        return Promise.reject(new SluiceError("EINVAL", `items[${i}]: ${problem}`));
      }
      wire[i] = [item.rule, item.key, cost];
    }
    return this.#request("acquire_all", [wire], DECISIONS, items.length, options?.timeoutMs ?? this.#timeoutMs);
  }

  /**
   * The state of `key` under `rule`, as an acquire of cost 0: spends nothing.
   * @param {string} rule
   * @param {string|Uint8Array} key
   * @param {{timeoutMs?: number}} [options]
   * @returns {Promise<Decision>}
   */
  peek(rule, key, options) {
    const problem = itemProblem(rule, key, 0);
    if (problem !== null) {
      return Promise.reject(new SluiceError("EINVAL", problem));
    }
    return this.#request("peek", [rule, key], DECISION, 1, options?.timeoutMs ?? this.#timeoutMs);
  }

  /**
   * Gives `cost` units of a concurrency rule back. Resolves to the daemon's
   * decision map, or `{allowed: true}` with zeros when it sent something else.
   * @param {string} rule
   * @param {string|Uint8Array} key
   * @param {{cost?: number, timeoutMs?: number}} [options]
   * @returns {Promise<Decision>}
   */
  release(rule, key, options) {
    const cost = options?.cost ?? 1;
    const problem = itemProblem(rule, key, cost);
    if (problem !== null) {
      return Promise.reject(new SluiceError("EINVAL", problem));
    }
    return this.#request("release", [rule, key, cost], RELEASED, 1, options?.timeoutMs ?? this.#timeoutMs);
  }

  /**
   * Admin only (root, the daemon's user, [access] admin_group): forgets
   * `key`'s state under `rule`; resolves to the fresh state, as peek reports it.
   * @param {string} rule
   * @param {string|Uint8Array} key
   * @param {{timeoutMs?: number}} [options]
   * @returns {Promise<Decision>}
   */
  reset(rule, key, options) {
    const problem = itemProblem(rule, key, 0);
    if (problem !== null) {
      return Promise.reject(new SluiceError("EINVAL", problem));
    }
    return this.#request("reset", [rule, key], RELEASED, 1, options?.timeoutMs ?? this.#timeoutMs);
  }

  /**
   * Decides like an acquire of `estimate` (1 to 10^9; never waits) and,
   * when allowed, opens a reservation: `id` names it (null when denied, or
   * when the unreachable policy decided). Unsettled after ttlMs (default
   * 60000) it settles at its estimate.
   * @param {string} rule
   * @param {string|Uint8Array} key
   * @param {number} estimate
   * @param {{ttlMs?: number, timeoutMs?: number}} [options]
   * @returns {Promise<import("../index.js").Reservation>}
   */
  reserve(rule, key, estimate, options) {
    const ttlMs = options?.ttlMs ?? DEFAULT_TTL_MS;
    const problem = itemProblem(rule, key, estimate) ??
      (estimate === 0 ? "estimate must be at least 1" : null) ??
      (!isUint32(ttlMs) || ttlMs === 0 ? "ttlMs must be an integer from 1 to 2^32-1" : null);
    if (problem !== null) {
      return Promise.reject(new SluiceError("EINVAL", problem));
    }
    return this.#request("reserve", [rule, key, estimate, ttlMs], RESERVED, 1,
      options?.timeoutMs ?? this.#timeoutMs);
  }

  /**
   * Settles reservation `id` at `actual` units: gives back estimate - actual
   * (`refunded`), or charges the excess (`debt`; the key's remaining goes
   * below 0; `unpaid`: the part past the rule's max_debt, charged to
   * nobody). Resolves to the key's state afterwards; an id not open rejects
   * with UnknownReservationError (code UNKNOWN_RESERVATION). A null id
   * resolves at once, nothing refunded, without asking the daemon.
   * @param {number|bigint|null} id
   * @param {number} actual
   * @param {{timeoutMs?: number}} [options]
   * @returns {Promise<import("../index.js").Settlement>}
   */
  settle(id, actual, options) {
    if (!isUint32(actual)) {
      return Promise.reject(new SluiceError("EINVAL", "actual must be an integer from 0 to 2^32-1"));
    }
    return this.#settleCall("settle", id, [actual], options);
  }

  /**
   * Gives reservation `id` back whole: settle at 0.
   * @param {number|bigint|null} id
   * @param {{timeoutMs?: number}} [options]
   * @returns {Promise<import("../index.js").Settlement>}
   */
  cancel(id, options) {
    return this.#settleCall("cancel", id, [], options);
  }

  #settleCall(method, id, rest, options) {
    if (id === null || id === undefined || id === 0 || id === 0n) {
      return Promise.resolve(noSettlement());
    }
    const exact = typeof id === "bigint" ? id : Number.isSafeInteger(id) ? BigInt(id) : -1n;
    if (exact <= 0n || exact >= 1n << 64n) {
      return Promise.reject(new SluiceError("EINVAL", "a reservation id is a positive integer below 2^64"));
    }
    const small = exact <= BigInt(Number.MAX_SAFE_INTEGER);
    if (!small && this.#bigEncoder === null) {
      this.#bigEncoder = new Encoder({ useBigInt64: true });
    }
    return this.#request(method, [small ? Number(exact) : exact, ...rest], SETTLED, 1,
      options?.timeoutMs ?? this.#timeoutMs, small ? this.#encoder : this.#bigEncoder);
  }

  /**
   * The daemon's health: `status` "ok" or "degraded", `redis` "up", "down"
   * or "none", and the rest of the map the README's protocol section lists.
   * @param {{timeoutMs?: number}} [options]
   * @returns {Promise<import("../index.js").Health>}
   */
  health(options) {
    return this.#request("health", [], RAW, 0, options?.timeoutMs ?? this.#timeoutMs);
  }

  /**
   * Any method with its params array (stats, rules, reload, ...); resolves
   * to the result as decoded.
   * @param {string} method
   * @param {unknown[]} [params]
   * @param {{timeoutMs?: number}} [options]
   * @returns {Promise<unknown>}
   */
  call(method, params = [], options) {
    if (typeof method !== "string" || method.length === 0 || !Array.isArray(params)) {
      return Promise.reject(new SluiceError("EINVAL", "call(method, params): a method name and an array"));
    }
    return this.#request(method, params, RAW, 0, options?.timeoutMs ?? this.#timeoutMs);
  }

  /**
   * Closes the connection. Calls in flight are rejected with ECLOSED (the
   * unreachable policy does not apply); later calls reject with EINVAL.
   */
  close() {
    if (this.#closed) {
      return;
    }
    this.#closed = true;
    const error = new SluiceError("ECLOSED", "the client was closed");
    for (const call of this.#calls.values()) {
      this.#settle(call);
      call.reject(error);
    }
    this.#takeQueue();
    this.#connecting?.socket.destroy();
    this.#socket?.destroy();
    this.#socket = null;
  }

  // ---- requests ------------------------------------------------------------

  #request(method, params, kind, count, timeoutMs, encoder = this.#encoder) {
    if (this.#closed) {
      return Promise.reject(closedError());
    }
    if (timeoutMs !== this.#timeoutMs) {
      try {
        timeoutMs = checkTimeout(timeoutMs);
      } catch (error) {
        return Promise.reject(error);
      }
    }
    const msgid = this.#takeMsgid();
    let frame;
    try {
      frame = encoder.encodeSharedRef([0, msgid, method, params]);
    } catch (error) {
      return Promise.reject(new SluiceError("EINVAL", `cannot encode the params: ${error.message}`, { cause: error }));
    }
    let call;
    const promise = new Promise((resolve, reject) => {
      call = new Call(msgid, kind, count, resolve, reject);
    });
    call.frameStart = this.#outBytes;
    this.#append(frame);
    call.frameEnd = this.#outBytes;
    this.#calls.set(msgid, call);
    if (!this.#referenced) {
      this.#setReferenced(true);
    }
    if (Number.isFinite(timeoutMs)) {
      call.timer = setTimeout(this.#timeOutNow, timeoutMs, call, timeoutMs);
    }
    this.#queue.push(call);
    if (this.#socket !== null) {
      if (!this.#flushScheduled) {
        this.#flushScheduled = true;
        setImmediate(this.#flushNow);
      }
    } else if (this.#connecting === null) {
      this.#connect();
    }
    return promise;
  }

  #takeMsgid() {
    let msgid = this.#nextMsgid;
    // An id is still in flight only when one call outlived 2^32 others: skip it.
    while (this.#calls.has(msgid)) {
      msgid = msgid === UINT32_MAX ? 0 : msgid + 1;
    }
    this.#nextMsgid = msgid === UINT32_MAX ? 0 : msgid + 1;
    return msgid;
  }

  // Copies one encoded request to the end of the output buffer. The buffer
  // is handed to the socket whole at each flush and a new one started, sized
  // from the last flush, so a steady stream of calls reuses no memory the
  // socket may still be writing and allocates once per flush.
  #append(frame) {
    const needed = this.#outBytes + frame.length;
    if (this.#out === null || needed > this.#out.length) {
      const grown = Buffer.allocUnsafe(Math.max(needed * 2, Math.min(this.#lastFlushBytes * 2, 1 << 20), 256));
      if (this.#out !== null) {
        this.#out.copy(grown, 0, 0, this.#outBytes);
      }
      this.#out = grown;
    }
    this.#out.set(frame, this.#outBytes);
    this.#outBytes = needed;
  }

  // Takes the queued calls and their bytes out of the client: the calls
  // still waiting, and the bytes of those alone.
  #takeQueue() {
    const queue = this.#queue;
    let bytes = this.#out === null ? null : this.#out.subarray(0, this.#outBytes);
    this.#lastFlushBytes = this.#outBytes;
    this.#queue = [];
    this.#out = null;
    this.#outBytes = 0;
    if (queue.some((call) => call.done)) {
      // Calls that timed out while waiting for a connection are never sent.
      const live = queue.filter((call) => !call.done);
      bytes = Buffer.concat(live.map((call) => bytes.subarray(call.frameStart, call.frameEnd)));
      return { calls: live, bytes };
    }
    return { calls: queue, bytes };
  }

  // Hands every queued request to the socket in one write.
  #flush() {
    this.#flushScheduled = false;
    const socket = this.#socket;
    if (socket === null || this.#queue.length === 0) {
      return;
    }
    if (!socket.writable) {
      // The daemon closed the connection in this turn of the loop, after
      // these calls were made: none of them reached it.
      this.#dead(socket, null);
      return;
    }
    const { calls, bytes } = this.#takeQueue();
    if (calls.length === 0) {
      return;
    }
    for (const call of calls) {
      call.written = true;
    }
    socket.write(bytes);
    if (socket.writableLength > MAX_UNSENT_BYTES) {
      socket.destroy(new SluiceError("EIO",
        `the daemon has not taken ${socket.writableLength} bytes of requests; closing the connection`));
    }
  }

  #timeOut(call, timeoutMs) {
    call.timer = null;
    if (call.done) {
      return;
    }
    this.#settle(call);
    this.counters.timeouts++;
    this.#fail(call, new SluiceError("ETIMEDOUT", `no answer within ${timeoutMs} ms`));
  }

  // Marks a call answered or failed: it leaves the calls in flight.
  #settle(call) {
    call.done = true;
    this.#calls.delete(call.msgid);
    if (call.timer !== null) {
      clearTimeout(call.timer);
      call.timer = null;
    }
    if (this.#calls.size === 0 && this.#referenced) {
      this.#setReferenced(false);
    }
  }

  // Rejects a settled call, or resolves it as the unreachable policy says.
  #fail(call, error) {
    if ((call.kind === DECISION || call.kind === DECISIONS || call.kind === RESERVED) &&
        this.#policy !== "throw" && error.unreachable) {
      const decision = this.#policyDecision(error);
      if (call.kind === RESERVED) {
        decision.id = null;
        call.resolve(decision);
      } else if (call.kind === DECISION) {
        call.resolve(decision);
      } else {
        call.resolve({ allowed: decision.allowed, results: Array.from({ length: call.count }, () => decision) });
      }
      return;
    }
    call.reject(error);
  }

  #policyDecision(error) {
    const open = this.#policy === "fail_open";
    if (open) {
      this.counters.failedOpen++;
    } else {
      this.counters.failedClosed++;
    }
    return {
      allowed: open,
      mode: open ? "open" : "closed",
      remaining: 0,
      limit: 0,
      resetAfterMs: 0,
      retryAfterMs: 0,
      unreachable: error,
    };
  }

  // An idle Client does not keep the process alive; one with calls in flight does.
  #setReferenced(referenced) {
    this.#referenced = referenced;
    const socket = this.#socket ?? this.#connecting?.socket;
    if (socket) {
      if (referenced) {
        socket.ref();
      } else {
        socket.unref();
      }
    }
  }

  // ---- the connection --------------------------------------------------------

  // Starts the one connection attempt that the queued calls share. Its
  // promise resolves to null once connected, or to the error.
  #connect() {
    const socket = net.createConnection({ path: this.#path });
    let resolveAttempt;
    const attempt = { socket, promise: new Promise((resolve) => { resolveAttempt = resolve; }) };
    this.#connecting = attempt;
    if (!this.#referenced) {
      socket.unref();
    }
    let lastError = null;
    socket.on("error", (error) => {
      lastError = error;
    });
    socket.once("connect", () => {
      this.#connecting = null;
      if (this.#everConnected) {
        this.counters.reconnects++;
      }
      this.#everConnected = true;
      this.#socket = socket;
      this.#input = null;
      socket.on("data", (chunk) => this.#receive(socket, chunk));
      // The daemon's end of the stream: the connection is over at once, so
      // that calls made from now on go to a new one.
      socket.once("end", () => this.#dead(socket, null));
      if (this.#calls.size === 0) {
        this.#setReferenced(false); // connect() alone: nothing to wait for
      }
      resolveAttempt(null);
      this.#flush();
    });
    socket.once("close", () => {
      if (this.#connecting === attempt) {
        this.#connecting = null;
        const error = new SluiceError("ECONNECT",
          `cannot connect to the daemon socket ${this.#path}: ${lastError?.message ?? "closed"}`,
          { cause: lastError });
        resolveAttempt(error);
        this.#failQueued(error);
      } else {
        this.#dead(socket, lastError);
      }
    });
    return attempt;
  }

  // The connection died: every request handed to it fails; requests that
  // never reached it get one new connection. Once per connection.
  #dead(socket, cause) {
    if (this.#socket !== socket) {
      return;
    }
    this.#socket = null;
    this.#input = null;
    socket.destroy();
    const error = connectionError(cause);
    for (const call of this.#calls.values()) {
      if (call.written) {
        this.#settle(call);
        this.#fail(call, error);
      }
    }
    if (this.#queue.some((call) => !call.done) && !this.#closed) {
      this.#connect();
    }
  }

  #failQueued(error) {
    for (const call of this.#takeQueue().calls) {
      this.#settle(call);
      this.#fail(call, error);
    }
  }

  // ---- responses ---------------------------------------------------------------

  #receive(socket, chunk) {
    let buf = chunk;
    if (this.#input !== null) {
      buf = Buffer.concat([this.#input, chunk]);
      this.#input = null;
    }
    // The whole frames first, then one decoder pass over all of them. A
    // frame that cannot be read ends the connection once the ones before it
    // are answered.
    const end = buf.length;
    const frameEnds = this.#frameEnds;
    let whole = 0;
    let failure = null;
    frameEnds.length = 0;
    try {
      for (let next; whole < end && (next = frameEnd(buf, whole, end, MAX_RESPONSE_BYTES)) >= 0;) {
        whole = next;
        frameEnds.push(next);
      }
    } catch (error) {
      failure = error;
    }
    if (whole > 0) {
      const messages = this.#decoder.decodeMulti(whole === end ? buf : buf.subarray(0, whole));
      try {
        for (let i = 0; ; i++) {
          let item;
          try {
            item = messages.next();
          } catch (error) {
            throw new SluiceError("EPROTO", `malformed response from the daemon: ${error.message}`, { cause: error });
          }
          if (item.done) {
            break;
          }
          this.#answer(item.value, buf, i);
        }
      } catch (error) {
        failure = error;
      } finally {
        messages.return(); // leaves the decoder ready for the next pass
      }
    }
    if (failure !== null) {
      socket.destroy(failure instanceof SluiceError ? failure : new SluiceError("EPROTO", String(failure)));
    } else if (whole < end) {
      this.#input = buf.subarray(whole);
    }
  }

  // message is the decoded frame `index` of buf (#frameEnds bounds it).
  #answer(message, buf, index) {
    if (!Array.isArray(message)) {
      throw new SluiceError("EPROTO", "malformed response from the daemon: not an array");
    }
    if (message.length === 3 && message[0] === 2) {
      return; // a notification answers no request
    }
    if (message.length !== 4 || message[0] !== 1 || !isUint32(message[1])) {
      throw new SluiceError("EPROTO", "malformed response from the daemon: not [1, msgid, error, result]");
    }
    const call = this.#calls.get(message[1]);
    if (call === undefined) {
      this.counters.lateAnswers++;
      return;
    }
    this.#settle(call);
    const error = message[2];
    if (error !== null && error !== undefined) {
      call.reject(serverError(error));
      return;
    }
    let result = message[3];
    if ((call.kind === RESERVED || call.kind === SETTLED) && typeof result?.id === "number" &&
        !Number.isSafeInteger(result.id)) {
      // An id past 2^53 lost bits as a number: this frame again, as bigints.
      this.#bigDecoder ??= new Decoder({ useBigInt64: true });
      const start = index === 0 ? 0 : this.#frameEnds[index - 1];
      const id = this.#bigDecoder.decode(buf.subarray(start, this.#frameEnds[index]))[3]?.id;
      result = { ...result, id: typeof id === "bigint" ? id : result.id };
    }
    try {
      result = convert(call.kind, result);
    } catch (problem) {
      call.reject(problem);
      return;
    }
    call.resolve(result);
  }
}

// ---- helpers -------------------------------------------------------------------

function isUint32(value) {
  return Number.isInteger(value) && value >= 0 && value <= UINT32_MAX;
}

// A timeout in ms: positive bounds the call; negative or Infinity waits without bound.
function checkTimeout(timeoutMs) {
  if (typeof timeoutMs !== "number" || Number.isNaN(timeoutMs) || timeoutMs === 0) {
    throw new SluiceError("EINVAL",
      `timeoutMs must be a positive number of milliseconds, or negative or Infinity for no bound, not ${timeoutMs}`);
  }
  return timeoutMs < 0 ? Infinity : timeoutMs;
}

function itemProblem(rule, key, cost) {
  if (typeof rule !== "string") {
    return "rule must be a string";
  }
  if (typeof key !== "string" && !(key instanceof Uint8Array)) {
    return "key must be a string or a Uint8Array";
  }
  if (!isUint32(cost)) {
    return "cost must be an integer from 0 to 2^32-1";
  }
  return null;
}

function closedError() {
  return new SluiceError("EINVAL", "the client is closed");
}

function connectionError(error) {
  if (error instanceof SluiceError) {
    return error;
  }
  if (error === null || error.code === "EPIPE" || error.code === "ECONNRESET" || error.code === "ENOTCONN") {
    return new SluiceError("ECLOSED", "connection closed by the daemon", { cause: error ?? undefined });
  }
  return new SluiceError("EIO", `socket I/O error: ${error.message}`, { cause: error });
}

function serverError(error) {
  if (typeof error === "string") {
    return new ServerError("", error); // not sluiced's shape, but some MessagePack-RPC servers send one
  }
  const code = typeof error?.code === "string" ? error.code : "";
  const message = typeof error?.message === "string" ? error.message : "";
  return code === "UNKNOWN_RESERVATION" ? new UnknownReservationError(code, message)
    : new ServerError(code, message);
}

function convert(kind, result) {
  switch (kind) {
    case DECISION:
      return toDecision(result);
    case DECISIONS: {
      if (result === null || typeof result !== "object" || typeof result.allowed !== "boolean" ||
          !Array.isArray(result.results)) {
        throw new SluiceError("EPROTO", "malformed acquire_all result from the daemon");
      }
      return { allowed: result.allowed, results: result.results.map(toDecision) };
    }
    case RESERVED: {
      const decision = toDecision(result);
      decision.id = decision.allowed ? reservationId(result.id) : null;
      return decision;
    }
    case SETTLED: {
      const decision = toDecision(result);
      decision.id = reservationId(result.id);
      decision.refunded = number(result.refunded);
      decision.debt = number(result.debt);
      decision.unpaid = number(result.unpaid);
      return decision;
    }
    case RELEASED:
      if (result !== null && typeof result === "object" && typeof result.allowed === "boolean") {
        return toDecision(result);
      }
      return { allowed: true, mode: "unknown", remaining: 0, limit: 0, resetAfterMs: 0, retryAfterMs: 0 };
    default:
      return result;
  }
}

function toDecision(map) {
  if (map === null || typeof map !== "object" || typeof map.allowed !== "boolean") {
    throw new SluiceError("EPROTO", "malformed decision from the daemon");
  }
  const decision = {
    allowed: map.allowed,
    mode: typeof map.mode === "string" ? map.mode : "unknown",
    remaining: number(map.remaining),
    limit: number(map.limit),
    resetAfterMs: number(map.reset_after_ms),
    retryAfterMs: number(map.retry_after_ms),
  };
  if (map.waited_ms !== undefined) {
    decision.waitedMs = number(map.waited_ms);
  }
  if (map.reason !== undefined) {
    decision.reason = map.reason;
  }
  return decision;
}

// A reservation id off the wire: a non-negative integer, number or bigint.
function reservationId(id) {
  if ((typeof id === "number" && Number.isInteger(id) && id > 0) || (typeof id === "bigint" && id > 0n)) {
    return id;
  }
  throw new SluiceError("EPROTO", "malformed reservation from the daemon: no id");
}

// What settle and cancel of no reservation resolve to: nothing was spent.
function noSettlement() {
  return { allowed: true, mode: "unknown", remaining: 0, limit: 0, resetAfterMs: 0, retryAfterMs: 0,
    id: null, refunded: 0, debt: 0, unpaid: 0 };
}

function number(value) {
  if (value === undefined) {
    return 0;
  }
  if (typeof value !== "number") {
    throw new SluiceError("EPROTO", "malformed decision from the daemon: a field is not a number");
  }
  return value;
}

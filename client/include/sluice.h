/* sluice.h: libsluice, the C client of the sluiced rate-limiting daemon.
 *
 * This header is the whole API. The library speaks the daemon's
 * MessagePack-RPC protocol (docs/design.md, "Protocol") over a stream Unix socket
 * and needs nothing beyond libc. C99; link with `pkg-config --libs sluice`.
 *
 * Handles: a sluice_client is opaque. sluice_connect() creates it,
 * sluice_destroy() frees it (NULL is accepted). Everything the library
 * allocates for the caller (JSON text) is freed with sluice_free().
 *
 * Thread-safety: a handle is used by one thread at a time; different handles
 * are independent, and the free functions (sluice_strerror, sluice_version,
 * sluice_format_headers, ...) may be called from any thread.
 *
 * Errors: every call that can fail returns 0 or a negative SLUICE_E* code
 * from the one table below; sluice_strerror() turns a code into text. When the
 * daemon answers with an error map, the call returns SLUICE_ESERVER and
 * sluice_server_error_code() / sluice_server_error_message() give the
 * daemon's `code` (e.g. "UNKNOWN_RULE") and `message`.
 *
 * Time: every timeout is in milliseconds and bounds the whole call; a
 * negative timeout waits without bound, 0 does not wait at all.
 *
 * Reconnection rule: a handle whose connection has died (the daemon
 * restarted, an earlier call failed with SLUICE_ECLOSED, EIO, EPROTO or
 * ETOOLARGE, or a synchronous call timed out) reconnects once, at the start
 * of the next call, before anything is written. A request is sent again only
 * when not one byte of it reached the socket; once any byte was written, a
 * failure is returned and the request is never re-sent, because the daemon
 * may have acted on it (an acquire spends quota). Pipelined requests that
 * were in flight when a connection died never get a response; the caller
 * decides whether to retry them.
 */
#ifndef SLUICE_H
#define SLUICE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Compile-time version; sluice_version() is the version of the library
 * actually loaded. Compare SLUICE_VERSION_NUMBER with sluice_version_number(). */
#define SLUICE_VERSION_MAJOR 0
#define SLUICE_VERSION_MINOR 1
#define SLUICE_VERSION_PATCH 0
#define SLUICE_VERSION_NUMBER \
  (SLUICE_VERSION_MAJOR * 10000 + SLUICE_VERSION_MINOR * 100 + SLUICE_VERSION_PATCH)

#if defined(SLUICE_BUILDING) && defined(__GNUC__)
#define SLUICE_API __attribute__((visibility("default")))
#else
#define SLUICE_API
#endif

/* The default socket path, used by sluicectl when neither --socket nor
 * $SLUICE_SOCKET is given. */
#define SLUICE_DEFAULT_SOCKET "/run/sluice/sluice.sock"

/* The largest response frame the library accepts; a bigger one fails with
 * SLUICE_ETOOLARGE and closes the connection. */
#define SLUICE_MAX_RESPONSE_BYTES (4u * 1024u * 1024u)

/* Error codes: XX(name, value, text). Values are stable; extend, never renumber. */
#define SLUICE_ERRNO_MAP(XX)                                                    \
  XX(EINVAL, -1, "invalid argument")                                           \
  XX(ENOMEM, -2, "out of memory")                                              \
  XX(ECONNECT, -3, "cannot connect to the daemon socket")                      \
  XX(ETIMEDOUT, -4, "timed out")                                               \
  XX(ECLOSED, -5, "connection closed by the daemon")                           \
  XX(EIO, -6, "socket I/O error")                                              \
  XX(EPROTO, -7, "malformed response from the daemon")                         \
  XX(ETOOLARGE, -8, "response larger than SLUICE_MAX_RESPONSE_BYTES")          \
  XX(ESERVER, -9, "the daemon answered with an error")                         \
  XX(EBUSY, -10, "a synchronous call while pipelined requests are in flight")  \
  XX(ENOSPC, -11, "output buffer too small")

typedef enum sluice_error {
#define SLUICE_XX_(name, value, text) SLUICE_##name = (value),
  SLUICE_ERRNO_MAP(SLUICE_XX_)
#undef SLUICE_XX_
  SLUICE_OK = 0
} sluice_error;

/* Text for a code from the table; "unknown error" for anything else. Never NULL. */
SLUICE_API const char* sluice_strerror(int code);
/* The code's name, e.g. "SLUICE_ETIMEDOUT"; "SLUICE_UNKNOWN" for anything else. */
SLUICE_API const char* sluice_err_name(int code);

/* "MAJOR.MINOR.PATCH" of the loaded library, and the same as SLUICE_VERSION_NUMBER. */
SLUICE_API const char* sluice_version(void);
SLUICE_API int sluice_version_number(void);

/* How the daemon reached a decision (the result's `mode`). */
typedef enum sluice_mode {
  SLUICE_MODE_UNKNOWN = 0, /* missing or a mode newer than this library */
  SLUICE_MODE_NORMAL,      /* global rule, Redis healthy */
  SLUICE_MODE_FALLBACK,    /* global rule on its local share, Redis down */
  SLUICE_MODE_OPEN,        /* Redis down, rule fails open */
  SLUICE_MODE_CLOSED,      /* Redis down, rule fails closed */
  SLUICE_MODE_SHADOW,      /* shadow rule: decided and counted, always allowed */
  SLUICE_MODE_LOCAL,       /* local-only rule */
  SLUICE_MODE_BLOCKED      /* key blocked by its rule's penalty */
} sluice_mode;

/* The wire name of a mode ("normal", ...); "unknown" for SLUICE_MODE_UNKNOWN. */
SLUICE_API const char* sluice_mode_name(sluice_mode mode);

/* One decision. Fields the daemon did not send are 0. */
typedef struct sluice_decision {
  int allowed; /* 1 allowed, 0 denied */
  sluice_mode mode;
  int64_t remaining;      /* units left now; on a global rule, the fleet's as
                             the daemon estimates it (docs/protocol.md) */
  int64_t limit;          /* the rule's limit */
  int64_t reset_after_ms; /* until the key is back at its full limit */
  int64_t retry_after_ms; /* until a retry may pass; 0 when allowed */
} sluice_decision;

/* One (rule, key, cost) of sluice_acquire_all. `key` is any bytes. */
typedef struct sluice_item {
  const char* rule;
  const void* key;
  size_t key_len;
  uint32_t cost;
} sluice_item;

typedef struct sluice_client sluice_client;

/* Creates a handle and connects to the daemon's socket within timeout_ms.
 * On success *out is the handle; on failure *out is NULL and nothing leaks. */
SLUICE_API int sluice_connect(const char* socket_path, int timeout_ms, sluice_client** out);
/* Closes the connection and frees the handle. NULL is a no-op. */
SLUICE_API void sluice_destroy(sluice_client* client);

/* The daemon's `code` and `message` of the last SLUICE_ESERVER answer on this
 * handle ("" when none); valid until the next call on the handle. */
SLUICE_API const char* sluice_server_error_code(const sluice_client* client);
SLUICE_API const char* sluice_server_error_message(const sluice_client* client);

/* --- synchronous calls: one request, wait for its answer ------------------
 * Each returns 0 and fills *out, or a negative code (SLUICE_ESERVER with the
 * daemon's error map). A denial is not an error: it is out->allowed == 0. */

/* May `key` spend `cost` units of `rule` now? Spends them when allowed. */
SLUICE_API int sluice_acquire(sluice_client* client, const char* rule, const void* key,
                              size_t key_len, uint32_t cost, int timeout_ms,
                              sluice_decision* out);
/* Like sluice_acquire, but when the units will be there within max_wait_ms
 * (token_bucket and gcra rules; global ones of one limit), the daemon
 * answers "allowed" once they are, instead of denying; *waited_ms (may be
 * NULL) is how long it held the answer. timeout_ms must cover max_wait_ms. Other rules answer
 * SLUICE_ESERVER (BAD_REQUEST) for a max_wait_ms above 0. */
SLUICE_API int sluice_acquire_wait(sluice_client* client, const char* rule, const void* key,
                                   size_t key_len, uint32_t cost, uint32_t max_wait_ms,
                                   int timeout_ms, sluice_decision* out, int64_t* waited_ms);
/* Like acquire with cost 0: reports the state, spends nothing. */
SLUICE_API int sluice_peek(sluice_client* client, const char* rule, const void* key,
                           size_t key_len, int timeout_ms, sluice_decision* out);
/* Gives `cost` units of a concurrency rule back (more than are held gives
 * back what is held); *out is the state afterwards, as sluice_peek reports
 * it. A rule of another algorithm is refused (SLUICE_ESERVER, BAD_REQUEST).
 * `out` may be NULL; when the daemon's result is not a decision map, *out is
 * zeroed with allowed = 1. */
SLUICE_API int sluice_release(sluice_client* client, const char* rule, const void* key,
                              size_t key_len, uint32_t cost, int timeout_ms,
                              sluice_decision* out);
/* Admin only: forgets `key`'s state under `rule` and lifts its penalty
 * block, so its next request is a fresh key's; for a global rule the state
 * in Redis is reset too, for every node (Redis must be reachable). *out is
 * the fresh state, as sluice_peek reports it. */
SLUICE_API int sluice_reset(sluice_client* client, const char* rule, const void* key,
                            size_t key_len, int timeout_ms, sluice_decision* out);
/* All-or-nothing over `count` items: *all_allowed is 1 only when every item
 * passed (and then each was spent); results[i] is the decision for items[i]
 * and `results` must hold `count` entries (it may be NULL). */
SLUICE_API int sluice_acquire_all(sluice_client* client, const sluice_item* items,
                                  size_t count, int timeout_ms, int* all_allowed,
                                  sluice_decision* results);

/* --- reservations: costs known only when the request ends -----------------
 * Reserve the most a request may cost (an LLM call's max_tokens), do the
 * work, then settle what it cost; the daemon gives back the difference, or
 * charges the excess as debt (out->remaining < 0 until it is paid back).
 * An unsettled reservation settles at its estimate after its TTL. Settle on
 * any handle connected to the daemon that reserved (docs/protocol.md,
 * "Reservations"). */

/* The TTL sluice_reserve sends for ttl_ms 0, in milliseconds. */
#define SLUICE_DEFAULT_TTL_MS 60000

/* Decides like sluice_acquire of `estimate` (>= 1) and, when allowed, opens
 * a reservation: *id is its id (0 when denied). ttl_ms 0 is
 * SLUICE_DEFAULT_TTL_MS. Token bucket, GCRA and window rules; others answer
 * SLUICE_ESERVER (BAD_REQUEST), and a full table OVERLOADED. */
SLUICE_API int sluice_reserve(sluice_client* client, const char* rule, const void* key,
                              size_t key_len, uint32_t estimate, uint32_t ttl_ms, int timeout_ms,
                              sluice_decision* out, uint64_t* id);
/* Settles reservation `id` at `actual` units: *refunded the units given back
 * (estimate - actual), *debt those charged past the estimate; *out the key's
 * state afterwards. `out`, `refunded` and `debt` may be NULL. An id not open
 * answers SLUICE_ESERVER (UNKNOWN_RESERVATION). */
SLUICE_API int sluice_settle(sluice_client* client, uint64_t id, uint32_t actual, int timeout_ms,
                             sluice_decision* out, int64_t* refunded, int64_t* debt);
/* sluice_settle, plus *unpaid: the units of the excess past the key's debt
 * bound (the rule's max_debt) that nobody was charged; 0 when the whole
 * excess was charged. `unpaid` may be NULL. A function of its own, so that
 * sluice_settle and sluice_decision keep their signature and layout. */
SLUICE_API int sluice_settle_with_unpaid(sluice_client* client, uint64_t id, uint32_t actual,
                                         int timeout_ms, sluice_decision* out, int64_t* refunded,
                                         int64_t* debt, int64_t* unpaid);
/* Gives reservation `id` back whole: sluice_settle with actual 0. */
SLUICE_API int sluice_cancel(sluice_client* client, uint64_t id, int timeout_ms,
                             sluice_decision* out, int64_t* refunded);

/* The daemon's `health` result: status "ok" or "degraded", redis "up",
 * "down" or "none" (copied, NUL-terminated, truncated to fit). */
typedef struct sluice_health_info {
  char status[16];
  char redis[16];
} sluice_health_info;
SLUICE_API int sluice_health(sluice_client* client, int timeout_ms, sluice_health_info* out);

/* Calls a method that takes no parameters (health, stats, rules, reload) and
 * returns its result as one line of JSON in *json_out, freed with
 * sluice_free(). Binary strings become JSON strings (bytes outside printable
 * ASCII escaped as \u00XX); non-string map keys are written as strings. */
SLUICE_API int sluice_call_json(sluice_client* client, const char* method, int timeout_ms,
                                char** json_out);
/* Frees memory the library returned. NULL is a no-op. */
SLUICE_API void sluice_free(void* ptr);

/* --- pipelined calls: many requests in flight on one connection ----------
 * sluice_send_* encodes a request into the handle's output buffer (no
 * syscall, no allocation once the buffer has grown) and returns its msgid;
 * sluice_flush writes the buffer (one write() when the socket takes it);
 * sluice_recv returns one response, in whatever order the daemon answered,
 * reading many at once into the input buffer. sluice_recv flushes first, so a
 * send/recv loop never deadlocks. A synchronous call on a handle with
 * requests in flight fails with SLUICE_EBUSY. */

/* The answer to one pipelined request. When status is SLUICE_ESERVER the
 * daemon's code and message are in sluice_server_error_code/message until
 * the next call; `decision` is valid only when status is 0. */
typedef struct sluice_response {
  uint32_t msgid;
  int status;
  sluice_decision decision;
} sluice_response;

SLUICE_API int sluice_send_acquire(sluice_client* client, const char* rule, const void* key,
                                   size_t key_len, uint32_t cost, uint32_t* msgid_out);
SLUICE_API int sluice_send_peek(sluice_client* client, const char* rule, const void* key,
                                size_t key_len, uint32_t* msgid_out);
/* Writes everything queued. Returns 0; SLUICE_ETIMEDOUT when the socket did
 * not take it all in time (nothing is lost, call again); or a connection
 * error, after which the connection is closed and every request in flight is
 * dropped (see the reconnection rule). */
SLUICE_API int sluice_flush(sluice_client* client, int timeout_ms);
/* Waits up to timeout_ms for the next response. Returns 0 and fills *out;
 * SLUICE_ETIMEDOUT when none arrived in time (nothing is lost, call again);
 * SLUICE_EINVAL when no request is in flight; or a connection error. A
 * response whose error map or result is malformed is returned with
 * out->status set, and the other responses keep flowing. A response whose
 * msgid is not in flight (unknown, or answered already) returns
 * SLUICE_EPROTO with out->msgid set: it is discarded, the connection stays
 * open and sluice_in_flight is unchanged. Notifications ([2, method,
 * params]) are skipped. Responses that arrived before the connection failed
 * are all returned before the error is. */
SLUICE_API int sluice_recv(sluice_client* client, int timeout_ms, sluice_response* out);
/* Requests sent (queued or written) and not yet answered. */
SLUICE_API size_t sluice_in_flight(const sluice_client* client);

/* --- HTTP headers -------------------------------------------------------
 * Formats the header values a server returns with a decision, in the
 * structured-field form of draft-ietf-httpapi-ratelimit-headers-10
 * (September 2025; the same syntax as drafts -08 and -09):
 *   RateLimit:        "api";r=20;t=30   (r = remaining, t = seconds to reset)
 *   RateLimit-Policy: "api";q=100;w=60  (q = limit, w = window in seconds,
 *                                        omitted when window_s <= 0)
 *   Retry-After:      3                 (RFC 9110 delay-seconds, rounded up,
 *                                        at least 1; "" when allowed)
 * Times are rounded up to whole seconds, so a client never retries early.
 * `policy` is the policy name (usually the rule name): printable ASCII, at
 * most 64 bytes; '"' and '\' are escaped. Returns 0 or SLUICE_EINVAL. */
typedef struct sluice_headers {
  char ratelimit[192];
  char ratelimit_policy[192];
  char retry_after[24];
} sluice_headers;
SLUICE_API int sluice_format_headers(const sluice_decision* decision, const char* policy,
                                     int64_t window_s, sluice_headers* out);

#ifdef __cplusplus
}
#endif

#endif /* SLUICE_H */

// Scripts: the Lua scripts of the lease path (lua/*.lua), embedded in the
// daemon at build time, and the one place that knows the order of their ARGV
// and of the integers they return, so the lease manager and the tests agree.
//
// Each script's contract (KEYS, ARGV, return, units, TTLs) is written at the
// top of its .lua file; this header restates only what a caller must build.
// Scripts never build key names: the caller names every key. Each takes
// KEYS[1], its state; the rate scripts take an optional KEYS[2] (the key's
// penalty block) and penalty.lua both. Scripts read Redis's clock (TIME) in microseconds;
// the trailing ARGV now_us overrides it when not 0, which only tests do.
//
// Redis >= 5 is required: every script reads TIME and then writes, which
// takes effects replication (the default from Redis 5.0, the only mode from
// 7.0); each script also calls redis.replicate_commands() before TIME where
// that function exists.
//
// Pure values and functions with no I/O; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rules.h"

namespace sluice::scripts {

enum class Script {
  kTokenBucket,    // lua/token_bucket.lua
  kGcra,           // lua/gcra.lua
  kFixedWindow,    // lua/fixed_window.lua
  kSlidingWindow,  // lua/sliding_window.lua
  kSlidingLog,     // lua/sliding_log.lua
  kConcurrency,    // lua/concurrency.lua
  kHeartbeat,      // lua/heartbeat.lua
  kPenalty,        // lua/penalty.lua
  kFleetVersion,   // lua/fleet_version.lua
};

// A script's text is the exact bytes of its preludes' files and then of its
// own. Every script's first prelude is lua/common.lua, the helpers they all
// share; token_bucket.lua's and gcra.lua's second is lua/rate_lease.lua,
// their shared maths, whose function each ends by calling. Redis loads each
// script alone, so the text sent to SCRIPT LOAD (and hashed for EVALSHA) is
// the whole of them, and the line numbers in Redis's error messages count
// from common.lua's first line.
struct ScriptSource {
  Script script;
  std::string_view name;                       // the file name, e.g. "token_bucket.lua"
  std::span<const std::string_view> preludes;  // their file names, in order: "common.lua", ...
  std::string_view source;                     // preludes and file, exactly, for SCRIPT LOAD
};

// Every script, in the order of the enum.
std::span<const ScriptSource> all();
const ScriptSource& get(Script script);

// The lease script of a global rule's algorithm (its lease_script in
// algorithm.h); nullopt for one that has none.
std::optional<Script> forAlgorithm(Algorithm algorithm);

// The operations of the lease scripts (ARGV[1]).
//  - kLease:  take up to n units into the node's slice when at least `need`
//             are available; otherwise nothing, and retry_after_ms says when.
//  - kReturn: give n unused units back (never beyond a full bucket/window).
//             Build it with returnArgv: the window scripts need the window the
//             units were leased in, and ignore a return for a window that
//             has ended (fixed_window) or for one before the previous one
//             (sliding_window), so a late return never refunds units other
//             nodes leased in a newer window.
//  - kDebit:  take n units unconditionally (units admitted in fallback),
//             charged as spent over the last `need` ms (the fallback span;
//             0: just now); the global state may go into debt. Rate scripts
//             only.
//  - kPeek:   take nothing, report the state (retry_after_ms for `need`).
//  - kRenew:  extend the node's holding to now + lease TTL. Concurrency only.
enum class Op { kLease, kReturn, kDebit, kPeek, kRenew };
std::string_view opName(Op op);

// ARGV of token_bucket, gcra, fixed_window, sliding_window and sliding_log:
// {op, n, need, limit, period_ms, burst, now_us}. period_ms is
// limit.period_ns in whole ms, rounded up (config periods are whole ms).
// need is 1..n for kLease, 0..burst for kPeek and the span in ms for
// kDebit; n is ignored by kPeek.
// For kLease, kDebit and kPeek; a kReturn built here (without a window) is
// an error reply from fixed_window and sliding_window: use returnArgv.
// A calendar limit's (fixed_window with limit.window) ARGV goes on: ARGV[8]
// (the deadline, the lease window, or "0"), then the calendar windows before,
// at and after now_us (0: this host's wall clock) as id, start_us, end_us
// (lua/fixed_window.lua).
std::vector<std::string> rateArgv(Op op, int64_t n, int64_t need, const Limit& limit, int64_t now_us = 0);

// The id of the window a lease counted its units in: floor(now_ms /
// period_ms), where now_ms is the granting lease's LeaseReply::now_ms and
// period_ms is as in rateArgv. Exact: the scripts' window id is floor(now_us /
// period_us) with period_us a whole number of ms. A daemon whose slice holds
// units of several leases returns each window's units with its own call (or
// only the newest lease's, up to what that lease granted).
// A calendar limit's (limit.window) is the calendar window's id at
// lease_now_ms on Redis's clock.
int64_t leaseWindow(int64_t lease_now_ms, const Limit& limit);

// Where the window of leaseWindow(lease_now_ms, limit) ends, in ms of
// Redis's clock: the units a lease granted then may be spent until it.
int64_t leaseWindowEndMs(int64_t lease_now_ms, const Limit& limit);

// ARGV of a kLease on any rate script: rateArgv's, then deadline_us (Redis
// clock, µs; 0: none): a lease that Redis runs after it grants nothing and
// replies as a peek, so a lease the daemon gave up on (Redis frozen with it
// in its socket) cannot take units that nobody will spend.
std::vector<std::string> leaseArgv(int64_t n, int64_t need, const Limit& limit, int64_t deadline_us);

// ARGV of a kReturn on any rate script: {"return", n, "0", limit, period_ms,
// burst, now_us, lease_window}, lease_window from leaseWindow (returnMark
// gives each algorithm's). fixed_window lowers its count only when
// lease_window is its stored, still current window; sliding_window lowers
// cur for the current window, prev for the previous one and ignores anything
// older; neither goes below 0. The buckets ignore lease_window; sliding_log
// takes the lease's now_ms there and removes the newest entries of that ms
// or before.
std::vector<std::string> returnArgv(int64_t n, const Limit& limit, int64_t lease_window, int64_t now_us = 0);

// What a return of units leased at lease_now_ms (Redis's clock) passes as
// returnArgv's lease_window for a rule of `algorithm`: the lease's now_ms
// itself for an algorithm whose leases are stamped (sliding_log: its units
// are entries of that ms), else leaseWindow(lease_now_ms, limit).
int64_t returnMark(int64_t lease_now_ms, Algorithm algorithm, const Limit& limit);

// ARGV of concurrency: {op, n, need, limit, lease_ttl_ms, node_id, now_us}.
// lease_ttl_ms is how long the node's holding lives unless renewed (not
// limit.period_ns, which bounds how long one caller holds a unit locally).
std::vector<std::string> concurrencyArgv(Op op, int64_t n, int64_t need, const Limit& limit, int64_t lease_ttl_ms,
                                         std::string_view node_id, int64_t now_us = 0);

enum class HeartbeatOp { kBeat, kLeave, kPeek };
std::string_view heartbeatOpName(HeartbeatOp op);

// ARGV of heartbeat: {op, node_id, ttl_ms, now_us}.
std::vector<std::string> heartbeatArgv(HeartbeatOp op, std::string_view node_id, int64_t ttl_ms, int64_t now_us = 0);

// ARGV of penalty: {op, block_ms}. kBlock blocks for block_ms (a longer
// block stays), kReset forgets the state and lifts the block, kPeek changes
// nothing; each returns the block's time left.
enum class PenaltyOp { kBlock, kReset, kPeek };
std::vector<std::string> penaltyArgv(PenaltyOp op, int64_t block_ms = 0);

// Parses penalty's reply, {blocked_ms}; nullopt when it is not 1 integer >= 0.
std::optional<int64_t> parsePenaltyReply(std::span<const int64_t> values);

// What a lease script returned: five integers; six for concurrency (held)
// and for a rate script given a block key (blocked_ms).
struct LeaseReply {
  int64_t granted = 0;         // units moved into the node's slice
  int64_t remaining = 0;       // units left in the global state now
  int64_t retry_after_ms = 0;  // until `need` units are there; 0 when granted
  int64_t reset_after_ms = 0;  // until the global state is full/fresh again
  int64_t now_ms = 0;          // Redis's clock, ms since the Unix epoch
  int64_t held = 0;            // concurrency: units this node holds now
  int64_t blocked_ms = 0;      // rate script with KEYS[2]: the block's time left
  bool never = false;          // need exceeds the limit/burst: retrying cannot help
};

// Parses the reply of `script` (a rate script or concurrency); nullopt when
// it is not 5 or 6 integers (rate), 6 (concurrency), in the ranges the
// scripts return (a negative remaining, which debt could give, reads as 0;
// waits are cut to 2^41 ms).
std::optional<LeaseReply> parseLeaseReply(std::span<const int64_t> values,
                                          Script script = Script::kTokenBucket);

// ARGV of fleet_version: {op, version, ttl_ms}. kClaim sets the marker to
// `version` when it is absent or already holds it; kPeek changes nothing.
enum class FleetVersionOp { kClaim, kPeek };
std::vector<std::string> fleetVersionArgv(FleetVersionOp op, int64_t version, int64_t ttl_ms);

// Parses fleet_version's reply, {fleet}: the marker's version (0: absent or
// not a version); nullopt when it is not 1 integer >= 0.
std::optional<int64_t> parseFleetVersionReply(std::span<const int64_t> values);

struct HeartbeatReply {
  int64_t live = 0;    // live nodes, N
  int64_t now_ms = 0;  // Redis's clock, ms since the Unix epoch
};

// Parses heartbeat's reply; nullopt when it is not 2 integers.
std::optional<HeartbeatReply> parseHeartbeatReply(std::span<const int64_t> values);

}  // namespace sluice::scripts

// Algorithm: the one table of what each rate-limiting algorithm is and can do.
//
// Every question of the form "can a rule of this algorithm ...?" is answered
// here, from one row per algorithm: whether a limit has a burst, whether an
// acquire may wait, whether a global rule leases a slice and with which Lua
// script, how many state words a limit takes, the largest limit. Code
// elsewhere asks the row instead of listing algorithms, so adding an algorithm
// is adding a row (and its functions), not hunting for switches. The enum is
// generated from the same list as the names (SLUICE_ALGORITHM_MAP, in the
// manner of libuv's UV_HANDLE_TYPE_MAP), and a static_assert keeps the rows in
// enum order.
//
// Invariant: kAlgorithmTraits[i].algorithm == Algorithm(i) for every i; an
// Algorithm value outside the enum cannot be built from the config (the loader
// only produces values it found by name here).
//
// Pure constants; any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace sluice {

// XX(enumerator, name as written in the config file and shown in stats).
#define SLUICE_ALGORITHM_MAP(XX)        \
  XX(kTokenBucket, "token_bucket")     \
  XX(kGcra, "gcra")                    \
  XX(kFixedWindow, "fixed_window")     \
  XX(kSlidingWindow, "sliding_window") \
  XX(kSlidingLog, "sliding_log")       \
  XX(kConcurrency, "concurrency")

enum class Algorithm : uint8_t {
#define SLUICE_ALGORITHM_ENUM(id, name) id,
  SLUICE_ALGORITHM_MAP(SLUICE_ALGORITHM_ENUM)
#undef SLUICE_ALGORITHM_ENUM
};

#define SLUICE_ALGORITHM_COUNT(id, name) +1
inline constexpr size_t kAlgorithmCount = 0 SLUICE_ALGORITHM_MAP(SLUICE_ALGORITHM_COUNT);
#undef SLUICE_ALGORITHM_COUNT

// How a limit's state is kept in a key's entry.
enum class StateShape {
  kOneWord,      // one 64-bit word per limit, updated by compare-and-swap
  kWordPerUnit,  // one word per unit of the limit (a slot each; algorithms/slots.h)
};

struct AlgorithmTraits {
  Algorithm algorithm;
  std::string_view name;
  StateShape state;
  // The largest `limit` (and `burst`) its state can hold; the config loader
  // refuses larger values. Per-unit algorithms are for small limits only.
  int64_t max_limit;
  // A limit has a capacity (`burst`) apart from its rate; `pace = true` sets
  // it to 1. Without one, burst equals limit and is not written.
  bool burst;
  // An acquire may reserve units that come free later and wait for them
  // (max_wait, pace): a bucket can be drawn ahead, a window cannot.
  bool waits;
  // A bucket: what it admitted stays remembered for as long as it takes to
  // refill from empty, which may be longer than the period.
  bool refills;
  // Counts units per window of period_ns: a lease granted in one window may
  // be spent only until that window ends.
  bool windowed;
  // Units are held until released, not spent; the period is the longest
  // hold ("0": no longest hold).
  bool holds;
  // A global rule of one limit leases a slice of spendable units from Redis
  // through `lease_script` (lease.h); such a rule can share a penalty block,
  // and a global rule of several limits is split into parts that lease each.
  bool leases_slice;
  // A leased unit enters the global state stamped with the lease's time (a
  // log's entry), not with the time it is spent: it leaves the state one
  // period after its lease, so it may be spent only within that period, and
  // the units a node holds leased are overshoot it can cause (docs/design.md,
  // "The sliding log in Redis").
  bool stamps_lease = false;
  // A hot key of a global rule of one limit may lease a rate instead of a
  // stream of tokens (rate_lease.h): `lease_script` takes the rate op and
  // keeps the rates held in the key's state, and a unit's refill is the
  // limit's whatever spent it, so a slice refilled locally at a rate counts
  // as the script does.
  bool leases_rate = false;
  // A reservation of it can be settled (reserve/settle, reservations.h):
  // units spent at some time can be given back later, and units charged
  // past the limit (a debt the state pays back before admitting more).
  bool settles;
  // The file in lua/ that leases this algorithm's units (a slice, or held
  // units for concurrency); "" when a global rule of it leases nothing and
  // is decided on the node's share at all times.
  std::string_view lease_script;
  // The algorithm to suggest for a limit above max_limit, when one counts
  // the same thing in less state; "" for none.
  std::string_view for_larger_limits = {};
};

inline constexpr std::array<AlgorithmTraits, kAlgorithmCount> kAlgorithmTraits = {{
    {.algorithm = Algorithm::kTokenBucket, .name = "token_bucket", .state = StateShape::kOneWord,
     .max_limit = 1'000'000'000, .burst = true, .waits = true, .refills = true, .windowed = false,
     .holds = false, .leases_slice = true, .leases_rate = true, .settles = true,
     .lease_script = "token_bucket.lua"},
    {.algorithm = Algorithm::kGcra, .name = "gcra", .state = StateShape::kOneWord,
     .max_limit = 1'000'000'000, .burst = true, .waits = true, .refills = true, .windowed = false,
     .holds = false, .leases_slice = true, .leases_rate = true, .settles = true,
     .lease_script = "gcra.lua"},
    // The window's count is 32 bits of the word.
    {.algorithm = Algorithm::kFixedWindow, .name = "fixed_window", .state = StateShape::kOneWord,
     .max_limit = 0xFFFFFFFFLL, .burst = false, .waits = false, .refills = false, .windowed = true,
     .holds = false, .leases_slice = true, .settles = true, .lease_script = "fixed_window.lua"},
    // Two windows' counts of 20 bits each share the word with the window.
    {.algorithm = Algorithm::kSlidingWindow, .name = "sliding_window",
     .state = StateShape::kOneWord, .max_limit = (1LL << 20) - 1, .burst = false, .waits = false,
     .refills = false, .windowed = true, .holds = false, .leases_slice = true,
     .settles = true, .lease_script = "sliding_window.lua"},
    {.algorithm = Algorithm::kSlidingLog, .name = "sliding_log", .state = StateShape::kWordPerUnit,
     .max_limit = 1000, .burst = false, .waits = false, .refills = false, .windowed = false,
     .holds = false, .leases_slice = true, .stamps_lease = true, .settles = false,
     .lease_script = "sliding_log.lua",
     .for_larger_limits = "sliding_window"},
    {.algorithm = Algorithm::kConcurrency, .name = "concurrency", .state = StateShape::kWordPerUnit,
     .max_limit = 1000, .burst = false, .waits = false, .refills = false, .windowed = false,
     .holds = true, .leases_slice = false, .settles = false, .lease_script = "concurrency.lua"},
}};

constexpr const AlgorithmTraits& algorithmTraits(Algorithm algorithm) {
  return kAlgorithmTraits[static_cast<size_t>(algorithm)];
}

namespace algorithm_detail {
constexpr bool rowsInEnumOrder() {
  constexpr std::string_view kNames[] = {
#define SLUICE_ALGORITHM_NAME(id, name) name,
      SLUICE_ALGORITHM_MAP(SLUICE_ALGORITHM_NAME)
#undef SLUICE_ALGORITHM_NAME
  };
  for (size_t i = 0; i < kAlgorithmCount; ++i) {
    const AlgorithmTraits& row = kAlgorithmTraits[i];
    if (static_cast<size_t>(row.algorithm) != i || row.name != kNames[i]) return false;
    // What the other columns imply: a slice is leased by a script; waiting
    // draws a bucket ahead; a held unit is in a slot of its own.
    if (row.leases_slice && row.lease_script.empty()) return false;
    if (row.stamps_lease && (!row.leases_slice || row.windowed)) return false;
    if (row.leases_rate && (!row.leases_slice || !row.refills)) return false;
    if (row.waits && !row.refills) return false;
    if (row.holds && row.state != StateShape::kWordPerUnit) return false;
    // Settling rewrites one word (limiter.h settle()).
    if (row.settles && row.state != StateShape::kOneWord) return false;
    if (!row.for_larger_limits.empty()) {
      bool found = false;
      for (const AlgorithmTraits& other : kAlgorithmTraits) {
        found = found || (other.name == row.for_larger_limits && other.max_limit > row.max_limit);
      }
      if (!found) return false;
    }
  }
  return true;
}
}  // namespace algorithm_detail
static_assert(algorithm_detail::rowsInEnumOrder(),
              "kAlgorithmTraits: one row per SLUICE_ALGORITHM_MAP entry, in its order");

constexpr std::string_view algorithmName(Algorithm algorithm) {
  return algorithmTraits(algorithm).name;
}

// The algorithm named `name` as written in the config file; nullopt for none.
constexpr std::optional<Algorithm> algorithmNamed(std::string_view name) {
  for (const AlgorithmTraits& row : kAlgorithmTraits) {
    if (row.name == name) return row.algorithm;
  }
  return std::nullopt;
}

// The largest `limit` (and `burst`) an algorithm can hold in its state.
constexpr int64_t maxLimit(Algorithm algorithm) { return algorithmTraits(algorithm).max_limit; }

// Whether lua/ has a rate lease script for the algorithm, so a global rule of
// it can lease a slice (slice.h).
constexpr bool hasRateLeaseScript(Algorithm algorithm) {
  return algorithmTraits(algorithm).leases_slice;
}

}  // namespace sluice

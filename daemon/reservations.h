// Reservations: one worker's open reserve → settle budgets (issue 22).
//
// A caller whose cost is known only when its request ends (LLM tokens,
// bytes, GPU seconds) reserves an estimate, which is spent at once like an
// acquire of it, and settles the actual cost later: the difference is
// refunded when the actual is smaller, and charged as debt when it is
// larger. This table remembers what is open between the two: for each
// reservation its rule, key, estimate and expiry. It spends and refunds
// nothing itself; the dispatcher does, with what settle() tells it.
//
// Ids are opaque to clients and unique on the node: the worker's index in
// the top 16 bits (workerOf: a settle that arrives on another worker is
// routed there) and a sequence number below, never 0.
//
// A reservation not settled within its TTL settles at its estimate: the
// estimate stays spent and the entry goes (expire()). A connection that
// closes leaves its reservations open until then: the request may still be
// running elsewhere. cancel is a settle with actual 0.
//
// Bounds: at most max_open reservations in the table and max_per_key on one
// (rule, key); open() refuses beyond them, and the caller answers with a
// clear error rather than letting memory grow.
//
// Time: now_ns and expiries are the daemon's monotonic clock, passed in.
// Not thread-safe: one worker owns its table and uses it on its loop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace sluice {

// What a settle of `actual` units does to a reservation of `estimate`.
struct Settlement {
  int64_t refund = 0;  // estimate - actual when positive: given back
  int64_t debt = 0;    // actual - estimate when positive: spent even past the limit
};
// Requires estimate >= 0 and actual >= 0.
constexpr Settlement settlementOf(int64_t estimate, int64_t actual) {
  return actual <= estimate ? Settlement{estimate - actual, 0} : Settlement{0, actual - estimate};
}

class Reservations {
 public:
  struct Bounds {
    size_t max_open = 65'536;  // per worker
    size_t max_per_key = 1'024;
  };

  struct Reservation {
    uint64_t id = 0;
    uint32_t rule_id = 0;
    std::string key;
    int64_t estimate = 0;
    int64_t opened_ns = 0;  // when the estimate was spent
    int64_t expires_ns = 0;
    // Spent from a global rule's leased slice (slice.h), not from state
    // this node decides alone: the settle goes back to the slice.
    bool leased = false;
  };

  enum class Refusal {
    kTableFull,  // max_open reached on this worker
    kKeyFull,    // max_per_key reached on this (rule, key)
  };

  // The worker whose table holds reservation `id`.
  static constexpr uint32_t workerOf(uint64_t id) { return static_cast<uint32_t>(id >> kSequenceBits); }

  Reservations(uint32_t worker_index, Bounds bounds);

  // Whether open() would take one more reservation of (rule_id, key); the
  // caller asks before it spends the estimate, so a refusal spends nothing.
  std::optional<Refusal> refusal(uint32_t rule_id, std::string_view key) const;

  // Opens a reservation of `estimate` units, spent by the caller, expiring
  // at now_ns + ttl_ns; returns its id. Requires !refusal(rule_id, key).
  uint64_t open(uint32_t rule_id, std::string_view key, int64_t estimate, int64_t ttl_ns,
                int64_t now_ns, bool leased = false);

  // Removes and returns reservation `id` for a settle or cancel; nullopt
  // when it is not open (never was, settled already, or expired).
  std::optional<Reservation> take(uint64_t id);

  // Removes every reservation whose expiry is at or before now_ns, settled
  // at its estimate, and returns them (oldest first).
  std::vector<Reservation> expire(int64_t now_ns);

  // The earliest expiry among the open reservations; nullopt when none.
  std::optional<int64_t> nextExpiryNs() const;

  size_t size() const { return open_.size(); }
  uint32_t workerIndex() const { return static_cast<uint32_t>(worker_bits_ >> kSequenceBits); }
  // Units reserved and not yet settled, over all open reservations.
  int64_t reservedUnits() const { return reserved_units_; }

 private:
  static constexpr int kSequenceBits = 48;
  using KeyOf = std::pair<uint32_t, std::string>;
  struct KeyHash {
    size_t operator()(const KeyOf& k) const {
      return std::hash<std::string>()(k.second) ^ (static_cast<size_t>(k.first) * 0x9E3779B97F4A7C15ULL);
    }
  };

  void forget(const Reservation& r);

  const uint64_t worker_bits_;
  const Bounds bounds_;
  uint64_t next_sequence_ = 1;
  int64_t reserved_units_ = 0;
  std::map<uint64_t, Reservation> open_;
  std::set<std::pair<int64_t, uint64_t>> by_expiry_;  // (expires_ns, id)
  std::unordered_map<KeyOf, size_t, KeyHash> per_key_;
};

}  // namespace sluice

// Metrics: the daemon's counters, sharded per worker so the request path
// never shares a cache line with another thread.
//
// Each worker owns one MetricsShard and is its only writer: it bumps counters
// with a relaxed load and store (no locked instruction). Any thread may read
// a shard at any time with relaxed loads; Metrics::snapshot() sums all shards
// and the server-wide counters. Totals are therefore eventually consistent,
// which is all `stats` and `/metrics` need.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "decision.h"
#include "rpc.h"

namespace sluice {

// A counter with a single writer and any number of readers.
class Counter {
 public:
  void add(uint64_t n = 1) { value_.store(value_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed); }
  uint64_t get() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// Why the daemon closed a client connection.
enum class CloseReason {
  kPeerClosed,      // the client hung up
  kIdle,            // no traffic for idle_timeout_ms
  kPartialFrame,    // a frame left half-sent for partial_frame_timeout_ms
  kOutputCap,       // more than max_output_bytes unsent: the client does not read
  kUnreadable,      // bytes that are not MessagePack-RPC, or a frame too large
  kShutdown,        // the daemon is stopping
  kError,           // a socket error
};
constexpr size_t kCloseReasons = 7;
std::string_view closeReasonName(CloseReason reason);

// Why the daemon closed a connection the moment it accepted it.
enum class RefuseReason {
  kMaxConnections,  // [limits] max_connections were open
  kMaxPerUser,      // the peer's uid held [access] max_connections_per_user
};
constexpr size_t kRefuseReasons = 2;
std::string_view refuseReasonName(RefuseReason reason);

constexpr size_t kModes = 7;        // Mode values
constexpr size_t kErrorCodes = 8;   // rpc::ErrorCode values

// Upper bounds of the latency histograms' buckets, in microseconds (the
// last bucket, +Inf, is implicit).
constexpr std::array<uint64_t, 12> kLatencyBucketsUs = {10,     25,     50,      100,    250,
                                                        500,    1'000,  2'500,   5'000,  10'000,
                                                        25'000, 100'000};
constexpr size_t kLatencyBuckets = kLatencyBucketsUs.size() + 1;

// A latency histogram with a single writer (its counters are Counters).
struct Histogram {
  std::array<Counter, kLatencyBuckets> buckets;  // not cumulative
  Counter sum_us;
  void observe(uint64_t us, uint64_t count = 1) {
    size_t i = 0;
    while (i < kLatencyBucketsUs.size() && us > kLatencyBucketsUs[i]) ++i;
    buckets[i].add(count);
    sum_us.add(us * count);
  }
};
struct HistogramSnapshot {
  std::array<uint64_t, kLatencyBuckets> buckets{};  // not cumulative
  uint64_t sum_us = 0;
  void add(const Histogram& histogram) {
    for (size_t i = 0; i < kLatencyBuckets; ++i) buckets[i] += histogram.buckets[i].get();
    sum_us += histogram.sum_us.get();
  }
  uint64_t count() const;
  // The upper bound of the bucket holding the q-quantile (0 < q <= 1), in
  // microseconds: that fraction of the observations took at most this long.
  // nullopt when it lies beyond the last bound, or nothing was observed.
  std::optional<uint64_t> quantileBoundUs(double q) const;
};

class Metrics;

// One rule's decisions on one worker, by result (allowed, denied) and Mode;
// those allowed with under a fifth of the limit left (near_limit, as
// envoyproxy/ratelimit counts it), and a shadow rule's would-be denials.
struct alignas(64) RuleShard {
  std::array<Counter, kModes> allowed;
  std::array<Counter, kModes> denied;
  Counter near_limit;
  Counter shadow_denied;
  // Reservations of the rule opened, and closed (settled, cancelled or
  // expired): the difference is open now, which the overshoot bound counts.
  Counter reservations_opened;
  Counter reservations_closed;
};

struct alignas(64) MetricsShard {
  // Set by Metrics: where per-rule counters live, and this shard's index.
  Metrics* owner = nullptr;
  size_t index = 0;
  std::array<Counter, kModes> allowed;  // by Mode
  std::array<Counter, kModes> denied;   // by Mode
  Counter shadow_denied;                // shadow rules that would have denied
  Counter requests;                     // frames parsed into a request or notification
  std::array<Counter, kErrorCodes> errors;  // error responses by rpc::ErrorCode
  Counter connections_accepted;
  std::array<Counter, kCloseReasons> connections_closed;
  // The lease path (global rules while leasing).
  Counter lease_units_spent;     // units spent from slices
  Counter lease_units_dropped;   // units whose window ended unspent
  // Units back in a concurrency holding's pool: released, or reclaimed when
  // their deadline passed (holding.h).
  Counter lease_units_released;
  Counter lease_negative_hits;   // denials answered from the negative cache
  Counter lease_deferred;        // requests that waited for a lease
  Counter lease_deferred_expired;  // of those, answered by policy at their deadline
  Counter penalty_blocks;          // keys blocked by their rule's penalty
  Counter unknown_fields;          // map entries skipped as unknown (rpc::Request)
  // Reservations (reservations.h): opened by reserve, closed by settle,
  // cancel or expiry at the estimate; units given back, and charged past
  // the estimate (debt); units of a settle's excess past the key's debt
  // bound (debtBound), left unpaid, and the settles that left some. Open
  // now = opened - settled - cancelled - expired.
  Counter reservations_opened;
  Counter reservations_settled;
  Counter reservations_cancelled;
  Counter reservations_expired;
  Counter reservation_refunded_units;
  Counter reservation_debt_units;
  Counter reservation_unpaid_units;
  Counter reservations_unpaid;
  // Time from reading a request to its answer being written: each batch of
  // one read counts its elapsed time once per request in it; a deferred
  // request counts its own wait.
  Histogram decision_latency;
};

// Decisions of one rule, summed over workers.
struct RuleSnapshot {
  std::string name;
  std::array<uint64_t, kModes> allowed{};
  std::array<uint64_t, kModes> denied{};
  uint64_t near_limit = 0;
  uint64_t shadow_denied = 0;
  uint64_t reservations_open = 0;
};

// Summed view of all shards at one moment.
struct MetricsSnapshot {
  std::array<uint64_t, kModes> allowed{};
  std::array<uint64_t, kModes> denied{};
  uint64_t shadow_denied = 0;
  uint64_t requests = 0;
  std::array<uint64_t, kErrorCodes> errors{};
  uint64_t connections_accepted = 0;
  std::array<uint64_t, kRefuseReasons> connections_refused{};
  uint64_t connections_forbidden = 0;
  std::array<uint64_t, kCloseReasons> connections_closed{};
  uint64_t lease_units_spent = 0;
  uint64_t lease_units_dropped = 0;
  uint64_t lease_units_released = 0;
  uint64_t lease_negative_hits = 0;
  uint64_t lease_deferred = 0;
  uint64_t lease_deferred_expired = 0;
  uint64_t penalty_blocks = 0;
  uint64_t unknown_fields = 0;
  uint64_t reservations_opened = 0;
  uint64_t reservations_settled = 0;
  uint64_t reservations_cancelled = 0;
  uint64_t reservations_expired = 0;
  uint64_t reservation_refunded_units = 0;
  uint64_t reservation_debt_units = 0;
  uint64_t reservation_unpaid_units = 0;
  uint64_t reservations_unpaid = 0;
  uint64_t envoy_overrides_refused = 0;
  uint64_t envoy_deadline_exceeded = 0;
  HistogramSnapshot decision_latency;

  uint64_t reservationsOpen() const {
    const uint64_t closed = reservations_settled + reservations_cancelled + reservations_expired;
    return reservations_opened > closed ? reservations_opened - closed : 0;
  }

  uint64_t decisions() const;
};

class Metrics {
 public:
  // Creates `shards` shards; call once before any worker starts.
  explicit Metrics(size_t shards);

  MetricsShard& shard(size_t index) { return shards_[index]; }
  // Connections refused at accept, and those accepted from peers that may
  // not use the daemon (access.h); written by the acceptor thread only.
  Counter& connectionsRefused(RefuseReason reason) {
    return connections_refused_[static_cast<size_t>(reason)];
  }
  Counter& connectionsForbidden() { return connections_forbidden_; }
  // Envoy limit overrides refused a rule (envoy_front.h); written under the
  // Envoy front's lock, so by one thread at a time.
  Counter& envoyOverridesRefused() { return envoy_overrides_refused_; }
  // Envoy calls finished DEADLINE_EXCEEDED without a decision
  // (envoy_front.h); written under the Envoy front's lock for them.
  Counter& envoyDeadlineExceeded() { return envoy_deadline_exceeded_; }

  MetricsSnapshot snapshot() const;

  // The counters of rule `name` on worker `shard`, created on first use and
  // kept for the daemon's life (a reload that drops a rule keeps its totals,
  // as Prometheus expects of counters). Takes a lock: call it when rules
  // are installed, never per request.
  RuleShard* ruleShard(std::string_view name, size_t shard);
  std::vector<RuleSnapshot> ruleSnapshots() const;

 private:
  std::deque<MetricsShard> shards_;  // stable addresses, one per worker and lane
  std::array<Counter, kRefuseReasons> connections_refused_;
  Counter connections_forbidden_;
  Counter envoy_overrides_refused_;
  Counter envoy_deadline_exceeded_;
  mutable std::mutex rules_mutex_;
  std::map<std::string, std::unique_ptr<RuleShard[]>, std::less<>> rules_;
};

}  // namespace sluice

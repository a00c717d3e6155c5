// Lease: the meeting point of workers, the control thread and the server on
// the lease path (docs/design.md, "The lease path").
//
// A global rule's key leases units from Redis into its slice (slice.h); a
// global concurrency rule's key leases a holding (holding.h); entry.h lays
// out a key entry's words. This header holds what crosses threads about
// them: the LeaseRequest a worker or the sweep queues for the control
// thread (lease_manager.h), the breaker's state as workers read it, and the
// counters `stats` shows, all in the LeaseBroker.
//
// A holding's units are not spent but held: a release puts them back into
// the pool, the control thread renews the node's holding in Redis
// (lua/concurrency.lua, a TTL of lease_ttl) and gives back what stays
// unused. Where a rate rule debits what fallback admitted, a holding turns
// the units its callers hold beyond its pool (acquired in fallback, or kept
// after Redis dropped the node's holding) into a debt that it leases back,
// at recovery before the breaker closes: units in use are what Redis must
// count, and they are still in use, whereas a rate rule's fallback
// admissions are already spent.
//
// Every LeaseBroker method is thread-safe. Time: monotonic ns of this host
// (clock.h), passed in.
#pragma once

#include <uv.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "breaker.h"
#include "metrics.h"
#include "rules.h"
#include "wait_lines.h"

namespace sluice {

// What a worker asks the control thread for.
struct LeaseRequest {
  // kDebit: units a share admitted while Redis was up but the key could not
  // lease (its lease failed or came late). kBlock: the key's penalty blocks
  // it for n ms across the fleet. kReset: the admin reset of the key's
  // global state and block. A global concurrency rule's key (holding.h)
  // asks only for kLease and kReturn; the units of a kReturn have left its
  // pool already.
  enum class Kind { kLease, kReturn, kDebit, kBlock, kReset };
  Kind kind = Kind::kLease;
  uint32_t rule_id = 0;
  std::string key;
  int64_t n = 0;     // kLease: at most; kReturn, kDebit: units; kBlock: ms
  int64_t need = 0;  // kLease: the fewest worth granting
  // kLease of a key that holds or wants a rate lease (rate_lease.h): the
  // rate asked for, units per period; n is then the tokens asked for beside
  // it (up to). -1: a token lease.
  int64_t rate = -1;
  int64_t lease_now_ms = 0;  // kReturn: Redis's clock at the lease (its window)
  // Which override of the rule decides the key (RuleSet::variant): its
  // limits are the ones the script is called with.
  uint32_t variant = 0;
};

// Counters of the lease path, for `stats` (each read on its own).
struct LeaseStats {
  uint64_t requested = 0;       // leases sent to Redis
  uint64_t granted = 0;         // leases that granted units
  uint64_t empty = 0;           // leases answered "nothing until t"
  uint64_t failed = 0;          // leases that got an error, timeout or disconnect
  uint64_t granted_units = 0;
  uint64_t returned_units = 0;  // given back (idle keys, stop)
  uint64_t debited_units = 0;   // admitted in fallback, debited on recovery
  uint64_t latency_us_sum = 0;  // answered leases
  uint64_t latency_us_max = 0;
  uint64_t fallback_entries = 0;  // times the breaker opened
  uint64_t fallback_ms = 0;       // time spent with the breaker open (so far)
  uint64_t learning_entries = 0;  // times Redis came back without our state
  // Concurrency holdings (holding.h): units freed into the pools by the
  // sweep and the control thread (expired deadlines; the workers count
  // theirs in MetricsShard), units Redis no longer held for this node
  // (its holding expired), and renewals sent.
  uint64_t released_units = 0;
  uint64_t lost_units = 0;
  uint64_t renewed = 0;
  // Words heard on the renew channel (LeaseManager::renewHeard): another
  // node's rate op found a key's rates to be divided again.
  uint64_t renew_words = 0;
};

class LeaseBroker {
 public:
  // lease_interval_ns: a batch covers about this much demand.
  // holding_return_ns: how long a unit of a global concurrency rule that a
  // caller released on another node takes to be leasable here (0: unknown).
  explicit LeaseBroker(int64_t lease_interval_ns, int64_t holding_return_ns = 0);
  LeaseBroker(const LeaseBroker&) = delete;
  LeaseBroker& operator=(const LeaseBroker&) = delete;

  int64_t leaseIntervalNs() const { return lease_interval_ns_; }
  int64_t holdingReturnNs() const { return holding_return_ns_; }

  // Workers: global rules lease while the breaker is closed.
  bool leasing() const { return breaker() == Breaker::kClosed; }
  Breaker breaker() const { return static_cast<Breaker>(breaker_.load(std::memory_order_acquire)); }
  // Whether `rule` is in learning mode at now_ns (breaker.h): Redis came
  // back without the fleet's state less than the rule's learning span ago,
  // so each node also holds itself to its share of the rule. Once every
  // rule is done, one load.
  bool learning(const Rule& rule, int64_t now_ns) const {
    return learningAny(now_ns) && now_ns < learningUntilNs(rule);
  }
  // When `rule`'s learning mode ends (monotonic ns; 0: it never began).
  int64_t learningUntilNs(const Rule& rule) const;
  // Whether some rule may still be learning (the longest span at the start).
  bool learningAny(int64_t now_ns) const {
    return now_ns < learning_until_ns_.load(std::memory_order_acquire);
  }

  // Workers and the server's sweep: queue a request for the control thread.
  void submit(LeaseRequest request);

  // Control thread.
  void setBreaker(Breaker breaker, int64_t now_ns);
  // While the breaker is open: since when (monotonic ns); 0 otherwise.
  int64_t openSinceNs() const { return open_since_ns_.load(std::memory_order_acquire); }
  // When the last outage began (monotonic ns), kept once it ends; 0:
  // never. An opening begins one unless the breaker has not closed since
  // the last: a recovery that failed (half-open, then open again) goes on
  // with the outage it was in. The fallback and learning hold a rate that
  // held then (LeasePath::outage, LeasePath::learnedRate).
  int64_t lastOpenedNs() const { return last_opened_ns_.load(std::memory_order_acquire); }
  // Learning mode starts at now_ns (CircuitBreaker): each rule learns for
  // learningSpanNs(rule, holding_memory_ns, reconnect_ns), the longest of
  // them longest_ns.
  void startLearning(int64_t now_ns, int64_t holding_memory_ns, int64_t reconnect_ns,
                     int64_t longest_ns);
  // The fleet marker's state version as last read (0: none yet, or not a
  // version) and whether this node refuses to lease for it (breaker.h).
  void setFleetVersion(int64_t fleet_version, bool refused) {
    fleet_version_.store(fleet_version, std::memory_order_relaxed);
    refused_.store(refused, std::memory_order_release);
  }
  int64_t fleetVersion() const { return fleet_version_.load(std::memory_order_relaxed); }
  bool refused() const { return refused_.load(std::memory_order_acquire); }
  // Takes every queued request.
  void takeRequests(std::vector<LeaseRequest>* out);
  // The handle submit() wakes (nullptr: none yet, requests wait).
  void setWakeup(uv_async_t* wakeup);
  // Wakes every worker with deferred requests (set by the server).
  void onReplies(std::function<void()> notify) { notify_ = std::move(notify); }
  void notifyWorkers() const {
    if (notify_) notify_();
  }
  // Where this node's waiting requests stand in line (any thread).
  WaitLines& lines() { return lines_; }

  // Counters (control thread writes, anyone reads).
  struct Counters {
    std::atomic<uint64_t> requested{0}, granted{0}, empty{0}, failed{0}, granted_units{0},
        returned_units{0}, debited_units{0}, latency_us_sum{0}, latency_us_max{0},
        fallback_entries{0}, learning_entries{0}, released_units{0}, lost_units{0}, renewed{0},
        renew_words{0};
    Histogram latency;  // answered leases; the control thread is its one writer
  };
  Counters& counters() { return counters_; }
  LeaseStats stats(int64_t now_ns) const;

 private:
  const int64_t lease_interval_ns_;
  const int64_t holding_return_ns_;
  std::atomic<int> breaker_{static_cast<int>(Breaker::kOpen)};
  std::atomic<int64_t> learning_since_ns_{0};  // 0: never
  std::atomic<int64_t> learning_holding_ns_{0};
  std::atomic<int64_t> learning_reconnect_ns_{0};
  std::atomic<int64_t> learning_until_ns_{0};  // the longest rule's end
  std::atomic<int64_t> open_since_ns_{0};      // while open: since when
  std::atomic<int64_t> last_opened_ns_{0};     // the last outage's opening, kept
  bool closed_since_opened_ = true;             // setBreaker's, on the control thread
  std::atomic<uint64_t> open_ns_total_{0};     // closed periods of fallback
  std::atomic<int64_t> fleet_version_{0};      // setFleetVersion
  std::atomic<bool> refused_{false};
  Counters counters_;
  WaitLines lines_;

  std::mutex mutex_;  // guards queue_ and wakeup_
  std::vector<LeaseRequest> queue_;
  uv_async_t* wakeup_ = nullptr;
  std::function<void()> notify_;  // set before any thread starts
};

}  // namespace sluice

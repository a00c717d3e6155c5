// Lease path: decisions of a leasable global rule while Redis is up, on the
// key's slice (slice.h): units leased from Redis in batches, spent here one
// acquire at a time.
//
// An acquire takes its cost from the slice; what it took is in its verdict
// (Taken), for the group path (group_path.h) to keep, or to give back when
// another entry of its group denies. Below the low-water mark it asks for
// the next batch (one lease in flight per key). On an empty slice it
// waits for the lease under way (Waiting, kLease), or, when it may not wait
// or the key's lease failed or came late, the rule's on_redis_down policy
// decides (policy.h). Redis's "nothing until t" is cached in the slice
// (denied until then). A request that may wait (max_wait) and would be
// denied until a time within its wait stands in the key's line (WaitLines)
// and waits until then (kDue) or behind those who came first (kLine); only a
// question of one entry may (Asker::may_wait_for_units). While learning, an
// acquire must also pass the node's equal share, unless the key holds a
// rate: one that held a rate when Redis went away asks the fresh state for
// it again, no more, until the fallback's hold ends (learnedRate). A key
// blocked by its
// rule's penalty is denied until its block is due to be asked of Redis again.
// While Redis is unreachable a key holding a rate lease spends it until it
// ends (acquireOnRate); the group path asks before the equal share decides.
//
// A LeasePath belongs to one worker (its Dispatcher) and is called only
// from that worker's loop, inside its KeyTable::ReadGuard, and only with a
// broker. now_ns is the daemon's monotonic clock, passed in.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "decision.h"
#include "key_table.h"
#include "entry.h"
#include "lease.h"
#include "lookup.h"
#include "metrics.h"
#include "policy.h"
#include "rpc.h"
#include "rules.h"
#include "slice.h"
#include "verdict.h"
#include "waiting.h"

namespace sluice {

// How long a request on `rule` may wait for its units: its max_wait_ms,
// else the rule's max_wait; 0 when it cannot wait.
inline int64_t maxWaitNs(const Rule& rule, const rpc::Item& item) {
  if (!canWait(rule)) return 0;
  return item.max_wait_ms >= 0 ? item.max_wait_ms * 1'000'000 : rule.max_wait_ns;
}

// A decision made on a slice (normal mode), before shadow. `words` are the
// slice's: an allowed decision's remaining is the fleet's as far as this
// node can tell, the units left in the slice plus what Redis had left at the
// last lease (slice::redisLeft), at most the rule's capacity.
Decision sliceDecision(const Rule& rule, const slice::TakeResult& taken, slice::ConstWords words,
                       int64_t now_ns);

class LeasePath {
 public:
  // Its methods are called only with a broker (`broker` non-null).
  LeasePath(KeyTable& keys, MetricsShard& metrics, LeaseBroker* broker, Waiting& waiting,
            PolicyPath& policy)
      : keys_(keys), metrics_(metrics), broker_(broker), waiting_(waiting), policy_(policy) {}

  // Acquires item.cost (> 0) units of a key of a leasable `rule`: answered
  // (`verdict`, after shadow, with what it took), or waiting (Outcome).
  Outcome acquire(const RuleSet& rules, const Rule& rule, const rpc::Item& item, int64_t now_ns,
                  const Asker& asker, Verdict* verdict);
  // Redis is unreachable (the broker is not leasing): a key of `rule` (on
  // on_redis_down "local") that holds a rate lease decides on it until the
  // rate ends (rate_lease.h; lease_ttl after its last renewal at the most),
  // in mode fallback: its demand-weighted share, which Redis charges as
  // held whether or not the node reaches it. nullopt when the key holds no
  // rate (or the cost is past its cap): the rule's equal share decides.
  std::optional<Outcome> acquireOnRate(const RuleSet& rules, const Rule& rule, const rpc::Item& item,
                                       int64_t now_ns, Verdict* verdict);
  // What acquireOnRate would answer for `cost`, spending nothing (a peek
  // while Redis is unreachable; `mode` gets fallback, or shadow). nullopt:
  // the equal share answers.
  std::optional<Decision> lookOnRate(const RuleSet& rules, const Rule& rule, std::string_view key,
                                     int64_t now_ns, int64_t cost, Mode* mode);
  // Asks for a key's lease as an acquire would, deciding and taking
  // nothing: for a part whose question already waits for another part's
  // lease, so that both leases come within one round trip. `again`: the
  // question's demand was counted when it was first asked.
  void askForLease(const RuleSet& rules, const Rule& rule, const rpc::Item& item, int64_t now_ns,
                   bool again);
  // What an acquire of `cost` would answer on a key of `rule`, spending and
  // claiming nothing; `mode` gets its mode. After shadow.
  // Settles a reservation of `rule` (reservations.h) on the key's slice:
  // gives back `refund` units spent at spent_ns, or charges `debt` past what
  // the slice holds (slice::refundSpent, slice::charge), with no call to
  // Redis. Answers the slice afterwards: remaining is its balance, negative
  // while it carries a debt. The slice carries at most debtBound of the
  // key's limit; *charged is the part of `debt` charged.
  Verdict settle(const RuleSet& rules, const Rule& rule, std::string_view key, int64_t spent_ns,
                 int64_t refund, int64_t debt, int64_t now_ns, int64_t* charged);
  Decision look(const RuleSet& rules, const Rule& rule, std::string_view key, int64_t now_ns,
                int64_t cost, Mode* mode);
  // Sends a lease request for a key of `rule` whose in-flight bit the
  // caller claimed; `deciding` is the rule's variant for the key, `words`
  // the entry's, `spent` what the caller took from the slice (0: it waits
  // for the lease). While the rule learns, the lease is capped at what the
  // node's share has left (none: the bit is given back, nothing is sent).
  void requestLease(const RuleSet& rules, const Rule& rule, const Rule& deciding,
                    std::string_view key, std::span<std::atomic<uint64_t>> words, int64_t now_ns,
                    int64_t cost, int64_t spent);
  // What the fallback share of global `rule` would answer for `cost` on
  // `key` now, spending nothing.
  Decision lookShare(const RuleSet& rules, const Rule& rule, std::string_view key, int64_t now_ns,
                     int64_t cost);

 private:
  // slice::take() for a key of `rule`, clearing a line mark its line has
  // outlived (and taking again).
  slice::TakeResult take(const Rule& rule, std::string_view key,
                         std::span<std::atomic<uint64_t>> words, int64_t now_ns, int64_t cost,
                         bool again, bool first_in_line);
  // What follows every take from a slice (acquire's and askForLease's):
  // counts the units an ended window dropped and, when the take claimed the
  // in-flight bit, asks for the next batch (requestLease, with what the
  // take spent).
  void afterTake(const RuleSet& rules, const Rule& rule, const Rule& deciding,
                 std::string_view key, std::span<std::atomic<uint64_t>> entry_words,
                 int64_t now_ns, int64_t cost, const slice::TakeResult& taken);
  // Whether an acquire on the key must also pass the node's equal share:
  // `deciding` learns at now_ns and the key holds no rate (a rate Redis
  // granted since it came back is counted there, and bounded by
  // learnedRate).
  bool learnsOnShare(const Rule& deciding, slice::ConstWords words, int64_t now_ns) const;
  // While the breaker is open: its opening and the outage's, as the
  // broker has them; empty otherwise.
  slice::Outage outage() const;
  // While `deciding` learns: the rate (units per period) the key may ask
  // the fresh state for, the one it held when the last outage began (or
  // holds now, granted since), until rate_lease::kFallbackHoldNs after the
  // opening; 0: none, the equal share bounds it. Its demand-weighted share
  // instead of the equal one: the rates held never summed past the limit.
  int64_t learnedRate(const Rule& deciding, slice::ConstWords words, int64_t now_ns) const;
  // acquire()'s decision on the key's entry; `wait` gets the request's
  // ticket when it joins the key's line.
  Outcome spend(const RuleSet& rules, const Rule& rule, const rpc::Item& item, int64_t now_ns,
                std::span<std::atomic<uint64_t>> entry_words, Wait& wait, const Asker& asker,
                Verdict* verdict);
  // Puts a waiting request for `cost` units of a key of `rule` (`deciding`
  // its limits) in the key's line, if it is not in it yet. False when more
  // units wait ahead of it (`ahead`) than the fleet could give the line
  // within its wait: it is refused.
  bool stand(Wait& wait, const Rule& rule, const Rule& deciding, std::string_view key,
             std::span<std::atomic<uint64_t>> words, int64_t cost, int64_t* ahead);

  KeyTable& keys_;
  MetricsShard& metrics_;
  LeaseBroker* broker_;
  Waiting& waiting_;
  PolicyPath& policy_;
  FreshState fresh_;
};

}  // namespace sluice

// Holding path: decisions on a global concurrency rule while a LeaseBroker
// exists, on the key's holding (holding.h), a pool of units leased from
// Redis that acquires hold and releases give back.
//
// While the breaker is closed an acquire holds units from the pool; an empty
// pool asks for a lease and the request waits for it (Waiting, kLease), or,
// when it may not wait or its lease failed or came late, the rule's
// on_redis_down policy decides (policy.h). "local" holds units at the node's
// share on the same slots, so that releases find them whatever the mode was;
// what it holds beyond the pool is the pool's debt, leased back once Redis
// answers. While learning, the node also holds to its share.
//
// Peek and release never create a key: an absent key is a fresh one. A
// release gives back up to its cost of held units (more than are held gives
// back what is held) and answers the state afterwards, as peek does.
//
// A HoldingPath belongs to one worker (its Dispatcher) and is called only
// from that worker's loop, inside its KeyTable::ReadGuard. now_ns is the
// daemon's monotonic clock, passed in.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string_view>

#include "decision.h"
#include "key_table.h"
#include "entry.h"
#include "lease.h"
#include "lookup.h"
#include "metrics.h"
#include "rpc.h"
#include "rules.h"
#include "slice.h"
#include "verdict.h"
#include "waiting.h"

namespace sluice {

class HoldingPath {
 public:
  // Its methods are called only with a broker (`broker` non-null).
  HoldingPath(KeyTable& keys, MetricsShard& metrics, LeaseBroker* broker, Waiting& waiting)
      : keys_(keys), metrics_(metrics), broker_(broker), waiting_(waiting) {}

  // Acquires item.cost (> 0) units of a key of `rule` (of `rules`):
  // answered (`verdict`, after shadow; when units are held, taken.held has
  // the holding's words, to give back with refund() if its group fails), or
  // waiting for a lease (kWaitsForLease).
  Outcome acquire(const RuleSet& rules, const Rule& rule, const rpc::Item& item, int64_t now_ns,
                  const Asker& asker, Verdict* verdict);
  // peek (release false) or release of item.cost units; before shadow.
  Decision look(const RuleSet& rules, const Rule& rule, const rpc::Item& item, bool release,
                int64_t now_ns, Mode* mode);
  // Gives back `cost` units that acquire() held (its group failed).
  void refund(const Rule& rule, std::span<std::atomic<uint64_t>> words, int64_t now_ns,
              int64_t cost);

 private:
  // What an acquire of `cost` would answer on a holding, holding nothing.
  Decision peekHeld(const RuleSet& rules, const Rule& rule,
                    std::span<const std::atomic<uint64_t>> words, int64_t now_ns, int64_t cost,
                    Mode* mode);
  // Sends a lease request for a holding whose in-flight bit the caller claimed.
  void requestHolding(const RuleSet& rules, const Rule& rule, std::string_view key,
                      std::span<std::atomic<uint64_t>> words, int64_t now_ns, int64_t cost);

  KeyTable& keys_;
  MetricsShard& metrics_;
  LeaseBroker* broker_;
  Waiting& waiting_;
  FreshState fresh_;
};

}  // namespace sluice

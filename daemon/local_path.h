// Local path: decisions the limiter (limiter.h) makes on state this node
// keeps: a local rule's key state, or a global rule's fallback share while
// the rule does not decide on leases (policy.h route: on_redis_down "local").
//
// An acquire spends at once; what it spent is in its verdict (Taken), for
// the group path (group_path.h) to keep, or to give back when another
// entry of its group denies. An acquire may wait (bounded waiting, a local
// token bucket or GCRA rule with max_wait, a question of one entry): the
// limiter allows on a reservation, the units are spent now and the answer
// waits until they are due (Waiting, kReserved). A key
// blocked by its rule's penalty is denied in mode blocked; for a global rule
// on its share the penalty's words are in the key's slice entry, where
// leasing keeps them too, so a block holds whatever the mode. What a share
// admits for a leasable rule is debited from Redis (PolicyPath) once its
// group keeps it.
//
// Peek and release never create a key: an absent key is a fresh one. A
// release gives back up to its cost of held units (more than are held gives
// back what is held) and answers the state afterwards, as peek does.
//
// A LocalPath belongs to one worker (its Dispatcher) and is called only
// from that worker's loop, inside its KeyTable::ReadGuard. now_ns is the
// daemon's monotonic clock, passed in.
#pragma once

#include <cstdint>
#include <string_view>

#include "decision.h"
#include "key_table.h"
#include "lookup.h"
#include "policy.h"
#include "rpc.h"
#include "entry.h"
#include "rules.h"
#include "verdict.h"
#include "waiting.h"

namespace sluice {

class LocalPath {
 public:
  LocalPath(KeyTable& keys, Waiting& waiting, PolicyPath& policy)
      : keys_(keys), waiting_(waiting), policy_(policy) {}

  // Acquires item.cost (> 0) units on `rule` in `mode`: `configured`
  // itself, or the share it is routed to. Answered (`verdict`, with what it
  // spent), or waiting on a reservation (kWaitsReserved; `verdict` has the
  // decision to count).
  Outcome acquire(const RuleSet& rules, const Rule& configured, const Rule& rule, Mode mode,
                  const rpc::Item& item, int64_t now_ns, const Asker& asker, Verdict* verdict);
  // Settles a reservation on `rule` in `mode` (reservations.h): gives back
  // `refund` units spent at spent_ns, or charges `debt` past the limit, on
  // the key's state, and answers the state afterwards (remaining negative in
  // debt). A key swept since it was spent is fresh: nothing to give back.
  // *charged: the part of `debt` charged (limiter.h settle, debtBound).
  Verdict settle(const RuleSet& rules, const Rule& rule, Mode mode, std::string_view key,
                 int64_t spent_ns, int64_t refund, int64_t debt, int64_t now_ns,
                 int64_t* charged);
  // peek (release false) or release of item.cost units.
  Verdict look(const RuleSet& rules, const Rule& configured, const Rule& rule, Mode mode,
               const rpc::Item& item, bool release, int64_t now_ns);

 private:
  KeyTable& keys_;
  Waiting& waiting_;
  PolicyPath& policy_;
  FreshState fresh_;
};

}  // namespace sluice

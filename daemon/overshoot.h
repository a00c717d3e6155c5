// Overshoot: the overshoot bound of a global rule on this node, the most it
// could admit on one key of the rule beyond its fair part of the limit right
// now (docs/design.md, "The overshoot bound"). Summed over the fleet's
// nodes, it bounds how far the fleet may pass the limit in a window of one
// period; `stats` and /metrics export it (docs/operations.md).
//
// With Redis up, every unit a node admits was leased from the global state,
// which counts it, so the bound is what escapes that count:
//  - units held leased and unspent, for an algorithm whose leases are
//    stamped (algorithm.h, stamps_lease: a sliding_log unit enters the log
//    when leased, so spent later it may count in no window). A bucket's
//    leased units were charged when leased, and a window's may be spent
//    only in the window that counted them: none escape;
//  - what a rate lease (rate_lease.h) lets escape on one key
//    (rateEscapeUnits): the rate itself is counted in Redis, which refills
//    the bucket only at what the rates leave of the limit, but the slice
//    may save up to its cap (slice::rateCapUnits) and spend it at once. Of
//    that, the rate's share of the burst does not escape: Redis's bucket
//    keeps it out of itself while the rate is held (the bucket's cap), so
//    the bucket and the slices save the burst once between them, which
//    the limit allows; the rest of the cap (one lease interval of the rate
//    beyond its burst share) does. While Redis is unreachable the key keeps
//    spending its rate until it ends (LeasePath::acquireOnRate): Redis
//    charges the rate and keeps its share out until then all the same, so
//    that too escapes the count by as much alone. Past its end it
//    spends on (rate_lease::kFallbackHoldNs), as a fallback budget of one
//    period of the rate (below). A master that
//    took over meanwhile may lack the rate's last renewal: what the rate
//    admitted is debited to it with the shares' admissions, and the rate
//    ends at the change (LeaseManager::endRates), so no rate refills beside
//    a bucket that does not count it; what the new master missed besides
//    is learning's (below);
//  - while the breaker is not closed, the fallback budget of the rule's
//    on_redis_down: "local" admits up to what its share (limit / N,
//    burst / N) admits in a span of one period, which Redis never counts
//    when the other nodes lease on (a node cut off alone): a bucket's
//    burst and a period's refill, a window's limit twice (a span straddles
//    two windows), a log's limit; "closed" nothing; "open" without bound.
//    A key that spends its rate past the rate's end admits one period of
//    the rate instead, when that is more;
//  - while the rule learns (breaker.h: Redis came back without the fleet's
//    state), that share again: what the node admitted in the period
//    before the state was lost, which a fresh state grants anew; a key
//    that asks the fresh state for the rate it held when Redis went away
//    (LeasePath::learnedRate) admitted a period of the rate, when that is
//    more;
//  - reservations (reservations.h): a settle above the estimate charges
//    its excess even past the limit, up to the key's debt bound
//    (debtBound), and Redis counts a slice's debt only when a lease pays
//    it. So the most one key of the rule owes on the node now, or the
//    debt bound while any reservation of the rule is open on the node
//    (any of them may settle that far past).
// A rule of several limits reports the largest of its limits' bounds, each
// in its own limit's units.
//
// Pure functions of their arguments: any thread, no clock, no allocation.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "rules.h"

namespace sluice {

// What the bound depends on, as the node has it now.
struct OvershootInput {
  bool leasing = true;     // the breaker is closed: decisions on leases
  bool learning = false;   // the rule (or one of its parts) learns
  int64_t held_units = 0;  // the most units one key of the rule holds leased (slice::heldUnits)
  // Reservations of the rule open on the node, and the most units one key
  // of the rule owes on it (slice::owed).
  int64_t open_reservations = 0;
  int64_t owed_units = 0;
  int64_t rate_escape_units = 0;  // the most one key's rate lease lets escape (rateEscapeUnits)
  // While the breaker is not closed, or the rule learns: the most one
  // key's last rate refills in a period (slice::ratePerPeriod).
  int64_t rate_period_units = 0;
};

// The bound of global `rule` in units; `share` is RuleSet::fallbackShare(rule),
// the node's share of each limit. nullopt: no bound (on_redis_down "open"
// while the breaker is not closed). 0 for a local rule.
std::optional<int64_t> overshootBound(const Rule& rule, const Rule& share, const OvershootInput& input);

// What one key's rate lease lets escape Redis's count of `limit`: the units
// its slice refills to (cap_units, slice::rateCapUnits) less the rate's
// share of the burst (rate_lease::burstShare), at least 0. The rate is read
// back from the slice's refill, one unit per ns_per_unit
// (rate_lease::rateOfNsPerUnit, never above the rate held), so the share is
// never overstated. 0 without a rate (cap_units or ns_per_unit <= 0).
int64_t rateEscapeUnits(const Limit& limit, int64_t cap_units, int64_t ns_per_unit);

// One configured global rule's bound, as `stats` and /metrics show it.
struct RuleOvershoot {
  std::string name;
  std::optional<int64_t> units;  // nullopt: no bound
};

}  // namespace sluice

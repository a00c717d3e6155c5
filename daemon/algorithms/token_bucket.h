// Token bucket: `burst` units of capacity refilled at limit/period_ns.
//
// State: ONE 64-bit word holding the virtual time T at which the bucket was
// (or would have been) empty, encoded with time_math::encodeTime so the zero
// word means T = distant past, i.e. a full bucket (folly's TokenBucket idea).
// The bucket holds min(burst, floor((now - T) / interval)) units, where
// interval = time_math::emissionIntervalNs(limit): period/limit rounded UP to
// whole ns, so the rate is exact when limit divides period_ns and otherwise a
// hair slower, never faster (integer maths, no drift from per-spend rounding).
// Spending c units moves T to max(T, now - burst*interval) + c*interval.
// Invariant: a spend without waiting never moves T past now; a full bucket is
// always stored as the zero word, so isIdle() is exact.
//
// Bounded waiting (max_wait_ns > 0): a spend whose new T lies up to
// max_wait_ns past now is allowed as a reservation with wait_ns = T - now, the
// time its units are refilled. T then stays ahead of now, the bucket reads as
// empty and later spends queue behind it, so reservations on one key are due
// in the order they were made (first come, first served) and at most
// max_wait_ns worth of refill is ever promised.
//
// Pure functions of (state word, limit, now_ns, cost): no clock, no I/O, no
// allocation; any thread. The caller publishes the new word with a CAS.
//
// Decision fields:
//  - remaining: whole units left in the bucket after this decision (0 while
//    it owes units: owed() tells how many).
//  - limit: limit.limit (units per period); capacity is limit.burst.
//  - reset_after_ms: until the bucket is full again, rounded up.
//  - retry_after_ms: 0 when allowed; otherwise until `cost` units are in the
//    bucket, rounded up to whole ms, so acquiring then succeeds.
//  - cost_exceeds_limit: cost > burst; such a cost is denied with retry 0.
// Cost 0 reports the current state and never spends.
// Time stepping backwards (now before T): the bucket reads as empty and the
// wait is counted from now, so no unit is ever granted twice.
#pragma once

#include <cstdint>

#include "decision.h"
#include "rules.h"

namespace sluice::token_bucket {

// Decides on spending `cost` units at now_ns, waiting at most max_wait_ns
// for them. When allowed and cost > 0, `state` is replaced by the state after
// spending; otherwise it is unchanged.
Decision acquire(uint64_t& state, const Limit& limit, int64_t now_ns, int64_t cost,
                 int64_t max_wait_ns = 0);

// Returns `state` with `cost` units given back (never beyond a full bucket),
// for undoing a spend made at now_ns when a later limit denied.
uint64_t refund(uint64_t state, const Limit& limit, int64_t now_ns, int64_t cost);

// Returns `state` with `cost` units spent at now_ns whatever the bucket holds:
// a settle's debt (reservations.h). The empty time may pass now, and the
// bucket then reads as owing units (negative `remaining`) until its refill
// has paid them back; nothing new passes before.
uint64_t charge(uint64_t state, const Limit& limit, int64_t now_ns, int64_t cost);

// Units the bucket owes at now_ns (its empty time past now, rounded up): a
// settle's debt, or reservations that wait; 0 when it owes none.
int64_t owed(uint64_t state, const Limit& limit, int64_t now_ns);

// A settle's refund of `cost` units spent at spent_ns: refund(); a bucket
// gives back the same whenever they were spent, never beyond full.
inline uint64_t refundSpent(uint64_t state, const Limit& limit, int64_t /*spent_ns*/,
                            int64_t now_ns, int64_t cost) {
  return refund(state, limit, now_ns, cost);
}

// True when the bucket is full at now_ns (indistinguishable from fresh).
bool isIdle(uint64_t state, const Limit& limit, int64_t now_ns);

}  // namespace sluice::token_bucket

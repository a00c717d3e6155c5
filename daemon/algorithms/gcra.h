// GCRA (generic cell rate algorithm): limit/period_ns with a burst tolerance.
//
// State: ONE 64-bit word holding the theoretical arrival time TAT in ns,
// encoded with time_math::encodeTime so the zero word means TAT = distant past
// (a fresh key). interval = time_math::emissionIntervalNs(limit), period/limit
// rounded up. A request of c units at now is conforming when
//   max(TAT, now) + c*interval - now <= burst*interval,
// and then TAT becomes max(TAT, now) + c*interval. The burst tolerance is
// therefore (burst - 1) * interval beyond one interval, chosen so that a fresh
// key can spend exactly `burst` units at once.
// Invariant: TAT <= now + burst*interval for the now that wrote it; a TAT at
// or before now is stored as the zero word, so isIdle() is exact. A spend
// whose new TAT would lie past the largest int64 time (about 292 years of
// clock) could never be stored, and waiting only moves it later, so it is
// reported as cost_exceeds_limit; only absurd rules (burst * interval of
// centuries) get there.
//
//
// Bounded waiting (max_wait_ns > 0): a request conforming within max_wait_ns,
//   max(TAT, now) + c*interval - now <= burst*interval + max_wait_ns,
// is allowed as a reservation: TAT advances now, and the answer is due after
// wait_ns = the time until it conforms. Reservations on one key are due in
// the order they were made; with burst = 1 they leave one interval apart
// (pacing: a rule's `pace = true`).
//
// Pure functions of (state word, limit, now_ns, cost): no clock, no I/O, no
// allocation; any thread. The caller publishes the new word with a CAS.
//
// Decision fields:
//  - remaining: whole units that could still be spent at once after this one
//    (0 while TAT lies past the tolerance: owed() tells how far).
//  - limit: limit.limit (units per period); at most limit.burst at once.
//  - reset_after_ms: until TAT, when the key is back to a fresh burst.
//  - retry_after_ms: 0 when allowed; otherwise until `cost` units conform,
//    rounded up to whole ms, so acquiring then succeeds.
//  - cost_exceeds_limit: cost > burst (or the TAT overflow above); denied
//    with retry 0.
// Cost 0 reports the current state and never spends.
// Time stepping backwards (now before a TAT a racing thread wrote): the wait
// is measured from now, so it only grows; nothing is granted twice.
#pragma once

#include <cstdint>

#include "decision.h"
#include "rules.h"

namespace sluice::gcra {

// Decides on spending `cost` units at now_ns, waiting at most max_wait_ns
// for them to conform. When allowed and cost > 0, `state` is replaced by the
// state after spending; otherwise it is unchanged.
Decision acquire(uint64_t& state, const Limit& limit, int64_t now_ns, int64_t cost,
                 int64_t max_wait_ns = 0);

// Returns `state` with `cost` units given back (TAT moved back, never before
// now), for undoing a spend made at now_ns when a later limit denied.
uint64_t refund(uint64_t state, const Limit& limit, int64_t now_ns, int64_t cost);

// Returns `state` with `cost` units spent at now_ns past any tolerance: a
// settle's debt (reservations.h). TAT moves cost intervals on (never past
// the last int64 time); nothing conforms until time has paid it back.
uint64_t charge(uint64_t state, const Limit& limit, int64_t now_ns, int64_t cost);

// Units owed at now_ns: how far TAT lies past the tolerance edge
// now + burst*interval, in intervals rounded up (a settle's debt, or
// reservations that wait); 0 when none.
int64_t owed(uint64_t state, const Limit& limit, int64_t now_ns);

// A settle's refund of `cost` units spent at spent_ns: refund(), whenever
// they were spent (TAT never moves before now).
inline uint64_t refundSpent(uint64_t state, const Limit& limit, int64_t /*spent_ns*/,
                            int64_t now_ns, int64_t cost) {
  return refund(state, limit, now_ns, cost);
}

// True when TAT <= now_ns (indistinguishable from a fresh key).
bool isIdle(uint64_t state, const Limit& limit, int64_t now_ns);

}  // namespace sluice::gcra

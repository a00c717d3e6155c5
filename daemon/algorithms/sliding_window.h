// Sliding-window counter: at most `limit` units per sliding `period_ns`,
// estimated from the counts of the current and the previous fixed window.
//
//   estimate(now) = prev * (period - elapsed) / period + cur
//
// where elapsed = now - start of the current window. A request of c units
// passes when estimate + c <= limit, compared exactly in integers
// (prev * (period - elapsed) + (cur + c) * period <= limit * period).
//
// State: ONE 64-bit word, window id mod 2^24 (bits 63..40) | cur (bits
// 39..20) | prev (bits 19..0). The zero word is a fresh key. maxLimit is
// 2^20 - 1. Invariant: cur <= limit, but after charge() (a settle's debt).
//
// Id aliasing: the id is kept mod 2^24, which wraps after 2^24 windows (4.7
// hours at the 1 ms minimum period, 194 days at 1 s). A stored id up to
// time_math::kMaxSkewWindows ahead of now's is taken as a racing thread's
// newer window (its clock read was later): the decision is then made as at the
// start of that window, where the estimate is largest, so nothing is granted
// twice. Any other id that is not now's or the one before reads as long gone
// (fresh). So a key untouched for exactly a multiple of 2^24 windows (or up to
// 16 windows short of that, or one window more) would read as recent: that
// errs towards denying, for at most 16 windows, and the key table drops idle
// keys long before.
//
// Pure functions of (state word, limit, now_ns, cost): no clock, no I/O, no
// allocation; any thread. The caller publishes the new word with a CAS.
//
// Decision fields:
//  - remaining: floor(limit - estimate) after this decision; negative in debt.
//  - limit: limit.limit.
//  - reset_after_ms: until the estimate is 0 again: the end of the next
//    window when cur > 0, else the end of this window when prev > 0, else 0.
//  - retry_after_ms: 0 when allowed; otherwise the first time at which
//    estimate + cost <= limit (the estimate only falls while nothing is
//    spent), rounded up to whole ms, so acquiring then succeeds.
//  - cost_exceeds_limit: cost > limit; denied with retry 0.
// Cost 0 reports the current state and never spends.
#pragma once

#include <cstdint>

#include "decision.h"
#include "rules.h"

namespace sluice::sliding_window {

// Decides on spending `cost` units at now_ns. When allowed and cost > 0,
// `state` is replaced by the state after spending; otherwise it is unchanged.
Decision acquire(uint64_t& state, const Limit& limit, int64_t now_ns, int64_t cost);

// Returns `state` with `cost` units given back to the current window's count,
// for undoing a spend made at now_ns when a later limit denied. Should a racing
// thread have moved to the next window in between, the units are taken from
// that window instead; the estimate is then briefly lower by at most cost.
uint64_t refund(uint64_t state, const Limit& limit, int64_t now_ns, int64_t cost);

// Returns `state` with `cost` units, spent at spent_ns, given back at now_ns:
// a settle's refund (reservations.h). A spend of now's window comes off its
// count, one of the window before off the previous count (so its weight in
// the estimate goes too); an older one left nothing to give back.
uint64_t refundSpent(uint64_t state, const Limit& limit, int64_t spent_ns, int64_t now_ns,
                     int64_t cost);

// Returns `state` with `cost` units counted in now_ns's window even past the
// limit: a settle's debt (the count saturates at 2^20-1). The estimate then
// exceeds the limit, `remaining` is negative, and nothing passes until it has
// decayed below the limit again.
uint64_t charge(uint64_t state, const Limit& limit, int64_t now_ns, int64_t cost);

// True when both counts are 0 as seen at now_ns.
bool isIdle(uint64_t state, const Limit& limit, int64_t now_ns);

}  // namespace sluice::sliding_window

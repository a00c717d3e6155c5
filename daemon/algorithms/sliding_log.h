// Sliding-window log: at most `limit` units in any span of `period_ns`,
// exactly, by remembering when each admitted unit was admitted.
//
// State: `limit` 64-bit words (one per unit; see slots.h), each holding the
// admission time of a unit encoded with time_math::encodeTime; the zero word
// is a never-used slot. A unit is free again when its time <= now - period.
// Memory grows with the limit, so the limit is capped at slots::kMaxSlots
// (1000 = maxLimit(kSlidingLog)): 8 KB of state per key at the cap. Use
// sliding_window for larger limits.
// Invariant: at most `limit` admission times lie in (now - period, now].
//
// Thread-safety: any thread, any number at once. acquire() claims `cost` free
// slots with one CAS each and gives back the ones it claimed when it cannot
// get them all. No clock, no I/O, no allocation.
//
// Decision fields:
//  - remaining: free slots after this decision.
//  - limit: limit.limit.
//  - reset_after_ms: until the newest admitted unit leaves the window.
//  - retry_after_ms: 0 when allowed; otherwise until enough units leave the
//    window for `cost`, rounded up to whole ms, so acquiring then succeeds.
//  - cost_exceeds_limit: cost > limit; denied with retry 0.
// Cost 0 reports the current state and never spends. Time stepping backwards:
// a unit admitted "in the future" counts as taken until its time + period.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>

#include "decision.h"
#include "rules.h"

namespace sluice::sliding_log {

// Number of state words of one limit: limit.limit, capped at slots::kMaxSlots.
size_t stateWords(const Limit& limit);

// Spends `cost` units at now_ns when `cost` slots are free, else nothing.
Decision acquire(std::span<std::atomic<uint64_t>> slots, const Limit& limit, int64_t now_ns, int64_t cost);

// Reports what acquire() would answer now, spending nothing.
Decision peek(std::span<const std::atomic<uint64_t>> slots, const Limit& limit, int64_t now_ns, int64_t cost);

// Undoes an acquire() of `cost` units made at now_ns (when a later limit denied).
void refund(std::span<std::atomic<uint64_t>> slots, const Limit& limit, int64_t now_ns, int64_t cost);

// True when every slot is free at now_ns.
bool isIdle(std::span<const std::atomic<uint64_t>> slots, const Limit& limit, int64_t now_ns);

}  // namespace sluice::sliding_log

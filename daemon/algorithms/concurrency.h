// Concurrency: at most `limit` units held at once; each unit is held until it
// is released or, when period_ns > 0, until its deadline passes, so a crashed
// caller cannot hold units forever.
//
// State: `limit` 64-bit words (one per unit; see slots.h), each holding the
// deadline of a held unit encoded with time_math::encodeTime. The zero word is
// a never-used (free) slot; a unit is free when its deadline <= now. With
// period_ns == 0 a unit is held until released: its deadline is
// time_math::kMaxTimeNs, which never passes. The limit is capped at
// slots::kMaxSlots (1000 = maxLimit(kConcurrency)).
// Invariant: at most `limit` deadlines lie after now.
//
// Thread-safety: any thread, any number at once. acquire() claims `cost` free
// slots with one CAS each and gives back the ones it claimed when it cannot
// get them all; release() clears slots one CAS each. No clock, no I/O, no
// allocation.
//
// Decision fields:
//  - remaining: free slots after this decision.
//  - limit: limit.limit.
//  - reset_after_ms: until the last held unit's deadline passes (units held
//    until released are left out); 0 when nothing expires.
//  - retry_after_ms: 0 when allowed; otherwise until enough deadlines pass
//    for `cost`, rounded up to whole ms; 0 when only releases can free
//    enough units (period_ns == 0).
//  - cost_exceeds_limit: cost > limit; denied with retry 0.
// Cost 0 reports the current state and never spends. Time stepping backwards
// only makes held units look held for longer.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>

#include "decision.h"
#include "rules.h"

namespace sluice::concurrency {

// Number of state words of one limit: limit.limit, capped at slots::kMaxSlots.
size_t stateWords(const Limit& limit);

// Holds `cost` units from now_ns when `cost` slots are free, else nothing.
Decision acquire(std::span<std::atomic<uint64_t>> slots, const Limit& limit, int64_t now_ns, int64_t cost);

// Reports what acquire() would answer now, holding nothing.
Decision peek(std::span<const std::atomic<uint64_t>> slots, const Limit& limit, int64_t now_ns, int64_t cost);

// Frees the `cost` held units whose deadlines are soonest (all held units when
// fewer are held) and reports the state afterwards as peek(…, 0) would.
Decision release(std::span<std::atomic<uint64_t>> slots, const Limit& limit, int64_t now_ns, int64_t cost);

// Undoes an acquire() of `cost` units made at now_ns (when a later limit denied).
void refund(std::span<std::atomic<uint64_t>> slots, const Limit& limit, int64_t now_ns, int64_t cost);

// True when no unit is held at now_ns.
bool isIdle(std::span<const std::atomic<uint64_t>> slots, const Limit& limit, int64_t now_ns);

}  // namespace sluice::concurrency

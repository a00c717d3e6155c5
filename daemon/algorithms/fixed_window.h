// Fixed window: at most `limit` units per window [k*period, (k+1)*period),
// or per calendar window (limit.window: a day, week or month of
// limit.time_zone; calendar.h), whose id is calendar::Window::id.
//
// State: ONE 64-bit word, (window id mod 2^32) << 32 | count (32 bits), where
// window id = now_ns / period_ns and count is the units spent in that window.
// The zero word (count 0) is a fresh key whatever its id. maxLimit is 2^32-1.
// Invariant: count <= limit for the stored window, but after charge() (a
// settle's debt), which may count past it.
//
// Id aliasing: the id is kept mod 2^32 (2^32 windows are 49 days at the
// 1 ms minimum period). A stored id up to time_math::kMaxSkewWindows ahead of
// now's is taken as a racing thread's newer window (its clock read was later);
// its count then still applies and spends go into it, so nothing is granted
// twice. An id further ahead can only be an old one that wrapped, and reads as
// a past window (fresh). A key left untouched for exactly a multiple of 2^32
// windows (or up to 16 windows short of it) would read as current: that errs
// towards denying, and the key table drops idle keys long before.
//
// Pure functions of (state word, limit, now_ns, cost): no clock, no I/O, no
// allocation; any thread. The caller publishes the new word with a CAS. A
// calendar window is found on the wall clock, now_ns + wall_offset_ns; the
// functions without wall_offset_ns take calendar::wallOffsetNs().
//
// Decision fields:
//  - remaining: limit - count after this decision; negative in debt.
//  - limit: limit.limit.
//  - reset_after_ms: until the window ends (count back to 0), rounded up;
//    0 when nothing is counted.
//  - retry_after_ms: 0 when allowed; otherwise until the window ends, rounded
//    up, when a fresh window lets `cost` pass.
//  - cost_exceeds_limit: cost > limit; denied with retry 0.
// Cost 0 reports the current state and never spends.
#pragma once

#include <cstdint>

#include "decision.h"
#include "rules.h"

namespace sluice::fixed_window {

// Decides on spending `cost` units at now_ns. When allowed and cost > 0,
// `state` is replaced by the state after spending; otherwise it is unchanged.
Decision acquire(uint64_t& state, const Limit& limit, int64_t now_ns, int64_t cost);
// The same, its calendar window found on the wall clock now_ns + wall_offset_ns.
Decision acquireOnWall(uint64_t& state, const Limit& limit, int64_t now_ns, int64_t cost,
                       int64_t wall_offset_ns);

// Returns `state` with `cost` units given back to the window of now_ns (or the
// newer window a racing thread stored), for undoing a spend made at now_ns.
uint64_t refund(uint64_t state, const Limit& limit, int64_t now_ns, int64_t cost);

// Returns `state` with `cost` units, spent at spent_ns, given back at now_ns:
// a settle's refund (reservations.h). Units spent in a window that has ended
// left nothing to give back, so only a spend of now's window is refunded.
uint64_t refundSpent(uint64_t state, const Limit& limit, int64_t spent_ns, int64_t now_ns,
                     int64_t cost);

// Returns `state` with `cost` units counted in now_ns's window even past the
// limit: a settle's debt (the count saturates at 2^32-1). The window then
// reports negative `remaining` and admits nothing more until it ends.
uint64_t charge(uint64_t state, const Limit& limit, int64_t now_ns, int64_t cost);

// True when nothing is counted in now_ns's window.
bool isIdle(uint64_t state, const Limit& limit, int64_t now_ns);

}  // namespace sluice::fixed_window

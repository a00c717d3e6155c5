// Time arithmetic shared by the algorithms: state-word time encoding,
// emission intervals, window ids and rounding to whole milliseconds.
//
// Invariant: every helper is total. It saturates instead of overflowing and
// never divides by zero, so a state word written by a thread whose clock read
// was later than ours (time seen "stepping backwards") cannot make a decision
// underflow, overflow or crash. Pure functions; any thread.
//
// Units: nanoseconds of the daemon's monotonic clock (int64), milliseconds only
// in the reported fields. Intermediates use 128-bit integers because
// burst * interval can reach 2^85 ns.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "rules.h"

namespace sluice::time_math {

using i128 = __int128;

constexpr int64_t kNsPerMs = 1'000'000;
constexpr int64_t kMinTimeNs = std::numeric_limits<int64_t>::min();
constexpr int64_t kMaxTimeNs = std::numeric_limits<int64_t>::max();

// Encodes a time for a state word so that the all-zero word decodes to
// kMinTimeNs, the distant past: a fresh key's zero words then mean "bucket
// full", "slot free" without any special case.
constexpr uint64_t encodeTime(int64_t t_ns) { return static_cast<uint64_t>(t_ns) ^ (1ULL << 63); }
constexpr int64_t decodeTime(uint64_t word) { return static_cast<int64_t>(word ^ (1ULL << 63)); }

constexpr int64_t clampToI64(i128 v) {
  if (v > kMaxTimeNs) return kMaxTimeNs;
  if (v < kMinTimeNs) return kMinTimeNs;
  return static_cast<int64_t>(v);
}

// A wait in nanoseconds as whole milliseconds, rounded up so that acting after
// that many milliseconds is never too early; 0 for waits that are over.
constexpr int64_t ceilMs(i128 wait_ns) {
  if (wait_ns <= 0) return 0;
  return clampToI64((wait_ns + kNsPerMs - 1) / kNsPerMs);
}

// The time one unit takes to refill for token bucket and GCRA: period/limit
// rounded UP to whole nanoseconds, so the sustained rate never exceeds
// limit/period. It is exact when limit divides period_ns; otherwise the rate
// is slower by less than limit/period_ns relative (under 0.1% below 10^6
// units per second).
constexpr int64_t emissionIntervalNs(const Limit& limit) {
  const int64_t units = std::max<int64_t>(limit.limit, 1);
  const int64_t period_ns = std::max<int64_t>(limit.period_ns, 1);
  return std::max<int64_t>((period_ns + units - 1) / units, 1);
}

// Window ids for fixed_window and sliding_window. Time before 0 (never seen
// from a monotonic clock) falls into window 0 rather than a negative id.
constexpr int64_t windowId(int64_t now_ns, int64_t period_ns) {
  return std::max<int64_t>(now_ns, 0) / std::max<int64_t>(period_ns, 1);
}

// How far a stored window id may lie AHEAD of the caller's window and still be
// taken as a racing thread's newer window (its clock read was later than
// ours). Anything further ahead can only be an old id that wrapped around the
// packed id bits, and is treated as a long-gone window.
constexpr int64_t kMaxSkewWindows = 16;

// Distance from a stored `bits`-wide window id to the caller's window id,
// in windows: positive when the stored window is older, 0 for the same window,
// in [-kMaxSkewWindows, 0) when a racing thread stored a newer window, and
// kMaxTimeNs when the stored id cannot belong to a recent window (it aliased).
constexpr int64_t windowsSince(uint64_t stored_id, int64_t now_id, int bits) {
  const uint64_t mask = (1ULL << bits) - 1;
  const uint64_t forward = (static_cast<uint64_t>(now_id) - stored_id) & mask;
  if (forward < (1ULL << (bits - 1))) return static_cast<int64_t>(forward);
  const int64_t behind = static_cast<int64_t>(mask + 1 - forward);
  return behind <= kMaxSkewWindows ? -behind : kMaxTimeNs;
}

}  // namespace sluice::time_math

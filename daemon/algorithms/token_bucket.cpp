// Token bucket: the maths on one virtual-time word (see token_bucket.h).
#include "algorithms/token_bucket.h"

#include <algorithm>

#include "algorithms/time_math.h"

namespace sluice::token_bucket {
namespace {

using time_math::i128;

// The virtual "empty" time, clamped so that a bucket can never hold more than
// burst units: anything older than now - burst*interval reads as full. The
// zero word is full by definition, even when now - burst*interval lies before
// the earliest int64 time (huge bursts and periods early in the clock).
i128 effectiveEmptyNs(uint64_t state, i128 full_ns) {
  if (state == 0) return full_ns;
  return std::max<i128>(time_math::decodeTime(state), full_ns);
}

// Stores an empty time that is not full. Times before the earliest int64 time
// are moved to just after it: later means fewer units, never more.
uint64_t encodeEmpty(i128 empty_ns, i128 full_ns) {
  if (empty_ns <= full_ns) return 0;
  return time_math::encodeTime(time_math::clampToI64(std::max<i128>(empty_ns, time_math::kMinTimeNs + 1)));
}

}  // namespace

Decision acquire(uint64_t& state, const Limit& limit, int64_t now_ns, int64_t cost,
                 int64_t max_wait_ns) {
  const int64_t interval_ns = time_math::emissionIntervalNs(limit);
  const int64_t burst = std::max<int64_t>(limit.burst, 0);
  const i128 full_ns = static_cast<i128>(now_ns) - static_cast<i128>(burst) * interval_ns;
  const i128 empty_ns = effectiveEmptyNs(state, full_ns);

  // Spending is allowed when the new empty time does not pass now.
  const i128 next_ns = empty_ns + static_cast<i128>(std::max<int64_t>(cost, 0)) * interval_ns;

  Decision d;
  d.limit = limit.limit;
  if (cost > burst) {
    d.cost_exceeds_limit = true;
  } else if (next_ns <= static_cast<i128>(now_ns) + std::max<int64_t>(max_wait_ns, 0)) {
    d.allowed = true;
    if (cost > 0) state = encodeEmpty(next_ns, full_ns);
    d.wait_ns = next_ns > now_ns ? static_cast<int64_t>(next_ns - now_ns) : 0;
    d.remaining = next_ns >= now_ns ? 0 : static_cast<int64_t>((now_ns - next_ns) / interval_ns);
    d.reset_after_ms = time_math::ceilMs(next_ns - full_ns);
    return d;
  } else {
    d.retry_after_ms = time_math::ceilMs(next_ns - now_ns);
  }
  d.remaining = empty_ns >= now_ns ? 0 : static_cast<int64_t>((now_ns - empty_ns) / interval_ns);
  d.reset_after_ms = time_math::ceilMs(empty_ns - full_ns);
  return d;
}

uint64_t charge(uint64_t state, const Limit& limit, int64_t now_ns, int64_t cost) {
  if (cost <= 0) return state;
  const int64_t interval_ns = time_math::emissionIntervalNs(limit);
  const i128 full_ns =
      static_cast<i128>(now_ns) - static_cast<i128>(std::max<int64_t>(limit.burst, 0)) * interval_ns;
  const i128 empty_ns = effectiveEmptyNs(state, full_ns) + static_cast<i128>(cost) * interval_ns;
  return encodeEmpty(empty_ns, full_ns);
}

uint64_t refund(uint64_t state, const Limit& limit, int64_t now_ns, int64_t cost) {
  if (state == 0 || cost <= 0) return state;
  const int64_t interval_ns = time_math::emissionIntervalNs(limit);
  const i128 full_ns =
      static_cast<i128>(now_ns) - static_cast<i128>(std::max<int64_t>(limit.burst, 0)) * interval_ns;
  const i128 empty_ns = static_cast<i128>(time_math::decodeTime(state)) - static_cast<i128>(cost) * interval_ns;
  return encodeEmpty(empty_ns, full_ns);
}

int64_t owed(uint64_t state, const Limit& limit, int64_t now_ns) {
  if (state == 0) return 0;
  const int64_t interval_ns = time_math::emissionIntervalNs(limit);
  const i128 past_ns = static_cast<i128>(time_math::decodeTime(state)) - now_ns;
  return past_ns <= 0 ? 0 : time_math::clampToI64((past_ns + interval_ns - 1) / interval_ns);
}

bool isIdle(uint64_t state, const Limit& limit, int64_t now_ns) {
  const i128 full_ns = static_cast<i128>(now_ns) -
                       static_cast<i128>(std::max<int64_t>(limit.burst, 0)) * time_math::emissionIntervalNs(limit);
  return state == 0 || time_math::decodeTime(state) <= full_ns;
}

}  // namespace sluice::token_bucket

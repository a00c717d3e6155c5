// GCRA: the maths on one theoretical-arrival-time word (see gcra.h).
#include "algorithms/gcra.h"

#include <algorithm>

#include "algorithms/time_math.h"

namespace sluice::gcra {
namespace {

using time_math::i128;

// Whole units that fit between `tat_ns` and the tolerance edge now + burst*interval.
int64_t unitsLeft(i128 tat_ns, i128 tolerance_end_ns, int64_t interval_ns) {
  return tat_ns >= tolerance_end_ns ? 0 : static_cast<int64_t>((tolerance_end_ns - tat_ns) / interval_ns);
}

}  // namespace

Decision acquire(uint64_t& state, const Limit& limit, int64_t now_ns, int64_t cost,
                 int64_t max_wait_ns) {
  const int64_t interval_ns = time_math::emissionIntervalNs(limit);
  const int64_t burst = std::max<int64_t>(limit.burst, 0);
  const i128 tolerance_end_ns = static_cast<i128>(now_ns) + static_cast<i128>(burst) * interval_ns;
  const i128 tat_ns = std::max<i128>(time_math::decodeTime(state), now_ns);

  Decision d;
  d.limit = limit.limit;
  const i128 next_tat_ns = tat_ns + static_cast<i128>(std::max<int64_t>(cost, 0)) * interval_ns;
  // A TAT past the last int64 time cannot be stored, and waiting only moves
  // it later, so such a cost can never pass (see gcra.h).
  if (cost > burst || next_tat_ns > time_math::kMaxTimeNs) {
    d.cost_exceeds_limit = true;
  } else if (next_tat_ns <= tolerance_end_ns + std::max<int64_t>(max_wait_ns, 0)) {
    d.allowed = true;
    if (cost > 0) state = time_math::encodeTime(static_cast<int64_t>(next_tat_ns));
    d.wait_ns = next_tat_ns > tolerance_end_ns ? static_cast<int64_t>(next_tat_ns - tolerance_end_ns) : 0;
    d.remaining = unitsLeft(next_tat_ns, tolerance_end_ns, interval_ns);
    d.reset_after_ms = time_math::ceilMs(next_tat_ns - now_ns);
    return d;
  } else {
    d.retry_after_ms = time_math::ceilMs(next_tat_ns - tolerance_end_ns);
  }
  d.remaining = unitsLeft(tat_ns, tolerance_end_ns, interval_ns);
  d.reset_after_ms = time_math::ceilMs(tat_ns - now_ns);
  return d;
}

uint64_t charge(uint64_t state, const Limit& limit, int64_t now_ns, int64_t cost) {
  if (cost <= 0) return state;
  const i128 tat_ns = std::max<i128>(time_math::decodeTime(state), now_ns) +
                      static_cast<i128>(cost) * time_math::emissionIntervalNs(limit);
  return time_math::encodeTime(time_math::clampToI64(tat_ns));
}

uint64_t refund(uint64_t state, const Limit& limit, int64_t now_ns, int64_t cost) {
  if (state == 0 || cost <= 0) return state;
  const i128 tat_ns = static_cast<i128>(time_math::decodeTime(state)) -
                      static_cast<i128>(cost) * time_math::emissionIntervalNs(limit);
  // A TAT at or before now is a fresh key, which is always the zero word.
  return tat_ns <= now_ns ? 0 : time_math::encodeTime(static_cast<int64_t>(tat_ns));
}

int64_t owed(uint64_t state, const Limit& limit, int64_t now_ns) {
  if (state == 0) return 0;
  const int64_t interval_ns = time_math::emissionIntervalNs(limit);
  const i128 past_ns = static_cast<i128>(time_math::decodeTime(state)) - now_ns -
                       static_cast<i128>(std::max<int64_t>(limit.burst, 0)) * interval_ns;
  return past_ns <= 0 ? 0 : time_math::clampToI64((past_ns + interval_ns - 1) / interval_ns);
}

bool isIdle(uint64_t state, const Limit& /*limit*/, int64_t now_ns) {
  return state == 0 || time_math::decodeTime(state) <= now_ns;
}

}  // namespace sluice::gcra

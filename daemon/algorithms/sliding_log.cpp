// Sliding-window log: admission times in a slot array (see sliding_log.h).
#include "algorithms/sliding_log.h"

#include <algorithm>

#include "algorithms/slots.h"
#include "algorithms/time_math.h"

namespace sluice::sliding_log {

size_t stateWords(const Limit& limit) {
  return static_cast<size_t>(std::clamp<int64_t>(limit.limit, 0, static_cast<int64_t>(slots::kMaxSlots)));
}

Decision acquire(std::span<std::atomic<uint64_t>> slots, const Limit& limit, int64_t now_ns, int64_t cost) {
  if (cost <= 0 || cost > limit.limit) return peek(slots, limit, now_ns, cost);
  const bool taken = slots::claim(slots, limit.period_ns, now_ns, cost, time_math::encodeTime(now_ns));
  return slots::report(slots, limit.period_ns, limit.limit, now_ns, cost, taken);
}

Decision peek(std::span<const std::atomic<uint64_t>> slots, const Limit& limit, int64_t now_ns, int64_t cost) {
  return slots::report(slots, limit.period_ns, limit.limit, now_ns, std::max<int64_t>(cost, 0), false);
}

void refund(std::span<std::atomic<uint64_t>> slots, const Limit& /*limit*/, int64_t now_ns, int64_t cost) {
  slots::unclaim(slots, cost, time_math::encodeTime(now_ns));
}

bool isIdle(std::span<const std::atomic<uint64_t>> slots, const Limit& limit, int64_t now_ns) {
  return slots::allFree(slots, limit.period_ns, now_ns);
}

}  // namespace sluice::sliding_log

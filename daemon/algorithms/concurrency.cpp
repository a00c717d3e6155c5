// Concurrency: deadlines of held units in a slot array (see concurrency.h).
#include "algorithms/concurrency.h"

#include <algorithm>

#include "algorithms/slots.h"
#include "algorithms/time_math.h"

namespace sluice::concurrency {
namespace {

// Slots store the deadline itself, so a unit is held for 0 ns past it.
constexpr int64_t kHoldPastDeadlineNs = 0;

// The word acquire() writes into each slot it takes at now_ns.
uint64_t heldWord(const Limit& limit, int64_t now_ns) {
  if (limit.period_ns <= 0) return time_math::encodeTime(time_math::kMaxTimeNs);
  return time_math::encodeTime(
      time_math::clampToI64(static_cast<time_math::i128>(now_ns) + limit.period_ns));
}

}  // namespace

size_t stateWords(const Limit& limit) {
  return static_cast<size_t>(std::clamp<int64_t>(limit.limit, 0, static_cast<int64_t>(slots::kMaxSlots)));
}

Decision acquire(std::span<std::atomic<uint64_t>> slots, const Limit& limit, int64_t now_ns, int64_t cost) {
  if (cost <= 0 || cost > limit.limit) return peek(slots, limit, now_ns, cost);
  const bool taken = slots::claim(slots, kHoldPastDeadlineNs, now_ns, cost, heldWord(limit, now_ns));
  return slots::report(slots, kHoldPastDeadlineNs, limit.limit, now_ns, cost, taken);
}

Decision peek(std::span<const std::atomic<uint64_t>> slots, const Limit& limit, int64_t now_ns, int64_t cost) {
  return slots::report(slots, kHoldPastDeadlineNs, limit.limit, now_ns, std::max<int64_t>(cost, 0), false);
}

Decision release(std::span<std::atomic<uint64_t>> slots, const Limit& limit, int64_t now_ns, int64_t cost) {
  while (cost > 0) {
    // Find the held unit with the soonest deadline; a racing release or
    // acquire may change it before our CAS, in which case we look again.
    size_t soonest = slots.size();
    uint64_t soonest_word = 0;
    for (size_t i = 0; i < slots.size(); ++i) {
      const uint64_t word = slots[i].load(std::memory_order_acquire);
      if (slots::isFree(word, kHoldPastDeadlineNs, now_ns)) continue;
      if (soonest == slots.size() || time_math::decodeTime(word) < time_math::decodeTime(soonest_word)) {
        soonest = i;
        soonest_word = word;
      }
    }
    if (soonest == slots.size()) break;
    if (slots[soonest].compare_exchange_strong(soonest_word, 0, std::memory_order_acq_rel)) --cost;
  }
  return peek(slots, limit, now_ns, 0);
}

void refund(std::span<std::atomic<uint64_t>> slots, const Limit& limit, int64_t now_ns, int64_t cost) {
  slots::unclaim(slots, cost, heldWord(limit, now_ns));
}

bool isIdle(std::span<const std::atomic<uint64_t>> slots, const Limit& /*limit*/, int64_t now_ns) {
  return slots::allFree(slots, kHoldPastDeadlineNs, now_ns);
}

}  // namespace sluice::concurrency

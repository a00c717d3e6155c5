// Overshoot: the overshoot bound of a global rule; see overshoot.h.
#include "overshoot.h"

#include <algorithm>

#include "algorithm.h"
#include "entry.h"

namespace sluice {

std::optional<int64_t> overshootBound(const Rule& rule, const Rule& share, const OvershootInput& input) {
  if (rule.scope != Scope::kGlobal) return 0;
  if (!input.leasing && rule.on_redis_down == RedisDownPolicy::kOpen) return std::nullopt;
  int64_t share_units = 0;
  for (const Limit& limit : share.limits) share_units = std::max(share_units, leaseCapacity(limit));
  int64_t bound = algorithmTraits(rule.algorithm).stamps_lease ? std::max<int64_t>(input.held_units, 0) : 0;
  if (!input.leasing) {
    if (rule.on_redis_down == RedisDownPolicy::kLocal) bound += share_units;
  } else if (input.learning) {
    bound += share_units;
  }
  return bound;
}

}  // namespace sluice

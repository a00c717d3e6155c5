// Overshoot: the overshoot bound of a global rule; see overshoot.h.
#include "overshoot.h"

#include <algorithm>

#include "algorithm.h"
#include "entry.h"
#include "rate_lease.h"

namespace sluice {

namespace {

// The most a share of `limit` admits in a span of one period: a bucket its
// burst and a period's refill, a window the end of one window and the start
// of the next, a log (or held units) its limit.
int64_t sharePerPeriod(const AlgorithmTraits& traits, const Limit& limit) {
  if (traits.refills) return leaseCapacity(limit) + limit.limit;
  if (traits.windowed) return 2 * limit.limit;
  return limit.limit;
}

}  // namespace

std::optional<int64_t> overshootBound(const Rule& rule, const Rule& share, const OvershootInput& input) {
  if (rule.scope != Scope::kGlobal) return 0;
  if (!input.leasing && rule.on_redis_down == RedisDownPolicy::kOpen) return std::nullopt;
  const AlgorithmTraits& traits = algorithmTraits(rule.algorithm);
  int64_t share_units = 0;
  for (const Limit& limit : share.limits) share_units = std::max(share_units, sharePerPeriod(traits, limit));
  int64_t bound = traits.stamps_lease ? std::max<int64_t>(input.held_units, 0) : 0;
  bound += std::max<int64_t>(input.rate_escape_units, 0);
  if (!input.leasing) {
    if (rule.on_redis_down == RedisDownPolicy::kLocal) {
      bound += std::max(share_units, input.rate_period_units);
    }
  } else if (input.learning) {
    bound += std::max(share_units, input.rate_period_units);
  }
  int64_t debt_units = std::max<int64_t>(input.owed_units, 0);
  if (input.open_reservations > 0 && traits.settles) {
    for (const Limit& limit : rule.limits) debt_units = std::max(debt_units, debtBound(rule, limit));
  }
  return bound + debt_units;
}

int64_t rateEscapeUnits(const Limit& limit, int64_t cap_units, int64_t ns_per_unit) {
  if (cap_units <= 0 || ns_per_unit <= 0) return 0;
  const int64_t share = rate_lease::burstShare(limit, rate_lease::rateOfNsPerUnit(limit, ns_per_unit));
  return std::max<int64_t>(cap_units - share, 0);
}

}  // namespace sluice

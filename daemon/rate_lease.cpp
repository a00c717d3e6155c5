// Rate lease: the script's maths, its ARGV and reply, the daemon's rule; see rate_lease.h.
#include "rate_lease.h"

#include <algorithm>
#include <cmath>

#include "algorithm.h"
#include "entry.h"

namespace sluice::rate_lease {

namespace {

int64_t ceilDiv(int64_t a, int64_t b) { return a <= 0 ? 0 : (a + b - 1) / b; }

int64_t periodUs(const Limit& limit) { return (limit.period_ns + 999'999) / 1'000'000 * 1000; }

// The scripts' interval, µs: ceil(period_us / limit), the period in whole ms.
int64_t intervalUs(const Limit& limit) {
  return std::max<int64_t>(ceilDiv(periodUs(limit), std::max<int64_t>(limit.limit, 1)), 1);
}

}  // namespace

int64_t burstShare(const Limit& limit, int64_t rate) {
  // burst * rate < 2^63: both are at most 10^9 (algorithm.h's max_limit).
  return limit.burst * std::max<int64_t>(rate, 0) / std::max<int64_t>(limit.limit, 1);
}

int64_t bucketCapUnits(std::span<const Held> held, const Limit& limit) {
  int64_t cap = limit.burst;
  for (const Held& h : held) cap -= h.rate > 0 ? burstShare(limit, h.rate) : 0;
  return std::max<int64_t>(cap, 0);
}

std::optional<int64_t> charge(std::optional<int64_t> stored_us, int64_t at_us, int64_t now_us,
                              std::span<const Held> held, const Limit& limit) {
  const int64_t interval_us = intervalUs(limit);
  std::optional<int64_t> t = stored_us;
  std::vector<Held> span_held;
  bool charged = false;
  at_us = std::min(at_us, now_us);
  while (at_us < now_us) {
    int64_t rate = 0;
    int64_t span_end = now_us;
    span_held.clear();
    for (const Held& h : held) {
      if (h.until_us > at_us && h.rate > 0) {
        rate += h.rate;
        span_end = std::min(span_end, h.until_us);
        span_held.push_back(h);
      }
    }
    if (rate == 0) break;
    const int64_t cap_us = bucketCapUnits(span_held, limit) * interval_us;
    int64_t e = std::max(t.value_or(at_us - cap_us), at_us - cap_us);
    e = std::max(e + ceilDiv((span_end - at_us) * rate, limit.limit), span_end - cap_us);
    t = e;
    charged = true;
    at_us = span_end;
  }
  if (!charged) return std::nullopt;
  return t;
}

int64_t fairShare(std::vector<int64_t> demands, int64_t capacity, int64_t mine) {
  std::sort(demands.begin(), demands.end());
  int64_t left = capacity;
  auto k = static_cast<int64_t>(demands.size());
  for (int64_t d : demands) {
    int64_t split = left / k;
    if (d > split) return std::min(mine, split);
    left -= d;
    --k;
  }
  return mine;
}

int64_t grant(std::span<const Held> live, std::string_view node, int64_t asked, int64_t limit) {
  std::vector<int64_t> demands;
  int64_t others = 0;
  for (const Held& h : live) {
    if (h.node == node) continue;
    others += h.rate;
    demands.push_back(h.demand);
  }
  demands.push_back(asked);
  return std::max<int64_t>(std::min(fairShare(std::move(demands), limit, asked), limit - others), 0);
}

bool pastNoise(int64_t rate, int64_t by, int64_t limit) {
  return by > 0 && (kNoiseParts * by > rate || kNoiseOfLimit * by >= limit);
}

bool unmet(std::span<const Held> live, int64_t limit) {
  std::vector<int64_t> demands;
  demands.reserve(live.size());
  for (const Held& h : live) demands.push_back(h.demand);
  for (const Held& h : live) {
    const int64_t share = fairShare(demands, limit, h.demand);
    if (pastNoise(share, share - h.rate, limit)) return true;
  }
  return false;
}

int64_t heldWaitUs(int64_t wait_us, int64_t held_rate, int64_t limit, int64_t first_end_us,
                   int64_t now_us) {
  if (held_rate >= limit) return first_end_us - now_us + wait_us;
  if (held_rate <= 0) return wait_us;
  return static_cast<int64_t>(std::ceil(static_cast<double>(wait_us) * static_cast<double>(limit) /
                                        static_cast<double>(limit - held_rate)));
}

int64_t retryWaitUs(int64_t empty_us, int64_t need, std::span<const Held> live, const Limit& limit,
                    int64_t now_us) {
  const int64_t interval_us = intervalUs(limit);
  int64_t from_us = now_us;
  int64_t t_us = empty_us;
  std::vector<Held> after(live.begin(), live.end());
  if (bucketCapUnits(live, limit) < need) {
    std::vector<int64_t> ends;
    for (const Held& h : live) {
      if (h.rate > 0) ends.push_back(h.until_us);
    }
    std::sort(ends.begin(), ends.end());
    for (int64_t end_us : ends) {
      after.clear();
      for (const Held& h : live) {
        if (h.until_us > end_us) after.push_back(h);
      }
      if (bucketCapUnits(after, limit) >= need) {
        t_us = charge(empty_us, now_us, end_us, live, limit).value_or(empty_us);
        from_us = end_us;
        break;
      }
    }
  }
  int64_t rate = 0;
  std::optional<int64_t> first_end_us;
  for (const Held& h : after) {
    rate += h.rate;
    if (h.rate > 0 && (!first_end_us || h.until_us < *first_end_us)) first_end_us = h.until_us;
  }
  const int64_t wait_us = t_us + need * interval_us - from_us;
  return from_us - now_us + heldWaitUs(wait_us, rate, limit.limit, first_end_us.value_or(from_us), from_us);
}

std::vector<std::string> rateArgv(int64_t rate, int64_t tokens, const Limit& limit, int64_t deadline_us,
                                  std::string_view node, int64_t lease_ms, int64_t now_us) {
  return {"rate",
          std::to_string(rate),
          std::to_string(tokens),
          std::to_string(limit.limit),
          std::to_string((limit.period_ns + 999'999) / 1'000'000),
          std::to_string(limit.burst),
          std::to_string(now_us),
          std::to_string(deadline_us),
          std::string(node),
          std::to_string(lease_ms)};
}

std::optional<Reply> parseReply(std::span<const int64_t> values, int64_t limit) {
  if (values.size() != 8 || values[6] < 0 || values[6] > limit || values[7] < 0 || values[7] > 1) {
    return std::nullopt;
  }
  std::optional<scripts::LeaseReply> lease = scripts::parseLeaseReply(values.first(6));
  if (!lease) return std::nullopt;
  return Reply{*lease, values[6], values[7] == 1};
}

int64_t shortRenewNs(const Limit& limit, int64_t asked, int64_t granted, int64_t lease_interval_ns) {
  if (granted <= 0 || granted >= asked || granted >= limit.limit) return 0;
  // kShortRenewUnits at `asked` per period, in doubles: period_ns * 200
  // would pass 2^63 for a period of a year or more.
  const double units_ns = static_cast<double>(limit.period_ns) * static_cast<double>(kShortRenewUnits) /
                          static_cast<double>(asked);
  const double most_ns = static_cast<double>(kMaxRenewNs);
  return std::max<int64_t>(static_cast<int64_t>(std::ceil(std::min(units_ns, most_ns))),
                           std::max<int64_t>(lease_interval_ns, 1));
}

int64_t settleNs(int64_t previous_gap_ns, int64_t lease_interval_ns) {
  if (previous_gap_ns <= 0 || previous_gap_ns >= kMaxRenewNs / kSettleFactor) return kMaxRenewNs;
  return std::max<int64_t>(kSettleFactor * previous_gap_ns, std::max<int64_t>(lease_interval_ns, 1));
}

int64_t renewAtNs(int64_t sent_ns, int64_t lease_ns, bool unmet, int64_t lease_interval_ns, bool quick,
                  int64_t sooner_ns) {
  int64_t after_ns = quick   ? std::max<int64_t>(lease_interval_ns / kQuickRenewsPerInterval, 1)
                     : unmet ? std::max<int64_t>(lease_interval_ns, 1)
                             : kMaxRenewNs;
  if (sooner_ns > 0) after_ns = std::min(after_ns, sooner_ns);
  return sent_ns + std::min(after_ns, lease_ns / 2);
}

bool rose(int64_t held_ns_per_unit, int64_t granted_ns_per_unit) {
  return granted_ns_per_unit > 0 &&
         (held_ns_per_unit <= 0 || granted_ns_per_unit < held_ns_per_unit - held_ns_per_unit / kNoiseParts);
}

int64_t reaskAfterMs(int64_t retry_ms, int64_t lease_interval_ms, bool quick) {
  const int64_t most_ms = quick ? lease_interval_ms / kQuickRenewsPerInterval : lease_interval_ms;
  return std::min(std::max<int64_t>(retry_ms, 1), std::max<int64_t>(most_ms, 1));
}

bool eligible(const Rule& rule) {
  // A paced rule's units leave the fleet one interval apart (rules.h,
  // pace): a rate paces each node on its own share, and two nodes could
  // each let one go within the same interval.
  if (!algorithmTraits(rule.algorithm).leases_rate || rule.pace || rule.limits.size() != 1 ||
      !leasable(rule)) {
    return false;
  }
  const Limit& limit = rule.limits.front();
  constexpr int64_t kExact = int64_t{1} << 53;  // Lua's doubles
  return limit.window == calendar::Span::kNone && limit.limit >= 1 &&
         limit.limit < kExact / (kMaxLeaseMs * 1000) && limit.burst < kExact / limit.limit;
}

bool wants(const Limit& limit, double demand_per_interval, bool drained, int64_t lease_interval_ns) {
  if (!drained || demand_per_interval <= 0) return false;
  const double refill = static_cast<double>(limit.limit) * static_cast<double>(lease_interval_ns) /
                        static_cast<double>(limit.period_ns);
  return refill >= 1.0;
}

int64_t askedRate(const Limit& limit, double demand_per_interval, int64_t lease_interval_ns) {
  const double per_period = demand_per_interval * static_cast<double>(limit.period_ns) /
                            static_cast<double>(std::max<int64_t>(lease_interval_ns, 1));
  return std::clamp<int64_t>(static_cast<int64_t>(std::ceil(per_period)), 1, limit.limit);
}

int64_t nsPerUnit(const Limit& limit, int64_t rate) {
  // limit * interval µs, in ns, over the rate.
  const int64_t span_ns = limit.limit * intervalUs(limit) * 1000;
  return ceilDiv(span_ns, std::max<int64_t>(rate, 1));
}

int64_t rateOfNsPerUnit(const Limit& limit, int64_t ns_per_unit) {
  if (ns_per_unit <= 0) return 0;
  // nsPerUnit(r) = ceil(span / r) = p holds for every r in [span / p,
  // span / (p - 1)): the least is ceil(span / p).
  const int64_t span_ns = limit.limit * intervalUs(limit) * 1000;
  return std::min(ceilDiv(span_ns, ns_per_unit), limit.limit);
}

int64_t capUnits(const Limit& limit, int64_t rate, int64_t lease_interval_ns) {
  const int64_t interval_units = ceilDiv(lease_interval_ns, nsPerUnit(limit, rate));
  return std::max<int64_t>({interval_units, burstShare(limit, rate), 1});
}

}  // namespace sluice::rate_lease

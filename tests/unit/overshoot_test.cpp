// Overshoot bound (daemon/overshoot.h): what a node could admit on one key
// of a global rule beyond its fair part of the limit, from the rule, its
// share and the node's state; and its /metrics rendering.
#include "overshoot.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "prometheus.h"
#include "rate_lease.h"
#include "slice.h"

namespace sluice {
namespace {

constexpr int64_t kSecondNs = 1'000'000'000;

Rule globalRule(Algorithm algorithm, Limit limit, RedisDownPolicy on_redis_down = RedisDownPolicy::kLocal) {
  Rule rule;
  rule.name = "r";
  rule.scope = Scope::kGlobal;
  rule.algorithm = algorithm;
  rule.on_redis_down = on_redis_down;
  rule.limits = {limit};
  return rule;
}

// The share as RuleSet builds it for N nodes: each limit and burst / N.
Rule shareOf(const Rule& rule, int64_t nodes) {
  Rule share = rule;
  share.scope = Scope::kLocal;
  for (Limit& limit : share.limits) {
    limit.limit /= nodes;
    limit.burst /= nodes;
  }
  return share;
}

const OvershootInput kLeasing{.leasing = true, .learning = false, .held_units = 0};

// Verifies that a local rule reports no overshoot: nothing is shared.
TEST(OvershootBound, ALocalRuleHasNone) {
  Rule rule = globalRule(Algorithm::kTokenBucket, {100, kSecondNs, 40});
  rule.scope = Scope::kLocal;
  EXPECT_EQ(overshootBound(rule, rule, {.leasing = false, .learning = true, .held_units = 9}), 0);
}

// Verifies that units a bucket or a window holds leased are no overshoot
// while Redis is up: Redis charged them when it leased them.
TEST(OvershootBound, LeasedUnitsOfABucketOrAWindowAreNone) {
  for (Algorithm algorithm : {Algorithm::kTokenBucket, Algorithm::kGcra, Algorithm::kFixedWindow,
                              Algorithm::kSlidingWindow}) {
    const Rule rule = globalRule(algorithm, {100, kSecondNs, 100});
    EXPECT_EQ(overshootBound(rule, shareOf(rule, 4), {.leasing = true, .learning = false, .held_units = 30}), 0)
        << algorithmName(algorithm);
  }
}

// Verifies that a sliding log's leased, unspent units are its bound while
// Redis is up: they entered the log when leased and may be spent later.
TEST(OvershootBound, ASlidingLogOwesTheUnitsItHoldsLeased) {
  const Rule rule = globalRule(Algorithm::kSlidingLog, {20, 2 * kSecondNs, 20});
  const Rule share = shareOf(rule, 2);
  EXPECT_EQ(overshootBound(rule, share, kLeasing), 0);
  EXPECT_EQ(overshootBound(rule, share, {.leasing = true, .learning = false, .held_units = 7}), 7);
}

// Verifies the fallback budget by on_redis_down while the breaker is not
// closed: "local" adds what the share admits in a span of one period (a
// bucket's burst and a period's refill, a window's limit twice, a log's
// limit), "closed" nothing, "open" has no bound.
TEST(OvershootBound, FallbackAddsThePolicysBudget) {
  const OvershootInput down{.leasing = false, .learning = false, .held_units = 3};
  const Rule bucket = globalRule(Algorithm::kTokenBucket, {100, kSecondNs, 40});
  EXPECT_EQ(overshootBound(bucket, shareOf(bucket, 4), down), 10 + 25);
  const Rule window = globalRule(Algorithm::kFixedWindow, {100, kSecondNs, 100});
  EXPECT_EQ(overshootBound(window, shareOf(window, 4), down), 2 * 25);
  const Rule log = globalRule(Algorithm::kSlidingLog, {20, 2 * kSecondNs, 20});
  EXPECT_EQ(overshootBound(log, shareOf(log, 4), down), 3 + 5);
  const Rule closed = globalRule(Algorithm::kSlidingLog, {20, 2 * kSecondNs, 20}, RedisDownPolicy::kClosed);
  EXPECT_EQ(overshootBound(closed, shareOf(closed, 4), down), 3);
  const Rule open = globalRule(Algorithm::kTokenBucket, {100, kSecondNs, 40}, RedisDownPolicy::kOpen);
  EXPECT_EQ(overshootBound(open, shareOf(open, 4), down), std::nullopt);
  EXPECT_EQ(overshootBound(open, shareOf(open, 4), kLeasing), 0);  // Redis up: leases bound it
}

// Verifies that learning adds the share once while leasing, and nothing
// more in fallback, which already counts it.
TEST(OvershootBound, LearningAddsTheShareWhileLeasing) {
  const Rule rule = globalRule(Algorithm::kFixedWindow, {90, kSecondNs, 90});
  const Rule share = shareOf(rule, 3);
  EXPECT_EQ(overshootBound(rule, share, {.leasing = true, .learning = true, .held_units = 0}), 2 * 30);
  EXPECT_EQ(overshootBound(rule, share, {.leasing = false, .learning = true, .held_units = 0}), 2 * 30);
}

// Verifies that a key learning on the rate it held when Redis went away
// adds a period of that rate while leasing, when that is more than the
// equal share, and that the share stays the floor.
TEST(OvershootBound, LearningOnARateAddsAPeriodOfItWhenThatIsMore) {
  const Rule rule = globalRule(Algorithm::kTokenBucket, {1000, kSecondNs, 30});
  const Rule share = shareOf(rule, 8);  // 125/s and a burst of 3: 128 a period
  EXPECT_EQ(overshootBound(rule, share, {.leasing = true, .learning = true, .held_units = 0,
                                         .rate_period_units = 900}), 900);
  EXPECT_EQ(overshootBound(rule, share, {.leasing = true, .learning = true, .held_units = 0,
                                         .rate_period_units = 20}), 128);
  EXPECT_EQ(overshootBound(rule, share, {.leasing = true, .learning = false, .held_units = 0,
                                         .rate_period_units = 900}), 0);
}

// Verifies that a rule of several limits reports the largest share among
// its limits, and that the bound follows N: more nodes, smaller shares.
TEST(OvershootBound, SeveralLimitsReportTheLargestShareAndFollowN) {
  Rule rule = globalRule(Algorithm::kSlidingLog, {10, kSecondNs, 10});
  rule.limits.push_back({600, 60 * kSecondNs, 600});
  const OvershootInput down{.leasing = false, .learning = false, .held_units = 0};
  EXPECT_EQ(overshootBound(rule, shareOf(rule, 2), down), 300);
  EXPECT_EQ(overshootBound(rule, shareOf(rule, 6), down), 100);
}

// Verifies that an open reservation adds the key's debt bound (max_debt,
// default the limit) on a settling rule, whatever the other terms: any of
// them may settle that far past the limit.
TEST(OvershootBound, AnOpenReservationAddsTheDebtBound) {
  Rule rule = globalRule(Algorithm::kTokenBucket, {100, kSecondNs, 40});
  const Rule share = shareOf(rule, 4);
  OvershootInput reserving = kLeasing;
  reserving.open_reservations = 3;
  EXPECT_EQ(overshootBound(rule, share, reserving), 100);
  rule.max_debt = 7;
  EXPECT_EQ(overshootBound(rule, share, reserving), 7);
  OvershootInput down = reserving;
  down.leasing = false;
  EXPECT_EQ(overshootBound(rule, share, down), 10 + 25 + 7);
  // A sliding log cannot reserve: nothing to settle past its limit.
  const Rule log = globalRule(Algorithm::kSlidingLog, {20, 2 * kSecondNs, 20});
  EXPECT_EQ(overshootBound(log, shareOf(log, 2), reserving), 0);
}

// Verifies, on a simulated clock, that a debt a key's slice carries is in
// the bound while its window lasts and leaves it when the window ends (it
// was owed to that window alone), and that an open reservation raises the
// bound to the debt bound even before any debt.
TEST(OvershootBound, ADebtTheSliceCarriesIsInTheBoundUntilItsWindowEnds) {
  Rule rule = globalRule(Algorithm::kFixedWindow, {1000, 60 * kSecondNs, 1000});
  rule.max_debt = 300;
  const Rule share = shareOf(rule, 2);
  std::vector<std::atomic<uint64_t>> words(slice::kWords);
  slice::Words slice_words{words.data(), words.size()};
  int64_t now_ns = 5 * kSecondNs;
  const int64_t window_end_ns = 60 * kSecondNs;
  slice::applyGrant(slice_words, 100, 5'000, window_end_ns, true);
  auto input = [&](int64_t open) {
    OvershootInput in = kLeasing;
    in.open_reservations = open;
    in.owed_units = slice::owed(slice_words, now_ns);
    return in;
  };
  EXPECT_EQ(overshootBound(rule, share, input(0)), 0);
  // A reserve of 80 comes out of the slice, and is open.
  ASSERT_EQ(slice::take(slice_words, now_ns, 80).outcome, slice::Outcome::kTaken);
  EXPECT_EQ(overshootBound(rule, share, input(1)), 300);
  // Settled at 500: 420 past the estimate, of which the slice's 20 and
  // 300 past it are charged.
  now_ns += 10 * kSecondNs;
  EXPECT_EQ(slice::charge(slice_words, 420, debtBound(rule, rule.limits.front())), 320);
  EXPECT_EQ(overshootBound(rule, share, input(0)), 300);
  now_ns = window_end_ns - 1;
  EXPECT_EQ(overshootBound(rule, share, input(0)), 300);
  now_ns = window_end_ns;
  EXPECT_EQ(overshootBound(rule, share, input(0)), 0);
}

// Verifies /metrics shows the bound per rule, +Inf for no bound.
TEST(OvershootBound, MetricsShowItPerRule) {
  MetricsView view;
  view.redis.emplace();
  view.overshoot = {{"log", 12}, {"open", std::nullopt}};
  const std::string text = renderPrometheus(view);
  EXPECT_NE(text.find("# TYPE sluice_overshoot_bound_units gauge\n"), std::string::npos) << text;
  EXPECT_NE(text.find("sluice_overshoot_bound_units{rule=\"log\"} 12\n"), std::string::npos) << text;
  EXPECT_NE(text.find("sluice_overshoot_bound_units{rule=\"open\"} +Inf\n"), std::string::npos) << text;
}

// Verifies that what a rate lease lets escape counts in a bucket's bound
// while Redis is up: the rate itself is counted in Redis.
TEST(OvershootBound, ARateLeaseOwesWhatItsSliceMaySaveUp) {
  const Rule rule = globalRule(Algorithm::kTokenBucket, {1000, kSecondNs, 30});
  const Rule share = shareOf(rule, 3);
  EXPECT_EQ(overshootBound(rule, share, {.leasing = true, .learning = false, .held_units = 0,
                                         .rate_escape_units = 70}), 70);
}

// Verifies the escape's arithmetic on design.md's worked example (1,000/s,
// burst 30, lease_interval 100 ms): the whole rate's slice refills to 100
// units, of which its share of the burst, 30, stays out of Redis's bucket
// while it is held, so 70 escape; at 500/s the slice's 50 less a share of
// 15, 35.
TEST(OvershootBound, ARateLetsEscapeItsSlicesCapLessItsShareOfTheBurst) {
  const Limit limit{1000, kSecondNs, 30};
  constexpr int64_t kIntervalNs = 100'000'000;
  for (auto [rate, cap, escape] : {std::tuple<int64_t, int64_t, int64_t>{1000, 100, 70}, {500, 50, 35}}) {
    ASSERT_EQ(rate_lease::capUnits(limit, rate, kIntervalNs), cap);
    EXPECT_EQ(rateEscapeUnits(limit, cap, rate_lease::nsPerUnit(limit, rate)), escape) << rate;
  }
}

// Verifies that a rate whose share of the burst is its whole cap lets
// nothing escape (100/s with a burst of 1,000: the slice refills to the
// burst, which Redis's bucket no longer holds), and that a key without a
// rate lets nothing escape.
TEST(OvershootBound, ARateWhoseCapIsItsBurstShareLetsNothingEscape) {
  const Limit limit{100, kSecondNs, 1000};
  const int64_t cap = rate_lease::capUnits(limit, 100, 100'000'000);
  ASSERT_EQ(cap, 1000);
  EXPECT_EQ(rateEscapeUnits(limit, cap, rate_lease::nsPerUnit(limit, 100)), 0);
  EXPECT_EQ(rateEscapeUnits(limit, 0, 0), 0);
  EXPECT_EQ(rateEscapeUnits(limit, 0, rate_lease::nsPerUnit(limit, 100)), 0);
}

// Verifies, for every rate of a few limits, that the rate read back from a
// slice's refill is never above the rate held (so its burst share, and the
// escape, are never understated) and is the rate held itself, and that the
// escape is the cap less that share, between 0 and the cap.
TEST(OvershootBound, TheRateReadBackFromARefillIsTheRateHeld) {
  for (const Limit& limit : {Limit{1000, kSecondNs, 30}, Limit{2000, kSecondNs, 40}, Limit{7, 3 * kSecondNs, 5},
                             Limit{333, kSecondNs, 1000}}) {
    for (int64_t rate = 1; rate <= limit.limit; ++rate) {
      const int64_t per_unit = rate_lease::nsPerUnit(limit, rate);
      ASSERT_EQ(rate_lease::rateOfNsPerUnit(limit, per_unit), rate) << limit.limit << " " << rate;
      const int64_t cap = rate_lease::capUnits(limit, rate, 100'000'000);
      const int64_t escape = rateEscapeUnits(limit, cap, per_unit);
      ASSERT_EQ(escape, std::max<int64_t>(cap - rate_lease::burstShare(limit, rate), 0));
      ASSERT_LE(escape, cap);
    }
  }
}

// Verifies that in fallback a key that may spend its rate past the rate's
// end (rate_lease::kFallbackHoldNs) counts a period of that rate as its
// fallback budget when that is more than the equal share's, and the share's
// when it is less.
TEST(OvershootBound, InFallbackARateSpentPastItsEndCountsAPeriodOfIt) {
  const Rule rule = globalRule(Algorithm::kTokenBucket, {1000, kSecondNs, 30});
  const Rule share = shareOf(rule, 3);  // 333/s, burst 10: 343 a period
  EXPECT_EQ(overshootBound(rule, share, {.leasing = false, .learning = false, .held_units = 0,
                                         .rate_escape_units = 90, .rate_period_units = 900}),
            90 + 900);
  EXPECT_EQ(overshootBound(rule, share, {.leasing = false, .learning = false, .held_units = 0,
                                         .rate_escape_units = 10, .rate_period_units = 100}),
            10 + 343);
}

}  // namespace
}  // namespace sluice

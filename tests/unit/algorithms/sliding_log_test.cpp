// Sliding-window log: exact counts over any span of one period, slot give-back,
// retry hints and clock oddities, on a simulated clock.
#include "algorithms/sliding_log.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <vector>

namespace sluice {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kSecond = 1'000 * kMs;

// One key's slots plus the limit they are judged by.
struct Log {
  explicit Log(Limit l) : limit(l), slots(sliding_log::stateWords(l)) {}

  Limit limit;
  std::vector<std::atomic<uint64_t>> slots;

  Decision acquire(int64_t now_ns, int64_t cost = 1) { return sliding_log::acquire(slots, limit, now_ns, cost); }
  Decision peek(int64_t now_ns, int64_t cost = 0) const { return sliding_log::peek(slots, limit, now_ns, cost); }
  int64_t drain(int64_t now_ns) {
    int64_t granted = 0;
    while (acquire(now_ns).allowed) ++granted;
    return granted;
  }
};

Limit limit(int64_t units, int64_t period_ns) { return Limit{units, period_ns, units}; }

// Verifies the DESIGN contract: 5 per second allows exactly 5 of 20
// back-to-back acquires on a fresh key.
TEST(SlidingLog, AllowsExactlyFiveOfTwentyBackToBackOnAFreshKey) {
  for (int64_t start_ns : {int64_t{0}, int64_t{123'456'789}, int64_t{1} << 62}) {
    Log log(limit(5, kSecond));
    int allowed = 0;
    for (int i = 0; i < 20; ++i) allowed += log.acquire(start_ns).allowed ? 1 : 0;
    EXPECT_EQ(allowed, 5) << "start " << start_ns;
  }
}

struct Shape {
  int64_t limit;
  int64_t period_ns;
};

class SlidingLogRate : public ::testing::TestWithParam<Shape> {};

// Verifies that draining every simulated millisecond never admits more than
// `limit` within any span of one period, and admits exactly `limit` per period.
TEST_P(SlidingLogRate, AdmitsExactlyLimitPerSlidingPeriodOverSimulatedTime) {
  const Shape shape = GetParam();
  Log log(limit(shape.limit, shape.period_ns));
  const int64_t start_ns = 7 * shape.period_ns + 3 * kMs;
  const int64_t periods = 30;
  std::deque<int64_t> admitted_ns;
  int64_t granted = 0;
  for (int64_t now_ns = start_ns; now_ns < start_ns + periods * shape.period_ns; now_ns += kMs) {
    const int64_t n = log.drain(now_ns);
    for (int64_t i = 0; i < n; ++i) admitted_ns.push_back(now_ns);
    while (admitted_ns.front() <= now_ns - shape.period_ns) admitted_ns.pop_front();
    ASSERT_LE(static_cast<int64_t>(admitted_ns.size()), shape.limit) << "at " << now_ns;
    granted += n;
  }
  EXPECT_EQ(granted, shape.limit * periods);
}

INSTANTIATE_TEST_SUITE_P(Shapes, SlidingLogRate,
                         ::testing::Values(Shape{5, kSecond}, Shape{100, 60 * kMs}, Shape{1, kMs},
                                           Shape{1000, 10 * kMs}, Shape{7, 3 * kMs}));

// Verifies that a unit comes back exactly one period after it was admitted.
TEST(SlidingLog, UnitIsFreeExactlyOnePeriodAfterItsAdmission) {
  Log log(limit(3, kSecond));
  ASSERT_TRUE(log.acquire(0).allowed);
  ASSERT_TRUE(log.acquire(400 * kMs, 2).allowed);
  EXPECT_EQ(log.drain(kSecond - 1), 0);
  EXPECT_EQ(log.drain(kSecond), 1);
  EXPECT_EQ(log.drain(1400 * kMs - 1), 0);
  EXPECT_EQ(log.drain(1400 * kMs), 2);
}

// Verifies that retry_after_ms is exact: denied a millisecond before it, allowed at it.
TEST(SlidingLog, RetryAfterIsTheFirstWholeMillisecondThatSucceeds) {
  for (int64_t cost : {1, 2, 3}) {
    Log log(limit(3, kSecond));
    const int64_t start_ns = 5 * kSecond + 17;
    ASSERT_TRUE(log.acquire(start_ns).allowed);
    ASSERT_TRUE(log.acquire(start_ns + 300 * kMs + 5).allowed);
    ASSERT_TRUE(log.acquire(start_ns + 600 * kMs + 9).allowed);
    const int64_t now_ns = start_ns + 700 * kMs;
    const Decision d = log.acquire(now_ns, cost);
    ASSERT_FALSE(d.allowed);
    EXPECT_EQ(d.reset_after_ms, 901);
    EXPECT_FALSE(log.peek(now_ns + (d.retry_after_ms - 1) * kMs, cost).allowed) << "cost " << cost;
    EXPECT_TRUE(log.acquire(now_ns + d.retry_after_ms * kMs, cost).allowed) << "cost " << cost;
  }
}

// Verifies that a request that cannot get all its slots gives back the ones it claimed.
TEST(SlidingLog, DenialGivesBackPartlyClaimedSlots) {
  Log log(limit(5, kSecond));
  ASSERT_TRUE(log.acquire(0, 3).allowed);
  const Decision d = log.acquire(100 * kMs, 3);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.remaining, 2);
  EXPECT_EQ(log.drain(100 * kMs), 2);
}

// Verifies that a cost above the limit is refused as hopeless, with no retry hint.
TEST(SlidingLog, DeniesCostAboveLimitAsExceedingTheLimit) {
  Log log(limit(5, kSecond));
  const Decision d = log.acquire(0, 6);
  EXPECT_FALSE(d.allowed);
  EXPECT_TRUE(d.cost_exceeds_limit);
  EXPECT_EQ(d.retry_after_ms, 0);
  EXPECT_TRUE(sliding_log::isIdle(log.slots, log.limit, 0));
}

// Verifies that cost 0 reports the state and spends nothing.
TEST(SlidingLog, CostZeroReportsWithoutSpending) {
  Log log(limit(5, kSecond));
  ASSERT_TRUE(log.acquire(kSecond, 2).allowed);
  for (const Decision& d : {log.acquire(kSecond + 250 * kMs, 0), log.peek(kSecond + 250 * kMs)}) {
    EXPECT_TRUE(d.allowed);
    EXPECT_EQ(d.remaining, 3);
    EXPECT_EQ(d.limit, 5);
    EXPECT_EQ(d.reset_after_ms, 750);
  }
  EXPECT_EQ(log.drain(kSecond + 250 * kMs), 3);
}

// Verifies that units admitted at a later clock read stay taken for callers
// whose clock reads earlier, and the wait is measured from their now.
TEST(SlidingLog, TimeSteppingBackwardsGrantsNothingExtra) {
  Log log(limit(2, kSecond));
  EXPECT_EQ(log.drain(10 * kSecond), 2);
  const Decision d = log.acquire(9 * kSecond);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after_ms, 2000);
  EXPECT_EQ(log.drain(0), 0);
}

// Verifies that refund frees the slots stamped at that time.
TEST(SlidingLog, RefundFreesTheSlotsItClaimed) {
  Log log(limit(5, kSecond));
  ASSERT_TRUE(log.acquire(0, 4).allowed);
  sliding_log::refund(log.slots, log.limit, 0, 3);
  EXPECT_EQ(log.peek(0).remaining, 4);
}

// Verifies that a log is idle once every admission has left the window.
TEST(SlidingLog, IsIdleOnceEveryUnitHasLeftTheWindow) {
  Log log(limit(5, kSecond));
  EXPECT_TRUE(sliding_log::isIdle(log.slots, log.limit, 0));
  ASSERT_TRUE(log.acquire(0).allowed);
  EXPECT_FALSE(sliding_log::isIdle(log.slots, log.limit, kSecond - 1));
  EXPECT_TRUE(sliding_log::isIdle(log.slots, log.limit, kSecond));
}

// Verifies that state is one word per unit, capped at the algorithm's maxLimit.
TEST(SlidingLog, StateIsOneWordPerUnitUpToTheCap) {
  EXPECT_EQ(sliding_log::stateWords(limit(5, kSecond)), 5u);
  EXPECT_EQ(sliding_log::stateWords(limit(maxLimit(Algorithm::kSlidingLog), kSecond)), 1000u);
  EXPECT_EQ(sliding_log::stateWords(limit(5000, kSecond)), 1000u);
}

}  // namespace
}  // namespace sluice

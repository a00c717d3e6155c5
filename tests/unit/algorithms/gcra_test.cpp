// GCRA: emission interval, burst tolerance, retry hints and clock oddities, on
// a simulated clock.
#include "algorithms/gcra.h"
#include "word_key.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace sluice {
namespace {

using test::kMs;
using test::kSecond;
// One key's state word plus the limit it is judged by.
using Cell = test::WordKey<gcra::acquire>;

Cell cell(int64_t limit, int64_t period_ns, int64_t burst) { return Cell{Limit{limit, period_ns, burst}}; }

// Verifies the DESIGN contract: 5 per second with burst 5 allows exactly 5 of
// 20 back-to-back acquires on a fresh key.
TEST(Gcra, AllowsExactlyBurstOfTwentyBackToBackOnAFreshKey) {
  for (int64_t start_ns : {int64_t{0}, int64_t{123'456'789}, int64_t{1} << 62}) {
    Cell c = cell(5, kSecond, 5);
    int allowed = 0;
    for (int i = 0; i < 20; ++i) allowed += c.acquire(start_ns).allowed ? 1 : 0;
    EXPECT_EQ(allowed, 5) << "start " << start_ns;
  }
}

struct Shape {
  int64_t limit;
  int64_t period_ns;
  int64_t burst;
};

class GcraRate : public ::testing::TestWithParam<Shape> {};

// Verifies that conforming greedily every simulated millisecond for a minute
// admits the burst plus one unit per emission interval, no more and no less.
TEST_P(GcraRate, AdmitsBurstPlusRateOverSimulatedTime) {
  const Shape shape = GetParam();
  Cell c = cell(shape.limit, shape.period_ns, shape.burst);
  const int64_t start_ns = 987'654'321;
  const int64_t duration_ns = 60 * kSecond;
  int64_t granted = 0;
  for (int64_t now_ns = start_ns; now_ns <= start_ns + duration_ns; now_ns += kMs) granted += c.drain(now_ns);
  const int64_t interval_ns = (shape.period_ns + shape.limit - 1) / shape.limit;
  EXPECT_EQ(granted, shape.burst + duration_ns / interval_ns);
  EXPECT_LE(granted, shape.burst + duration_ns * shape.limit / shape.period_ns);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GcraRate,
                         ::testing::Values(Shape{5, kSecond, 5}, Shape{100, 60 * kSecond, 20},
                                           Shape{3, kSecond, 2}, Shape{1000, kSecond, 1000},
                                           Shape{7, 10 * kSecond, 30}, Shape{1, kMs, 1}));

// Verifies that after a burst the next unit conforms exactly one interval later.
TEST(Gcra, ConformsAgainOneEmissionIntervalAfterTheBurst) {
  Cell c = cell(5, kSecond, 5);
  EXPECT_EQ(c.drain(0), 5);
  EXPECT_FALSE(c.acquire(200 * kMs - 1).allowed);
  EXPECT_TRUE(c.acquire(200 * kMs).allowed);
  EXPECT_FALSE(c.acquire(200 * kMs).allowed);
}

// Verifies that a long rest never banks more than burst.
TEST(Gcra, CapsBankedUnitsAtBurst) {
  Cell c = cell(5, kSecond, 3);
  EXPECT_EQ(c.drain(0), 3);
  EXPECT_EQ(c.drain(1000 * kSecond), 3);
}

// Verifies that retry_after_ms is exact: denied a millisecond before it, allowed at it.
TEST(Gcra, RetryAfterIsTheFirstWholeMillisecondThatSucceeds) {
  for (int64_t cost : {1, 2, 3}) {
    Cell c = cell(3, kSecond, 3);
    const int64_t start_ns = 5 * kSecond + 17;
    EXPECT_EQ(c.drain(start_ns), 3);
    const Decision denied = c.acquire(start_ns, cost);
    ASSERT_FALSE(denied.allowed);
    ASSERT_GT(denied.retry_after_ms, 0);
    EXPECT_FALSE(c.peek(start_ns + (denied.retry_after_ms - 1) * kMs, cost).allowed) << "cost " << cost;
    EXPECT_TRUE(c.acquire(start_ns + denied.retry_after_ms * kMs, cost).allowed) << "cost " << cost;
  }
}

// Verifies that a cost above burst is refused as hopeless, with no retry hint.
TEST(Gcra, DeniesCostAboveBurstAsExceedingTheLimit) {
  Cell c = cell(10, kSecond, 4);
  const Decision d = c.acquire(0, 5);
  EXPECT_FALSE(d.allowed);
  EXPECT_TRUE(d.cost_exceeds_limit);
  EXPECT_EQ(d.retry_after_ms, 0);
  EXPECT_EQ(c.state, 0u);
}

// Verifies that cost 0 reports the state and spends nothing.
TEST(Gcra, CostZeroReportsWithoutSpending) {
  Cell c = cell(5, kSecond, 5);
  ASSERT_TRUE(c.acquire(kSecond, 2).allowed);
  const uint64_t before = c.state;
  const Decision d = c.acquire(kSecond, 0);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 3);
  EXPECT_EQ(d.limit, 5);
  EXPECT_EQ(d.reset_after_ms, 400);
  EXPECT_EQ(c.state, before);
}

// Verifies that a clock read earlier than the stored TAT grants nothing extra.
TEST(Gcra, TimeSteppingBackwardsGrantsNothingExtra) {
  Cell c = cell(5, kSecond, 5);
  EXPECT_EQ(c.drain(10 * kSecond), 5);
  const Decision d = c.acquire(9 * kSecond);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.retry_after_ms, 1200);
  EXPECT_EQ(c.drain(0), 0);
  EXPECT_EQ(c.drain(std::numeric_limits<int64_t>::min()), 0);
}

// Verifies that a huge burst and period near the end of the clock neither
// overflow nor grant anything extra: a TAT past the last int64 time is refused.
TEST(Gcra, ExtremeTimesAndPeriodsStayInRange) {
  Cell c = cell(1, kMaxPeriodNs, 1'000'000'000);
  EXPECT_TRUE(c.acquire(0, 100).allowed);
  const Decision d = c.acquire(0);
  EXPECT_TRUE(d.allowed);
  const Decision huge = c.acquire(0, 1'000'000);
  EXPECT_FALSE(huge.allowed);
  EXPECT_TRUE(huge.cost_exceeds_limit);
  EXPECT_EQ(huge.retry_after_ms, 0);
  const int64_t late_ns = std::numeric_limits<int64_t>::max() - kSecond;
  Cell late = cell(1, kMaxPeriodNs, 5);
  EXPECT_FALSE(late.acquire(late_ns).allowed);
  EXPECT_EQ(late.state, 0u);
}

// Verifies that refund moves TAT back, and a TAT back at now is a fresh key.
TEST(Gcra, RefundRestoresUnitsUpToFresh) {
  Cell c = cell(5, kSecond, 5);
  ASSERT_TRUE(c.acquire(0, 3).allowed);
  c.state = gcra::refund(c.state, c.limit, 0, 2);
  EXPECT_EQ(c.peek(0).remaining, 4);
  c.state = gcra::refund(c.state, c.limit, 0, 100);
  EXPECT_EQ(c.state, 0u);
}

// Verifies that a key is idle exactly once its TAT has passed.
TEST(Gcra, IsIdleOnceTheTheoreticalArrivalTimeHasPassed) {
  Cell c = cell(5, kSecond, 5);
  EXPECT_TRUE(gcra::isIdle(c.state, c.limit, 0));
  ASSERT_TRUE(c.acquire(0).allowed);
  EXPECT_FALSE(gcra::isIdle(c.state, c.limit, 200 * kMs - 1));
  EXPECT_TRUE(gcra::isIdle(c.state, c.limit, 200 * kMs));
}

// --- bounded waiting --------------------------------------------------------------

// Verifies pacing: at 10/s with burst 1, back-to-back requests that may wait
// a second are allowed at once and due one interval apart in arrival order;
// the one that would wait longer is denied, with the usual retry hint: until
// its unit would pass without waiting.
TEST(GcraWaiting, PacedRequestsAreDueOneIntervalApartInArrivalOrder) {
  Cell c = cell(10, kSecond, 1);
  const int64_t now_ns = 5 * kSecond;
  for (int64_t i = 0; i <= 10; ++i) {
    Decision d = c.reserve(now_ns, kSecond);
    ASSERT_TRUE(d.allowed) << i;
    EXPECT_EQ(d.wait_ns, i * 100 * kMs) << i;
    EXPECT_EQ(d.retry_after_ms, 0);
  }
  Decision late = c.reserve(now_ns, kSecond);
  EXPECT_FALSE(late.allowed);
  EXPECT_EQ(late.wait_ns, 0);
  EXPECT_EQ(late.retry_after_ms, 1100);
}

// Verifies that reservations come before later requests that do not wait,
// and that the queue drains with time: each interval frees one unit.
TEST(GcraWaiting, ReservationsHoldTheirPlaceAgainstRequestsThatDoNotWait) {
  Cell c = cell(10, kSecond, 1);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(c.reserve(0, kSecond).allowed);
  Decision now = c.acquire(0);
  EXPECT_FALSE(now.allowed);
  EXPECT_EQ(now.retry_after_ms, 500);
  EXPECT_FALSE(c.acquire(450 * kMs).allowed);
  EXPECT_TRUE(c.acquire(500 * kMs).allowed);
}

// Verifies that a wait of zero is the plain acquire, and that a burst is
// spent at once before anything waits.
TEST(GcraWaiting, BurstIsSpentAtOnceBeforeAnythingWaits) {
  Cell c = cell(10, kSecond, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c.reserve(0, kSecond).wait_ns, 0) << i;
  EXPECT_EQ(c.reserve(0, kSecond).wait_ns, 100 * kMs);
  EXPECT_FALSE(c.reserve(0, 0).allowed);
}

}  // namespace
}  // namespace sluice

// Fixed window: per-window counts, boundaries, retry hints, id aliasing and
// clock oddities, on a simulated clock.
#include "algorithms/fixed_window.h"
#include "word_key.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace sluice {
namespace {

using test::kMs;
using test::kSecond;
// One key's state word plus the limit it is judged by.
using Counter = test::WordKey<fixed_window::acquire>;

Counter counter(int64_t limit, int64_t period_ns) { return Counter{Limit{limit, period_ns, limit}}; }

// Verifies the DESIGN contract: 5 per second allows exactly 5 of 20
// back-to-back acquires on a fresh key.
TEST(FixedWindow, AllowsExactlyFiveOfTwentyBackToBackOnAFreshKey) {
  for (int64_t start_ns : {int64_t{0}, int64_t{123'456'789}, int64_t{1} << 62}) {
    Counter c = counter(5, kSecond);
    int allowed = 0;
    for (int i = 0; i < 20; ++i) allowed += c.acquire(start_ns).allowed ? 1 : 0;
    EXPECT_EQ(allowed, 5) << "start " << start_ns;
  }
}

struct Shape {
  int64_t limit;
  int64_t period_ns;
};

class FixedWindowRate : public ::testing::TestWithParam<Shape> {};

// Verifies that draining every simulated millisecond admits exactly `limit`
// per window touched, over many windows.
TEST_P(FixedWindowRate, AdmitsLimitPerWindowOverSimulatedTime) {
  const Shape shape = GetParam();
  Counter c = counter(shape.limit, shape.period_ns);
  const int64_t start_ns = 5 * shape.period_ns + 3 * kMs;
  const int64_t end_ns = start_ns + 40 * shape.period_ns;
  int64_t granted = 0;
  for (int64_t now_ns = start_ns; now_ns < end_ns; now_ns += kMs) granted += c.drain(now_ns);
  const int64_t windows = (end_ns - 1) / shape.period_ns - start_ns / shape.period_ns + 1;
  EXPECT_EQ(granted, shape.limit * windows);
}

INSTANTIATE_TEST_SUITE_P(Shapes, FixedWindowRate,
                         ::testing::Values(Shape{5, kSecond}, Shape{100, 60 * kMs}, Shape{1, kMs},
                                           Shape{1000, 10 * kMs}, Shape{7, 3 * kMs}));

// Verifies that the count resets exactly at the window boundary.
TEST(FixedWindow, ResetsExactlyAtTheWindowBoundary) {
  Counter c = counter(5, kSecond);
  EXPECT_EQ(c.drain(10 * kSecond + 400 * kMs), 5);
  EXPECT_FALSE(c.acquire(11 * kSecond - 1).allowed);
  EXPECT_EQ(c.drain(11 * kSecond), 5);
}

// Verifies that retry_after_ms points at the window end and acquiring then succeeds.
TEST(FixedWindow, RetryAfterIsTheFirstWholeMillisecondThatSucceeds) {
  Counter c = counter(5, kSecond);
  const int64_t now_ns = 10 * kSecond + 400 * kMs + 1;
  EXPECT_EQ(c.drain(now_ns), 5);
  const Decision d = c.acquire(now_ns, 3);
  ASSERT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after_ms, 600);
  EXPECT_EQ(d.reset_after_ms, 600);
  EXPECT_FALSE(c.peek(now_ns + (d.retry_after_ms - 1) * kMs, 3).allowed);
  EXPECT_TRUE(c.acquire(now_ns + d.retry_after_ms * kMs, 3).allowed);
}

// Verifies that a cost above the limit is refused as hopeless, with no retry hint.
TEST(FixedWindow, DeniesCostAboveLimitAsExceedingTheLimit) {
  Counter c = counter(5, kSecond);
  const Decision d = c.acquire(0, 6);
  EXPECT_FALSE(d.allowed);
  EXPECT_TRUE(d.cost_exceeds_limit);
  EXPECT_EQ(d.retry_after_ms, 0);
  EXPECT_EQ(c.state, 0u);
}

// Verifies that cost 0 reports the state and spends nothing.
TEST(FixedWindow, CostZeroReportsWithoutSpending) {
  Counter c = counter(5, kSecond);
  ASSERT_TRUE(c.acquire(kSecond + 250 * kMs, 2).allowed);
  const uint64_t before = c.state;
  const Decision d = c.acquire(kSecond + 250 * kMs, 0);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 3);
  EXPECT_EQ(d.limit, 5);
  EXPECT_EQ(d.reset_after_ms, 750);
  EXPECT_EQ(c.state, before);
  EXPECT_EQ(counter(5, kSecond).peek(0).reset_after_ms, 0) << "a fresh key has nothing to reset";
}

// Verifies that a caller whose clock reads up to kMaxSkewWindows windows
// before a racing thread's newer window is judged by the newer window's count.
TEST(FixedWindow, TimeSteppingBackwardsGrantsNothingExtra) {
  Counter c = counter(5, kSecond);
  EXPECT_EQ(c.drain(100 * kSecond), 5);
  const Decision d = c.acquire(99 * kSecond + 999 * kMs);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.retry_after_ms, 1001);
  EXPECT_EQ(c.drain(84 * kSecond), 0);
}

// Verifies that a stored id more than kMaxSkewWindows ahead can only be an
// old id that wrapped, and reads as a past window.
TEST(FixedWindow, IdFarAheadReadsAsWrappedAndPast) {
  Counter c = counter(5, kSecond);
  EXPECT_EQ(c.drain(100 * kSecond), 5);
  EXPECT_EQ(c.drain(83 * kSecond), 5);
}

// Verifies that an id which wrapped around 2^32 windows reads as long gone.
TEST(FixedWindow, WrappedWindowIdReadsAsPast) {
  Counter c = counter(5, kMs);
  EXPECT_EQ(c.drain(0), 5);
  EXPECT_EQ(c.drain((int64_t{1} << 32) * kMs - 100 * kMs), 5);
}

// Verifies that refund gives units back to the current window only.
TEST(FixedWindow, RefundGivesBackToTheCurrentWindow) {
  Counter c = counter(5, kSecond);
  ASSERT_TRUE(c.acquire(0, 4).allowed);
  c.state = fixed_window::refund(c.state, c.limit, 0, 3);
  EXPECT_EQ(c.peek(0).remaining, 4);
  c.state = fixed_window::refund(c.state, c.limit, 0, 100);
  EXPECT_EQ(c.state, 0u);
}

// Verifies that a key is idle when nothing is counted in the current window.
TEST(FixedWindow, IsIdleOnceTheWindowHasPassed) {
  Counter c = counter(5, kSecond);
  EXPECT_TRUE(fixed_window::isIdle(c.state, c.limit, 0));
  ASSERT_TRUE(c.acquire(0).allowed);
  EXPECT_FALSE(fixed_window::isIdle(c.state, c.limit, kSecond - 1));
  EXPECT_TRUE(fixed_window::isIdle(c.state, c.limit, kSecond));
}

// Verifies that the largest clock values and the largest limit stay in range.
TEST(FixedWindow, ExtremeTimesAndLimitsStayInRange) {
  Counter c = counter(maxLimit(Algorithm::kFixedWindow), kMinPeriodNs);
  const int64_t late_ns = std::numeric_limits<int64_t>::max();
  EXPECT_TRUE(c.acquire(late_ns, c.limit.limit).allowed);
  const Decision d = c.acquire(late_ns);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_GE(d.retry_after_ms, 0);
}

}  // namespace
}  // namespace sluice

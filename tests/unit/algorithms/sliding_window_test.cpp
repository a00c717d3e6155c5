// Sliding-window counter: the weighted estimate, boundaries, retry hints, id
// aliasing and clock oddities, on a simulated clock.
#include "algorithms/sliding_window.h"
#include "word_key.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>

namespace sluice {
namespace {

using test::kMs;
using test::kSecond;
// One key's state word plus the limit it is judged by.
using Counter = test::WordKey<sliding_window::acquire>;

Counter counter(int64_t limit, int64_t period_ns) { return Counter{Limit{limit, period_ns, limit}}; }

// Verifies the DESIGN contract: 5 per second allows exactly 5 of 20
// back-to-back acquires on a fresh key.
TEST(SlidingWindow, AllowsExactlyFiveOfTwentyBackToBackOnAFreshKey) {
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

class SlidingWindowRate : public ::testing::TestWithParam<Shape> {};

// Verifies that draining every simulated millisecond never admits more than
// `limit` in any fixed window, and over many windows admits at least half of
// `limit` per window: the estimate is strict, so under greedy load a window
// whose predecessor was full only reaches `limit` as the window ends (limit 1
// alternates 1, 0, 1, ...).
TEST_P(SlidingWindowRate, AdmitsAtMostLimitPerWindowAndAtLeastHalfOverSimulatedTime) {
  const Shape shape = GetParam();
  Counter c = counter(shape.limit, shape.period_ns);
  const int64_t start_ns = 5 * shape.period_ns;
  const int64_t windows = 40;
  std::map<int64_t, int64_t> per_window;
  int64_t granted = 0;
  for (int64_t now_ns = start_ns; now_ns < start_ns + windows * shape.period_ns; now_ns += kMs) {
    const int64_t n = c.drain(now_ns);
    per_window[now_ns / shape.period_ns] += n;
    granted += n;
  }
  for (const auto& [window, count] : per_window) EXPECT_LE(count, shape.limit) << "window " << window;
  EXPECT_LE(granted, shape.limit * windows);
  EXPECT_GE(granted, shape.limit * windows / 2);
}

INSTANTIATE_TEST_SUITE_P(Shapes, SlidingWindowRate,
                         ::testing::Values(Shape{5, kSecond}, Shape{100, 60 * kMs}, Shape{1, kMs},
                                           Shape{1000, 10 * kMs}, Shape{7, 3 * kMs}));

// Verifies that the previous window counts by the fraction of it still inside
// the sliding window: halfway through, half of it.
TEST(SlidingWindow, PreviousWindowWeighsByItsRemainingFraction) {
  Counter c = counter(10, kSecond);
  EXPECT_EQ(c.drain(3 * kSecond), 10);
  EXPECT_EQ(c.peek(4 * kSecond + 500 * kMs).remaining, 5);
  EXPECT_EQ(c.drain(4 * kSecond + 500 * kMs), 5);
}

// Verifies that right at the boundary the previous window weighs fully, so
// a full window cannot be followed by a burst.
TEST(SlidingWindow, BoundaryDoesNotOpenABurst) {
  Counter c = counter(10, kSecond);
  EXPECT_EQ(c.drain(4 * kSecond - 1), 10);
  EXPECT_EQ(c.drain(4 * kSecond), 0);
  EXPECT_EQ(c.drain(4 * kSecond + 100 * kMs), 1);
  EXPECT_EQ(c.drain(6 * kSecond), 10) << "two windows later nothing is counted";
}

// Verifies that retry_after_ms is exact: denied a millisecond before it,
// allowed at it, for waits inside this window and into the next.
TEST(SlidingWindow, RetryAfterIsTheFirstWholeMillisecondThatSucceeds) {
  for (int64_t cost : {1, 3, 7, 10}) {
    Counter c = counter(10, kSecond);
    ASSERT_EQ(c.drain(2 * kSecond + 100 * kMs), 10);
    const int64_t now_ns = 3 * kSecond + 300 * kMs + 7;
    ASSERT_TRUE(c.acquire(now_ns, 2).allowed);
    c.drain(now_ns);
    const Decision d = c.acquire(now_ns, cost);
    ASSERT_FALSE(d.allowed) << "cost " << cost;
    ASSERT_GT(d.retry_after_ms, 0);
    EXPECT_FALSE(c.peek(now_ns + (d.retry_after_ms - 1) * kMs, cost).allowed) << "cost " << cost;
    EXPECT_TRUE(c.acquire(now_ns + d.retry_after_ms * kMs, cost).allowed) << "cost " << cost;
  }
}

// Verifies reset_after_ms: until the current count has decayed out of the next window.
TEST(SlidingWindow, ResetIsTheEndOfTheNextWindowWhileTheCurrentOneCounts) {
  Counter c = counter(10, kSecond);
  EXPECT_EQ(c.acquire(2 * kSecond + 250 * kMs).reset_after_ms, 1750);
  EXPECT_EQ(c.peek(3 * kSecond + 250 * kMs).reset_after_ms, 750);
  EXPECT_EQ(c.peek(4 * kSecond).reset_after_ms, 0);
}

// Verifies that a cost above the limit is refused as hopeless, with no retry hint.
TEST(SlidingWindow, DeniesCostAboveLimitAsExceedingTheLimit) {
  Counter c = counter(5, kSecond);
  const Decision d = c.acquire(0, 6);
  EXPECT_FALSE(d.allowed);
  EXPECT_TRUE(d.cost_exceeds_limit);
  EXPECT_EQ(d.retry_after_ms, 0);
  EXPECT_EQ(c.state, 0u);
}

// Verifies that cost 0 reports the state and spends nothing.
TEST(SlidingWindow, CostZeroReportsWithoutSpending) {
  Counter c = counter(5, kSecond);
  ASSERT_TRUE(c.acquire(kSecond, 2).allowed);
  const uint64_t before = c.state;
  const Decision d = c.acquire(kSecond, 0);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 3);
  EXPECT_EQ(d.limit, 5);
  EXPECT_EQ(c.state, before);
}

// Verifies that a caller whose clock reads before a racing thread's newer
// window is judged as at the start of that window, where the estimate is largest.
TEST(SlidingWindow, TimeSteppingBackwardsGrantsNothingExtra) {
  Counter c = counter(5, kSecond);
  EXPECT_EQ(c.drain(10 * kSecond), 5);
  const Decision d = c.acquire(9 * kSecond + 500 * kMs);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_GT(d.retry_after_ms, 500);
  EXPECT_EQ(c.drain(0), 0);
}

// Verifies the documented aliasing of the 24-bit window id: an id 2^24 windows
// old reads as current (erring towards denial), one a few windows short of it
// reads as a racing newer window, and anything else reads as past.
TEST(SlidingWindow, WindowIdAliasingErrsTowardsDenial) {
  const int64_t wrap_ns = (int64_t{1} << 24) * kMs;
  Counter c = counter(5, kMs);
  EXPECT_EQ(c.drain(0), 5);
  EXPECT_EQ(c.peek(wrap_ns / 2).remaining, 5);
  EXPECT_EQ(c.peek(wrap_ns - 20 * kMs).remaining, 5);
  EXPECT_EQ(c.peek(wrap_ns - 10 * kMs).remaining, 0);
  EXPECT_EQ(c.peek(wrap_ns).remaining, 0);
  EXPECT_EQ(c.peek(wrap_ns + 2 * kMs).remaining, 5);
}

// Verifies that refund gives units back to the current window.
TEST(SlidingWindow, RefundGivesBackToTheCurrentWindow) {
  Counter c = counter(5, kSecond);
  ASSERT_TRUE(c.acquire(0, 4).allowed);
  c.state = sliding_window::refund(c.state, c.limit, 0, 3);
  EXPECT_EQ(c.peek(0).remaining, 4);
  c.state = sliding_window::refund(c.state, c.limit, 0, 100);
  EXPECT_EQ(c.state, 0u);
}

// Verifies that a key is idle only once its counts have left both windows.
TEST(SlidingWindow, IsIdleOnceBothWindowsHavePassed) {
  Counter c = counter(5, kSecond);
  EXPECT_TRUE(sliding_window::isIdle(c.state, c.limit, 0));
  ASSERT_TRUE(c.acquire(0).allowed);
  EXPECT_FALSE(sliding_window::isIdle(c.state, c.limit, kSecond));
  EXPECT_FALSE(sliding_window::isIdle(c.state, c.limit, 2 * kSecond - 1));
  EXPECT_TRUE(sliding_window::isIdle(c.state, c.limit, 2 * kSecond));
}

// Verifies that the largest limit (2^20 - 1) fits the packed counts.
TEST(SlidingWindow, LargestLimitFitsThePackedCounts) {
  const int64_t largest = maxLimit(Algorithm::kSlidingWindow);
  Counter c = counter(largest, kSecond);
  EXPECT_TRUE(c.acquire(kSecond, largest).allowed);
  EXPECT_FALSE(c.acquire(kSecond).allowed);
  EXPECT_EQ(c.peek(2 * kSecond + 500 * kMs).remaining, largest - (largest + 1) / 2);
}

}  // namespace
}  // namespace sluice

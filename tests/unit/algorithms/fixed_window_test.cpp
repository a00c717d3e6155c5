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

// --- calendar windows ---------------------------------------------------------

constexpr int64_t kHour = 3600 * kSecond;
constexpr int64_t kDay = 24 * kHour;
// 2026-03-01T00:00Z and 2026-10-25T00:00Z in Unix ns (days since 1970 * a day).
constexpr int64_t kMarch1Utc = 20513 * kDay;
constexpr int64_t kOctober25Utc = 20751 * kDay;
// The simulated monotonic clock starts at 1000 s; the wall clock is it plus
// this offset, so the monotonic time `mono(unix_ns)` reads unix_ns on the wall.
constexpr int64_t kBootNs = 1000 * kSecond;
int64_t mono(int64_t unix_ns, int64_t offset_ns) { return unix_ns - offset_ns; }

Limit calendarLimit(int64_t units, calendar::Span window, const char* zone) {
  Limit limit{units, calendar::longestNs(window), units};
  limit.window = window;
  limit.time_zone = calendar::Zone::named(zone).value();
  return limit;
}

// Verifies that a monthly budget in Berlin admits `limit` from local midnight
// of the 1st to the next 1st, with reset_after_ms at the real boundary.
TEST(FixedWindowCalendar, AMonthlyBudgetInBerlinResetsAtLocalMidnightOfTheFirst) {
  const Limit limit = calendarLimit(3, calendar::Span::kMonth, "Europe/Berlin");
  const int64_t offset = kMarch1Utc + 10 * kDay - kBootNs;  // boot on March 11th
  uint64_t state = 0;
  // March 20th, noon UTC: March in Berlin, which ends 2026-03-31T22:00Z (CEST).
  const int64_t march20 = mono(kMarch1Utc + 19 * kDay + 12 * kHour, offset);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(fixed_window::acquireOnWall(state, limit, march20, 1, offset).allowed);
  const Decision denied = fixed_window::acquireOnWall(state, limit, march20, 1, offset);
  EXPECT_FALSE(denied.allowed);
  const int64_t april_starts = mono(kMarch1Utc + 30 * kDay + 22 * kHour, offset);
  EXPECT_EQ(denied.retry_after_ms, (april_starts - march20) / kMs);
  EXPECT_EQ(denied.reset_after_ms, (april_starts - march20) / kMs);
  // A nanosecond before local midnight it is still March; at it, April.
  EXPECT_FALSE(fixed_window::acquireOnWall(state, limit, april_starts - 1, 1, offset).allowed);
  const Decision april = fixed_window::acquireOnWall(state, limit, april_starts, 1, offset);
  EXPECT_TRUE(april.allowed);
  EXPECT_EQ(april.remaining, 2);
  // April lasts 30 days in Berlin.
  EXPECT_EQ(april.reset_after_ms, 30 * kDay / kMs);
}

// Verifies that the day on which Berlin falls back lasts 25 hours: the
// window does not reset at 23:00 UTC (midnight CEST) but at midnight CET.
TEST(FixedWindowCalendar, ADailyLimitLasts25HoursOnTheDayTheClocksGoBack) {
  const Limit limit = calendarLimit(1, calendar::Span::kDay, "Europe/Berlin");
  const int64_t offset = kOctober25Utc - kBootNs;
  uint64_t state = 0;
  // 2026-10-25 starts in Berlin at 2026-10-24T22:00Z and ends at 10-25T23:00Z.
  const int64_t start = mono(kOctober25Utc - 2 * kHour, offset);
  const Decision first = fixed_window::acquireOnWall(state, limit, start, 1, offset);
  EXPECT_TRUE(first.allowed);
  EXPECT_EQ(first.reset_after_ms, 25 * kHour / kMs);
  EXPECT_FALSE(fixed_window::acquireOnWall(state, limit, start + 24 * kHour, 1, offset).allowed);
  EXPECT_TRUE(fixed_window::acquireOnWall(state, limit, start + 25 * kHour, 1, offset).allowed);
}

// Verifies that a refund goes back into the calendar window it was spent in,
// and that a key is idle once its window has ended.
TEST(FixedWindowCalendar, ARefundGoesBackIntoTheCalendarWindowAndTheKeyIdlesAfterIt) {
  const Limit limit = calendarLimit(2, calendar::Span::kWeek, "UTC");
  calendar::setWallOffsetNs(kMarch1Utc - kBootNs);  // Sunday 2026-03-01
  uint64_t state = 0;
  const int64_t now = kBootNs + 12 * kHour;
  EXPECT_TRUE(fixed_window::acquire(state, limit, now, 2).allowed);
  EXPECT_FALSE(fixed_window::isIdle(state, limit, now));
  state = fixed_window::refund(state, limit, now, 1);
  EXPECT_TRUE(fixed_window::acquire(state, limit, now, 1).allowed);
  // The week ends at Monday 2026-03-02T00:00Z, 12 hours later.
  EXPECT_FALSE(fixed_window::isIdle(state, limit, now + 12 * kHour - 1));
  EXPECT_TRUE(fixed_window::isIdle(state, limit, now + 12 * kHour));
}

}  // namespace
}  // namespace sluice

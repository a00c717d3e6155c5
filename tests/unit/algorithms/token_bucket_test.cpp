// Token bucket: refill rate, capacity, retry hints and clock oddities, on a
// simulated clock.
#include "algorithms/token_bucket.h"
#include "word_key.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace sluice {
namespace {

using test::kMs;
using test::kSecond;
// One key's state word plus the limit it is judged by.
using Bucket = test::WordKey<token_bucket::acquire>;

Bucket bucket(int64_t limit, int64_t period_ns, int64_t burst) { return Bucket{Limit{limit, period_ns, burst}}; }

// Verifies the DESIGN contract: 5 per second with burst 5 allows exactly 5 of
// 20 back-to-back acquires on a fresh key.
TEST(TokenBucket, AllowsExactlyBurstOfTwentyBackToBackOnAFreshKey) {
  for (int64_t start_ns : {int64_t{0}, int64_t{123'456'789}, int64_t{1} << 62}) {
    Bucket b = bucket(5, kSecond, 5);
    int allowed = 0;
    for (int i = 0; i < 20; ++i) allowed += b.acquire(start_ns).allowed ? 1 : 0;
    EXPECT_EQ(allowed, 5) << "start " << start_ns;
  }
}

struct Shape {
  int64_t limit;
  int64_t period_ns;
  int64_t burst;
};

class TokenBucketRate : public ::testing::TestWithParam<Shape> {};

// Verifies that draining the bucket every simulated millisecond for a minute
// admits the burst plus one unit per emission interval, no more and no less.
// (Each shape's interval is a whole number of ms or its burst is above 1, so
// no refill is lost to the bucket being full between two steps.)
TEST_P(TokenBucketRate, AdmitsBurstPlusRateOverSimulatedTime) {
  const Shape shape = GetParam();
  Bucket b = bucket(shape.limit, shape.period_ns, shape.burst);
  const int64_t start_ns = 987'654'321;
  const int64_t duration_ns = 60 * kSecond;
  const int64_t step_ns = kMs;
  int64_t granted = 0;
  int64_t now_ns = start_ns;
  for (; now_ns <= start_ns + duration_ns; now_ns += step_ns) granted += b.drain(now_ns);
  const int64_t interval_ns = (shape.period_ns + shape.limit - 1) / shape.limit;
  const int64_t elapsed_ns = now_ns - step_ns - start_ns;
  EXPECT_EQ(granted, shape.burst + elapsed_ns / interval_ns);
  // Never more than the configured rate allows.
  EXPECT_LE(granted, shape.burst + static_cast<int64_t>(static_cast<__int128>(elapsed_ns) * shape.limit /
                                                         shape.period_ns));
}

INSTANTIATE_TEST_SUITE_P(Shapes, TokenBucketRate,
                         ::testing::Values(Shape{5, kSecond, 5}, Shape{100, 60 * kSecond, 20},
                                           Shape{3, kSecond, 2}, Shape{1000, kSecond, 1000},
                                           Shape{7, 10 * kSecond, 30}, Shape{1, kMs, 1}));

// Verifies that a sliver of an interval refills nothing and a whole one refills one unit.
TEST(TokenBucket, RefillsOneUnitPerEmissionInterval) {
  Bucket b = bucket(5, kSecond, 5);
  EXPECT_EQ(b.drain(0), 5);
  EXPECT_FALSE(b.acquire(200 * kMs - 1).allowed);
  EXPECT_TRUE(b.acquire(200 * kMs).allowed);
  EXPECT_FALSE(b.acquire(200 * kMs).allowed);
}

// Verifies that the bucket never holds more than burst, however long it rests.
TEST(TokenBucket, CapsRefillAtBurst) {
  Bucket b = bucket(5, kSecond, 3);
  EXPECT_EQ(b.drain(0), 3);
  EXPECT_EQ(b.drain(1000 * kSecond), 3);
}

// Verifies that retry_after_ms is exact: denied a millisecond before it, allowed at it.
TEST(TokenBucket, RetryAfterIsTheFirstWholeMillisecondThatSucceeds) {
  for (int64_t cost : {1, 2, 3}) {
    Bucket b = bucket(3, kSecond, 3);  // interval 333'333'334 ns
    const int64_t start_ns = 5 * kSecond + 17;
    EXPECT_EQ(b.drain(start_ns), 3);
    const Decision denied = b.acquire(start_ns, cost);
    ASSERT_FALSE(denied.allowed);
    ASSERT_GT(denied.retry_after_ms, 0);
    EXPECT_FALSE(b.peek(start_ns + (denied.retry_after_ms - 1) * kMs, cost).allowed) << "cost " << cost;
    EXPECT_TRUE(b.acquire(start_ns + denied.retry_after_ms * kMs, cost).allowed) << "cost " << cost;
  }
}

// Verifies that a cost above burst is refused as hopeless, with no retry hint.
TEST(TokenBucket, DeniesCostAboveBurstAsExceedingTheLimit) {
  Bucket b = bucket(10, kSecond, 4);
  const Decision d = b.acquire(0, 5);
  EXPECT_FALSE(d.allowed);
  EXPECT_TRUE(d.cost_exceeds_limit);
  EXPECT_EQ(d.retry_after_ms, 0);
  EXPECT_EQ(b.state, 0u);
}

// Verifies that cost 0 reports the state and spends nothing.
TEST(TokenBucket, CostZeroReportsWithoutSpending) {
  Bucket b = bucket(5, kSecond, 5);
  ASSERT_TRUE(b.acquire(kSecond, 2).allowed);
  const uint64_t before = b.state;
  const Decision d = b.acquire(kSecond, 0);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 3);
  EXPECT_EQ(d.limit, 5);
  EXPECT_EQ(d.reset_after_ms, 400);
  EXPECT_EQ(b.state, before);
}

// Verifies remaining and reset_after_ms after a spend.
TEST(TokenBucket, ReportsRemainingAndTimeUntilFull) {
  Bucket b = bucket(10, kSecond, 10);
  const Decision d = b.acquire(0, 4);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 6);
  EXPECT_EQ(d.reset_after_ms, 400);
  EXPECT_EQ(d.retry_after_ms, 0);
}

// Verifies that a clock read earlier than the state's grants nothing extra and
// yields a sane, bounded retry hint.
TEST(TokenBucket, TimeSteppingBackwardsGrantsNothingExtra) {
  Bucket b = bucket(5, kSecond, 5);
  EXPECT_EQ(b.drain(10 * kSecond), 5);
  const Decision d = b.acquire(9 * kSecond);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.retry_after_ms, 1200);
  EXPECT_EQ(b.drain(0), 0);
  EXPECT_EQ(b.drain(std::numeric_limits<int64_t>::min()), 0);
}

// Verifies that extreme clock values and a huge period neither overflow nor crash.
TEST(TokenBucket, ExtremeTimesAndPeriodsStayInRange) {
  Bucket b = bucket(1, kMaxPeriodNs, 1'000'000'000);
  const int64_t late_ns = std::numeric_limits<int64_t>::max() - kSecond;
  EXPECT_TRUE(b.acquire(late_ns, 1'000'000'000).allowed);
  const Decision d = b.acquire(late_ns);
  EXPECT_FALSE(d.allowed);
  EXPECT_GT(d.retry_after_ms, 0);
  EXPECT_GT(d.reset_after_ms, 0);
  EXPECT_EQ(b.drain(0), 0);
}

// Verifies that refund gives units back, never beyond a full bucket.
TEST(TokenBucket, RefundRestoresUnitsUpToFull) {
  Bucket b = bucket(5, kSecond, 5);
  ASSERT_TRUE(b.acquire(0, 3).allowed);
  b.state = token_bucket::refund(b.state, b.limit, 0, 2);
  EXPECT_EQ(b.peek(0).remaining, 4);
  b.state = token_bucket::refund(b.state, b.limit, 0, 100);
  EXPECT_EQ(b.state, 0u);
}

// Verifies that a full bucket is idle and a partly spent one is not, until it refills.
TEST(TokenBucket, IsIdleExactlyWhenFull) {
  Bucket b = bucket(5, kSecond, 5);
  EXPECT_TRUE(token_bucket::isIdle(b.state, b.limit, 0));
  ASSERT_TRUE(b.acquire(0).allowed);
  EXPECT_FALSE(token_bucket::isIdle(b.state, b.limit, 200 * kMs - 1));
  EXPECT_TRUE(token_bucket::isIdle(b.state, b.limit, 200 * kMs));
}

// --- bounded waiting --------------------------------------------------------------

// Verifies that once the bucket is empty, requests that may wait are allowed
// with waits one refill apart, in arrival order, up to max_wait.
TEST(TokenBucketWaiting, EmptyBucketQueuesReservationsOneRefillApart) {
  Bucket b = bucket(10, kSecond, 2);
  const int64_t now_ns = 7 * kSecond;
  EXPECT_EQ(b.reserve(now_ns, kSecond).wait_ns, 0);
  EXPECT_EQ(b.reserve(now_ns, kSecond).wait_ns, 0);
  for (int64_t i = 1; i <= 10; ++i) {
    Decision d = b.reserve(now_ns, kSecond);
    ASSERT_TRUE(d.allowed) << i;
    EXPECT_EQ(d.wait_ns, i * 100 * kMs) << i;
    EXPECT_EQ(d.remaining, 0);
  }
  Decision late = b.reserve(now_ns, kSecond);
  EXPECT_FALSE(late.allowed);
  EXPECT_EQ(late.retry_after_ms, 1100);  // until it would pass without waiting
}

// Verifies that a bucket in debt to reservations reads as empty to a request
// that does not wait, and refills to full only after the debt is paid.
TEST(TokenBucketWaiting, DebtIsPaidBeforeTheBucketRefills) {
  Bucket b = bucket(10, kSecond, 5);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(b.acquire(0).allowed);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(b.reserve(0, kSecond).allowed);
  EXPECT_FALSE(b.acquire(250 * kMs).allowed);
  EXPECT_EQ(b.acquire(250 * kMs).retry_after_ms, 150);
  EXPECT_FALSE(token_bucket::isIdle(b.state, b.limit, 700 * kMs));
  EXPECT_TRUE(token_bucket::isIdle(b.state, b.limit, 800 * kMs));
}

}  // namespace
}  // namespace sluice

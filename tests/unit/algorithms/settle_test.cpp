// Settling a reservation on each single-word algorithm, on a simulated clock:
// refundSpent() gives back what a reserve spent, charge() spends past the
// limit as debt (negative remaining), and debt is paid back before anything
// new passes.
#include "algorithms/fixed_window.h"
#include "algorithms/gcra.h"
#include "algorithms/sliding_window.h"
#include "algorithms/token_bucket.h"
#include "word_key.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace sluice {
namespace {

using test::kMs;
using test::kSecond;

// --- token bucket -----------------------------------------------------------------

using Bucket = test::WordKey<token_bucket::acquire>;

TEST(SettleTokenBucket, ARefundGivesBackTheUnitsTheActualDidNotUse) {
  Bucket b{Limit{100, kSecond, 100}};
  const int64_t now_ns = 5 * kSecond;
  ASSERT_TRUE(b.acquire(now_ns, 80).allowed);  // reserve 80
  EXPECT_EQ(b.peek(now_ns).remaining, 20);
  b.state = token_bucket::refundSpent(b.state, b.limit, now_ns, now_ns + kMs, 50);  // actual 30
  EXPECT_EQ(b.peek(now_ns + kMs).remaining, 70);
}

TEST(SettleTokenBucket, ARefundNeverFillsPastTheBurst) {
  Bucket b{Limit{100, kSecond, 100}};
  ASSERT_TRUE(b.acquire(0, 80).allowed);
  // A second later the bucket is full again; the refund has nowhere to go.
  b.state = token_bucket::refundSpent(b.state, b.limit, 0, 2 * kSecond, 80);
  EXPECT_EQ(b.state, 0u);
  EXPECT_EQ(b.peek(2 * kSecond).remaining, 100);
}

TEST(SettleTokenBucket, DebtIsOwedAndIsPaidBackBeforeAnythingPasses) {
  Bucket b{Limit{10, kSecond, 10}};  // one unit per 100 ms
  const int64_t now_ns = kSecond;
  ASSERT_TRUE(b.acquire(now_ns, 10).allowed);           // reserve the whole bucket
  b.state = token_bucket::charge(b.state, b.limit, now_ns, 5);  // actual 15
  EXPECT_EQ(b.peek(now_ns).remaining, 0);
  EXPECT_EQ(token_bucket::owed(b.state, b.limit, now_ns), 5);
  EXPECT_EQ(token_bucket::owed(b.state, b.limit, now_ns + 450 * kMs), 1);
  EXPECT_FALSE(b.acquire(now_ns).allowed);
  // The 5 owed refill in 500 ms, the next unit 100 ms after.
  EXPECT_FALSE(b.acquire(now_ns + 599 * kMs).allowed);
  EXPECT_TRUE(b.acquire(now_ns + 600 * kMs).allowed);
}

// --- GCRA -------------------------------------------------------------------------

using Cell = test::WordKey<gcra::acquire>;

TEST(SettleGcra, ARefundMovesTheArrivalTimeBack) {
  Cell c{Limit{100, kSecond, 100}};
  ASSERT_TRUE(c.acquire(0, 90).allowed);
  EXPECT_EQ(c.peek(0).remaining, 10);
  c.state = gcra::refundSpent(c.state, c.limit, 0, 0, 60);
  EXPECT_EQ(c.peek(0).remaining, 70);
}

TEST(SettleGcra, DebtIsOwedAndIsPaidBackBeforeAnythingPasses) {
  Cell c{Limit{10, kSecond, 10}};
  ASSERT_TRUE(c.acquire(0, 10).allowed);
  c.state = gcra::charge(c.state, c.limit, 0, 3);
  EXPECT_EQ(c.peek(0).remaining, 0);
  EXPECT_EQ(gcra::owed(c.state, c.limit, 0), 3);
  EXPECT_EQ(gcra::owed(c.state, c.limit, 300 * kMs), 0);
  EXPECT_FALSE(c.acquire(399 * kMs).allowed);
  EXPECT_TRUE(c.acquire(400 * kMs).allowed);
}

// --- fixed window -----------------------------------------------------------------

using Window = test::WordKey<fixed_window::acquire>;

TEST(SettleFixedWindow, ARefundInTheSameWindowLowersItsCount) {
  Window w{Limit{1000, 60 * kSecond, 1000}};
  ASSERT_TRUE(w.acquire(kSecond, 800).allowed);
  w.state = fixed_window::refundSpent(w.state, w.limit, kSecond, 30 * kSecond, 500);
  EXPECT_EQ(w.peek(30 * kSecond).remaining, 700);
}

TEST(SettleFixedWindow, ARefundOfAnEndedWindowGivesNothingToTheNextOne) {
  Window w{Limit{1000, 60 * kSecond, 1000}};
  ASSERT_TRUE(w.acquire(59 * kSecond, 800).allowed);
  ASSERT_TRUE(w.acquire(61 * kSecond, 100).allowed);  // the next window
  w.state = fixed_window::refundSpent(w.state, w.limit, 59 * kSecond, 62 * kSecond, 800);
  EXPECT_EQ(w.peek(62 * kSecond).remaining, 900);
}

TEST(SettleFixedWindow, DebtCountsPastTheLimitUntilTheWindowEnds) {
  Window w{Limit{100, 60 * kSecond, 100}};
  ASSERT_TRUE(w.acquire(kSecond, 100).allowed);
  w.state = fixed_window::charge(w.state, w.limit, 2 * kSecond, 40);
  const Decision d = w.peek(2 * kSecond);
  EXPECT_EQ(d.remaining, -40);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after_ms, 58'000);
  EXPECT_TRUE(w.acquire(60 * kSecond).allowed);
}

TEST(SettleFixedWindow, DebtSaturatesTheCountInsteadOfSpillingIntoTheId) {
  Window w{Limit{0xFFFFFFFFLL, 60 * kSecond, 0xFFFFFFFFLL}};
  ASSERT_TRUE(w.acquire(kSecond, 0xFFFFFF00LL).allowed);
  w.state = fixed_window::charge(w.state, w.limit, kSecond, 1'000'000'000);
  EXPECT_EQ(w.peek(kSecond).remaining, 0);
  EXPECT_EQ(w.peek(61 * kSecond).remaining, 0xFFFFFFFFLL);  // the next window is fresh
}

// --- sliding window ---------------------------------------------------------------

using Sliding = test::WordKey<sliding_window::acquire>;

TEST(SettleSlidingWindow, ARefundInTheSameWindowLowersTheCurrentCount) {
  Sliding s{Limit{1000, 10 * kSecond, 1000}};
  ASSERT_TRUE(s.acquire(kSecond, 600).allowed);
  s.state = sliding_window::refundSpent(s.state, s.limit, kSecond, 2 * kSecond, 400);
  EXPECT_EQ(s.peek(2 * kSecond).remaining, 800);
}

TEST(SettleSlidingWindow, ARefundOfThePreviousWindowLowersItsWeight) {
  Sliding s{Limit{1000, 10 * kSecond, 1000}};
  ASSERT_TRUE(s.acquire(9 * kSecond, 800).allowed);
  // Half-way through the next window the 800 weigh 400.
  EXPECT_EQ(s.peek(15 * kSecond).remaining, 600);
  s.state = sliding_window::refundSpent(s.state, s.limit, 9 * kSecond, 15 * kSecond, 600);
  EXPECT_EQ(s.peek(15 * kSecond).remaining, 900);
}

TEST(SettleSlidingWindow, DebtIsNegativeRemainingUntilItHasDecayed) {
  Sliding s{Limit{100, 10 * kSecond, 100}};
  ASSERT_TRUE(s.acquire(0, 100).allowed);
  s.state = sliding_window::charge(s.state, s.limit, 0, 50);
  EXPECT_EQ(s.peek(0).remaining, -50);
  EXPECT_FALSE(s.acquire(0).allowed);
  // 150 in the previous window weigh 100 a third of the way into the next.
  EXPECT_FALSE(s.acquire(13 * kSecond).allowed);
  EXPECT_TRUE(s.acquire(14 * kSecond).allowed);
}

}  // namespace
}  // namespace sluice

// The lease broker (lease.h) and the lines it owns (wait_lines.h): where
// waiting requests stand, learning spans and fallback time, on a fake clock.
#include "lease.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "slice.h"

namespace sluice {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kInterval = 100 * kMs;

// Verifies a key's line: tickets are first in the order they joined,
// whatever order they leave in; joining marks the slice and the last to
// leave clears the mark; a leaving first counts a promotion; a mark the
// line outlived (its last ticket left without the key's words) is cleared
// by standing().
TEST(WaitLinesTest, FirstComeFirstServedPerKey) {
  std::vector<std::atomic<uint64_t>> a(slice::kWords), b(slice::kWords);
  std::span<std::atomic<uint64_t>> sa(a.data(), a.size()), sb(b.data(), b.size());
  WaitLines lines;
  int64_t ahead = 0;
  uint64_t a1 = lines.join(7, "a", sa, 1, 100, &ahead);
  uint64_t b1 = lines.join(7, "b", sb, 1, 100, &ahead);
  uint64_t a2 = lines.join(7, "a", sa, 1, 100, &ahead);
  uint64_t a3 = lines.join(7, "a", sa, 1, 100, &ahead);
  uint64_t other_rule = lines.join(8, "a", sb, 1, 100, &ahead);
  EXPECT_NE(a[slice::kFlags].load() & slice::kLine, 0u);
  EXPECT_TRUE(lines.first(a1));
  EXPECT_TRUE(lines.first(b1));
  EXPECT_TRUE(lines.first(other_rule));
  EXPECT_FALSE(lines.first(a2));
  EXPECT_EQ(lines.size(), 5u);

  uint64_t before = lines.promotions();
  EXPECT_FALSE(lines.leave(a3, sa));  // from the back: nobody moves up
  EXPECT_EQ(lines.promotions(), before);
  EXPECT_TRUE(lines.leave(a1, sa));
  EXPECT_EQ(lines.promotions(), before + 1);
  EXPECT_TRUE(lines.first(a2));
  EXPECT_FALSE(lines.first(a1));  // gone
  EXPECT_FALSE(lines.leave(a1, sa));  // twice: nothing
  EXPECT_NE(a[slice::kFlags].load() & slice::kLine, 0u);
  EXPECT_FALSE(lines.leave(a2, sa));  // the last: the mark goes
  EXPECT_EQ(a[slice::kFlags].load() & slice::kLine, 0u);

  EXPECT_FALSE(lines.leave(b1, {}));  // without the words: the mark stays
  EXPECT_NE(b[slice::kFlags].load() & slice::kLine, 0u);
  EXPECT_FALSE(lines.standing(7, "b", sb));
  EXPECT_EQ(b[slice::kFlags].load() & slice::kLine, 0u);
  b[slice::kFlags].fetch_or(slice::kLine);
  EXPECT_TRUE(lines.standing(8, "a", sb));  // rule 8's line still stands
  EXPECT_NE(b[slice::kFlags].load() & slice::kLine, 0u);
  EXPECT_EQ(lines.size(), 1u);
}

// Verifies a line is bounded by units: a request is refused when more units
// stand ahead of it than it may wait behind, and `ahead` says how many;
// the first of a line is never refused, and units leave with their tickets.
TEST(WaitLinesTest, LongLinesRefuseAtOnce) {
  std::vector<std::atomic<uint64_t>> a(slice::kWords);
  std::span<std::atomic<uint64_t>> sa(a.data(), a.size());
  WaitLines lines;
  int64_t ahead = -1;
  uint64_t big = lines.join(1, "k", sa, 5, 0, &ahead);  // first: joins whatever its bound
  EXPECT_NE(big, 0u);
  EXPECT_EQ(ahead, 0);
  EXPECT_NE(lines.join(1, "k", sa, 2, 5, &ahead), 0u);
  EXPECT_EQ(ahead, 5);
  EXPECT_EQ(lines.join(1, "k", sa, 1, 6, &ahead), 0u);  // 7 ahead
  EXPECT_EQ(ahead, 7);
  EXPECT_EQ(lines.size(), 2u);
  lines.leave(big, sa);
  EXPECT_NE(lines.join(1, "k", sa, 1, 6, &ahead), 0u);
  EXPECT_EQ(ahead, 2);
}

// Verifies learning mode lasts one of the rule's memory spans: a window,
// or the time its bucket takes to refill.
TEST(LeaseBrokerTest, LearningLastsOneRulePeriod) {
  LeaseBroker broker(kInterval);
  Rule window;
  window.algorithm = Algorithm::kFixedWindow;
  window.limits = {Limit{.limit = 10, .period_ns = 1'000 * kMs, .burst = 10}};
  Rule bucket;
  bucket.algorithm = Algorithm::kTokenBucket;
  bucket.limits = {Limit{.limit = 10, .period_ns = 1'000 * kMs, .burst = 30}};  // 3 s to refill
  EXPECT_FALSE(broker.learning(window, 5'000 * kMs));
  broker.startLearning(5'000 * kMs, 0, 0, 3'000 * kMs);
  EXPECT_TRUE(broker.learning(window, 5'999 * kMs));
  EXPECT_FALSE(broker.learning(window, 6'000 * kMs));
  EXPECT_TRUE(broker.learning(bucket, 7'999 * kMs));
  EXPECT_FALSE(broker.learning(bucket, 8'000 * kMs));
  EXPECT_TRUE(broker.learningAny(7'999 * kMs));
  EXPECT_EQ(broker.stats(0).learning_entries, 1u);
}

// Verifies the breaker's bookkeeping: entries into fallback and the time
// spent there.
TEST(LeaseBrokerTest, BreakerCountsFallbackTime) {
  LeaseBroker broker(kInterval);
  EXPECT_FALSE(broker.leasing());  // open until Redis answers
  broker.setBreaker(Breaker::kHalfOpen, 10 * kMs);
  broker.setBreaker(Breaker::kClosed, 11 * kMs);
  EXPECT_TRUE(broker.leasing());
  broker.setBreaker(Breaker::kOpen, 100 * kMs);
  EXPECT_FALSE(broker.leasing());
  EXPECT_EQ(broker.stats(150 * kMs).fallback_ms, 50u);
  broker.setBreaker(Breaker::kHalfOpen, 400 * kMs);
  EXPECT_EQ(broker.stats(1'000 * kMs).fallback_ms, 300u);
  EXPECT_EQ(broker.stats(1'000 * kMs).fallback_entries, 1u);
}

// Verifies when an outage begins: at an opening after the breaker closed
// (or the first), and not at one from a recovery that failed before the
// breaker closed, which goes on with the outage it was in.
TEST(LeaseBrokerTest, AnOutageGoesOnThroughARecoveryThatFailed) {
  LeaseBroker broker(kInterval);
  // Redis unreachable at the start: the first opening begins one.
  broker.setBreaker(Breaker::kHalfOpen, 10 * kMs);
  broker.setBreaker(Breaker::kOpen, 20 * kMs);
  EXPECT_EQ(broker.lastOpenedNs(), 20 * kMs);
  broker.setBreaker(Breaker::kHalfOpen, 30 * kMs);
  broker.setBreaker(Breaker::kClosed, 30 * kMs);
  broker.setBreaker(Breaker::kOpen, 100 * kMs);
  EXPECT_EQ(broker.lastOpenedNs(), 100 * kMs);
  broker.setBreaker(Breaker::kHalfOpen, 400 * kMs);
  broker.setBreaker(Breaker::kOpen, 500 * kMs);  // the recovery failed
  EXPECT_EQ(broker.lastOpenedNs(), 100 * kMs);
  EXPECT_EQ(broker.openSinceNs(), 500 * kMs);
  broker.setBreaker(Breaker::kHalfOpen, 600 * kMs);
  broker.setBreaker(Breaker::kClosed, 600 * kMs);
  EXPECT_EQ(broker.lastOpenedNs(), 100 * kMs);  // kept once it ends
  // Closed, then half-open (the fleet marker refused the node), then open:
  // a new outage.
  broker.setBreaker(Breaker::kHalfOpen, 700 * kMs);
  broker.setBreaker(Breaker::kOpen, 800 * kMs);
  EXPECT_EQ(broker.lastOpenedNs(), 800 * kMs);
}

}  // namespace
}  // namespace sluice

// Concurrency: held units, release, deadlines that free a crashed caller's
// units, retry hints and clock oddities, on a simulated clock.
#include "algorithms/concurrency.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <vector>

namespace sluice {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kSecond = 1'000 * kMs;

// One key's slots plus the limit they are judged by.
struct Pool {
  explicit Pool(Limit l) : limit(l), slots(concurrency::stateWords(l)) {}

  Limit limit;
  std::vector<std::atomic<uint64_t>> slots;

  Decision acquire(int64_t now_ns, int64_t cost = 1) { return concurrency::acquire(slots, limit, now_ns, cost); }
  Decision release(int64_t now_ns, int64_t cost = 1) { return concurrency::release(slots, limit, now_ns, cost); }
  Decision peek(int64_t now_ns, int64_t cost = 0) const { return concurrency::peek(slots, limit, now_ns, cost); }
  int64_t drain(int64_t now_ns) {
    int64_t granted = 0;
    while (acquire(now_ns).allowed) ++granted;
    return granted;
  }
};

Limit limit(int64_t units, int64_t hold_ns) { return Limit{units, hold_ns, units}; }

// Verifies the DESIGN contract for a limit of 5: exactly 5 of 20 back-to-back
// acquires are held on a fresh key.
TEST(Concurrency, AllowsExactlyFiveOfTwentyBackToBackOnAFreshKey) {
  for (int64_t start_ns : {int64_t{0}, int64_t{123'456'789}, int64_t{1} << 62}) {
    Pool pool(limit(5, kSecond));
    int allowed = 0;
    for (int i = 0; i < 20; ++i) allowed += pool.acquire(start_ns).allowed ? 1 : 0;
    EXPECT_EQ(allowed, 5) << "start " << start_ns;
  }
}

struct Shape {
  int64_t limit;
  int64_t hold_ns;
};

class ConcurrencyRate : public ::testing::TestWithParam<Shape> {};

// Verifies that callers who never release get exactly `limit` units per hold
// period, as each unit frees itself at its deadline.
TEST_P(ConcurrencyRate, CrashedCallersGetLimitUnitsPerHoldPeriod) {
  const Shape shape = GetParam();
  Pool pool(limit(shape.limit, shape.hold_ns));
  const int64_t start_ns = 3 * shape.hold_ns + 11;
  const int64_t periods = 30;
  int64_t granted = 0;
  for (int64_t now_ns = start_ns; now_ns < start_ns + periods * shape.hold_ns; now_ns += kMs) {
    granted += pool.drain(now_ns);
  }
  EXPECT_EQ(granted, shape.limit * periods);
}

INSTANTIATE_TEST_SUITE_P(Shapes, ConcurrencyRate,
                         ::testing::Values(Shape{5, kSecond}, Shape{100, 60 * kMs}, Shape{1, kMs},
                                           Shape{1000, 10 * kMs}, Shape{7, 3 * kMs}));

// Verifies that released units can be acquired again at once.
TEST(Concurrency, ReleaseFreesUnitsAtOnce) {
  Pool pool(limit(3, 0));
  EXPECT_EQ(pool.drain(0), 3);
  const Decision d = pool.release(kMs, 2);
  EXPECT_EQ(d.remaining, 2);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(pool.drain(kMs), 2);
}

// Verifies that a unit whose holder never releases it frees itself exactly at its deadline.
TEST(Concurrency, UnitFreesItselfAtItsDeadline) {
  Pool pool(limit(2, 30 * kSecond));
  EXPECT_EQ(pool.drain(kSecond), 2);
  EXPECT_EQ(pool.drain(31 * kSecond - 1), 0);
  EXPECT_EQ(pool.drain(31 * kSecond), 2);
}

// Verifies that with no hold period units are held until released, and a
// denial then has no retry hint because only a release can help.
TEST(Concurrency, ZeroPeriodHoldsUntilReleased) {
  Pool pool(limit(2, 0));
  EXPECT_EQ(pool.drain(0), 2);
  const Decision d = pool.acquire(int64_t{1} << 62);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after_ms, 0);
  EXPECT_EQ(d.reset_after_ms, 0);
  EXPECT_FALSE(concurrency::isIdle(pool.slots, pool.limit, int64_t{1} << 62));
  pool.release(int64_t{1} << 62, 5);
  EXPECT_TRUE(concurrency::isIdle(pool.slots, pool.limit, int64_t{1} << 62));
}

// Verifies that release frees the units whose deadlines are soonest.
TEST(Concurrency, ReleaseFreesTheSoonestDeadlinesFirst) {
  Pool pool(limit(3, 10 * kSecond));
  ASSERT_TRUE(pool.acquire(0).allowed);
  ASSERT_TRUE(pool.acquire(5 * kSecond).allowed);
  ASSERT_TRUE(pool.acquire(2 * kSecond).allowed);
  pool.release(6 * kSecond, 2);
  const Decision d = pool.peek(6 * kSecond);
  EXPECT_EQ(d.remaining, 2);
  EXPECT_EQ(d.reset_after_ms, 9000) << "the unit held until 15 s is the one left";
}

// Verifies that releasing more than is held releases what is held and nothing more.
TEST(Concurrency, ReleasingMoreThanHeldReleasesWhatIsHeld) {
  Pool pool(limit(4, kSecond));
  ASSERT_TRUE(pool.acquire(0, 2).allowed);
  EXPECT_EQ(pool.release(0, 10).remaining, 4);
  EXPECT_EQ(pool.drain(0), 4);
}

// Verifies that retry_after_ms is exact: denied a millisecond before it, allowed at it.
TEST(Concurrency, RetryAfterIsTheFirstWholeMillisecondThatSucceeds) {
  for (int64_t cost : {1, 2, 3}) {
    Pool pool(limit(3, kSecond));
    const int64_t start_ns = 5 * kSecond + 17;
    ASSERT_TRUE(pool.acquire(start_ns).allowed);
    ASSERT_TRUE(pool.acquire(start_ns + 300 * kMs + 5).allowed);
    ASSERT_TRUE(pool.acquire(start_ns + 600 * kMs + 9).allowed);
    const int64_t now_ns = start_ns + 700 * kMs;
    const Decision d = pool.acquire(now_ns, cost);
    ASSERT_FALSE(d.allowed);
    EXPECT_FALSE(pool.peek(now_ns + (d.retry_after_ms - 1) * kMs, cost).allowed) << "cost " << cost;
    EXPECT_TRUE(pool.acquire(now_ns + d.retry_after_ms * kMs, cost).allowed) << "cost " << cost;
  }
}

// Verifies that a cost above the limit is refused as hopeless, with no retry hint.
TEST(Concurrency, DeniesCostAboveLimitAsExceedingTheLimit) {
  Pool pool(limit(5, kSecond));
  const Decision d = pool.acquire(0, 6);
  EXPECT_FALSE(d.allowed);
  EXPECT_TRUE(d.cost_exceeds_limit);
  EXPECT_EQ(d.retry_after_ms, 0);
  EXPECT_TRUE(concurrency::isIdle(pool.slots, pool.limit, 0));
}

// Verifies that cost 0 reports the state and holds nothing.
TEST(Concurrency, CostZeroReportsWithoutHolding) {
  Pool pool(limit(5, kSecond));
  ASSERT_TRUE(pool.acquire(0, 2).allowed);
  for (const Decision& d : {pool.acquire(250 * kMs, 0), pool.peek(250 * kMs)}) {
    EXPECT_TRUE(d.allowed);
    EXPECT_EQ(d.remaining, 3);
    EXPECT_EQ(d.limit, 5);
    EXPECT_EQ(d.reset_after_ms, 750);
  }
  EXPECT_EQ(pool.drain(250 * kMs), 3);
}

// Verifies that a request that cannot get all its units gives back the ones it claimed.
TEST(Concurrency, DenialGivesBackPartlyClaimedUnits) {
  Pool pool(limit(5, kSecond));
  ASSERT_TRUE(pool.acquire(0, 3).allowed);
  EXPECT_FALSE(pool.acquire(0, 3).allowed);
  EXPECT_EQ(pool.drain(0), 2);
}

// Verifies that units held from a later clock read stay held for callers whose clock reads earlier.
TEST(Concurrency, TimeSteppingBackwardsGrantsNothingExtra) {
  Pool pool(limit(2, kSecond));
  EXPECT_EQ(pool.drain(10 * kSecond), 2);
  const Decision d = pool.acquire(9 * kSecond);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after_ms, 2000);
  EXPECT_EQ(pool.drain(0), 0);
}

// Verifies that refund frees the units it holds from that acquire.
TEST(Concurrency, RefundFreesTheUnitsItClaimed) {
  Pool pool(limit(5, kSecond));
  ASSERT_TRUE(pool.acquire(0, 4).allowed);
  concurrency::refund(pool.slots, pool.limit, 0, 3);
  EXPECT_EQ(pool.peek(0).remaining, 4);
}

}  // namespace
}  // namespace sluice

// Holdings (holding.h): a global concurrency rule's leased units, handed to
// local acquires and taken back on release, with per-unit deadlines, the
// fallback share, debts and surplus, on a fake clock.
#include "holding.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "entry.h"

namespace sluice {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kInterval = 100 * kMs;

Rule concurrencyRule(int64_t limit, int64_t period_ns) {
  Rule rule;
  rule.scope = Scope::kGlobal;
  rule.algorithm = Algorithm::kConcurrency;
  rule.limits = {Limit{.limit = limit, .period_ns = period_ns, .burst = limit}};
  return rule;
}

class HoldingTest : public ::testing::Test {
 protected:
  explicit HoldingTest(int64_t period_ns = 1'000 * kMs)
      : rule_(concurrencyRule(10, period_ns)),
        words_(holding::words(rule_.limits.front())) {}

  const Limit& limit() const { return rule_.limits.front(); }
  std::span<std::atomic<uint64_t>> words() { return {words_.data(), words_.size()}; }
  // What a granting lease reply does (lease_holdings.cpp).
  void grant(int64_t units) {
    holding::applyGrant(words(), units);
    slice::unclaim(words());
  }
  int64_t pool() { return holding::pool(words()); }
  int64_t held() { return holding::held(words()); }
  holding::Acquired acquire(int64_t now_ns, int64_t cost = 1, int64_t cap = 0) {
    return holding::acquire(words(), limit(), now_ns, cost, false, cap);
  }

  Rule rule_;
  std::vector<std::atomic<uint64_t>> words_;
};

// Verifies a cold key holds nothing and claims one lease, and that a batch's
// units are held by acquires one by one until the pool is empty.
TEST_F(HoldingTest, AColdKeyLeasesAndItsBatchIsHeldUntilTheLimitOfThePool) {
  holding::Acquired cold = acquire(kMs);
  EXPECT_EQ(cold.taken.outcome, slice::Outcome::kEmpty);
  EXPECT_TRUE(cold.taken.must_request);
  EXPECT_FALSE(acquire(kMs).taken.must_request);  // in flight already
  grant(3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(acquire(2 * kMs).taken.outcome, slice::Outcome::kTaken) << i;
  EXPECT_EQ(acquire(2 * kMs).taken.outcome, slice::Outcome::kEmpty);
  EXPECT_EQ(pool(), 0);
  EXPECT_EQ(holding::live(words(), 2 * kMs), 3);
  EXPECT_EQ(held(), 3);
}

// Verifies a release puts the unit back into the pool (not into Redis:
// the holding stays), where the next acquire finds it without a lease.
TEST_F(HoldingTest, AReleaseGoesBackIntoThePoolForTheNextAcquire) {
  grant(2);
  acquire(kMs);
  acquire(kMs);
  EXPECT_EQ(holding::release(words(), 2 * kMs, 1), 1);
  EXPECT_EQ(pool(), 1);
  EXPECT_EQ(held(), 2);
  holding::Acquired again = acquire(3 * kMs);
  EXPECT_EQ(again.taken.outcome, slice::Outcome::kTaken);
  // Releasing more than is held frees what is held, no more.
  EXPECT_EQ(holding::release(words(), 4 * kMs, 5), 2);
  EXPECT_EQ(pool(), 2);
  EXPECT_EQ(holding::live(words(), 4 * kMs), 0);
}

// Verifies a unit whose caller never released it comes back into the pool
// once its period has passed, and that the next acquire counts it.
TEST_F(HoldingTest, AUnitPastItsDeadlineComesBackIntoThePool) {
  grant(1);
  EXPECT_EQ(acquire(0).taken.outcome, slice::Outcome::kTaken);  // deadline 1000 ms
  EXPECT_NE(acquire(999 * kMs).taken.outcome, slice::Outcome::kTaken);
  holding::Acquired later = acquire(1'000 * kMs);
  EXPECT_EQ(later.taken.outcome, slice::Outcome::kTaken);
  EXPECT_EQ(later.reclaimed, 1);
  EXPECT_EQ(pool() + holding::live(words(), 1'000 * kMs), held());
}

class HoldingWithoutPeriodTest : public HoldingTest {
 protected:
  HoldingWithoutPeriodTest() : HoldingTest(0) {}
};

// Verifies a rule without a period holds its units until released, however
// long that is.
TEST_F(HoldingWithoutPeriodTest, UnitsAreHeldUntilReleased) {
  grant(1);
  acquire(0);
  constexpr int64_t kYearNs = 366LL * 24 * 3600 * 1'000'000'000;
  EXPECT_EQ(holding::reclaim(words(), kYearNs), 0);
  EXPECT_EQ(holding::live(words(), kYearNs), 1);
  EXPECT_EQ(holding::release(words(), kYearNs, 1), 1);
  EXPECT_EQ(pool(), 1);
}

// Verifies the learning cap: with units in the pool, an acquire beyond the
// cap is denied and its unit stays in the pool.
TEST_F(HoldingTest, TheCapDeniesBeyondItAndKeepsThePool) {
  grant(5);
  EXPECT_EQ(acquire(kMs, 2, 2).taken.outcome, slice::Outcome::kTaken);
  holding::Acquired capped = acquire(kMs, 1, 2);
  EXPECT_EQ(capped.taken.outcome, slice::Outcome::kDenied);
  EXPECT_TRUE(capped.capped);
  EXPECT_EQ(pool(), 3);
  EXPECT_EQ(holding::live(words(), kMs), 2);
}

// Verifies fallback holds units at the node's share whatever the pool holds,
// and that what it holds beyond the pool is a debt: no leasing acquire gets
// through, and the next lease asks for the debt on top of the cost.
TEST_F(HoldingTest, FallbackHoldsAtTheShareAndLeavesADebtToLease) {
  grant(1);
  int64_t reclaimed = 0;
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(holding::acquireLocal(words(), limit(), kMs, 1, 3, &reclaimed)) << i;
  }
  EXPECT_FALSE(holding::acquireLocal(words(), limit(), kMs, 1, 3, &reclaimed));
  EXPECT_EQ(pool(), -2);
  EXPECT_EQ(pool() + holding::live(words(), kMs), held());
  holding::Acquired leasing = acquire(2 * kMs);
  EXPECT_EQ(leasing.taken.outcome, slice::Outcome::kEmpty);
  ASSERT_TRUE(leasing.taken.must_request);
  slice::Batch batch = holding::nextBatch(words(), 2 * kMs, 1, rule_, 2, kInterval);
  EXPECT_EQ(batch.need, 3);  // the debt of 2 and the cost
  EXPECT_GE(batch.n, batch.need);
  EXPECT_LE(batch.n, 10);
  grant(3);
  EXPECT_EQ(acquire(3 * kMs).taken.outcome, slice::Outcome::kTaken);
  EXPECT_EQ(pool(), 0);
}

// Verifies a lost holding's units (Redis said it holds fewer) turn the units
// callers hold into a debt that releases pay off.
TEST_F(HoldingTest, ReleasesPayOffADebt) {
  grant(2);
  acquire(kMs);
  acquire(kMs);
  // What the control thread does when Redis says held = 0 (lease_manager.cpp).
  words_[slice::kUnits].fetch_sub(2);
  words_[holding::kHeld].store(0);
  EXPECT_EQ(pool(), -2);
  EXPECT_EQ(acquire(2 * kMs).taken.outcome, slice::Outcome::kEmpty);
  holding::release(words(), 3 * kMs, 2);
  EXPECT_EQ(pool(), 0);
  EXPECT_EQ(pool() + holding::live(words(), 3 * kMs), held());
}

// Verifies refund() undoes an acquire exactly (an all-or-nothing group that
// another item denied).
TEST_F(HoldingTest, RefundUndoesAnAcquire) {
  grant(4);
  acquire(kMs, 3);
  holding::refund(words(), limit(), kMs, 3);
  EXPECT_EQ(pool(), 4);
  EXPECT_EQ(holding::live(words(), kMs), 0);
}

// Verifies the surplus: units the pool held all through a pass go back, and
// units the pool needed during it stay.
TEST_F(HoldingTest, OnlyUnitsUnusedForAWholePassAreSurplus) {
  grant(6);
  acquire(kMs, 4);                       // the pool went down to 2
  EXPECT_EQ(holding::takeSurplus(words()), 0);  // the first pass only measures (low 0)
  holding::release(words(), 2 * kMs, 4);  // pool 6, low starts at 2
  EXPECT_EQ(holding::takeSurplus(words()), 2);
  EXPECT_EQ(pool(), 4);
  EXPECT_EQ(holding::takeSurplus(words()), 4);  // nothing asked for since
  EXPECT_EQ(pool(), 0);
  acquire(3 * kMs);                      // the pool is empty: no surplus, ever
  EXPECT_EQ(holding::takeSurplus(words()), 0);
}

// Verifies a denial says when enough deadlines pass, and reset when the last.
TEST_F(HoldingTest, DecisionsTellTheDeadlines) {
  grant(2);
  acquire(0);            // until 1000 ms
  acquire(500 * kMs);    // until 1500 ms
  Decision denied = holding::decide(words(), limit(), 600 * kMs, 2, 0, false);
  EXPECT_FALSE(denied.allowed);
  EXPECT_EQ(denied.retry_after_ms, 900);  // both must pass
  EXPECT_EQ(denied.reset_after_ms, 900);
  Decision allowed = holding::decide(words(), limit(), 600 * kMs, 1, 3, true);
  EXPECT_TRUE(allowed.allowed);
  EXPECT_EQ(allowed.remaining, 3);
  EXPECT_EQ(allowed.retry_after_ms, 0);
  EXPECT_EQ(allowed.limit, 10);
}

// Verifies a denial's retry while other nodes hold units: a unit released
// there can be leased here long before a deadline here passes (limit 10,
// period 1 s), so the retry is at most how soon it comes back, never below
// the negative cache's wait; a node that holds the whole limit waits for
// its own deadlines.
TEST_F(HoldingTest, ADenialExpectsUnitsOtherNodesReleaseSooner) {
  grant(2);              // the other nodes hold 8
  acquire(0);            // until 1000 ms
  acquire(500 * kMs);    // until 1500 ms
  Decision sooner = holding::decide(words(), limit(), 600 * kMs, 2, 0, false, 0, 300 * kMs);
  EXPECT_EQ(sooner.retry_after_ms, 300);
  Decision later = holding::decide(words(), limit(), 600 * kMs, 2, 0, false, 0, 2000 * kMs);
  EXPECT_EQ(later.retry_after_ms, 900);  // the deadlines here come first
  Decision cached = holding::decide(words(), limit(), 600 * kMs, 2, 0, false, 400 * kMs, 300 * kMs);
  EXPECT_EQ(cached.retry_after_ms, 400);  // Redis said no for 400 ms
  Decision none_here = holding::decide(words(), limit(), 600 * kMs, 5, 0, false, 0, 300 * kMs);
  EXPECT_EQ(none_here.retry_after_ms, 300);  // not enough deadlines here at all
  grant(8);              // this node holds the whole limit
  Decision all_here = holding::decide(words(), limit(), 600 * kMs, 2, 0, false, 0, 300 * kMs);
  EXPECT_EQ(all_here.retry_after_ms, 900);
}

// Verifies that under racing acquires and releases on several threads the
// units held here never exceed the holding, and that the invariant (pool +
// held slots = holding) stands at the end.
TEST_F(HoldingTest, RacingThreadsNeverHoldMoreThanTheHolding) {
  grant(6);
  std::atomic<int64_t> holders{0};
  std::atomic<int64_t> most{0};
  std::atomic<int64_t> granted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20'000; ++i) {
        if (acquire(kMs).taken.outcome != slice::Outcome::kTaken) continue;
        granted.fetch_add(1);
        int64_t now_held = holders.fetch_add(1) + 1;
        int64_t seen = most.load();
        while (now_held > seen && !most.compare_exchange_weak(seen, now_held)) {
        }
        holders.fetch_sub(1);
        holding::release(words(), kMs, 1);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_LE(most.load(), 6);
  EXPECT_GT(granted.load(), 0);
  EXPECT_EQ(pool(), 6);
  EXPECT_EQ(holding::live(words(), kMs), 0);
}

// Verifies what the control thread does to a holding: a grant goes into
// the pool and kHeld and ends the negative cache; a return leaves kHeld;
// Redis holding fewer units than the node believes loses the difference
// from the pool too (a debt when callers hold them); a stop takes all.
TEST_F(HoldingTest, GrantsReturnsAndReconcilingKeepPoolPlusLiveEqualToHeld) {
  slice::applyEmpty(words(), kMs, 10 * kMs);
  grant(5);
  EXPECT_EQ(held(), 5);
  EXPECT_EQ(acquire(2 * kMs, 3).taken.outcome, slice::Outcome::kTaken);  // no negative cache
  EXPECT_EQ(pool(), 2);
  slice::refund(words(), -1);  // one unit of the pool leaves, to be returned
  holding::returned(words(), 1);
  EXPECT_EQ(held(), 4);
  EXPECT_EQ(pool() + holding::live(words(), 2 * kMs), held());
  EXPECT_EQ(holding::reconcile(words(), 4), 0);  // Redis agrees
  EXPECT_EQ(holding::reconcile(words(), 1), 3);  // the holding shrank in Redis
  EXPECT_EQ(held(), 1);
  EXPECT_EQ(pool(), -2);  // 3 held by callers, 1 held in Redis: a debt of 2
  EXPECT_EQ(pool() + holding::live(words(), 2 * kMs), held());
  EXPECT_EQ(holding::takeAll(words()), 1);
  EXPECT_EQ(held(), 0);
  EXPECT_EQ(pool(), 0);
}

// Verifies which rules lease a holding, and that the holding's words come
// first in their entries, one slot per unit after the slice's and its own.
TEST(HoldingLayoutTest, GlobalConcurrencyRulesOfOneLimitLeaseAHolding) {
  Rule rule = concurrencyRule(7, 0);
  EXPECT_TRUE(leasesHolding(rule));
  EXPECT_FALSE(leasable(rule));
  EXPECT_EQ(entryWords(rule), size_t{slice::kWords} + 2 + 7);
  rule.scope = Scope::kLocal;
  EXPECT_FALSE(leasesHolding(rule));
  rule.scope = Scope::kGlobal;
  rule.algorithm = Algorithm::kTokenBucket;
  EXPECT_FALSE(leasesHolding(rule));
}

}  // namespace
}  // namespace sluice

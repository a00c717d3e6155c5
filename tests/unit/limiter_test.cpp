// Limiter: several limits per rule, shadow rules, all-or-nothing requests,
// release, idleness and many threads on one key, on a simulated clock.
#include "limiter.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace sluice {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kSecond = 1'000 * kMs;
constexpr int64_t kMinute = 60 * kSecond;
constexpr int64_t kDay = 24 * 3600 * kSecond;

Rule makeRule(Algorithm algorithm, std::vector<Limit> limits, bool shadow = false) {
  Rule rule;
  rule.name = "test";
  rule.algorithm = algorithm;
  rule.limits = std::move(limits);
  rule.shadow = shadow;
  return rule;
}

Limit window(int64_t limit, int64_t period_ns) { return Limit{limit, period_ns, limit}; }

// One key's state words, fresh (all zero), sized for its rule.
struct Key {
  explicit Key(const Rule& rule) : words(stateWords(rule)) {}
  std::span<std::atomic<uint64_t>> state() { return words; }
  std::vector<std::atomic<uint64_t>> words;
};

// Spends cost 1 until denied; returns how many were allowed.
int64_t drain(const Rule& rule, Key& key, int64_t now_ns) {
  int64_t granted = 0;
  while (acquire(rule, key.state(), now_ns, 1).allowed) ++granted;
  return granted;
}

// The DESIGN example: 100 per minute and 20 per 10 s on a fixed window.
Rule hundredPerMinuteAndTwentyPerTenSeconds() {
  return makeRule(Algorithm::kFixedWindow, {window(100, kMinute), window(20, 10 * kSecond)});
}

// Verifies that word algorithms take one word per limit and slot algorithms one per unit.
TEST(Limiter, StateWordsFollowTheAlgorithmLayout) {
  EXPECT_EQ(stateWords(hundredPerMinuteAndTwentyPerTenSeconds()), 2u);
  EXPECT_EQ(stateWords(makeRule(Algorithm::kSlidingLog, {window(5, kSecond), window(7, kMinute)})), 12u);
  EXPECT_EQ(stateWords(makeRule(Algorithm::kConcurrency, {window(3, 0)})), 3u);
}

// Verifies that a request passes only while every limit allows it: 20 per
// 10 s, then after 50 s the minute's 100 are used up.
TEST(Limiter, MultiLimitRuleAllowsOnlyWhatEveryLimitAllows) {
  const Rule rule = hundredPerMinuteAndTwentyPerTenSeconds();
  Key key(rule);
  int64_t granted = 0;
  for (int64_t t = 0; t < 6; ++t) granted += drain(rule, key, t * 10 * kSecond);
  EXPECT_EQ(granted, 100);
  EXPECT_EQ(drain(rule, key, kMinute), 20);
}

// Verifies that when a later limit denies, the earlier limit's spend is given back.
TEST(Limiter, MultiLimitDenialLeavesNothingSpentOnTheOtherLimits) {
  const Rule rule = hundredPerMinuteAndTwentyPerTenSeconds();
  const Rule minute_only = makeRule(Algorithm::kFixedWindow, {window(100, kMinute)});
  Key key(rule);
  EXPECT_EQ(drain(rule, key, 0), 20);
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(acquire(rule, key.state(), 0, 1).allowed);
  // The minute limit's word comes first: it holds exactly the 20 allowed units.
  EXPECT_EQ(peek(minute_only, key.state().first(1), 0, 0).remaining, 80);
}

// Verifies that a denial by the first limit spends nothing on the second.
TEST(Limiter, MultiLimitDenialByTheFirstLimitSpendsNothingOnTheSecond) {
  const Rule rule = makeRule(Algorithm::kTokenBucket, {Limit{10, kMinute, 3}, Limit{100, kSecond, 100}});
  const Rule second_only = makeRule(Algorithm::kTokenBucket, {Limit{100, kSecond, 100}});
  Key key(rule);
  EXPECT_EQ(drain(rule, key, 0), 3);
  EXPECT_EQ(peek(second_only, key.state().subspan(1, 1), 0, 0).remaining, 97);
}

// Verifies that the decision reports the most restrictive limit: fewest
// remaining when allowed, the one that denied (longest retry) when denied.
TEST(Limiter, MultiLimitReportsTheMostRestrictiveLimit) {
  const Rule rule = hundredPerMinuteAndTwentyPerTenSeconds();
  Key key(rule);
  const Decision allowed = acquire(rule, key.state(), 2 * kSecond, 5);
  EXPECT_TRUE(allowed.allowed);
  EXPECT_EQ(allowed.limit, 20);
  EXPECT_EQ(allowed.remaining, 15);
  EXPECT_EQ(allowed.reset_after_ms, 8000);
  ASSERT_TRUE(acquire(rule, key.state(), 2 * kSecond, 15).allowed);
  const Decision denied = acquire(rule, key.state(), 2 * kSecond, 1);
  EXPECT_FALSE(denied.allowed);
  EXPECT_EQ(denied.limit, 20);
  EXPECT_EQ(denied.retry_after_ms, 8000);
}

// Verifies that when several limits deny, the longest retry is reported, so
// retrying then passes every limit.
TEST(Limiter, MultiLimitDenialReportsTheLongestRetry) {
  const Rule rule = makeRule(Algorithm::kFixedWindow, {window(20, 10 * kSecond), window(20, kMinute)});
  Key key(rule);
  EXPECT_EQ(drain(rule, key, 0), 20);
  const Decision denied = acquire(rule, key.state(), 0, 1);
  EXPECT_FALSE(denied.allowed);
  EXPECT_EQ(denied.retry_after_ms, 60'000);
  EXPECT_FALSE(acquire(rule, key.state(), 10 * kSecond, 1).allowed);
  EXPECT_TRUE(acquire(rule, key.state(), denied.retry_after_ms * kMs, 1).allowed);
}

// Verifies that a cost above any limit is reported as hopeless.
TEST(Limiter, CostAboveAnyLimitIsReportedAsExceedingTheLimit) {
  const Rule rule = hundredPerMinuteAndTwentyPerTenSeconds();
  Key key(rule);
  const Decision d = acquire(rule, key.state(), 0, 21);
  EXPECT_FALSE(d.allowed);
  EXPECT_TRUE(d.cost_exceeds_limit);
  EXPECT_EQ(d.retry_after_ms, 0);
  EXPECT_TRUE(isIdle(rule, key.state(), 0));
}

// A global rule of two limits, for each algorithm that splits into parts.
Rule twoLimitGlobalRule(Algorithm algorithm) {
  bool bucket = algorithm == Algorithm::kTokenBucket || algorithm == Algorithm::kGcra;
  Rule rule = makeRule(algorithm, {Limit{5, kSecond, bucket ? 3 : 5},
                                   Limit{12, 5 * kSecond, 12}});
  rule.scope = Scope::kGlobal;
  rule.id = 1;
  return rule;
}

void expectSameDecision(const Decision& merged, const Decision& local, int step) {
  EXPECT_EQ(merged.allowed, local.allowed) << "step " << step;
  EXPECT_EQ(merged.remaining, local.remaining) << "step " << step;
  EXPECT_EQ(merged.limit, local.limit) << "step " << step;
  EXPECT_EQ(merged.reset_after_ms, local.reset_after_ms) << "step " << step;
  EXPECT_EQ(merged.retry_after_ms, local.retry_after_ms) << "step " << step;
  EXPECT_EQ(merged.cost_exceeds_limit, local.cost_exceeds_limit) << "step " << step;
}

class LimiterParts : public ::testing::TestWithParam<Algorithm> {};

// Verifies that deciding a rule of several limits on its parts (RuleSet::parts),
// all or nothing with acquireAll and reported through MostRestrictive, as
// the dispatcher decides a global rule that leases its limits one by one,
// answers exactly as the limiter answers the rule on one state: every
// field, on a simulated clock stepped by irregular amounts, with costs from
// 1 to above the tighter limit, and for peek as well.
TEST_P(LimiterParts, MergedPartsDecideAsTheRuleOfSeveralLimits) {
  const RuleSet rules({twoLimitGlobalRule(GetParam())});
  const Rule& rule = *rules.find("test");
  ASSERT_EQ(rules.parts(rule).size(), 2u);
  Key whole(rule);
  std::vector<Key> part_keys;
  part_keys.reserve(2);
  for (const Rule& part : rules.parts(rule)) part_keys.emplace_back(part);
  uint64_t seed = 12345;
  auto next = [&seed](uint64_t bound) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return (seed >> 33) % bound;
  };
  int64_t now_ns = kSecond;
  int allowed = 0;
  for (int step = 0; step < 3000; ++step) {
    now_ns += static_cast<int64_t>(next(4) == 0 ? next(2000) : next(150)) * kMs;
    const int64_t cost = static_cast<int64_t>(next(20) == 0 ? 6 : 1 + next(3));
    std::vector<AcquireItem> items;
    for (size_t i = 0; i < 2; ++i) {
      items.push_back({&rules.parts(rule)[i], part_keys[i].state(), cost, {}});
    }
    const Decision local = acquire(rule, whole.state(), now_ns, cost);
    const bool all = acquireAll(items, now_ns);
    MostRestrictive merged;
    for (const AcquireItem& item : items) merged.add(item.decision);
    EXPECT_EQ(all, local.allowed) << "step " << step;
    expectSameDecision(merged.decision(), local, step);
    allowed += local.allowed;

    MostRestrictive peeked;
    for (size_t i = 0; i < 2; ++i) {
      peeked.add(peek(rules.parts(rule)[i], part_keys[i].state(), now_ns, cost));
    }
    expectSameDecision(peeked.decision(), peek(rule, whole.state(), now_ns, cost), step);
    if (HasFailure()) return;
  }
  // Both limits bound at times: neither all nor none passed.
  EXPECT_GT(allowed, 300);
  EXPECT_LT(allowed, 2500);
}

INSTANTIATE_TEST_SUITE_P(Algorithms, LimiterParts,
                         ::testing::Values(Algorithm::kTokenBucket, Algorithm::kGcra,
                                           Algorithm::kFixedWindow, Algorithm::kSlidingWindow));

// Verifies the order MostRestrictive keeps: any denial over allowances, a
// cost that can never pass over any other denial, then the longest retry;
// among allowances the fewest remaining; the earlier on a tie.
TEST(Limiter, MostRestrictiveRanksDenialsThenRetryThenRemaining) {
  auto decision = [](bool allowed, int64_t remaining, int64_t retry_ms, int64_t limit) {
    Decision d;
    d.allowed = allowed;
    d.remaining = remaining;
    d.retry_after_ms = retry_ms;
    d.limit = limit;
    return d;
  };
  MostRestrictive allowances;
  EXPECT_TRUE(allowances.add(decision(true, 7, 0, 10)));
  EXPECT_TRUE(allowances.add(decision(true, 3, 0, 20)));
  EXPECT_FALSE(allowances.add(decision(true, 3, 0, 30)));  // a tie keeps the earlier
  EXPECT_EQ(allowances.decision().limit, 20);
  MostRestrictive denials;
  denials.add(decision(true, 0, 0, 10));
  EXPECT_TRUE(denials.add(decision(false, 0, 500, 20)));
  EXPECT_TRUE(denials.add(decision(false, 0, 900, 30)));
  EXPECT_FALSE(denials.add(decision(false, 0, 100, 40)));
  EXPECT_EQ(denials.decision().limit, 30);
  Decision hopeless = decision(false, 0, 0, 50);
  hopeless.cost_exceeds_limit = true;
  EXPECT_TRUE(denials.add(hopeless));
  EXPECT_FALSE(denials.add(decision(false, 0, 99'999, 60)));
  EXPECT_EQ(denials.decision().limit, 50);
}

// Verifies that a shadow rule's denial is reported as allowed, flagged, and spends nothing.
TEST(Limiter, ShadowRuleAllowsDenialsAndSpendsNothingOnThem) {
  const Rule rule = makeRule(Algorithm::kTokenBucket, {Limit{5, kSecond, 5}}, /*shadow=*/true);
  Key key(rule);
  for (int i = 0; i < 5; ++i) {
    const Decision d = acquire(rule, key.state(), 0, 1);
    EXPECT_TRUE(d.allowed);
    EXPECT_FALSE(d.shadow_denied);
  }
  const uint64_t before = key.words[0].load();
  const Decision d = acquire(rule, key.state(), 0, 1);
  EXPECT_TRUE(d.allowed);
  EXPECT_TRUE(d.shadow_denied);
  EXPECT_EQ(d.retry_after_ms, 0);
  EXPECT_EQ(key.words[0].load(), before);
  EXPECT_TRUE(peek(rule, key.state(), 0, 1).shadow_denied);
}

// Verifies that acquireAll spends every item's cost when all pass.
TEST(Limiter, AcquireAllSpendsEveryItemWhenAllPass) {
  const Rule a = makeRule(Algorithm::kGcra, {Limit{10, kSecond, 10}});
  const Rule b = makeRule(Algorithm::kSlidingWindow, {window(5, kSecond)});
  Key a1(a), b1(b);
  std::vector<AcquireItem> items = {{&a, a1.state(), 3, {}}, {&b, b1.state(), 2, {}}};
  EXPECT_TRUE(acquireAll(items, kSecond));
  EXPECT_EQ(items[0].decision.remaining, 7);
  EXPECT_EQ(items[1].decision.remaining, 3);
  EXPECT_EQ(peek(a, a1.state(), kSecond, 0).remaining, 7);
  EXPECT_EQ(peek(b, b1.state(), kSecond, 0).remaining, 3);
}

// Verifies that acquireAll across rules and keys spends nothing when one item
// denies: the earlier items' spends are given back.
TEST(Limiter, AcquireAllIsAllOrNothingAcrossRulesAndKeys) {
  const Rule a = makeRule(Algorithm::kTokenBucket, {Limit{10, kSecond, 10}});
  const Rule b = hundredPerMinuteAndTwentyPerTenSeconds();
  const Rule c = makeRule(Algorithm::kConcurrency, {window(2, kMinute)});
  Key a1(a), b1(b), b2(b), c1(c);
  ASSERT_EQ(drain(b, b2, 0), 20);
  std::vector<AcquireItem> items = {
      {&a, a1.state(), 4, {}}, {&b, b1.state(), 3, {}}, {&c, c1.state(), 2, {}}, {&b, b2.state(), 1, {}}};
  EXPECT_FALSE(acquireAll(items, 0));
  EXPECT_TRUE(items[0].decision.allowed);
  EXPECT_TRUE(items[2].decision.allowed);
  EXPECT_FALSE(items[3].decision.allowed);
  EXPECT_EQ(items[3].decision.retry_after_ms, 10'000);
  EXPECT_EQ(peek(a, a1.state(), 0, 0).remaining, 10);
  EXPECT_EQ(peek(b, b1.state(), 0, 0).remaining, 20);
  EXPECT_EQ(peek(c, c1.state(), 0, 0).remaining, 2);
  EXPECT_TRUE(isIdle(a, a1.state(), 0));
  EXPECT_TRUE(isIdle(b, b1.state(), 0));
  EXPECT_TRUE(isIdle(c, c1.state(), 0));
}

// Verifies that items after the denying one are reported as they alone would be answered.
TEST(Limiter, AcquireAllReportsItemsAfterADenialAsPeeks) {
  const Rule a = makeRule(Algorithm::kFixedWindow, {window(1, kSecond)});
  const Rule b = makeRule(Algorithm::kFixedWindow, {window(5, kSecond)});
  Key a1(a), b1(b);
  ASSERT_TRUE(acquire(a, a1.state(), 0, 1).allowed);
  std::vector<AcquireItem> items = {{&a, a1.state(), 1, {}}, {&b, b1.state(), 6, {}}};
  EXPECT_FALSE(acquireAll(items, 0));
  EXPECT_FALSE(items[0].decision.allowed);
  EXPECT_TRUE(items[1].decision.cost_exceeds_limit);
  EXPECT_TRUE(isIdle(b, b1.state(), 0));
}

// Verifies that a shadow item never denies the group, and its denial spends nothing.
TEST(Limiter, AcquireAllShadowItemNeverDeniesTheGroup) {
  const Rule shadow = makeRule(Algorithm::kFixedWindow, {window(1, kSecond)}, /*shadow=*/true);
  const Rule real = makeRule(Algorithm::kFixedWindow, {window(5, kSecond)});
  Key s1(shadow), r1(real);
  ASSERT_TRUE(acquire(shadow, s1.state(), 0, 1).allowed);
  std::vector<AcquireItem> items = {{&shadow, s1.state(), 1, {}}, {&real, r1.state(), 2, {}}};
  EXPECT_TRUE(acquireAll(items, 0));
  EXPECT_TRUE(items[0].decision.shadow_denied);
  EXPECT_EQ(peek(real, r1.state(), 0, 0).remaining, 3);
}

// Verifies that a group denied by a later item gives back a shadow item's real spend.
TEST(Limiter, AcquireAllRefundsAShadowItemsSpendWhenTheGroupIsDenied) {
  const Rule shadow = makeRule(Algorithm::kFixedWindow, {window(5, kSecond)}, /*shadow=*/true);
  const Rule real = makeRule(Algorithm::kFixedWindow, {window(1, kSecond)});
  Key s1(shadow), r1(real);
  std::vector<AcquireItem> items = {{&shadow, s1.state(), 2, {}}, {&real, r1.state(), 2, {}}};
  EXPECT_FALSE(acquireAll(items, 0));
  EXPECT_TRUE(isIdle(shadow, s1.state(), 0));
}

// Verifies that release frees held concurrency units on every limit of the rule.
TEST(Limiter, ReleaseFreesConcurrencyUnits) {
  const Rule rule = makeRule(Algorithm::kConcurrency, {window(3, kMinute), window(5, 0)});
  Key key(rule);
  EXPECT_EQ(drain(rule, key, 0), 3);
  const Decision d = release(rule, key.state(), kSecond, 2);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 2);
  EXPECT_EQ(drain(rule, key, kSecond), 2);
  release(rule, key.state(), kSecond, 100);
  EXPECT_TRUE(isIdle(rule, key.state(), kSecond));
}

// Verifies that release on a non-concurrency rule spends and frees nothing.
TEST(Limiter, ReleaseOnOtherAlgorithmsChangesNothing) {
  const Rule rule = makeRule(Algorithm::kTokenBucket, {Limit{5, kSecond, 5}});
  Key key(rule);
  ASSERT_TRUE(acquire(rule, key.state(), 0, 2).allowed);
  const Decision d = release(rule, key.state(), 0, 2);
  EXPECT_EQ(d.remaining, 3);
  EXPECT_EQ(peek(rule, key.state(), 0, 0).remaining, 3);
}

// Verifies that a crashed caller's concurrency units free themselves at their deadline.
TEST(Limiter, ConcurrencyDeadlinesFreeUnitsOfCrashedCallers) {
  const Rule rule = makeRule(Algorithm::kConcurrency, {window(2, 30 * kSecond)});
  Key key(rule);
  EXPECT_EQ(drain(rule, key, kSecond), 2);
  const Decision d = acquire(rule, key.state(), 10 * kSecond, 1);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after_ms, 21'000);
  EXPECT_FALSE(isIdle(rule, key.state(), 31 * kSecond - 1));
  EXPECT_TRUE(isIdle(rule, key.state(), 31 * kSecond));
  EXPECT_EQ(drain(rule, key, 31 * kSecond), 2);
}

class LimiterIdle : public ::testing::TestWithParam<Algorithm> {};

// Verifies that a key is idle when fresh, not after a spend, and idle again
// once the spend has aged out (two periods for every algorithm).
TEST_P(LimiterIdle, IsIdleExactlyWhenStateMatchesAFreshKey) {
  const Rule rule = makeRule(GetParam(), {Limit{5, kSecond, 5}, Limit{50, kMinute, 50}});
  Key key(rule);
  const int64_t start_ns = 7 * kMinute + 1;
  EXPECT_TRUE(isIdle(rule, key.state(), start_ns));
  ASSERT_TRUE(acquire(rule, key.state(), start_ns, 1).allowed);
  EXPECT_FALSE(isIdle(rule, key.state(), start_ns));
  EXPECT_TRUE(isIdle(rule, key.state(), start_ns + 2 * kMinute));
}

INSTANTIATE_TEST_SUITE_P(Algorithms, LimiterIdle,
                         ::testing::Values(Algorithm::kTokenBucket, Algorithm::kGcra, Algorithm::kFixedWindow,
                                           Algorithm::kSlidingWindow, Algorithm::kSlidingLog,
                                           Algorithm::kConcurrency));

class LimiterThreads : public ::testing::TestWithParam<Algorithm> {};

// Verifies that 4 threads racing on one fresh key with a period of a day are
// granted exactly the limit in total: the CAS loops lose nothing and grant
// nothing twice, including the refunds of a second limit.
TEST_P(LimiterThreads, FourThreadsOnOneKeyAreGrantedExactlyTheLimit) {
  constexpr int64_t kUnits = 60;
  const Rule rule = makeRule(GetParam(), {Limit{100, kDay, 100}, Limit{kUnits, kDay, kUnits}});
  Key key(rule);
  const int64_t now_ns = 3 * kDay + 12345;
  std::atomic<int64_t> granted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        if (acquire(rule, key.state(), now_ns, 1).allowed) granted.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(granted.load(), kUnits);
  // The first limit was spent exactly as often as the second allowed.
  const Rule first_only = makeRule(GetParam(), {Limit{100, kDay, 100}});
  EXPECT_EQ(peek(first_only, key.state().first(stateWords(first_only)), now_ns, 0).remaining, 100 - kUnits);
}

INSTANTIATE_TEST_SUITE_P(Algorithms, LimiterThreads,
                         ::testing::Values(Algorithm::kTokenBucket, Algorithm::kGcra, Algorithm::kFixedWindow,
                                           Algorithm::kSlidingWindow, Algorithm::kSlidingLog,
                                           Algorithm::kConcurrency));

// Verifies that threads acquiring and releasing concurrency units never hold
// more than the limit at once and leave nothing held.
TEST(Limiter, ThreadsAcquiringAndReleasingNeverExceedTheLimit) {
  constexpr int64_t kUnits = 8;
  const Rule rule = makeRule(Algorithm::kConcurrency, {window(kUnits, 0)});
  Key key(rule);
  std::atomic<int64_t> held{0};
  std::atomic<int64_t> most_held{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        if (!acquire(rule, key.state(), 0, 2).allowed) continue;
        const int64_t now_held = held.fetch_add(2) + 2;
        int64_t seen = most_held.load();
        while (now_held > seen && !most_held.compare_exchange_weak(seen, now_held)) {
        }
        held.fetch_sub(2);
        release(rule, key.state(), 0, 2);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_LE(most_held.load(), kUnits);
  EXPECT_TRUE(isIdle(rule, key.state(), 0));
}

// --- bounded waiting --------------------------------------------------------------

// Verifies that with several limits the request is due when the last limit's
// reservation is, and a denial by one limit leaves no reservation behind.
TEST(Limiter, WaitingOnSeveralLimitsIsDueWhenTheSlowestIs) {
  Rule rule = makeRule(Algorithm::kGcra, {Limit{10, kSecond, 1}, Limit{4, kSecond, 1}});
  Key key(rule);
  EXPECT_EQ(acquire(rule, key.state(), 0, 1, kSecond).wait_ns, 0);
  Decision second = acquire(rule, key.state(), 0, 1, kSecond);
  ASSERT_TRUE(second.allowed);
  EXPECT_EQ(second.wait_ns, 250 * kMs);  // 4/s is the slower
  // Within 300 ms the 10/s limit could reserve again, the 4/s one cannot:
  // denied, and the 10/s limit keeps only the two units above.
  EXPECT_FALSE(acquire(rule, key.state(), 0, 1, 300 * kMs).allowed);
  EXPECT_EQ(acquire(rule, key.state(), 0, 1, kSecond).wait_ns, 500 * kMs);
}

// Verifies that a shadow rule never holds a request back, and that the
// window algorithms answer at once whatever the wait.
TEST(Limiter, ShadowAndWindowRulesNeverWait) {
  Rule shadow = makeRule(Algorithm::kGcra, {Limit{10, kSecond, 1}}, /*shadow=*/true);
  Key shadow_key(shadow);
  for (int i = 0; i < 3; ++i) {
    Decision d = acquire(shadow, shadow_key.state(), 0, 1, kSecond);
    EXPECT_TRUE(d.allowed);
    EXPECT_EQ(d.wait_ns, 0);
  }
  Rule windowed = makeRule(Algorithm::kFixedWindow, {window(1, kSecond)});
  Key window_key(windowed);
  EXPECT_TRUE(acquire(windowed, window_key.state(), 0, 1, kSecond).allowed);
  Decision second = acquire(windowed, window_key.state(), 0, 1, kSecond);
  EXPECT_FALSE(second.allowed);
  EXPECT_EQ(second.wait_ns, 0);
}

// --- settle (reserve → settle, reservations.h) ----------------------------------

class LimiterSettle : public ::testing::TestWithParam<Algorithm> {};

// Verifies that on every settling algorithm a reserve of 100 settled at 30
// leaves the key as a spend of 30 would have.
TEST_P(LimiterSettle, ASmallerActualLeavesTheKeyAsIfOnlyTheActualWasSpent) {
  const Rule rule = makeRule(GetParam(), {window(100, kMinute)});
  Key key(rule);
  ASSERT_TRUE(acquire(rule, key.state(), kSecond, 100).allowed);
  const Decision settled = settle(rule, key.state(), kSecond, 2 * kSecond, 70, 0);
  EXPECT_TRUE(settled.allowed);
  // A bucket refills a little in the second between; a window does not.
  EXPECT_GE(settled.remaining, 70);
  EXPECT_LE(settled.remaining, 72);
  EXPECT_EQ(peek(rule, key.state(), 2 * kSecond, 0).remaining, settled.remaining);
}

// Verifies that on every settling algorithm an actual above the estimate is
// charged past the limit, reported as negative remaining, and denies what
// comes next.
TEST_P(LimiterSettle, ALargerActualIsDebtThatDeniesWhatComesNext) {
  const Rule rule = makeRule(GetParam(), {window(100, kMinute)});
  Key key(rule);
  ASSERT_TRUE(acquire(rule, key.state(), kSecond, 100).allowed);
  const Decision settled = settle(rule, key.state(), kSecond, kSecond, 0, 25);
  EXPECT_EQ(settled.remaining, -25);
  EXPECT_FALSE(settled.allowed);
  EXPECT_FALSE(acquire(rule, key.state(), kSecond, 1).allowed);
}

// Verifies that on every settling algorithm a debt is charged only as far
// as the key's bound (max_debt) past the limit: from a key with units left,
// those and the bound; from a key at its bound, nothing. The rest is unpaid.
TEST_P(LimiterSettle, ADebtIsChargedUpToTheKeysBound) {
  Rule rule = makeRule(GetParam(), {window(100, kMinute)});
  rule.max_debt = 40;
  Key key(rule);
  ASSERT_TRUE(acquire(rule, key.state(), kSecond, 70).allowed);
  int64_t charged = -1;
  Decision settled = settle(rule, key.state(), kSecond, kSecond, 0, 500, &charged);
  EXPECT_EQ(charged, 30 + 40);
  EXPECT_EQ(settled.remaining, -40);
  EXPECT_FALSE(settled.allowed);
  settled = settle(rule, key.state(), kSecond, kSecond, 0, 5, &charged);
  EXPECT_EQ(charged, 0);
  EXPECT_EQ(settled.remaining, -40);
  // A refund charges nothing.
  settle(rule, key.state(), kSecond, kSecond, 10, 0, &charged);
  EXPECT_EQ(charged, 0);
}

// Verifies that max_debt 0 keeps a key within its limit: the excess past
// what it has left is unpaid.
TEST_P(LimiterSettle, ADebtBoundOfZeroNeverPassesTheLimit) {
  Rule rule = makeRule(GetParam(), {window(100, kMinute)});
  rule.max_debt = 0;
  Key key(rule);
  ASSERT_TRUE(acquire(rule, key.state(), kSecond, 90).allowed);
  int64_t charged = -1;
  const Decision settled = settle(rule, key.state(), kSecond, kSecond, 0, 25, &charged);
  EXPECT_EQ(charged, 10);
  EXPECT_EQ(settled.remaining, 0);
}

INSTANTIATE_TEST_SUITE_P(Algorithms, LimiterSettle,
                         ::testing::Values(Algorithm::kTokenBucket, Algorithm::kGcra,
                                           Algorithm::kFixedWindow, Algorithm::kSlidingWindow),
                         [](const auto& info) { return std::string(algorithmName(info.param)); });

// Verifies that a rule of several limits settles on each of them, and
// reports the most restrictive afterwards.
TEST(Limiter, SettleGivesBackAndChargesOnEveryLimit) {
  const Rule rule = makeRule(Algorithm::kFixedWindow, {window(100, kMinute), window(1000, kDay)});
  Key key(rule);
  ASSERT_TRUE(acquire(rule, key.state(), 0, 80).allowed);
  EXPECT_EQ(settle(rule, key.state(), 0, 0, 50, 0).remaining, 70);
  EXPECT_EQ(settle(rule, key.state(), 0, 0, 0, 90).remaining, -20);
  // The next minute is fresh; the day still holds the 120 spent.
  EXPECT_EQ(peek(rule, key.state(), kMinute, 0).remaining, 100);
  EXPECT_TRUE(acquire(rule, key.state(), kMinute, 100).allowed);
  EXPECT_EQ(peek(rule, key.state(), 2 * kMinute, 0).remaining, 100);
}

// Verifies that a rule of several limits charges each up to its own bound
// (by default its limit) and reports the least charged, so the caller's
// unpaid is what some limit could not take.
TEST(Limiter, SettleChargesEachLimitUpToItsOwnBound) {
  const Rule rule = makeRule(Algorithm::kFixedWindow, {window(100, kMinute), window(400, kDay)});
  Key key(rule);
  ASSERT_TRUE(acquire(rule, key.state(), 0, 100).allowed);
  int64_t charged = -1;
  EXPECT_EQ(settle(rule, key.state(), 0, 0, 0, 300, &charged).remaining, -100);
  EXPECT_EQ(charged, 100);  // the minute's bound
  // The day took all 300 (its 300 left and none past): nothing left today.
  EXPECT_EQ(peek(rule, key.state(), kMinute, 0).remaining, 0);
}

}  // namespace
}  // namespace sluice

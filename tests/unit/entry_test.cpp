// Key entries (entry.h): which rules lease, and the layout of an entry's
// words.
#include "entry.h"

#include <gtest/gtest.h>

#include <atomic>
#include <utility>
#include <vector>

#include "limiter.h"
#include "penalty.h"
#include "slice.h"

namespace sluice {
namespace {

constexpr int64_t kMs = 1'000'000;

// Verifies which rules lease and what their capacity is.
TEST(LeasableTest, OnlySingleLimitRateRulesLease) {
  Rule rule;
  rule.scope = Scope::kGlobal;
  rule.limits = {Limit{.limit = 10, .period_ns = 1'000 * kMs, .burst = 20}};
  for (Algorithm algorithm : {Algorithm::kTokenBucket, Algorithm::kGcra, Algorithm::kFixedWindow,
                              Algorithm::kSlidingWindow, Algorithm::kSlidingLog}) {
    rule.algorithm = algorithm;
    EXPECT_TRUE(leasable(rule)) << algorithmName(algorithm);
  }
  rule.algorithm = Algorithm::kConcurrency;
  EXPECT_FALSE(leasable(rule));
  rule.algorithm = Algorithm::kTokenBucket;
  rule.limits.push_back(rule.limits.front());
  EXPECT_FALSE(leasable(rule));  // several limits decide on the share
  rule.limits.pop_back();
  rule.scope = Scope::kLocal;
  EXPECT_FALSE(leasable(rule));
  EXPECT_EQ(leaseCapacity(Limit{.limit = 10, .period_ns = kMs, .burst = 20}), 20);
  EXPECT_EQ(leaseCapacity(Limit{.limit = 10, .period_ns = kMs, .burst = 0}), 10);
}

// Verifies the entry layouts: a leasable rule's slice, then its penalty's
// words, then the override word; a share's state, its undebited word and its
// override word; and that the override recorded for a key (any of them, the
// last one too) is read back as decidingRule chose it.
TEST(EntryLayoutTest, OverrideWordFollowsTheStateAndPenalty) {
  Rule rule;
  rule.name = "api";
  rule.id = 3;
  rule.scope = Scope::kGlobal;
  rule.limits = {Limit{.limit = 10, .period_ns = 1'000 * kMs, .burst = 10}};
  rule.penalty = Penalty{.denials = 3, .window_ns = 1'000 * kMs, .block_ns = 1'000 * kMs};
  rule.overrides = {Override{Override::Match::kPrefix, "pro:", {Limit{100, 1'000 * kMs, 100}}},
                    Override{Override::Match::kKey, "acme", {Limit{40, 1'000 * kMs, 40}}}};
  RuleSet rules({rule}, 2);
  const Rule& global = *rules.find("api");
  const Rule& share = *rules.fallbackShare(global);
  EXPECT_EQ(entryWords(global), size_t{slice::kWords} + penalty::kWords + 1);
  EXPECT_EQ(entryWords(share), stateWords(share) + 2);
  for (auto [key, which] : {std::pair{"free", 0u}, {"pro:1", 1u}, {"acme", 2u}}) {
    std::vector<std::atomic<uint64_t>> words(entryWords(global));
    std::span<std::atomic<uint64_t>> span(words.data(), words.size());
    EXPECT_EQ(storedOverride(global, span), 0u) << key;  // not resolved yet
    const Rule& deciding = decidingRule(rules, global, key, span);
    EXPECT_EQ(&deciding, &rules.variant(global, which)) << key;
    EXPECT_EQ(storedOverride(global, span), which) << key;
    EXPECT_EQ(words[size_t{slice::kWords} + penalty::kWords].load(), which + 1) << key;
    EXPECT_EQ(penaltyState(global, span).data(), words.data() + slice::kWords) << key;
  }
}

}  // namespace
}  // namespace sluice

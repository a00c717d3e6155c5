// Tests for the rule set (daemon/rules.h): which override decides a key, and
// the glob matching behind it.
#include "rules.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace sluice {
namespace {

constexpr int64_t kMinuteNs = 60'000'000'000;

Override override(Override::Match match, std::string pattern, int64_t limit) {
  return Override{match, std::move(pattern), {Limit{limit, kMinuteNs, limit}}};
}

// A tiers rule: free keys get 10 a minute, "pro:" 100, "pro:vip:" 500, the
// partner "acme" 1000, and keys ending in "-eu" 20.
RuleSet tiers() {
  Rule rule;
  rule.name = "api";
  rule.id = 7;
  rule.limits = {Limit{10, kMinuteNs, 10}};
  rule.overrides = {override(Override::Match::kPrefix, "pro:", 100),
                    override(Override::Match::kGlob, "*-eu", 20),
                    override(Override::Match::kPrefix, "pro:vip:", 500),
                    override(Override::Match::kKey, "acme", 1000)};
  Rule plain;
  plain.name = "plain";
  plain.id = 8;
  plain.limits = {Limit{5, kMinuteNs, 5}};
  return RuleSet({rule, plain});
}

int64_t limitFor(const RuleSet& rules, std::string_view rule_name, std::string_view key) {
  const Rule& rule = *rules.find(rule_name);
  return rules.variant(rule, rules.matchOverride(rule, key)).limits.front().limit;
}

// Verifies the precedence: an exact key, then the longest prefix, then the
// first glob, and the rule's own limit for the rest.
TEST(RuleSetTest, OverridePrecedenceIsExactThenLongestPrefixThenGlob) {
  RuleSet rules = tiers();
  EXPECT_EQ(limitFor(rules, "api", "acme"), 1000);
  EXPECT_EQ(limitFor(rules, "api", "pro:vip:42"), 500);
  EXPECT_EQ(limitFor(rules, "api", "pro:42"), 100);
  EXPECT_EQ(limitFor(rules, "api", "pro:42-eu"), 100);  // a prefix wins over a glob
  EXPECT_EQ(limitFor(rules, "api", "free:42-eu"), 20);
  EXPECT_EQ(limitFor(rules, "api", "free:42"), 10);
  EXPECT_EQ(limitFor(rules, "api", "acme2"), 10);  // exact means exact
  EXPECT_EQ(limitFor(rules, "plain", "pro:42"), 5);
}

// Verifies that keys are matched as bytes: NUL bytes and braces are plain
// bytes, and a prefix is not found in the middle of a key.
TEST(RuleSetTest, OverridesMatchKeyBytes) {
  RuleSet rules = tiers();
  EXPECT_EQ(limitFor(rules, "api", std::string("pro:\0x", 6)), 100);
  EXPECT_EQ(limitFor(rules, "api", std::string("\0pro:", 5)), 10);
  EXPECT_EQ(limitFor(rules, "api", "{pro:}"), 10);
}

// Verifies a variant is the rule with the override's limits, and variant 0
// the rule itself.
TEST(RuleSetTest, VariantsCarryTheOverridesLimits) {
  RuleSet rules = tiers();
  const Rule& api = *rules.find("api");
  EXPECT_EQ(&rules.variant(api, 0), &api);
  const Rule& pro = rules.variant(api, 1);
  EXPECT_EQ(pro.name, "api");
  EXPECT_EQ(pro.id, api.id);
  EXPECT_EQ(pro.limits.front().limit, 100);
  EXPECT_TRUE(pro.overrides.empty());
}

// Verifies a global rule's share keeps its overrides, each divided by the
// nodes as the rule is, matches keys as the rule does, and leaves the
// penalty to the rule's slice entries.
TEST(RuleSetTest, SharesOfAGlobalRuleDivideItsOverrides) {
  Rule rule;
  rule.name = "api";
  rule.id = 7;
  rule.scope = Scope::kGlobal;
  rule.limits = {Limit{10, kMinuteNs, 10}};
  rule.overrides = {override(Override::Match::kPrefix, "pro:", 100),
                    override(Override::Match::kKey, "acme", 1000)};
  rule.penalty = Penalty{3, kMinuteNs, kMinuteNs};
  RuleSet rules({rule}, 4);
  const Rule& global = *rules.find("api");
  const Rule& share = *rules.fallbackShare(global);
  EXPECT_FALSE(share.penalty);
  EXPECT_EQ(share.limits.front().limit, 2);  // 10 / 4, rounded down
  EXPECT_EQ(rules.matchOverride(share, "pro:1"), rules.matchOverride(global, "pro:1"));
  EXPECT_EQ(rules.variant(share, rules.matchOverride(share, "pro:1")).limits.front().limit, 25);
  EXPECT_EQ(rules.variant(share, rules.matchOverride(share, "acme")).limits.front().limit, 250);
  EXPECT_EQ(rules.variant(share, rules.matchOverride(share, "acme")).id, share.id);
  EXPECT_EQ(rules.variant(share, rules.matchOverride(share, "free:1")).limits.front().limit, 2);
  // The rule's own variants are the fleet's limits, undivided.
  EXPECT_EQ(rules.variant(global, rules.matchOverride(global, "pro:1")).limits.front().limit, 100);
}

constexpr int64_t kHourNs = 60 * kMinuteNs;

// A global rule of two limits (10 a minute, 100 an hour) with a penalty-free
// tier override, and rules that do not split.
std::vector<Rule> severalLimits() {
  Rule rule;
  rule.name = "api";
  rule.id = 7;
  rule.scope = Scope::kGlobal;
  rule.on_redis_down = RedisDownPolicy::kClosed;
  rule.limits = {Limit{10, kMinuteNs, 10}, Limit{100, kHourNs, 100}};
  rule.overrides = {Override{Override::Match::kPrefix, "pro:", {Limit{50, kMinuteNs, 50},
                                                                 Limit{1000, kHourNs, 1000}}},
                    Override{Override::Match::kKey, "acme", {Limit{20, kMinuteNs, 20},
                                                              Limit{400, kHourNs, 400}}}};
  Rule local = rule;
  local.name = "local";
  local.id = 8;
  local.scope = Scope::kLocal;
  local.overrides.clear();
  Rule held = local;
  held.name = "held";
  held.id = 9;
  held.scope = Scope::kGlobal;
  held.algorithm = Algorithm::kConcurrency;
  Rule one;
  one.name = "one";
  one.id = 10;
  one.scope = Scope::kGlobal;
  one.limits = {Limit{5, kMinuteNs, 5}};
  return {rule, local, held, one};
}

// Verifies a global rule of several limits splits into one part per limit:
// the rule with that limit alone (and each override's), a name no
// configured rule can have, an id derived from the rule's, no penalty or
// waiting; the other rules have none.
TEST(RuleSetTest, AGlobalRuleOfSeveralLimitsHasOnePartPerLimit) {
  std::vector<Rule> configured = severalLimits();
  configured[0].penalty = Penalty{3, kMinuteNs, kMinuteNs};
  configured[0].max_wait_ns = kMinuteNs;
  RuleSet rules(configured);
  const Rule& api = *rules.find("api");
  ASSERT_EQ(rules.parts(api).size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const Rule& part = rules.parts(api)[i];
    EXPECT_EQ(part.name, std::string("api\x1f") + std::to_string(i));
    EXPECT_EQ(part.name, partName("api", i));
    EXPECT_EQ(part.id, partId(api.id, i));
    EXPECT_EQ(part.algorithm, api.algorithm);
    EXPECT_EQ(part.scope, Scope::kGlobal);
    EXPECT_EQ(part.on_redis_down, RedisDownPolicy::kClosed);
    ASSERT_EQ(part.limits.size(), 1u);
    EXPECT_EQ(part.limits.front().limit, api.limits[i].limit);
    EXPECT_EQ(part.limits.front().period_ns, api.limits[i].period_ns);
    ASSERT_EQ(part.overrides.size(), 2u);
    EXPECT_EQ(part.overrides[0].pattern, "pro:");
    ASSERT_EQ(part.overrides[0].limits.size(), 1u);
    EXPECT_EQ(part.overrides[0].limits.front().limit, api.overrides[0].limits[i].limit);
    EXPECT_EQ(part.overrides[1].limits.front().limit, api.overrides[1].limits[i].limit);
    EXPECT_FALSE(part.penalty);
    EXPECT_EQ(part.max_wait_ns, 0);
    EXPECT_TRUE(rules.parts(part).empty());
  }
  EXPECT_TRUE(rules.parts(*rules.fallbackShare(api)).empty());
  EXPECT_TRUE(rules.parts(*rules.find("local")).empty());
  EXPECT_TRUE(rules.parts(*rules.find("held")).empty());
  EXPECT_TRUE(rules.parts(*rules.find("one")).empty());
  EXPECT_EQ(rules.parts().size(), 2u);
}

// Verifies parts are found by id but not by name, are not configured
// rules, and that their ids collide with no configured rule's, share's or
// other part's, and stay the same when the rule set is built again (a
// reload, a change of N) while the rule's id does.
TEST(RuleSetTest, PartsAreFoundByIdOnlyWithIdsOfTheirOwn) {
  RuleSet rules(severalLimits(), 2);
  const Rule& api = *rules.find("api");
  std::vector<uint32_t> ids;
  for (const Rule& rule : rules.rules()) {
    ids.push_back(rule.id);
    if (const Rule* share = rules.fallbackShare(rule)) ids.push_back(share->id);
    EXPECT_EQ(rule.id & ~kRuleIdMask, 0u);
  }
  for (const Rule& part : rules.parts(api)) {
    EXPECT_EQ(rules.findById(part.id), &part);
    EXPECT_EQ(rules.find(part.name), nullptr);
    const Rule* share = rules.fallbackShare(part);
    ASSERT_NE(share, nullptr);
    EXPECT_EQ(rules.findById(share->id), share);
    ids.push_back(part.id);
    ids.push_back(share->id);
    // A derived id names the configured rule it belongs to.
    EXPECT_EQ(part.id & kRuleIdMask, api.id);
    EXPECT_EQ(share->id & kRuleIdMask, api.id);
  }
  std::vector<uint32_t> sorted = ids;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());
  EXPECT_EQ(rules.rules().size(), 4u);
  // Rebuilt from the same rules (as a reload of an unchanged file does):
  // the same ids.
  RuleSet again(std::vector<Rule>(rules.rules()), 3);
  const Rule& api_again = *again.find("api");
  ASSERT_EQ(again.parts(api_again).size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(again.parts(api_again)[i].id, rules.parts(api)[i].id);
  }
}

// Verifies each part has its own fallback share, at the node's share of its
// limit and of each override's, matching keys as the rule does.
TEST(RuleSetTest, EachPartHasAShareOfItsLimit) {
  RuleSet rules(severalLimits(), 2);
  const Rule& api = *rules.find("api");
  const Rule& hourly = rules.parts(api)[1];
  const Rule& share = *rules.fallbackShare(hourly);
  EXPECT_EQ(share.id, hourly.id | kFallbackIdBit);
  EXPECT_EQ(share.scope, Scope::kLocal);
  ASSERT_EQ(share.limits.size(), 1u);
  EXPECT_EQ(share.limits.front().limit, 50);  // 100 / 2
  for (std::string_view key : {"pro:1", "acme", "free"}) {
    EXPECT_EQ(rules.matchOverride(hourly, key), rules.matchOverride(api, key)) << key;
    EXPECT_EQ(rules.matchOverride(share, key), rules.matchOverride(api, key)) << key;
  }
  EXPECT_EQ(rules.variant(hourly, rules.matchOverride(hourly, "pro:1")).limits.front().limit, 1000);
  EXPECT_EQ(rules.variant(hourly, rules.matchOverride(hourly, "acme")).limits.front().limit, 400);
  EXPECT_EQ(rules.variant(share, rules.matchOverride(share, "pro:1")).limits.front().limit, 500);
  EXPECT_EQ(rules.variant(share, rules.matchOverride(share, "free")).limits.front().limit, 50);
  const Rule& minutely_share = *rules.fallbackShare(rules.parts(api)[0]);
  EXPECT_EQ(rules.variant(minutely_share, rules.matchOverride(minutely_share, "acme"))
                .limits.front()
                .limit,
            10);  // 20 / 2
}

// Verifies glob matching: * any run (also empty), ? one byte, literals.
TEST(GlobTest, StarAndQuestionMark) {
  EXPECT_TRUE(globMatch("*", ""));
  EXPECT_TRUE(globMatch("*", "anything"));
  EXPECT_TRUE(globMatch("a*c", "ac"));
  EXPECT_TRUE(globMatch("a*c", "abbbc"));
  EXPECT_FALSE(globMatch("a*c", "abcd"));
  EXPECT_TRUE(globMatch("a?c", "abc"));
  EXPECT_FALSE(globMatch("a?c", "ac"));
  EXPECT_TRUE(globMatch("*-eu-*", "user-eu-1"));
  EXPECT_TRUE(globMatch("*a*a*a", "aaaa"));
  EXPECT_FALSE(globMatch("*a*a*b", "aaaaaaaa"));
  EXPECT_TRUE(globMatch("x*", "x*y"));
  EXPECT_FALSE(globMatch("", "x"));
}

}  // namespace
}  // namespace sluice

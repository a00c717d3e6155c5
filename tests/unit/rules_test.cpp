// Tests for the rule set (daemon/rules.h): which override decides a key, and
// the glob matching behind it.
#include "rules.h"

#include <gtest/gtest.h>

#include <string>

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

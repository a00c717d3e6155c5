// Tests for a ShouldRateLimit request as questions and their answers as a
// RateLimitResponse (daemon/envoy_rls.h).
#include "envoy_rls.h"

#include <gtest/gtest.h>

namespace sluice {
namespace {

constexpr std::string_view kYaml = R"(
domain: web
descriptors:
  - key: user
    name: per_user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: vip
    rate_limit: {unit: second, requests_per_unit: 100}
    replaces:
      - name: per_user
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: health
    unlimited: true
)";

EnvoyPolicy policy() {
  EnvoyPolicy out;
  EXPECT_EQ(readEnvoyYaml(kYaml, "rl.yaml", {}, &out), "");
  return out;
}

// Admits every limit override's rule, as the front does under its bound.
bool admitAll(std::string_view, const EnvoyLimit&) { return true; }

RateLimitRequest request(std::initializer_list<std::pair<const char*, const char*>> descriptors,
                         uint32_t hits = 0) {
  RateLimitRequest out;
  out.set_domain("web");
  out.set_hits_addend(hits);
  for (auto [key, value] : descriptors) {
    auto* entry = out.add_descriptors()->add_entries();
    entry->set_key(key);
    entry->set_value(value);
  }
  return out;
}

Decision decision(bool allowed, int64_t remaining, int64_t reset_ms, int64_t retry_ms = 0) {
  Decision out;
  out.allowed = allowed;
  out.remaining = remaining;
  out.reset_after_ms = reset_ms;
  out.retry_after_ms = retry_ms;
  return out;
}

TEST(EnvoyRls, LimitedDescriptorsBecomeItemsOfRuleKeyAndCost) {
  const EnvoyPolicy rules = policy();
  EnvoyPlan plan =
      planRequest(rules, request({{"user", "ann"}, {"nope", "x"}, {"health", "y"}}, 4), admitAll);
  ASSERT_EQ(plan.descriptors.size(), 3u);
  ASSERT_EQ(plan.rules.size(), 1u);
  EXPECT_EQ(plan.rules[0], "web/user");
  EXPECT_EQ(plan.keys[0], "ann");
  EXPECT_EQ(plan.costs[0], 4);
  EXPECT_EQ(plan.descriptors[0].item, 0);
  EXPECT_EQ(plan.descriptors[1].limit, nullptr);
  EXPECT_TRUE(plan.descriptors[2].limit->unlimited);
  EXPECT_EQ(plan.descriptors[2].item, -1);
}

TEST(EnvoyRls, UnsetHitsAddendSpendsOneAndADescriptorsOwnWins) {
  const EnvoyPolicy rules = policy();
  RateLimitRequest asked = request({{"user", "ann"}, {"path", "/"}});
  asked.mutable_descriptors(1)->mutable_hits_addend()->set_value(7);
  EnvoyPlan plan = planRequest(rules, asked, admitAll);
  ASSERT_EQ(plan.costs.size(), 2u);
  EXPECT_EQ(plan.costs[0], 1);
  EXPECT_EQ(plan.costs[1], 7);
}

TEST(EnvoyRls, ALimitThatReplacesAnotherLeavesItUnspent) {
  const EnvoyPolicy rules = policy();
  EnvoyPlan plan = planRequest(rules, request({{"user", "ann"}, {"vip", "ann"}}), admitAll);
  ASSERT_EQ(plan.rules.size(), 1u);
  EXPECT_EQ(plan.rules[0], "web/vip");
  EXPECT_EQ(plan.descriptors[0].limit, nullptr);
}

TEST(EnvoyRls, ADescriptorsOwnLimitIsDecidedOnItsOverrideRule) {
  const EnvoyPolicy rules = policy();
  RateLimitRequest asked = request({{"user", "ann"}, {"unknown", "x"}, {"path", "/"}});
  for (int i : {0, 1}) {
    auto* own = asked.mutable_descriptors(i)->mutable_limit();
    own->set_requests_per_unit(42);
    own->set_unit(2);  // MINUTE
  }
  asked.mutable_descriptors(2)->mutable_limit()->set_requests_per_unit(0);  // unset: ignored
  EnvoyPlan plan = planRequest(rules, asked, admitAll);
  ASSERT_EQ(plan.rules.size(), 3u);
  EXPECT_EQ(plan.rules[0], "web/=42/minute");
  EXPECT_EQ(plan.rules[1], "web/=42/minute");
  EXPECT_EQ(plan.rules[2], "web/path");
  // One override rule serves every descriptor: the entries' keys are in the key.
  EXPECT_EQ(plan.keys[0], "user=ann");
  EXPECT_EQ(plan.keys[1], "unknown=x");
  EXPECT_EQ(plan.descriptors[0].limit->name, "per_user");
  EXPECT_EQ(plan.descriptors[1].limit->requests_per_unit, 42u);

  const Rule rule = envoyOverrideRule("web", 42, EnvoyUnit::kMinute,
                                      {.scope = Scope::kLocal, .algorithm = Algorithm::kGcra});
  EXPECT_EQ(rule.name, "web/=42/minute");
  EXPECT_EQ(rule.algorithm, Algorithm::kGcra);
  ASSERT_EQ(rule.limits.size(), 1u);
  EXPECT_EQ(rule.limits[0].limit, 42);
  EXPECT_EQ(rule.limits[0].period_ns, 60'000'000'000);
}

TEST(EnvoyRls, AnOverrideRefusedItsRuleIsDecidedOnTheConfiguredLimit) {
  const EnvoyPolicy rules = policy();
  RateLimitRequest asked = request({{"user", "ann"}, {"unknown", "x"}});
  for (int i : {0, 1}) {
    auto* own = asked.mutable_descriptors(i)->mutable_limit();
    own->set_requests_per_unit(42);
    own->set_unit(2);  // MINUTE
  }
  std::vector<std::string> asked_for;
  EnvoyPlan plan = planRequest(rules, asked, [&](std::string_view domain, const EnvoyLimit& limit) {
    asked_for.push_back(std::string(domain) + " " + limit.rule);
    return false;
  });
  EXPECT_EQ(asked_for, (std::vector<std::string>{"web web/=42/minute", "web web/=42/minute"}));
  EXPECT_TRUE(plan.override_limits.empty());
  ASSERT_EQ(plan.rules.size(), 1u);
  EXPECT_EQ(plan.rules[0], "web/user");
  EXPECT_EQ(plan.keys[0], "ann");
  EXPECT_EQ(plan.descriptors[0].limit->requests_per_unit, 10u);
  EXPECT_FALSE(plan.descriptors[0].own_limit);
  EXPECT_EQ(plan.descriptors[1].limit, nullptr);  // unknown: OK, nothing spent
}

TEST(EnvoyRls, OverrideRulesOfTwoDomainsAndKeysOfTwoDescriptorsNeverMeet) {
  EXPECT_EQ(envoyOverrideRuleName("web", 1, EnvoyUnit::kSecond), "web/=1/second");
  // A domain that spells another's override rule is escaped apart from it.
  EXPECT_EQ(envoyOverrideRuleName("web/=1/second", 1, EnvoyUnit::kSecond),
            "web%2F%3D1%2Fsecond/=1/second");
  EXPECT_EQ(envoyOverrideRuleName("a\x1f", 5, EnvoyUnit::kDay), "a%1F/=5/day");
  // Two descriptors under one override rule: an `=` inside a key or value
  // does not make them one key.
  RateLimitRequest asked = request({{"a=b", "c"}, {"a", "b=c"}});
  for (int i : {0, 1}) {
    auto* own = asked.mutable_descriptors(i)->mutable_limit();
    own->set_requests_per_unit(3);
    own->set_unit(1);  // SECOND
  }
  EnvoyPlan plan = planRequest(policy(), asked, admitAll);
  ASSERT_EQ(plan.keys.size(), 2u);
  EXPECT_EQ(plan.keys[0], "a%3Db=c");
  EXPECT_EQ(plan.keys[1], "a=b%3Dc");
}

TEST(EnvoyRls, ADeniedDescriptorMakesTheOverallCodeOverLimit) {
  const EnvoyPolicy rules = policy();
  EnvoyPlan plan =
      planRequest(rules, request({{"user", "ann"}, {"path", "/"}, {"nope", "x"}}), admitAll);
  RateLimitResponse response;
  encodeResponse(plan, {{.decision = decision(true, 9, 60'000)}, {.decision = decision(false, 0, 3'600'000, 1'500)}},
                 &response);
  EXPECT_EQ(response.overall_code(), RateLimitResponse::OVER_LIMIT);
  ASSERT_EQ(response.statuses_size(), 3);
  EXPECT_EQ(response.statuses(0).code(), RateLimitResponse::OK);
  EXPECT_EQ(response.statuses(0).limit_remaining(), 9u);
  EXPECT_EQ(response.statuses(0).current_limit().name(), "per_user");
  EXPECT_EQ(response.statuses(0).current_limit().unit(), RateLimitResponse::RateLimit::MINUTE);
  EXPECT_EQ(response.statuses(0).duration_until_reset().seconds(), 60);
  EXPECT_EQ(response.statuses(1).code(), RateLimitResponse::OVER_LIMIT);
  EXPECT_EQ(response.statuses(1).current_limit().requests_per_unit(), 3u);
  EXPECT_FALSE(response.statuses(2).has_current_limit());
  EXPECT_EQ(response.statuses(2).code(), RateLimitResponse::OK);
  // The headers are the denied descriptor's: t= is when it may pass again.
  ASSERT_EQ(response.response_headers_to_add_size(), 2);
  EXPECT_EQ(response.response_headers_to_add(0).key(), "RateLimit-Policy");
  EXPECT_EQ(response.response_headers_to_add(0).value(), "\"web/path\";q=3;w=3600");
  EXPECT_EQ(response.response_headers_to_add(1).key(), "RateLimit");
  EXPECT_EQ(response.response_headers_to_add(1).value(), "\"web/path\";r=0;t=2");
}

TEST(EnvoyRls, AllowedDescriptorsReportTheFewestRemainingInTheHeaders) {
  const EnvoyPolicy rules = policy();
  EnvoyPlan plan = planRequest(rules, request({{"user", "ann"}, {"path", "/"}}), admitAll);
  RateLimitResponse response;
  encodeResponse(plan, {{.decision = decision(true, 9, 60'000)}, {.decision = decision(true, 2, 1'200'001)}},
                 &response);
  EXPECT_EQ(response.overall_code(), RateLimitResponse::OK);
  ASSERT_EQ(response.response_headers_to_add_size(), 2);
  EXPECT_EQ(response.response_headers_to_add(1).value(), "\"web/path\";r=2;t=1201");
}

TEST(EnvoyRls, AnErrorAnswerIsOkAndARequestWithoutLimitsHasNoHeaders) {
  const EnvoyPolicy rules = policy();
  EnvoyPlan plan = planRequest(rules, request({{"user", "ann"}}), admitAll);
  RateLimitResponse response;
  encodeResponse(plan, {{.failed = true, .decision = {}}}, &response);
  EXPECT_EQ(response.overall_code(), RateLimitResponse::OK);
  EXPECT_EQ(response.statuses(0).code(), RateLimitResponse::OK);
  EXPECT_EQ(response.response_headers_to_add_size(), 0);

  EnvoyPlan none = planRequest(rules, request({{"health", "x"}}), admitAll);
  RateLimitResponse empty;
  encodeResponse(none, {}, &empty);
  EXPECT_EQ(empty.overall_code(), RateLimitResponse::OK);
  EXPECT_EQ(empty.statuses_size(), 1);
  EXPECT_EQ(empty.response_headers_to_add_size(), 0);
}

}  // namespace
}  // namespace sluice

// Tests for envoyproxy/ratelimit's YAML as sluice rules (daemon/envoy_policy.h):
// the reference README's shapes, matching, and refusals naming line and fix.
#include "envoy_policy.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace sluice {
namespace {

EnvoyPolicy mustRead(std::string_view yaml, EnvoyRuleOptions options = {}) {
  EnvoyPolicy policy;
  const std::string error = readEnvoyYaml(yaml, "rl.yaml", options, &policy);
  EXPECT_EQ(error, "");
  return policy;
}

std::string refusal(std::string_view yaml) {
  EnvoyPolicy policy;
  return readEnvoyYaml(yaml, "rl.yaml", {}, &policy);
}

// The reference README's first example.
constexpr std::string_view kMongo = R"(
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
)";

// Nested descriptors, a key without value, a wildcard, shadow and unlimited.
constexpr std::string_view kEdge = R"(
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: remote_address
    value: 50.0.0.5
    unlimited: true
  - key: path
    value: /foo*
    rate_limit: {unit: hour, requests_per_unit: 7}
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        shadow_mode: true
        rate_limit:
          unit: day
          requests_per_unit: 5
)";

std::vector<EnvoyEntry> entries(std::initializer_list<std::pair<std::string_view, std::string_view>> list) {
  std::vector<EnvoyEntry> out;
  for (auto [key, value] : list) out.push_back({key, value});
  return out;
}

TEST(EnvoyPolicy, EachLimitedDescriptorBecomesARuleNamedByItsPath) {
  EnvoyPolicy policy = mustRead(kMongo, {.scope = Scope::kLocal, .algorithm = Algorithm::kGcra});
  ASSERT_EQ(policy.rules.size(), 2u);
  EXPECT_EQ(policy.rules[0].name, "mongo_cps/database=users");
  EXPECT_EQ(policy.rules[0].algorithm, Algorithm::kGcra);
  EXPECT_EQ(policy.rules[0].scope, Scope::kLocal);
  ASSERT_EQ(policy.rules[0].limits.size(), 1u);
  EXPECT_EQ(policy.rules[0].limits[0].limit, 500);
  EXPECT_EQ(policy.rules[0].limits[0].period_ns, 1'000'000'000);
}

TEST(EnvoyPolicy, AnExactValueWinsOverAKeyWithoutValue) {
  EnvoyPolicy policy = mustRead(kEdge);
  const EnvoyLimit* any = policy.match("edge_proxy_per_ip", entries({{"remote_address", "10.0.0.1"}}));
  ASSERT_NE(any, nullptr);
  EXPECT_EQ(any->rule, "edge_proxy_per_ip/remote_address");
  EXPECT_EQ(any->requests_per_unit, 10u);
  const EnvoyLimit* exact = policy.match("edge_proxy_per_ip", entries({{"remote_address", "50.0.0.5"}}));
  ASSERT_NE(exact, nullptr);
  EXPECT_TRUE(exact->unlimited);
  EXPECT_EQ(exact->rule, "");
}

TEST(EnvoyPolicy, AValueEndingInAStarMatchesByPrefix) {
  EnvoyPolicy policy = mustRead(kEdge);
  const EnvoyLimit* limit = policy.match("edge_proxy_per_ip", entries({{"path", "/foo/bar"}}));
  ASSERT_NE(limit, nullptr);
  EXPECT_EQ(limit->unit, EnvoyUnit::kHour);
  EXPECT_EQ(policy.match("edge_proxy_per_ip", entries({{"path", "/fo"}})), nullptr);
}

TEST(EnvoyPolicy, ANestedLimitAppliesOnlyToTheFullPathAndInheritsNothingAbove) {
  EnvoyPolicy policy = mustRead(kEdge);
  EXPECT_EQ(policy.match("edge_proxy_per_ip", entries({{"message_type", "marketing"}})), nullptr);
  const EnvoyLimit* limit = policy.match(
      "edge_proxy_per_ip", entries({{"message_type", "marketing"}, {"to_number", "2061111111"}}));
  ASSERT_NE(limit, nullptr);
  EXPECT_TRUE(limit->shadow);
  EXPECT_EQ(limit->rule, "edge_proxy_per_ip/message_type=marketing/to_number");
  EXPECT_EQ(policy.match("edge_proxy_per_ip",
                         entries({{"message_type", "marketing"}, {"to_number", "1"}, {"x", "y"}})),
            nullptr);
}

TEST(EnvoyPolicy, AnUnknownDomainOrKeyMatchesNothing) {
  EnvoyPolicy policy = mustRead(kEdge);
  EXPECT_EQ(policy.match("other", entries({{"remote_address", "1"}})), nullptr);
  EXPECT_EQ(policy.match("edge_proxy_per_ip", entries({{"nope", "1"}})), nullptr);
  EXPECT_EQ(policy.match("edge_proxy_per_ip", {}), nullptr);
}

TEST(EnvoyPolicy, AKeyIsTheValuesJoinedBySeparator) {
  EXPECT_EQ(envoyKey(entries({{"a", "x"}, {"b", "y"}})), std::string("x\x1fy"));
}

TEST(EnvoyPolicy, ReplacesAndNameAreKept) {
  EnvoyPolicy policy = mustRead(R"(
domain: d
descriptors:
  - key: user
    name: per_user
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: vip
    rate_limit: {unit: second, requests_per_unit: 50}
    replaces:
      - name: per_user
)");
  const EnvoyLimit* vip = policy.match("d", entries({{"vip", "1"}}));
  ASSERT_NE(vip, nullptr);
  EXPECT_EQ(vip->replaces, std::vector<std::string>{"per_user"});
  EXPECT_EQ(policy.match("d", entries({{"user", "1"}}))->name, "per_user");
}

TEST(EnvoyPolicy, AnUnknownUnitIsRefusedWithLineAndTheUnits) {
  EXPECT_EQ(refusal("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, "
                    "requests_per_unit: 1}\n"),
            "rl.yaml:4:24: unknown unit \"fortnight\"; write second, minute, hour or day");
}

TEST(EnvoyPolicy, AnUnknownKeyIsRefusedNamingTheKeys) {
  const std::string error = refusal("domain: d\ndescriptors:\n  - key: k\n    valeu: x\n");
  EXPECT_EQ(error.rfind("rl.yaml:4:5: unknown key \"valeu\" in a descriptor; the keys are key, ", 0),
            0u)
      << error;
}

TEST(EnvoyPolicy, AMissingDomainOrZeroRequestsIsRefused) {
  EXPECT_EQ(refusal("descriptors: []\n").rfind("rl.yaml:1:1: no domain;", 0), 0u);
  EXPECT_NE(refusal("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, "
                    "requests_per_unit: 0}\n")
                .find("rl.yaml:4:51: requests_per_unit must be a whole number"),
            std::string::npos);
}

TEST(EnvoyPolicy, ALimitAboveWhatTheAlgorithmCountsIsRefused) {
  EnvoyPolicy policy;
  const std::string yaml =
      "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, "
      "requests_per_unit: 2000000000}\n";
  EXPECT_EQ(readEnvoyYaml(yaml, "rl.yaml", {.scope = Scope::kLocal, .algorithm = Algorithm::kGcra},
                          &policy),
            "rl.yaml:4:51: requests_per_unit 2000000000 is above 1000000000, the most [envoy] "
            "algorithm = \"gcra\" counts; lower it or use algorithm = \"fixed_window\"");
  EnvoyPolicy windows;
  EXPECT_EQ(readEnvoyYaml(yaml, "rl.yaml", {}, &windows), "");
}

TEST(EnvoyPolicy, BrokenYamlIsRefusedWithItsPosition) {
  const std::string error = refusal("domain: d\ndescriptors:\n  - key: [k\n");
  EXPECT_EQ(error.rfind("rl.yaml:", 0), 0u) << error;
  EXPECT_NE(error.find("invalid YAML"), std::string::npos) << error;
}

TEST(EnvoyPolicy, ADescriptorTwiceAndADomainTwiceAreRefused) {
  EXPECT_NE(refusal("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, "
                    "requests_per_unit: 1}\n  - key: k\n    rate_limit: {unit: second, "
                    "requests_per_unit: 2}\n")
                .find("rl.yaml:5:5: descriptor \"d/k\" is configured twice"),
            std::string::npos);
  EnvoyPolicy policy;
  ASSERT_EQ(readEnvoyYaml("domain: d\n", "a.yaml", {}, &policy), "");
  EXPECT_EQ(readEnvoyYaml("domain: d\n", "b.yaml", {}, &policy).rfind("b.yaml:1:9: domain \"d\" is "
                                                                     "configured twice",
                                                                     0),
            0u);
}

}  // namespace
}  // namespace sluice

// Tests for envoyproxy/ratelimit's YAML as sluice rules (daemon/envoy_policy.h):
// the reference README's shapes, matching, and refusals naming line and fix.
#include "envoy_policy.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "config.h"

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

TEST(EnvoyPolicy, RulesFollowTheConfiguredRedisDownPolicy) {
  EnvoyPolicy policy = mustRead(kMongo, {.on_redis_down = RedisDownPolicy::kClosed});
  ASSERT_EQ(policy.rules.size(), 2u);
  EXPECT_EQ(policy.rules[0].scope, Scope::kGlobal);
  EXPECT_EQ(policy.rules[0].on_redis_down, RedisDownPolicy::kClosed);
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

TEST(EnvoyPolicy, AValueHoldingTheSeparatorMakesAKeyOfItsOwn) {
  const std::string joined = envoyKey(entries({{"a", "x"}, {"b", "y"}}));
  EXPECT_NE(envoyKey(entries({{"a", "x\x1fy"}})), joined);
  EXPECT_EQ(envoyKey(entries({{"a", "x\x1fy"}})), "x%1Fy");
  EXPECT_NE(envoyKey(entries({{"a", "x%1Fy"}})), envoyKey(entries({{"a", "x\x1fy"}})));
}

// Pairs of descriptors whose names would be one string if written as they
// are: a domain or key holding `/` or `=`, a value holding `/`.
TEST(EnvoyPolicy, NoTwoDescriptorsOfOneDomainOrOfTwoShareARuleName) {
  EnvoyPolicy policy;
  const char* files[] = {
      "domain: a/b\ndescriptors:\n  - key: c\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
      "domain: a\ndescriptors:\n  - key: b\n    descriptors:\n      - key: c\n        rate_limit: "
      "{unit: second, requests_per_unit: 2}\n",
      "domain: d\ndescriptors:\n"
      "  - key: x=y\n    rate_limit: {unit: second, requests_per_unit: 3}\n"
      "  - key: x\n    value: y\n    rate_limit: {unit: second, requests_per_unit: 4}\n"
      "  - key: p\n    value: x/q\n    rate_limit: {unit: second, requests_per_unit: 5}\n"
      "  - key: p\n    value: x\n    descriptors:\n      - key: q\n        rate_limit: "
      "{unit: second, requests_per_unit: 6}\n"
      "  - key: path\n    value: /api/*\n    rate_limit: {unit: second, requests_per_unit: 7}\n"
      "  - key: limit\n    value: \"42\"\n    descriptors:\n      - key: minute\n"
      "        rate_limit: {unit: second, requests_per_unit: 8}\n",
  };
  for (const char* file : files) ASSERT_EQ(readEnvoyYaml(file, "rl.yaml", {}, &policy), "");
  std::vector<std::string> names;
  for (const Rule& rule : policy.rules) names.push_back(rule.name);
  EXPECT_EQ(names, (std::vector<std::string>{"a%2Fb/c", "a/b/c", "d/x%3Dy", "d/x=y", "d/p=x%2Fq",
                                             "d/p=x/q", "d/path=%2Fapi%2F*", "d/limit=42/minute"}));
  for (const std::string& name : names) {
    EXPECT_EQ(name.find(kEnvoyOverrideMark), std::string::npos) << name;
  }
  // Each still matches as written.
  EXPECT_EQ(policy.match("a/b", entries({{"c", "1"}}))->rule, "a%2Fb/c");
  EXPECT_EQ(policy.match("d", entries({{"p", "x/q"}}))->rule, "d/p=x%2Fq");
  EXPECT_EQ(policy.match("d", entries({{"path", "/api/v1"}}))->rule, "d/path=%2Fapi%2F*");
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

// A YAML file of kMongo in /tmp, removed at the end of the test.
class EnvoySection : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = "/tmp/envoy_section_" + std::to_string(::getpid()) + ".yaml";
    std::ofstream(path_) << kMongo;
  }
  void TearDown() override { std::remove(path_.c_str()); }
  ConfigResult load(const std::string& envoy, bool redis = false) {
    std::string text = redis ? "[redis]\nurl = \"redis://127.0.0.1:6379\"\n" : "";
    text += "[envoy]\n" + envoy;
    return loadConfigString(text, "x.toml");
  }
  std::string path_;
};

TEST_F(EnvoySection, ItsLimitsJoinTheRuleSetLocalWithoutRedis) {
  ConfigResult result = load("listen = \"127.0.0.1:8081\"\nconfig = \"" + path_ + "\"\n");
  ASSERT_TRUE(result.ok()) << result.error;
  const Rule* rule = result.config->rules->find("mongo_cps/database=users");
  ASSERT_NE(rule, nullptr);
  EXPECT_EQ(rule->scope, Scope::kLocal);
  EXPECT_NE(rule->id, 0u);
  EXPECT_EQ(result.config->envoy->policy->domains.size(), 1u);
}

TEST_F(EnvoySection, ItsOptionsShapeTheRules) {
  ConfigResult result = load("listen = \"unix:/tmp/rls.sock\"\nconfig = \"" + path_ +
                                 "\"\nalgorithm = \"gcra\"\non_redis_down = \"open\"\n"
                                 "all_or_nothing = true\nthreads = 2\npoll_spin_us = 50\n",
                             true);
  ASSERT_TRUE(result.ok()) << result.error;
  const Rule* rule = result.config->rules->find("mongo_cps/database=default");
  ASSERT_NE(rule, nullptr);
  EXPECT_EQ(rule->scope, Scope::kGlobal);
  EXPECT_EQ(rule->algorithm, Algorithm::kGcra);
  EXPECT_EQ(rule->on_redis_down, RedisDownPolicy::kOpen);
  EXPECT_TRUE(result.config->envoy->all_or_nothing);
  EXPECT_EQ(result.config->envoy->threads, 2);
  EXPECT_EQ(result.config->envoy->poll_spin_us, 50);
}

TEST_F(EnvoySection, MistakesAreRefusedWithLineAndFix) {
  EXPECT_EQ(load("listen = \"127.0.0.1:8081\"\nconfig = \"" + path_ + "\"\nscope = \"global\"\n")
                .error,
            "x.toml:4:9: [envoy] scope = \"global\" needs Redis; add a [redis] section or write "
            "scope = \"local\"");
  EXPECT_EQ(load("listen = \"127.0.0.1:8081\"\nconfig = \"" + path_ + "\"\nalgoritm = \"gcra\"\n")
                .error,
            "x.toml:4:1: unknown option \"algoritm\" in [envoy]; did you mean \"algorithm\"?");
  EXPECT_EQ(load("config = \"" + path_ + "\"\n").error.rfind("x.toml:1:1: [envoy] has no listen;", 0),
            0u);
  const std::string missing = load("listen = \"127.0.0.1:8081\"\nconfig = \"/nonexistent/*.yaml\"\n").error;
  EXPECT_EQ(missing.rfind("x.toml:3:10: [envoy] config: /nonexistent/*.yaml: no file matches;", 0), 0u)
      << missing;
  EXPECT_EQ(load("listen = \"127.0.0.1:8081\"\nconfig = \"" + path_ + "\"\nthreads = 0\n").error,
            "x.toml:4:11: [envoy] threads is 0; write 1 to 64 (1, the default, costs the least "
            "per call)");
  EXPECT_EQ(load("listen = \"127.0.0.1:8081\"\nconfig = \"" + path_ + "\"\npoll_spin_us = 5000\n")
                .error,
            "x.toml:4:16: [envoy] poll_spin_us is 5000; write 0 to 1000 (0, the default, sleeps "
            "at once)");
}

TEST_F(EnvoySection, ARuleNamedAsADescriptorOrAnOverrideRuleIsRefused) {
  const std::string envoy = "listen = \"127.0.0.1:8081\"\nconfig = \"" + path_ + "\"\n";
  const std::string rule = "[[rule]]\nlimit = 1\nperiod = \"1s\"\nname = ";
  EXPECT_EQ(load(envoy + rule + "\"mongo_cps/database=users\"\n").error,
            "x.toml:1:1: rule \"mongo_cps/database=users\" is both a [[rule]] and a descriptor of "
            "[envoy] config; rename the [[rule]]");
  EXPECT_EQ(load(envoy + rule + "\"web/=42/minute\"\n").error,
            "x.toml:1:1: rule \"web/=42/minute\" has \"/=\", which marks the rules of Envoy's "
            "limit overrides; rename the [[rule]]");
  EXPECT_TRUE(load(envoy + rule + "\"web/limit=42/minute\"\n").ok());
}

}  // namespace
}  // namespace sluice

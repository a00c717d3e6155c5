// envoy_yaml_fuzz: any bytes as an envoyproxy/ratelimit YAML file, through
// readEnvoyYaml (yaml-cpp and every check of daemon/envoy_policy.cpp).
//
// Properties checked: a refusal names the file first ("fuzz.yaml:"); an
// accepted file gives one domain, a rule per limit that is not unlimited,
// each named without control characters, with one limit of 1 unit or more
// within its algorithm's bound and a period of a second to a day, and
// every limit's rule among the rules.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "envoy_policy.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sluice;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (Algorithm algorithm : {Algorithm::kFixedWindow, Algorithm::kGcra}) {
    EnvoyPolicy policy;
    const std::string error =
        readEnvoyYaml(text, "fuzz.yaml", {.scope = Scope::kLocal, .algorithm = algorithm}, &policy);
    if (!error.empty()) {
      FUZZ_CHECK(error.rfind("fuzz.yaml:", 0) == 0, "a refusal names the file");
      continue;
    }
    FUZZ_CHECK(policy.domains.size() == 1, "an accepted file has one domain");
    size_t limited = 0;
    for (const EnvoyLimit& limit : policy.limits) {
      if (limit.unlimited) {
        FUZZ_CHECK(limit.rule.empty(), "an unlimited descriptor has no rule");
        continue;
      }
      ++limited;
      bool found = false;
      for (const Rule& rule : policy.rules) found = found || rule.name == limit.rule;
      FUZZ_CHECK(found, "a limit's rule is among the rules");
    }
    FUZZ_CHECK(limited == policy.rules.size(), "one rule per limited descriptor");
    for (const Rule& rule : policy.rules) {
      for (char c : rule.name) {
        FUZZ_CHECK(static_cast<unsigned char>(c) >= 0x20 && c != 0x7f,
                   "a rule name has no control character");
      }
      FUZZ_CHECK(rule.limits.size() == 1, "a rule has one limit");
      const Limit& only = rule.limits[0];
      FUZZ_CHECK(only.limit >= 1 && only.limit <= maxLimit(algorithm), "a limit is in range");
      FUZZ_CHECK(only.period_ns >= 1'000'000'000 && only.period_ns <= 86'400'000'000'000,
                 "a period is a second to a day");
    }
  }
  return 0;
}

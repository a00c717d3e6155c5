// config_fuzz: any bytes as a config file, through loadConfigString (the
// TOML parser and every check of daemon/config.cpp), and as a duration.
//
// Properties checked: a refusal names the file first ("fuzz.toml:line:col: "
// or "fuzz.toml: "); an accepted file holds what config.h and rules.h promise
// of it: a rule set, every rule findable by its name and id, ids non-zero
// and below kFallbackIdBit, limits, bursts and periods within their bounds,
// global rules only with [redis], a frame that holds the longest key. A
// duration is never negative.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "config.h"
#include "fuzz_check.h"
#include "rules.h"

namespace sluice {
namespace {

void checkAccepted(const Config& config) {
  FUZZ_CHECK(config.path == "fuzz.toml", "a config knows its source");
  FUZZ_CHECK(config.rules != nullptr, "a loaded config has a rule set");
  FUZZ_CHECK(config.limits.max_frame_bytes >= uint64_t{config.limits.max_key_bytes} + 256,
             "a frame holds the longest key");
  for (const Rule& rule : config.rules->rules()) {
    FUZZ_CHECK(config.rules->find(rule.name) == &rule, "a rule is found by its name");
    FUZZ_CHECK(config.rules->findById(rule.id) == &rule, "a rule is found by its id");
    FUZZ_CHECK(rule.id != 0 && rule.id < kFallbackIdBit, "a rule id is in range");
    FUZZ_CHECK(!rule.limits.empty(), "a rule has a limit");
    FUZZ_CHECK(rule.scope == Scope::kLocal || config.redis.has_value(),
               "a global rule needs [redis]");
    if (rule.scope == Scope::kGlobal) {
      FUZZ_CHECK(config.rules->fallbackShare(rule) != nullptr, "a global rule has a share");
    }
    const int64_t most = maxLimit(rule.algorithm);
    for (const Limit& limit : rule.limits) {
      FUZZ_CHECK(limit.limit >= 1 && limit.limit <= most, "a limit is in range");
      FUZZ_CHECK(limit.burst >= 1 && limit.burst <= most, "a burst is in range");
      bool unbounded_hold = rule.algorithm == Algorithm::kConcurrency && limit.period_ns == 0;
      FUZZ_CHECK(unbounded_hold || (limit.period_ns >= kMinPeriodNs && limit.period_ns <= kMaxPeriodNs),
                 "a period is in range");
    }
  }
}

}  // namespace
}  // namespace sluice

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sluice;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  ConfigResult result = loadConfigString(text, "fuzz.toml");
  if (result.ok()) {
    checkAccepted(*result.config);
  } else {
    FUZZ_CHECK(result.error.starts_with("fuzz.toml:"), "a refusal names the file first");
  }
  if (std::optional<int64_t> ns = parseDurationNs(text)) {
    FUZZ_CHECK(*ns >= 0, "a duration is never negative");
  }
  return 0;
}

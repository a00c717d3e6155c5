// config_fuzz: any bytes as a config file, through loadConfigString (the
// TOML parser and every check of daemon/config*.cpp), and as a duration.
//
// Properties checked: a refusal names the file first ("fuzz.toml:line:col: "
// or "fuzz.toml: "); an accepted file holds what config.h and rules.h promise
// of it: a rule set, every rule findable by its name and id, ids non-zero
// and within kRuleIdMask, names without control characters, limits, bursts
// and periods within their bounds, global rules only with [redis], each with
// a share and, of several limits that lease, a part per limit (found by id,
// one limit each); overrides with as many limits as their rule, and no
// empty prefix (it would match every key); a penalty with a count and durations in range
// (on a global rule, one of one limit that leases); max_wait and pace only
// where a rule can wait, max_wait within kMaxWaitNs, pace with bursts of 1;
// and a frame that holds the longest key. A duration is never negative.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "config.h"
#include "fuzz_check.h"
#include "rules.h"

namespace sluice {
namespace {

// Limits (a rule's or an override's) within the algorithm's bounds.
void checkLimits(const Rule& rule, const std::vector<Limit>& limits) {
  const int64_t most = maxLimit(rule.algorithm);
  for (const Limit& limit : limits) {
    FUZZ_CHECK(limit.limit >= 1 && limit.limit <= most, "a limit is in range");
    FUZZ_CHECK(limit.burst >= 1 && limit.burst <= most, "a burst is in range");
    bool unbounded_hold = rule.algorithm == Algorithm::kConcurrency && limit.period_ns == 0;
    FUZZ_CHECK(unbounded_hold || (limit.period_ns >= kMinPeriodNs && limit.period_ns <= kMaxPeriodNs),
               "a period is in range");
  }
}

void checkAccepted(const Config& config) {
  FUZZ_CHECK(config.path == "fuzz.toml", "a config knows its source");
  FUZZ_CHECK(config.rules != nullptr, "a loaded config has a rule set");
  FUZZ_CHECK(config.limits.max_frame_bytes >= uint64_t{config.limits.max_key_bytes} + 256,
             "a frame holds the longest key");
  for (const Rule& rule : config.rules->rules()) {
    FUZZ_CHECK(config.rules->find(rule.name) == &rule, "a rule is found by its name");
    FUZZ_CHECK(config.rules->findById(rule.id) == &rule, "a rule is found by its id");
    FUZZ_CHECK(rule.id != 0 && rule.id <= kRuleIdMask, "a configured rule's id is in range");
    for (char c : rule.name) {
      FUZZ_CHECK(static_cast<unsigned char>(c) >= 0x20 && c != 0x7f, "a name has no control characters");
    }
    FUZZ_CHECK(!rule.limits.empty(), "a rule has a limit");
    FUZZ_CHECK(rule.scope == Scope::kLocal || config.redis.has_value(),
               "a global rule needs [redis]");
    if (rule.scope == Scope::kGlobal) {
      FUZZ_CHECK(config.rules->fallbackShare(rule) != nullptr, "a global rule has a share");
    }
    checkLimits(rule, rule.limits);
    std::span<const Rule> parts = config.rules->parts(rule);
    FUZZ_CHECK(parts.size() == (splitsIntoParts(rule) ? rule.limits.size() : 0),
               "a global rule of several limits that lease has a part per limit");
    for (size_t i = 0; i < parts.size(); ++i) {
      FUZZ_CHECK(config.rules->findById(parts[i].id) == &parts[i] && parts[i].limits.size() == 1 &&
                     parts[i].limits[0].limit == rule.limits[i].limit,
                 "a part is found by its id and has its rule's limit");
      FUZZ_CHECK(config.rules->find(parts[i].name) == nullptr, "a part is not found by name");
    }
    for (const Override& override : rule.overrides) {
      FUZZ_CHECK(override.limits.size() == rule.limits.size(),
                 "an override has as many limits as its rule");
      FUZZ_CHECK(override.match != Override::Match::kPrefix || !override.pattern.empty(),
                 "no prefix override matches every key");
      checkLimits(rule, override.limits);
    }
    if (rule.penalty) {
      FUZZ_CHECK(rule.penalty->denials >= 1 && rule.penalty->window_ns >= kMinPeriodNs &&
                     rule.penalty->block_ns >= kMinPeriodNs,
                 "a penalty's count and durations are in range");
      FUZZ_CHECK(rule.scope == Scope::kLocal || (rule.limits.size() == 1 && hasRateLeaseScript(rule.algorithm)),
                 "a penalty on a global rule is on one that leases one limit");
    }
    if (rule.max_wait_ns > 0 || rule.pace) {
      FUZZ_CHECK(canWait(rule), "max_wait and pace are on a rule that can wait");
    }
    FUZZ_CHECK(rule.max_wait_ns >= 0 && rule.max_wait_ns <= kMaxWaitNs, "max_wait is in range");
    for (const Limit& limit : rule.limits) {
      FUZZ_CHECK(!rule.pace || limit.burst == 1, "pace lets one unit through at a time");
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

// EnvoyRls: ShouldRateLimit requests as the seam's items, and decisions as
// a RateLimitResponse (envoy_rls.h). Pure; no clock, no I/O.
#include "envoy_rls.h"

#include <algorithm>
#include <array>
#include <limits>
#include <set>
#include <string_view>

namespace sluice {
namespace {

using Code = RateLimitResponse::Code;

// A structured-field string (RFC 8941): quoted, with \ and " escaped.
std::string sfString(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  out += '"';
  return out;
}

uint32_t clampU32(int64_t value) {
  return static_cast<uint32_t>(std::clamp<int64_t>(value, 0, std::numeric_limits<uint32_t>::max()));
}

// Whole seconds, rounded up (a header's t= and w=).
int64_t ceilSeconds(int64_t ms) { return ms <= 0 ? 0 : (ms + 999) / 1000; }

}  // namespace

EnvoyPlan planRequest(const EnvoyPolicy& policy, const RateLimitRequest& request,
                      const AdmitOverride& admit) {
  EnvoyPlan plan;
  const int descriptor_count = request.descriptors_size();
  plan.descriptors.resize(static_cast<size_t>(descriptor_count));
  std::vector<EnvoyEntry> entries;
  std::set<std::string_view> replaced;
  for (int i = 0; i < descriptor_count; ++i) {
    const auto& descriptor = request.descriptors(i);
    entries.clear();
    for (const auto& entry : descriptor.entries()) entries.push_back({entry.key(), entry.value()});
    const EnvoyLimit* limit = policy.match(request.domain(), entries);
    if (descriptor.has_limit()) {
      const auto& own = descriptor.limit();
      const auto unit = static_cast<EnvoyUnit>(own.unit());
      if (own.requests_per_unit() > 0 && envoyUnitNs(unit) > 0) {
        if (plan.override_limits.capacity() == 0) {
          plan.override_limits.reserve(static_cast<size_t>(descriptor_count));
        }
        EnvoyLimit& made = plan.override_limits.emplace_back();
        made.rule = envoyOverrideRuleName(request.domain(), own.requests_per_unit(), unit);
        made.requests_per_unit = own.requests_per_unit();
        made.unit = unit;
        made.shadow = limit != nullptr && limit->shadow;
        if (limit != nullptr) made.name = limit->name;
        if (admit(request.domain(), made)) {
          limit = &made;
          plan.descriptors[static_cast<size_t>(i)].own_limit = true;
        } else {
          plan.override_limits.pop_back();
        }
      }
    }
    if (limit == nullptr) continue;
    for (const std::string& name : limit->replaces) replaced.insert(name);
    plan.descriptors[static_cast<size_t>(i)].limit = limit;
  }
  const int64_t request_hits = request.hits_addend() == 0 ? 1 : request.hits_addend();
  for (int i = 0; i < descriptor_count; ++i) {
    EnvoyPlan::Descriptor& planned = plan.descriptors[static_cast<size_t>(i)];
    if (planned.limit == nullptr) continue;
    if (!planned.limit->name.empty() && replaced.contains(planned.limit->name)) {
      planned.limit = nullptr;
      continue;
    }
    if (planned.limit->unlimited) continue;
    const auto& descriptor = request.descriptors(i);
    entries.clear();
    for (const auto& entry : descriptor.entries()) entries.push_back({entry.key(), entry.value()});
    planned.item = static_cast<int>(plan.rules.size());
    plan.rules.push_back(planned.limit->rule);
    if (planned.own_limit) {
      // An override rule serves every descriptor: its keys are in the key.
      std::string key;
      for (size_t e = 0; e < entries.size(); ++e) {
        if (e > 0) key += kEnvoyKeySeparator;
        appendEnvoyNamePart(&key, entries[e].key);
        key += '=';
        appendEnvoyNamePart(&key, entries[e].value);
      }
      plan.keys.push_back(std::move(key));
    } else {
      plan.keys.push_back(envoyKey(entries));
    }
    const uint64_t hits = descriptor.has_hits_addend() ? descriptor.hits_addend().value()
                                                       : static_cast<uint64_t>(request_hits);
    plan.costs.push_back(static_cast<int64_t>(
        std::min<uint64_t>(hits, static_cast<uint64_t>(std::numeric_limits<uint32_t>::max()))));
  }
  return plan;
}

std::string envoyOverrideRuleName(std::string_view domain, uint32_t requests_per_unit,
                                  EnvoyUnit unit) {
  static constexpr std::array<std::string_view, 5> kUnitNames = {"unknown", "second", "minute",
                                                                 "hour", "day"};
  const auto index = static_cast<size_t>(unit);
  std::string name;
  appendEnvoyNamePart(&name, domain);
  name += kEnvoyOverrideMark;
  name += std::to_string(requests_per_unit);
  name += '/';
  name += index < kUnitNames.size() ? kUnitNames[index] : kUnitNames[0];
  return name;
}

Rule envoyOverrideRule(std::string_view domain, uint32_t requests_per_unit, EnvoyUnit unit,
                       const EnvoyRuleOptions& options) {
  Rule rule;
  rule.name = envoyOverrideRuleName(domain, requests_per_unit, unit);
  rule.algorithm = options.algorithm;
  const int64_t most = maxLimit(options.algorithm);
  const int64_t limit = std::min<int64_t>(requests_per_unit, most);
  rule.limits.push_back(Limit{.limit = limit, .period_ns = envoyUnitNs(unit), .burst = limit});
  rule.scope = options.scope;
  rule.on_redis_down = options.on_redis_down;
  return rule;
}

Item envoyItem(const EnvoyPlan& plan, size_t i) {
  return Item{.rule = plan.rules[i], .key = plan.keys[i], .cost = plan.costs[i]};
}

void encodeResponse(const EnvoyPlan& plan, const std::vector<EnvoyOutcome>& outcomes,
                    RateLimitResponse* response) {
  bool over = false;
  // The most restrictive limited descriptor: a denied one, else the fewest remaining.
  const EnvoyPlan::Descriptor* tightest = nullptr;
  const EnvoyOutcome* tightest_outcome = nullptr;
  for (const EnvoyPlan::Descriptor& planned : plan.descriptors) {
    auto* status = response->add_statuses();
    status->set_code(RateLimitResponse::OK);
    if (planned.limit == nullptr || planned.item < 0) continue;
    const EnvoyLimit& limit = *planned.limit;
    const EnvoyOutcome& outcome = outcomes[static_cast<size_t>(planned.item)];
    auto* current = status->mutable_current_limit();
    current->set_name(limit.name);
    current->set_requests_per_unit(limit.requests_per_unit);
    current->set_unit(static_cast<RateLimitResponse::RateLimit::Unit>(limit.unit));
    if (outcome.failed) continue;
    const Decision& decision = outcome.decision;
    status->set_limit_remaining(clampU32(decision.remaining));
    status->mutable_duration_until_reset()->set_seconds(decision.reset_after_ms / 1000);
    status->mutable_duration_until_reset()->set_nanos(
        static_cast<int32_t>(decision.reset_after_ms % 1000 * 1'000'000));
    if (!decision.allowed) {
      status->set_code(RateLimitResponse::OVER_LIMIT);
      over = true;
    }
    const bool tighter =
        tightest_outcome == nullptr ||
        (!decision.allowed && tightest_outcome->decision.allowed) ||
        (decision.allowed == tightest_outcome->decision.allowed &&
         decision.remaining < tightest_outcome->decision.remaining);
    if (tighter) {
      tightest = &planned;
      tightest_outcome = &outcome;
    }
  }
  response->set_overall_code(over ? RateLimitResponse::OVER_LIMIT : RateLimitResponse::OK);
  if (tightest == nullptr) return;
  const EnvoyLimit& limit = *tightest->limit;
  const Decision& decision = tightest_outcome->decision;
  const std::string name = sfString(limit.name.empty() ? limit.rule : limit.name);
  const int64_t window_s = envoyUnitNs(limit.unit) / 1'000'000'000;
  auto* policy = response->add_response_headers_to_add();
  policy->set_key("RateLimit-Policy");
  policy->set_value(name + ";q=" + std::to_string(limit.requests_per_unit) +
                    ";w=" + std::to_string(window_s));
  auto* state = response->add_response_headers_to_add();
  state->set_key("RateLimit");
  state->set_value(name + ";r=" + std::to_string(std::max<int64_t>(decision.remaining, 0)) +
                   ";t=" + std::to_string(ceilSeconds(decision.allowed ? decision.reset_after_ms
                                                                       : decision.retry_after_ms)));
}

}  // namespace sluice

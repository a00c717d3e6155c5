// Policy: decisions that take no units, and routing; see policy.h.
#include "policy.h"

#include <algorithm>

namespace sluice {

Route route(const RuleSet& rules, const Rule& rule) {
  Mode shadow_or = rule.shadow ? Mode::kShadow : Mode::kLocal;
  if (rule.scope == Scope::kLocal) {
    return {&rule, shadow_or};
  }
  switch (rule.on_redis_down) {
    case RedisDownPolicy::kLocal:
      return {rules.fallbackShare(rule), rule.shadow ? Mode::kShadow : Mode::kFallback};
    case RedisDownPolicy::kOpen: return {nullptr, rule.shadow ? Mode::kShadow : Mode::kOpen};
    case RedisDownPolicy::kClosed: return {nullptr, rule.shadow ? Mode::kShadow : Mode::kClosed};
  }
  return {nullptr, Mode::kClosed};
}

Decision policyDecision(const Rule& rule, Mode mode) {
  Decision decision;
  decision.allowed = mode == Mode::kOpen;
  decision.limit = rule.limits.front().limit;
  decision.remaining = decision.allowed ? decision.limit : 0;
  int64_t period_ms = rule.limits.front().period_ns / 1'000'000;
  decision.reset_after_ms = period_ms;
  decision.retry_after_ms = decision.allowed ? 0 : std::max<int64_t>(period_ms, 1);
  applyShadow(rule, &decision);
  return decision;
}

Decision blockedDecision(const Rule& rule, int64_t left_ns) {
  Decision decision;
  decision.limit = rule.limits.front().limit;
  decision.retry_after_ms = (left_ns + 999'999) / 1'000'000;
  decision.reset_after_ms = decision.retry_after_ms;
  return decision;
}

Decision exceedsCapacity(const Rule& rule) {
  Decision decision;
  decision.limit = rule.limits.front().limit;
  decision.cost_exceeds_limit = true;
  return decision;
}

void applyShadow(const Rule& rule, Decision* decision) {
  if (rule.shadow && !decision->allowed) {
    decision->allowed = true;
    decision->shadow_denied = true;
    decision->retry_after_ms = 0;
  }
}

Decision withoutShadow(Decision decision) {
  if (decision.shadow_denied) {
    decision.allowed = false;
    decision.shadow_denied = false;
  }
  return decision;
}

}  // namespace sluice

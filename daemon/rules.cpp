// Rules: the immutable rule set and the names of its enums.
#include "rules.h"

#include <algorithm>

namespace sluice {

RuleSet::RuleSet(std::vector<Rule> rules, uint32_t fallback_nodes)
    : rules_(std::move(rules)), fallback_nodes_(std::max<uint32_t>(fallback_nodes, 1)) {
  int64_t nodes = fallback_nodes_;
  for (const Rule& rule : rules_) {
    if (rule.scope != Scope::kGlobal) {
      continue;
    }
    // Rounded down: the fleet's shares never add up to more than the limit,
    // except where a share of 1 is the least that keeps a key usable.
    Rule share = rule;
    share.scope = Scope::kLocal;
    share.id = rule.id | kFallbackIdBit;
    for (Limit& limit : share.limits) {
      limit.limit = std::max<int64_t>(limit.limit / nodes, 1);
      limit.burst = std::max<int64_t>(limit.burst / nodes, 1);
    }
    shares_.push_back(std::move(share));
  }
  by_name_.reserve(rules_.size());
  by_id_.reserve(rules_.size() + shares_.size());
  for (const Rule& rule : rules_) {
    by_name_.emplace(rule.name, &rule);
    by_id_.emplace(rule.id, &rule);
  }
  for (const Rule& share : shares_) {
    by_id_.emplace(share.id, &share);
  }
}

const Rule* RuleSet::fallbackShare(const Rule& rule) const {
  return rule.scope == Scope::kGlobal ? findById(rule.id | kFallbackIdBit) : nullptr;
}

const Rule* RuleSet::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

int64_t maxLimit(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kTokenBucket:
    case Algorithm::kGcra: return 1'000'000'000;
    case Algorithm::kFixedWindow: return 0xFFFFFFFFLL;
    case Algorithm::kSlidingWindow: return (1LL << 20) - 1;
    case Algorithm::kSlidingLog:
    case Algorithm::kConcurrency: return 1000;
  }
  return 0;
}

bool canWait(const Rule& rule) {
  return rule.scope == Scope::kLocal &&
         (rule.algorithm == Algorithm::kTokenBucket || rule.algorithm == Algorithm::kGcra);
}

const Rule* RuleSet::findById(uint32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

std::string_view algorithmName(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kTokenBucket: return "token_bucket";
    case Algorithm::kGcra: return "gcra";
    case Algorithm::kFixedWindow: return "fixed_window";
    case Algorithm::kSlidingWindow: return "sliding_window";
    case Algorithm::kSlidingLog: return "sliding_log";
    case Algorithm::kConcurrency: return "concurrency";
  }
  return "unknown";
}

std::string_view scopeName(Scope scope) {
  return scope == Scope::kGlobal ? "global" : "local";
}

std::string_view redisDownPolicyName(RedisDownPolicy policy) {
  switch (policy) {
    case RedisDownPolicy::kLocal: return "local";
    case RedisDownPolicy::kOpen: return "open";
    case RedisDownPolicy::kClosed: return "closed";
  }
  return "unknown";
}

}  // namespace sluice

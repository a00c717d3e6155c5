// Rules: the immutable rule set and the names of its enums.
#include "rules.h"

namespace sluice {

RuleSet::RuleSet(std::vector<Rule> rules) : rules_(std::move(rules)) {
  by_name_.reserve(rules_.size());
  by_id_.reserve(rules_.size());
  for (const Rule& rule : rules_) {
    by_name_.emplace(rule.name, &rule);
    by_id_.emplace(rule.id, &rule);
  }
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

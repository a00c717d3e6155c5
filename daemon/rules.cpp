// Rules: the immutable rule set and the names of its enums.
#include "rules.h"

#include <algorithm>

namespace sluice {

namespace {

// One node's share of `limits`, rounded down: the fleet's shares never add
// up to more than the limit, except where a share of 1 is the least that
// keeps a key usable.
void divideLimits(std::vector<Limit>* limits, int64_t nodes) {
  for (Limit& limit : *limits) {
    limit.limit = std::max<int64_t>(limit.limit / nodes, 1);
    limit.burst = std::max<int64_t>(limit.burst / nodes, 1);
  }
}

// Appends `rule`'s variants (one per override: the rule with its limits) to
// `variants` and records where they start.
void addVariants(Rule* rule, std::vector<Rule>* variants, int64_t nodes) {
  rule->first_variant = variants->size();
  if (rule->overrides.empty()) return;
  Rule base = *rule;  // copied once: a rule may have many overrides
  base.overrides.clear();
  for (const Override& override : rule->overrides) {
    Rule variant = base;
    variant.limits = override.limits;
    if (nodes > 1) divideLimits(&variant.limits, nodes);
    variants->push_back(std::move(variant));
  }
}

// Part `index` of `rule` (RuleSet::parts): the rule with that limit alone.
Rule makePart(const Rule& rule, size_t index) {
  Rule part = rule;
  part.name = partName(rule.name, index);
  part.id = partId(rule.id, index);
  part.limits = {rule.limits[index]};
  for (size_t i = 0; i < rule.overrides.size(); ++i) {
    part.overrides[i].limits = {rule.overrides[i].limits[index]};
  }
  // The config loader refuses these on a global rule of several limits;
  // a part has no room for them either (its rule decides on all parts).
  part.penalty.reset();
  part.max_wait_ns = 0;
  part.pace = false;
  part.part_count = 0;
  return part;
}

}  // namespace

std::string partName(std::string_view rule_name, size_t index) {
  std::string name(rule_name);
  name += '\x1f';
  name += std::to_string(index);
  return name;
}

bool splitsIntoParts(const Rule& rule) {
  return rule.scope == Scope::kGlobal && rule.limits.size() >= 2 &&
         hasRateLeaseScript(rule.algorithm);
}

RuleSet::RuleSet(std::vector<Rule> rules, uint32_t fallback_nodes)
    : rules_(std::move(rules)), fallback_nodes_(std::max<uint32_t>(fallback_nodes, 1)) {
  // Each override decides as the rule with its limits; only the rule's own
  // id names key-table entries, so variants need no ids of their own.
  for (Rule& rule : rules_) addVariants(&rule, &variants_, 1);
  for (Rule& rule : rules_) {
    rule.first_part = parts_.size();
    rule.part_count = 0;
    if (!splitsIntoParts(rule)) continue;
    rule.part_count = static_cast<uint32_t>(rule.limits.size());
    for (size_t i = 0; i < rule.limits.size(); ++i) {
      parts_.push_back(makePart(rule, i));
      addVariants(&parts_.back(), &variants_, 1);
    }
  }
  for (const Rule& rule : rules_) {
    for (uint32_t i = 0; i < rule.overrides.size(); ++i) {
      const Override& override = rule.overrides[i];
      if (override.match == Override::Match::kKey) {
        exact_[rule.id].emplace(override.pattern, i + 1);
      } else {
        scanned_[rule.id].push_back(i);
      }
    }
  }
  int64_t nodes = fallback_nodes_;
  auto addShare = [&](const Rule& rule) {
    // A share keeps the rule's overrides, each divided as the rule is, and
    // matches keys as the rule does (matchOverride). A global rule's penalty
    // lives in its slice entries, whatever decides the key (lease.h).
    Rule share = rule;
    share.scope = Scope::kLocal;
    share.id = rule.id | kFallbackIdBit;
    share.penalty.reset();
    share.part_count = 0;  // a share decides its rule's keys on its own
    divideLimits(&share.limits, nodes);
    addVariants(&share, &variants_, nodes);
    shares_.push_back(std::move(share));
  };
  for (const Rule& rule : rules_) {
    if (rule.scope == Scope::kGlobal) addShare(rule);
  }
  for (const Rule& part : parts_) addShare(part);
  by_name_.reserve(rules_.size());
  by_id_.reserve(rules_.size() + parts_.size() + shares_.size());
  for (const Rule& rule : rules_) {
    by_name_.emplace(rule.name, &rule);
    by_id_.emplace(rule.id, &rule);
  }
  for (const Rule& part : parts_) {
    by_id_.emplace(part.id, &part);
  }
  for (const Rule& share : shares_) {
    by_id_.emplace(share.id, &share);
  }
}

const Rule* RuleSet::fallbackShare(const Rule& rule) const {
  return rule.scope == Scope::kGlobal ? findById(rule.id | kFallbackIdBit) : nullptr;
}

uint32_t RuleSet::matchOverride(const Rule& rule, std::string_view key) const {
  if (rule.overrides.empty()) return 0;
  // A share or a part matches as its configured rule does (the overrides are
  // in the same order).
  const uint32_t id = rule.id & kRuleIdMask;
  if (auto keys = exact_.find(id); keys != exact_.end()) {
    if (auto hit = keys->second.find(key); hit != keys->second.end()) return hit->second;
  }
  auto scanned = scanned_.find(id);
  if (scanned == scanned_.end()) return 0;
  uint32_t best = 0;
  size_t best_length = 0;
  for (uint32_t i : scanned->second) {
    const Override& override = rule.overrides[i];
    if (override.match == Override::Match::kPrefix && key.starts_with(override.pattern) &&
        (best == 0 || override.pattern.size() > best_length)) {
      best = i + 1;
      best_length = override.pattern.size();
    }
  }
  if (best != 0) return best;
  for (uint32_t i : scanned->second) {
    const Override& override = rule.overrides[i];
    if (override.match == Override::Match::kGlob && globMatch(override.pattern, key)) return i + 1;
  }
  return 0;
}

bool globMatch(std::string_view pattern, std::string_view key) {
  // Greedy with one backtrack point, the last *: linear in practice, and at
  // worst pattern x key steps, which only entry creation pays.
  size_t p = 0;
  size_t k = 0;
  size_t star = std::string_view::npos;
  size_t star_k = 0;
  while (k < key.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      star_k = k;
    } else if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == key[k])) {
      ++p;
      ++k;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      k = ++star_k;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

const Rule* RuleSet::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

const Rule* RuleSet::findById(uint32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
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

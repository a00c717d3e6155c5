// Policy: decisions that take no units, and routing; see policy.h.
#include "policy.h"

#include <algorithm>
#include <string>

#include "limiter.h"
#include "lookup.h"
#include "penalty.h"

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

std::optional<Decision> PolicyPath::acquireShare(const RuleSet& rules, const Rule& share,
                                                 std::string_view key, int64_t now_ns,
                                                 int64_t cost, bool fallback,
                                                 Taken* taken) {
  KeyTable::Entry* entry = keys_.findOrInsert(share.id, key, entryWords(share), now_ns);
  if (entry == nullptr) return std::nullopt;
  const Rule& deciding = decidingRule(rules, share, key, entry->state());
  auto state = entry->state().first(stateWords(deciding));
  Decision decision = acquire(deciding, state, now_ns, cost);
  if (decision.allowed && !decision.shadow_denied) {
    taken->cost = cost;
    taken->limited = &deciding;
    taken->state = state;
    if (fallback) {
      taken->share = &share;
      taken->share_words = entry->state();
    }
  }
  return decision;
}

void PolicyPath::noteFallbackSpend(const RuleSet& rules, const Rule& share, std::string_view key,
                                   std::span<std::atomic<uint64_t>> words, int64_t cost) {
  const Rule* global = rules.findById(share.id & ~kFallbackIdBit);
  if (broker_ == nullptr || global == nullptr || !leasable(*global)) return;
  if (broker_->leasing()) {
    // Redis is up but this key could not lease (its lease failed or was
    // late): debit the units now rather than at the next outage's end.
    LeaseRequest debit;
    debit.kind = LeaseRequest::Kind::kDebit;
    debit.rule_id = global->id;
    debit.key = std::string(key);
    debit.n = cost;
    debit.variant = storedOverride(share, words);
    broker_->submit(std::move(debit));
    return;
  }
  addUndebited(share, words, cost);
}

void PolicyPath::countDenial(const Rule& configured, std::string_view key,
                             std::span<std::atomic<uint64_t>> entry_words,
                             const Decision& decision, int64_t now_ns) {
  const Penalty* penalty = activePenalty(configured);
  if (penalty == nullptr || entry_words.empty() || decision.allowed ||
      decision.cost_exceeds_limit) {
    return;
  }
  auto words = penaltyState(configured, entry_words);
  if (!penalty::recordDenial(*penalty, words, now_ns)) return;
  metrics_.penalty_blocks.add();
  if (configured.scope != Scope::kGlobal || broker_ == nullptr || !broker_->leasing()) return;
  // Shared through Redis, where every node's next lease of the key finds it.
  // This node asks Redis again after slice::kBlockRecheckNs, with nothing
  // left to spend meanwhile.
  LeaseRequest block;
  block.kind = LeaseRequest::Kind::kBlock;
  block.rule_id = configured.id;
  block.key = std::string(key);
  block.n = (penalty->block_ns + 999'999) / 1'000'000;
  broker_->submit(std::move(block));
  slice::block(entry_words, now_ns, penalty->block_ns);
}

int64_t PolicyPath::globalBlockedFor(const Rule& configured, std::string_view key,
                                     int64_t now_ns) {
  if (activePenalty(configured) == nullptr) return 0;
  KeyTable::Entry* entry = currentEntry(keys_, configured, key);
  if (entry == nullptr) return 0;
  return penalty::blockedFor(penaltyState(configured, entry->state()), now_ns);
}

}  // namespace sluice

// Local path: the limiter on this node's state; see local_path.h.
#include "local_path.h"

#include <span>

#include "lease.h"
#include "lease_path.h"
#include "limiter.h"
#include "penalty.h"

namespace sluice {

Outcome LocalPath::acquire(const RuleSet& rules, const Rule& configured, const Rule& rule,
                           Mode mode, const rpc::Item& item, int64_t now_ns, const Asker& asker,
                           Verdict* verdict) {
  KeyTable::Entry* entry = keys_.findOrInsert(rule.id, item.key, entryWords(rule), now_ns);
  if (entry == nullptr) {
    verdict->fail(rpc::ErrorCode::kOverloaded, kTableFull);
    return Outcome::kAnswered;
  }
  const Rule& deciding = decidingRule(rules, rule, item.key, entry->state());
  auto state = entry->state().first(stateWords(deciding));
  // The penalty's words: in the key's entry; for a global rule deciding on
  // its share, in the key's slice entry, where leasing keeps them too.
  const Penalty* penalty = activePenalty(configured);
  std::span<std::atomic<uint64_t>> penalty_entry = entry->state();
  if (penalty != nullptr && &rule != &configured) {
    KeyTable::Entry* slice_entry =
        keys_.findOrInsert(configured.id, item.key, entryWords(configured), now_ns);
    penalty_entry = slice_entry != nullptr ? slice_entry->state()
                                          : std::span<std::atomic<uint64_t>>();
    if (slice_entry == nullptr) penalty = nullptr;  // table full: unblocked, uncounted
  }
  if (penalty != nullptr) {
    if (int64_t left_ns = penalty::blockedFor(penaltyState(configured, penalty_entry), now_ns)) {
      verdict->decide(blockedDecision(deciding, left_ns), Mode::kBlocked);
      return Outcome::kAnswered;
    }
  }
  // Only a request that gets an answer may wait (not a notification), and
  // only a question of one entry.
  int64_t max_wait_ns = asker.may_wait && asker.may_wait_for_units && &rule == &configured
                            ? maxWaitNs(rule, item)
                            : 0;
  Decision decision;
  if (max_wait_ns > 0 && !waiting_.mayReserve()) {
    decision = sluice::acquire(deciding, state, now_ns, item.cost);
    if (!decision.allowed && !decision.cost_exceeds_limit &&
        decision.retry_after_ms * 1'000'000 <= max_wait_ns) {
      verdict->fail(rpc::ErrorCode::kOverloaded, Waiting::tooManyWaiting());
      return Outcome::kAnswered;
    }
  } else {
    decision = sluice::acquire(deciding, state, now_ns, item.cost, max_wait_ns);
  }
  if (item.cost > 0 && decision.allowed && !decision.shadow_denied) {
    verdict->taken.cost = item.cost;
    verdict->taken.limited = &deciding;
    verdict->taken.state = state;
    if (&rule != &configured) {  // a fallback spend, to note once kept
      verdict->taken.share = &rule;
      verdict->taken.share_words = entry->state();
    }
  }
  if (penalty != nullptr) {
    policy_.countDenial(configured, item.key, penalty_entry, decision, now_ns);
  }
  verdict->decide(decision, mode, max_wait_ns > 0 ? 0 : -1);
  if (decision.wait_ns > 0) {
    waiting_.reserve(asker.recipient, asker.tag, decision, mode, now_ns, now_ns + decision.wait_ns);
    return Outcome::kWaitsReserved;
  }
  return Outcome::kAnswered;
}

Verdict LocalPath::settle(const RuleSet& rules, const Rule& rule, Mode mode, std::string_view key,
                          int64_t spent_ns, int64_t refund, int64_t debt, int64_t now_ns,
                          int64_t* charged) {
  Verdict verdict;
  *charged = 0;
  // A refund to a key that is gone has nothing to give back to; a debt is
  // charged to the key, made afresh when it was swept.
  KeyTable::Entry* entry = debt > 0 ? keys_.findOrInsert(rule.id, key, entryWords(rule), now_ns)
                                    : currentEntry(keys_, rule, key);
  if (entry == nullptr && debt > 0) {
    verdict.fail(rpc::ErrorCode::kOverloaded, kTableFull);
    return verdict;
  }
  const Rule& deciding = decidingFor(rules, rule, key, entry);
  if (entry == nullptr) {
    verdict.decide(peek(deciding, fresh_.of(deciding), now_ns, 0), mode);
    return verdict;
  }
  entry->touch(now_ns);
  verdict.decide(sluice::settle(deciding, entry->state().first(stateWords(deciding)), spent_ns,
                                now_ns, refund, debt, charged),
                 mode);
  return verdict;
}

Verdict LocalPath::look(const RuleSet& rules, const Rule& configured, const Rule& rule, Mode mode,
                        const rpc::Item& item, bool release, int64_t now_ns) {
  // peek, release and cost 0 never create a key: an absent key is fresh.
  KeyTable::Entry* entry = currentEntry(keys_, rule, item.key);
  const Rule& deciding = decidingFor(rules, rule, item.key, entry);
  auto state =
      entry != nullptr ? entry->state().first(stateWords(deciding)) : fresh_.of(deciding);
  int64_t blocked_ns = entry != nullptr && activePenalty(rule) != nullptr
                           ? penalty::blockedFor(penaltyState(rule, entry->state()), now_ns)
                           : 0;
  if (&rule != &configured) blocked_ns = policy_.globalBlockedFor(configured, item.key, now_ns);
  Decision decision;
  if (release) {
    // A key that holds nothing gives nothing back: the answer is peek's.
    if (entry != nullptr) entry->touch(now_ns);
    decision = entry != nullptr ? sluice::release(deciding, state, now_ns, item.cost)
                                : peek(deciding, state, now_ns, 0);
  } else if (blocked_ns > 0) {
    decision = blockedDecision(deciding, blocked_ns);
    mode = Mode::kBlocked;
  } else {
    decision = peek(deciding, state, now_ns, item.cost);
  }
  Verdict verdict;
  verdict.decide(decision, mode);
  return verdict;
}

}  // namespace sluice

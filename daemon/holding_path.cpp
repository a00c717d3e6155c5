// Holding path: global concurrency rules on their holdings; see holding_path.h.
#include "holding_path.h"

#include <algorithm>

#include "holding.h"
#include "limiter.h"
#include "policy.h"

namespace sluice {

namespace {

// What the fleet has free, as far as the node can tell: its own free units
// (`left`) and what Redis had free at the key's last lease answer
// (slice::redisLeft), at most the limit; see docs/protocol.md,
// "Remaining on a global rule".
int64_t fleetFree(std::span<const std::atomic<uint64_t>> words, const Rule& rule, int64_t now_ns,
                  int64_t left) {
  return std::min(rule.limits.front().limit,
                  left + slice::redisLeft(words.first(slice::kWords), rule, now_ns));
}

}  // namespace

void HoldingPath::requestHolding(const RuleSet& rules, const Rule& rule, std::string_view key,
                                 std::span<std::atomic<uint64_t>> words, int64_t now_ns,
                                 int64_t cost) {
  slice::Batch batch = holding::nextBatch(words, now_ns, cost, rule, rules.fallbackNodes(),
                                          broker_->leaseIntervalNs());
  LeaseRequest request;
  request.rule_id = rule.id;
  request.key = std::string(key);
  request.n = batch.n;
  request.need = batch.need;
  broker_->submit(std::move(request));
}

Outcome HoldingPath::acquire(const RuleSet& rules, const Rule& rule, const rpc::Item& item,
                             int64_t now_ns, const Asker& asker, Verdict* verdict) {
  const Limit& limit = rule.limits.front();
  Mode mode = rule.shadow ? Mode::kShadow : Mode::kNormal;
  Decision decision;
  // Answers with `decision` in `mode`, after shadow; `held` has the words
  // when units are held.
  auto answer = [&](std::span<std::atomic<uint64_t>> held) {
    if (!held.empty()) {
      verdict->taken.cost = item.cost;
      verdict->taken.held = held;
    }
    applyShadow(rule, &decision);
    verdict->decide(decision, mode);
    return Outcome::kAnswered;
  };
  if (item.cost > limit.limit) {
    decision = exceedsCapacity(rule);
    return answer({});
  }
  KeyTable::Entry* entry = keys_.findOrInsert(rule.id, item.key, entryWords(rule), now_ns);
  if (entry == nullptr) {
    verdict->fail(rpc::ErrorCode::kOverloaded, kTableFull);
    return Outcome::kAnswered;
  }
  std::span<std::atomic<uint64_t>> words = entry->state();
  if (broker_->leasing()) {
    // Learning (Redis came back without the fleet's state): the node also
    // holds to its share until every node has renewed what it holds.
    int64_t cap =
        broker_->learning(rule, now_ns) ? rules.fallbackShare(rule)->limits.front().limit : 0;
    holding::Acquired got = holding::acquire(words, limit, now_ns, item.cost, asker.again, cap);
    if (got.reclaimed > 0) metrics_.lease_units_released.add(static_cast<uint64_t>(got.reclaimed));
    if (got.taken.must_request) requestHolding(rules, rule, item.key, words, now_ns, item.cost);
    switch (got.taken.outcome) {
      case slice::Outcome::kTaken:
        metrics_.lease_units_spent.add(static_cast<uint64_t>(item.cost));
        decision = holding::decide(words, limit, now_ns, item.cost,
                                   cap > 0 ? got.taken.left
                                           : fleetFree(words, rule, now_ns, got.taken.left),
                                   true);
        return answer(words);
      case slice::Outcome::kDenied:
        if (got.capped) {
          decision = holding::decide(words, limit, now_ns, item.cost,
                                     cap - holding::live(words, now_ns), false);
        } else {
          metrics_.lease_negative_hits.add();
          decision = holding::decide(words, limit, now_ns, item.cost, 0, false,
                                     std::max<int64_t>(got.taken.until_ns - now_ns, 1),
                                     broker_->holdingReturnNs());
        }
        return answer({});
      case slice::Outcome::kEmpty:
        if (waiting_.waitForLease(asker, {})) return Outcome::kWaitsForLease;
        [[fallthrough]];
      case slice::Outcome::kQueued:  // never: concurrency requests do not wait in line
      case slice::Outcome::kFallback: break;
    }
  }
  // Redis is down, or this key's lease failed or came too late: the policy
  // decides. "local" holds units at the node's share on the same slots, so
  // releases find them whatever the mode was; what it holds beyond the
  // pool is the pool's debt, leased back once Redis answers.
  auto [share, policy_mode] = route(rules, rule);
  mode = policy_mode;
  if (share == nullptr) {
    decision = policyDecision(rule, policy_mode);
    return answer({});
  }
  int64_t cap = share->limits.front().limit;
  int64_t reclaimed = 0;
  bool held = holding::acquireLocal(words, limit, now_ns, item.cost, cap, &reclaimed);
  if (reclaimed > 0) metrics_.lease_units_released.add(static_cast<uint64_t>(reclaimed));
  decision = holding::decide(words, limit, now_ns, item.cost, cap - holding::live(words, now_ns),
                             held);
  decision.limit = cap;
  if (!held) return answer({});
  metrics_.lease_units_spent.add(static_cast<uint64_t>(item.cost));
  return answer(words);
}

Decision HoldingPath::peekHeld(const RuleSet& rules, const Rule& rule,
                               std::span<const std::atomic<uint64_t>> words, int64_t now_ns,
                               int64_t cost, Mode* mode) {
  const Limit& limit = rule.limits.front();
  *mode = rule.shadow ? Mode::kShadow : Mode::kNormal;
  if (broker_->leasing()) {
    slice::TakeResult looked = slice::look(words.first(slice::kWords), now_ns, cost);
    switch (looked.outcome) {
      case slice::Outcome::kTaken:
        return holding::decide(words, limit, now_ns, cost,
                               fleetFree(words, rule, now_ns, looked.left), true);
      case slice::Outcome::kDenied:
        return holding::decide(words, limit, now_ns, cost, 0, false,
                               std::max<int64_t>(looked.until_ns - now_ns, 1),
                               broker_->holdingReturnNs());
      case slice::Outcome::kEmpty:
        // Nothing held here, and Redis has not said no: a lease would be asked for.
        return holding::decide(words, limit, now_ns, cost, 0, true);
      case slice::Outcome::kQueued:  // never: concurrency requests do not wait in line
      case slice::Outcome::kFallback: break;
    }
  }
  auto [share, policy_mode] = route(rules, rule);
  *mode = policy_mode;
  if (share == nullptr) return policyDecision(rule, policy_mode);
  int64_t cap = share->limits.front().limit;
  int64_t free_units = cap - holding::live(words, now_ns);
  bool allowed = free_units >= cost;
  Decision decision = holding::decide(words, limit, now_ns, cost,
                                      allowed ? free_units - cost : free_units, allowed);
  decision.limit = cap;
  return decision;
}

Decision HoldingPath::look(const RuleSet& rules, const Rule& rule, const rpc::Item& item,
                           bool release, int64_t now_ns, Mode* mode) {
  KeyTable::Entry* entry = currentEntry(keys_, rule, item.key);
  if (entry == nullptr) {
    *mode = broker_->leasing() ? (rule.shadow ? Mode::kShadow : Mode::kNormal)
                              : route(rules, rule).mode;
    // A release on a key that holds nothing gives nothing back: peek's answer.
    int64_t cost = release ? 0 : std::max<int64_t>(item.cost, 0);
    return cost > rule.limits.front().limit ? exceedsCapacity(rule)
                                            : peek(rule, fresh_.of(rule), now_ns, cost);
  }
  std::span<std::atomic<uint64_t>> words = entry->state();
  int64_t cost = item.cost;
  if (release) {
    entry->touch(now_ns);
    int64_t freed = holding::release(words, now_ns, item.cost);
    if (freed > 0) metrics_.lease_units_released.add(static_cast<uint64_t>(freed));
    cost = 0;  // the answer reports the state afterwards
  }
  return item.cost > rule.limits.front().limit && cost > 0
             ? exceedsCapacity(rule)
             : peekHeld(rules, rule, words, now_ns, std::max<int64_t>(cost, 0), mode);
}

void HoldingPath::refund(const Rule& rule, std::span<std::atomic<uint64_t>> words, int64_t now_ns,
                         int64_t cost) {
  holding::refund(words, rule.limits.front(), now_ns, cost);
  metrics_.lease_units_released.add(static_cast<uint64_t>(cost));
}

}  // namespace sluice

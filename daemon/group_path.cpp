// Group path: all-or-nothing decisions on several entries; see group_path.h.
#include "group_path.h"

#include <algorithm>

#include "failure.h"
#include "holding.h"
#include "penalty.h"

namespace sluice {

void GroupPath::refundEntries(int64_t now_ns) {
  for (const Entry& entry : entries_) {
    if (entry.taken > 0) slice::refund(entry.slice, entry.taken);
    if (!entry.held.empty()) holding_.refund(*entry.rule, entry.held, now_ns, entry.item.cost);
  }
}

GroupPath::Collected GroupPath::collectItem(const Rule& configured, const Item& item,
                                              int64_t now_ns, const Asker& asker,
                                              bool* denied) {
  groups_.push_back({&configured, item.key, entries_.size(), 0});
  // Without Redis, a global rule decides on its share (route), parts or not.
  std::span<const Rule> parts =
      broker_ != nullptr ? rules_->parts(configured) : std::span<const Rule>();
  // A cold key defers for its first part's lease; the parts after it are
  // still asked (without deferring again, and refunded), so that their
  // leases are on the way too and all come within one round trip.
  bool deferred = false;
  Asker no_wait = asker;
  no_wait.may_wait = false;
  for (const Rule& rule : parts.empty() ? std::span<const Rule>(&configured, 1) : parts) {
    switch (collectEntry(rule, item, now_ns, deferred ? no_wait : asker, denied)) {
      case Collected::kOk: break;
      case Collected::kDeferred: deferred = true; break;
      case Collected::kTableFull: return Collected::kTableFull;
    }
  }
  groups_.back().count = entries_.size() - groups_.back().first;
  return deferred ? Collected::kDeferred : Collected::kOk;
}

GroupPath::Collected GroupPath::collectEntry(const Rule& rule, const Item& item,
                                               int64_t now_ns, const Asker& asker,
                                               bool* denied) {
  const std::string_view key = item.key;
  const int64_t cost = item.cost;
  // Items a policy answers ("open", "closed") and slice denials are decided
  // here and spend nothing; slices are taken from; the rest go to the
  // limiter (settleEntries), all or nothing.
  AcquireItem acquire_item;
  acquire_item.cost = cost;
  int64_t taken_units = 0;
  std::span<std::atomic<uint64_t>> slice_words;
  const Rule* share_rule = nullptr;  // the share the limiter decides on
  const Rule* share_spend = nullptr;  // spent in fallback: count for debit
  std::span<std::atomic<uint64_t>> share_words;
  Mode mode = Mode::kLocal;
  bool decided = false;
  if (int64_t blocked_ns = cost > 0 && rule.scope == Scope::kGlobal
                               ? policy_.globalBlockedFor(rule, key, now_ns)
                               : 0) {
    // A blocked key denies the group, as a closed policy does.
    acquire_item.decision = blockedDecision(decidingFor(rule, key, nullptr), blocked_ns);
    mode = Mode::kBlocked;
    *denied = true;
    decided = true;
  }
  std::span<std::atomic<uint64_t>> held_words;
  if (!decided && broker_ != nullptr && leasesHolding(rule) && cost > 0) {
    switch (holding_.acquire(*rules_, rule, item, now_ns, asker, &acquire_item.decision, &mode,
                             &held_words)) {
      case HoldingPath::Held::kWaitsForLease: return Collected::kDeferred;
      case HoldingPath::Held::kTableFull: return Collected::kTableFull;
      case HoldingPath::Held::kHeld:
      case HoldingPath::Held::kAnswered: break;
    }
    applyShadow(rule, &acquire_item.decision);
    *denied = *denied || !acquire_item.decision.allowed;
    decided = true;
  }
  if (!decided && leasing(rule) && cost > 0) {
    mode = rule.shadow ? Mode::kShadow : Mode::kNormal;
    KeyTable::Entry* entry = keys_.findOrInsert(rule.id, key, entryWords(rule), now_ns);
    if (entry == nullptr) return Collected::kTableFull;
    const Rule& deciding = decidingRule(*rules_, rule, key, entry->state());
    if (cost > leaseCapacity(deciding.limits.front())) {
      acquire_item.decision = exceedsCapacity(deciding);
      applyShadow(rule, &acquire_item.decision);
      *denied = *denied || !acquire_item.decision.allowed;
      decided = true;
    } else {
      slice_words = slice::of(entry->state());
      slice::TakeResult taken =
          lease_.take(rule, key, slice_words, now_ns, cost, asker.again, false);
      lease_.afterTake(*rules_, rule, deciding, key, entry->state(), now_ns, cost, taken);
      // Behind waiters with no answer from Redis yet, it waits for the
      // lease under way as on an empty slice.
      bool lease_coming = taken.outcome == slice::Outcome::kEmpty ||
                          (taken.outcome == slice::Outcome::kQueued && taken.until_ns == 0);
      if (lease_coming && waiting_.waitForLease(asker, {})) return Collected::kDeferred;
      if (taken.outcome == slice::Outcome::kTaken || taken.outcome == slice::Outcome::kDenied ||
          taken.outcome == slice::Outcome::kQueued) {
        if (taken.outcome == slice::Outcome::kTaken) taken_units = cost;
        if (taken.outcome == slice::Outcome::kDenied) metrics_.lease_negative_hits.add();
        acquire_item.decision = sliceDecision(deciding, taken, slice_words, now_ns);
        applyShadow(rule, &acquire_item.decision);
        *denied = *denied || !acquire_item.decision.allowed;
        decided = true;
        if (taken_units > 0 && broker_->learning(deciding, now_ns)) {
          // Learning: the share must allow it too (the limiter decides it).
          decided = false;
          share_rule = rules_->fallbackShare(rule);
        }
      }
    }
  }
  if (!decided && share_rule == nullptr) {
    auto [routed, route_mode] = route(rule);
    mode = route_mode;
    if (routed == nullptr) {
      acquire_item.decision = policyDecision(rule, mode);
      *denied = *denied || !acquire_item.decision.allowed;
      decided = true;
    } else {
      share_rule = routed;
    }
  }
  if (!decided) {
    KeyTable::Entry* entry =
        keys_.findOrInsert(share_rule->id, key, entryWords(*share_rule), now_ns);
    if (entry == nullptr) {
      if (taken_units > 0) slice::refund(slice_words, taken_units);
      return Collected::kTableFull;
    }
    const Rule& deciding = decidingRule(*rules_, *share_rule, key, entry->state());
    int64_t blocked_ns =
        activePenalty(*share_rule) != nullptr
            ? penalty::blockedFor(penaltyState(*share_rule, entry->state()), now_ns)
            : 0;
    if (blocked_ns > 0) {
      // A blocked key denies the group, as a closed policy does.
      acquire_item.decision = blockedDecision(deciding, blocked_ns);
      mode = Mode::kBlocked;
      *denied = true;
    } else {
      acquire_item.rule = &deciding;
      acquire_item.state = entry->state().first(stateWords(deciding));
      // Spent in fallback (not learning): counted for the debit afterwards.
      if (share_rule != &rule && taken_units == 0) {
        share_spend = share_rule;
        share_words = entry->state();
      }
    }
  }
  entries_.push_back({acquire_item, mode, &rule, taken_units, slice_words, share_spend,
                      share_words, held_words});
  return Collected::kOk;
}

bool GroupPath::settleEntries(int64_t now_ns, bool denied) {
  // The limiter's items are the ones with a rule; a denial above means none
  // of them may spend, so they are only looked at.
  limited_.clear();
  for (const Entry& entry : entries_) {
    if (entry.item.rule != nullptr) {
      limited_.push_back(entry.item);
    }
  }
  bool allowed = !denied;
  if (denied) {
    for (AcquireItem& item : limited_) {
      item.decision = sluice::peek(*item.rule, item.state, now_ns, item.cost);
    }
  } else {
    allowed = sluice::acquireAll(limited_, now_ns);
  }
  if (!allowed) refundEntries(now_ns);
  size_t next = 0;
  for (Entry& entry : entries_) {
    if (entry.item.rule == nullptr) continue;
    const Decision& limited = limited_[next++].decision;
    // A learning entry keeps its slice's answer unless the share said no.
    if (entry.taken == 0 || !limited.allowed) entry.item.decision = limited;
    if (entry.taken > 0 && !limited.allowed) entry.item.decision.allowed = false;
  }
  for (const Group& group : groups_) {
    if (allowed && group.count > 1 && group.configured->shadow) refundShadowGroup(group, now_ns);
    for (const Entry& entry : std::span(entries_).subspan(group.first, group.count)) {
      if (allowed && entry.taken > 0) {
        metrics_.lease_units_spent.add(static_cast<uint64_t>(entry.taken));
      }
      if (allowed && entry.share != nullptr && !entry.item.decision.shadow_denied) {
        policy_.noteFallbackSpend(*rules_, *entry.share, group.key, entry.share_words,
                                  entry.item.cost);
      }
    }
  }
  return allowed;
}

void GroupPath::refundShadowGroup(const Group& group, int64_t now_ns) {
  // A shadow rule spends nothing on a request one of its limits denies, as
  // the limiter's rule of several limits does.
  auto entries = std::span(entries_).subspan(group.first, group.count);
  if (std::none_of(entries.begin(), entries.end(),
                   [](const Entry& entry) { return entry.item.decision.shadow_denied; })) {
    return;
  }
  for (Entry& entry : entries) {
    if (entry.taken > 0) slice::refund(entry.slice, entry.taken);
    entry.taken = 0;
    const AcquireItem& item = entry.item;
    if (item.rule != nullptr && item.decision.allowed && !item.decision.shadow_denied) {
      refund(*item.rule, item.state, now_ns, item.cost);
    }
    entry.share = nullptr;
    entry.share_words = {};
  }
}

Decision GroupPath::groupDecision(const Group& group, Mode* mode) const {
  if (group.count == 1) {
    *mode = entries_[group.first].mode;
    return entries_[group.first].item.decision;
  }
  // The parts report as the limits of a local rule do (limiter.h); the mode
  // is the reported part's.
  MostRestrictive merged;
  for (size_t i = group.first; i < group.first + group.count; ++i) {
    if (merged.add(withoutShadow(entries_[i].item.decision))) *mode = entries_[i].mode;
  }
  Decision decision = merged.decision();
  applyShadow(*group.configured, &decision);
  return decision;
}

Outcome GroupPath::acquire(const RuleSet& rules, std::span<const Item> items, int64_t now_ns,
                           const Asker& asker, Answer* answer) {
  rules_ = &rules;
  entries_.clear();
  groups_.clear();
  // Every rule is known before anything is taken or waited for: a request
  // naming an unknown rule is refused at once, not after a lease wait.
  for (const Item& item : items) {
    if (rules.find(item.rule) == nullptr) {
      answer->fail(ErrorCode::kUnknownRule, unknownRule(item.rule));
      return Outcome::kAnswered;
    }
  }
  bool denied = false;
  for (const Item& item : items) {
    const Rule* configured = rules.find(item.rule);
    switch (collectItem(*configured, item, now_ns, asker, &denied)) {
      case Collected::kOk: break;
      case Collected::kDeferred: refundEntries(now_ns); return Outcome::kWaitsForLease;
      case Collected::kTableFull:
        refundEntries(now_ns);
        answer->fail(ErrorCode::kOverloaded, kTableFull);
        return Outcome::kAnswered;
    }
  }
  bool allowed = settleEntries(now_ns, denied);
  for (const Group& group : groups_) {
    Mode mode = Mode::kLocal;
    Decision decision = groupDecision(group, &mode);
    answer->decide(decision, mode);
  }
  answer->allowed = allowed;
  return Outcome::kAnswered;
}

Decision GroupPath::peek(const RuleSet& rules, const Rule& configured, const Item& item,
                         int64_t now_ns, Mode* reported) {
  rules_ = &rules;
  MostRestrictive merged;
  Mode mode = Mode::kLocal;
  for (const Rule& part : rules_->parts(configured)) {
    Mode part_mode = Mode::kLocal;
    Decision decision;
    if (leasing(part)) {
      decision = lease_.look(*rules_, part, item.key, now_ns, item.cost, &part_mode);
    } else if (auto [share, policy_mode] = route(part); share == nullptr) {
      part_mode = policy_mode;
      decision = policyDecision(part, policy_mode);
    } else {
      part_mode = policy_mode;
      KeyTable::Entry* entry = currentEntry(keys_, *share, item.key);
      const Rule& deciding = decidingFor(*share, item.key, entry);
      decision = sluice::peek(deciding,
                      entry != nullptr ? entry->state().first(stateWords(deciding))
                                       : fresh_.of(deciding),
                      now_ns, item.cost);
    }
    if (merged.add(withoutShadow(decision))) mode = part_mode;
  }
  Decision decision = merged.decision();
  applyShadow(configured, &decision);
  *reported = mode;
  return decision;
}

}  // namespace sluice

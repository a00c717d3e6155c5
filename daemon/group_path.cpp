// Group path: every acquire, all or nothing on its entries; see group_path.h.
#include "group_path.h"

#include <algorithm>

#include "failure.h"
#include "limiter.h"
#include "slice.h"

namespace sluice {

inline Outcome GroupPath::decideEntry(const Rule& rule, const Item& item, int64_t now_ns,
                                      const Asker& asker, Verdict* verdict) {
  // A cost of 0 takes nothing: the limiter answers it as a peek, on the
  // key's state or its share's.
  if (item.cost > 0 && broker_ != nullptr && leasesHolding(rule)) {
    return holding_.acquire(*rules_, rule, item, now_ns, asker, verdict);
  }
  if (item.cost > 0 && leasing(rule)) {
    return lease_.acquire(*rules_, rule, item, now_ns, asker, verdict);
  }
  // Asked again after standing in its key's line, on a rule that no longer
  // leases: it leaves the line.
  waiting_.leaveLine(asker.wait.ticket);
  if (item.cost > 0 && broker_ != nullptr && leasable(rule)) {
    // Redis is unreachable: a key holding a rate spends it (its demand-weighted share).
    if (std::optional<Outcome> rated = lease_.acquireOnRate(*rules_, rule, item, now_ns, verdict)) {
      return *rated;
    }
  }
  auto [routed, mode] = route(rule);
  if (routed == nullptr) {
    verdict->decide(policyDecision(rule, mode), mode);
    return Outcome::kAnswered;
  }
  return local_.acquire(*rules_, rule, *routed, mode, item, now_ns, asker, verdict);
}

Outcome GroupPath::acquire(const RuleSet& rules, std::span<const Item> items, int64_t now_ns,
                           const Asker& asker, Answer* answer) {
  rules_ = &rules;
  groups_.clear();
  // Every rule is known before anything is taken or waited for: a request
  // naming an unknown rule is refused at once, not after a lease wait.
  for (const Item& item : items) {
    const Rule* configured = rules.find(item.rule);
    if (configured == nullptr) {
      waiting_.leaveLine(asker.wait.ticket);  // asked again: the rule went in a reload
      answer->fail(ErrorCode::kUnknownRule, unknownRule(item.rule));
      return Outcome::kAnswered;
    }
    groups_.push_back({configured, item.key});
  }
  // Only a question of one entry may wait for its units (group_path.h).
  if (items.size() == 1 && (broker_ == nullptr || groups_.front().configured->part_count == 0)) {
    return acquireAlone(*groups_.front().configured, items.front(), now_ns, asker, answer);
  }
  return acquireGroups(items, now_ns, asker, answer);
}

Outcome GroupPath::acquireParts(const Rule& configured, const Item& item, int64_t now_ns,
                                const Asker& asker, Answer* answer) {
  groups_.clear();
  groups_.push_back({&configured, item.key});
  return acquireGroups(std::span<const Item>(&item, 1), now_ns, asker, answer);
}

Outcome GroupPath::acquireGroups(std::span<const Item> items, int64_t now_ns, const Asker& asker,
                                 Answer* answer) {
  entries_.clear();
  in_group_ = asker;
  in_group_.may_wait_for_units = false;
  for (size_t i = 0; i < items.size(); ++i) {
    Group& group = groups_[i];
    group.first = entries_.size();
    Outcome outcome = decideItem(group, items[i], now_ns, in_group_);
    group.count = entries_.size() - group.first;
    if (outcome == Outcome::kAnswered && entries_.back().verdict.failed) {
      giveBackAll(now_ns);
      answer->fail(entries_.back().verdict.error, entries_.back().verdict.message);
      return Outcome::kAnswered;
    }
    if (outcome != Outcome::kAnswered) {
      // Waits for a lease (nothing of a group waits for units): taken again
      // when it is asked again.
      giveBackAll(now_ns);
      return outcome;
    }
  }
  const bool allowed = std::all_of(entries_.begin(), entries_.end(), [](const Entry& entry) {
    return entry.verdict.decision.allowed;
  });
  if (!allowed) giveBackAll(now_ns);
  for (const Group& group : groups_) {
    auto entries = std::span(entries_).subspan(group.first, group.count);
    if (allowed && group.count > 1 && group.configured->shadow &&
        std::any_of(entries.begin(), entries.end(), [](const Entry& entry) {
          return entry.verdict.decision.shadow_denied;
        })) {
      // A shadow rule spends nothing on a request one of its limits denies,
      // as the limiter's rule of several limits does.
      for (Entry& entry : entries) giveBack(entry, now_ns);
    }
    if (allowed) {
      for (const Entry& entry : entries) keep(group.key, entry);
    }
    Mode mode = Mode::kLocal;
    Decision decision = groupDecision(group, &mode);
    answer->decide(decision, mode);
  }
  answer->allowed = allowed;
  return Outcome::kAnswered;
}

Outcome GroupPath::acquireAlone(const Rule& configured, const Item& item, int64_t now_ns,
                                const Asker& asker, Answer* answer) {
  // The lone entry is kept between questions: only what a path may leave
  // unset is reset (a path always decides or fails what it answers). Of
  // what it took, that is the kinds keep() and giveBack() look at: a path
  // sets the rest of a kind with it.
  Entry& entry = alone_;
  entry.rule = &configured;
  Taken& taken = entry.verdict.taken;
  taken.slice = {};
  taken.held = {};
  taken.limited = nullptr;
  taken.share = nullptr;
  taken.on_rate = false;  // keep() counts the slice's units as a rate's fallback spend
  entry.verdict.failed = false;
  entry.verdict.waited_ms = -1;
  Outcome outcome = decideEntry(configured, item, now_ns, asker, &entry.verdict);
  switch (outcome) {
    case Outcome::kWaitsForLease:
    case Outcome::kWaitsUntilDue:
    case Outcome::kWaitsInLine: return outcome;  // nothing taken
    case Outcome::kAnswered:
      if (entry.verdict.failed) {
        answer->fail(entry.verdict.error, entry.verdict.message);
        return outcome;
      }
      break;
    case Outcome::kWaitsReserved: break;  // allowed: its units are spent already
    case Outcome::kRouted:
      // Only a settle is routed, and it never reaches a path.
      impossible("GroupPath::acquireAlone: a decision path routed an acquire");
      answer->fail(ErrorCode::kInternal, "an acquire was routed to another worker");
      return Outcome::kAnswered;
  }
  if (entry.verdict.decision.allowed) {
    keep(item.key, entry);
  } else {
    giveBack(entry, now_ns);
  }
  answer->decide(entry.verdict.decision, entry.verdict.mode, entry.verdict.waited_ms);
  return outcome;
}

Outcome GroupPath::decideItem(const Group& group, const Item& item, int64_t now_ns,
                              const Asker& asker) {
  // Without Redis, a global rule decides on its share (route), parts or not.
  std::span<const Rule> parts =
      broker_ != nullptr ? rules_->parts(*group.configured) : std::span<const Rule>();
  if (parts.empty()) {
    Entry& entry = entries_.emplace_back();
    entry.rule = group.configured;
    return decideEntry(*group.configured, item, now_ns, asker, &entry.verdict);
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    Entry& entry = entries_.emplace_back();
    entry.rule = &parts[i];
    Outcome outcome = decideEntry(parts[i], item, now_ns, asker, &entry.verdict);
    if (outcome == Outcome::kWaitsForLease) {
      // The parts after it ask for their leases too, so that all come
      // within one round trip.
      for (const Rule& part : parts.subspan(i + 1)) {
        if (leasing(part)) lease_.askForLease(*rules_, part, item, now_ns, asker.again);
      }
      return outcome;
    }
    if (outcome != Outcome::kAnswered || entries_.back().verdict.failed) return outcome;
  }
  return Outcome::kAnswered;
}


void GroupPath::giveBack(Entry& entry, int64_t now_ns) {
  Taken& taken = entry.verdict.taken;
  if (!taken.slice.empty()) slice::refund(taken.slice, taken.cost);
  if (!taken.held.empty()) holding_.refund(*entry.rule, taken.held, now_ns, taken.cost);
  if (taken.limited != nullptr) refund(*taken.limited, taken.state, now_ns, taken.cost);
  taken = Taken{};
}

void GroupPath::giveBackAll(int64_t now_ns) {
  for (Entry& entry : entries_) giveBack(entry, now_ns);
}

void GroupPath::keep(std::string_view key, const Entry& entry) {
  const Taken& taken = entry.verdict.taken;
  if (!taken.slice.empty()) metrics_.lease_units_spent.add(static_cast<uint64_t>(taken.cost));
  // Fallback admissions on a rate lease: debited when Redis answers again.
  if (taken.on_rate) slice::noteRateFallback(taken.slice, taken.cost);
  if (taken.share != nullptr) {
    policy_.noteFallbackSpend(*rules_, *taken.share, key, taken.share_words, taken.cost);
  }
}

Decision GroupPath::groupDecision(const Group& group, Mode* mode) const {
  if (group.count == 1) {
    *mode = entries_[group.first].verdict.mode;
    return entries_[group.first].verdict.decision;
  }
  // The parts report as the limits of a local rule do (limiter.h); the mode
  // is the reported part's.
  MostRestrictive merged;
  for (const Entry& entry : std::span(entries_).subspan(group.first, group.count)) {
    if (merged.add(withoutShadow(entry.verdict.decision))) *mode = entry.verdict.mode;
  }
  Decision decision = merged.decision();
  applyShadow(*group.configured, &decision);
  return decision;
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
    } else if (std::optional<Decision> rated;
               broker_ != nullptr && leasable(part) &&
               (rated = lease_.lookOnRate(*rules_, part, item.key, now_ns, item.cost, &part_mode))) {
      decision = *rated;  // Redis is unreachable and the part's key holds a rate
    } else if (auto [share, policy_mode] = route(part); share == nullptr) {
      part_mode = policy_mode;
      decision = policyDecision(part, policy_mode);
    } else {
      part_mode = policy_mode;
      KeyTable::Entry* entry = currentEntry(keys_, *share, item.key);
      const Rule& deciding = decidingFor(*rules_, *share, item.key, entry);
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

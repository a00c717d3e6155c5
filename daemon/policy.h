// Policy: the decisions that take no units from anywhere, and the rules that
// route a request to where its units come from.
//
// Which path decides a configured rule's request (route): a local rule
// decides on its key's own state (the limiter); a global rule that is not
// deciding on leases right now (Redis down, the key's lease failed or was
// late) answers as its on_redis_down policy
// says: "local" decides on the rule's fallback share (RuleSet::fallbackShare)
// in mode fallback, "open" allows and "closed" denies without state. A
// shadow rule reports mode shadow whatever decided it. A key blocked by its
// rule's penalty is denied in mode blocked until the block ends.
//
// The free functions are pure functions of their arguments: any thread, no
// clock, no allocation. Times are the decision's wire units (ms), from the
// rule's ns. PolicyPath (below) decides on state: the fallback share and the
// penalty's blocks.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "decision.h"
#include "key_table.h"
#include "entry.h"
#include "lease.h"
#include "metrics.h"
#include "rules.h"
#include "slice.h"
#include "verdict.h"

namespace sluice {

// Which rule decides a configured rule's requests, and in which mode. A null
// rule means the rule's Redis-down policy answers without state.
struct Route {
  const Rule* rule;
  Mode mode;
};
// The route while the rule is not deciding on leases (see above).
Route route(const RuleSet& rules, const Rule& rule);

// The mode of a global rule's decisions made on its lease: normal, or shadow.
inline Mode leasedMode(const Rule& rule) { return rule.shadow ? Mode::kShadow : Mode::kNormal; }

// The answer of a global rule whose policy is "open" or "closed" while it is
// not deciding on leases; nothing is spent.
Decision policyDecision(const Rule& rule, Mode mode);

// A rule's penalty as it applies: a shadow rule only observes, so never.
inline const Penalty* activePenalty(const Rule& rule) {
  return rule.penalty && !rule.shadow ? &*rule.penalty : nullptr;
}

// The answer for a key blocked by its rule's penalty for `left_ns` more.
Decision blockedDecision(const Rule& rule, int64_t left_ns);

// The answer for a cost that can never pass (over the rule's first limit).
Decision exceedsCapacity(const Rule& rule);

// A shadow rule's denial is reported allowed, with shadow_denied set.
void applyShadow(const Rule& rule, Decision* decision);

// A decision as a rule that is not in shadow mode would have it: a shadow
// denial is a denial again (with no retry_after: applyShadow dropped it).
Decision withoutShadow(Decision decision);

// The decisions of the policy path that keep state: a global rule deciding on
// its fallback share (on_redis_down "local"), and penalties, whose blocks a
// global rule shares across the fleet through Redis. One worker's, called
// only from its loop, inside its KeyTable::ReadGuard; `broker` is null
// without Redis.
class PolicyPath {
 public:
  PolicyPath(KeyTable& keys, MetricsShard& metrics, LeaseBroker* broker)
      : keys_(keys), metrics_(metrics), broker_(broker) {}

  // A limiter decision on the share entry of a global rule. What it spends
  // goes in `taken` (limited, state), and for a `fallback` spend (not a
  // learning node's cap) the share too, for the caller to note
  // (noteFallbackSpend) once it keeps the units. nullopt: table full.
  std::optional<Decision> acquireShare(const RuleSet& rules, const Rule& share,
                                       std::string_view key, int64_t now_ns, int64_t cost,
                                       bool fallback, Taken* taken);
  // Records units a share admitted for a leasable global rule: debited at
  // once while Redis is up, else counted in the entry for the recovery.
  // `share` is the share itself (not a variant); `words` its entry's.
  void noteFallbackSpend(const RuleSet& rules, const Rule& share, std::string_view key,
                         std::span<std::atomic<uint64_t>> words, int64_t cost);
  // Counts a denial toward `configured`'s penalty in the words of the entry
  // that holds it (the key's, or for a global rule its slice entry); at the
  // D-th, blocks the key, for a global rule across the fleet (lease.h).
  void countDenial(const Rule& configured, std::string_view key,
                   std::span<std::atomic<uint64_t>> entry_words, const Decision& decision,
                   int64_t now_ns);
  // How long a global rule's key stays blocked, as this node knows (0: not).
  int64_t globalBlockedFor(const Rule& configured, std::string_view key, int64_t now_ns);

 private:
  KeyTable& keys_;
  MetricsShard& metrics_;
  LeaseBroker* broker_;
};

}  // namespace sluice

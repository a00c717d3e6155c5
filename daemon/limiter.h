// Limiter: applies a rule's limits to one key's state, all-or-nothing.
//
// A key's state is an array of 64-bit atomic words owned by its key-table
// entry (stateWords(rule) of them, all zero for a fresh key). The limiter
// runs the rule's algorithms (algorithms/*.h, pure functions) on snapshots of
// those words and publishes the result with compare-and-swap; it never takes
// a lock, allocates, reads a clock or logs. Every function here is
// thread-safe: any number of workers may decide on the same key at once.
//
// All-or-nothing: a rule with several limits, and acquireAll() over several
// (rule, key) items, spend on each limit in turn and refund what was already
// spent when a later limit denies, so nothing stays spent on a denial.
//
// Shadow rules: a denial is reported as allowed with shadow_denied set, and
// nothing is spent; in acquireAll() a shadow item never denies the group.
//
// Time: now_ns is the daemon's monotonic clock in nanoseconds, passed in.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>

#include "decision.h"
#include "rules.h"

namespace sluice {

// Number of 64-bit state words one key of `rule` needs: one per limit, but
// for the algorithms that keep a word per unit. Inline: every decision asks.
size_t wordPerUnitStateWords(const Rule& rule);
inline size_t stateWords(const Rule& rule) {
  if (algorithmTraits(rule.algorithm).state == StateShape::kOneWord) return rule.limits.size();
  return wordPerUnitStateWords(rule);
}

// Spends `cost` units (cost >= 1) when every limit allows it. A cost of 0 or
// less spends nothing and answers like peek(rule, state, now_ns, 0).
// With max_wait_ns > 0, token bucket and GCRA limits may allow on a
// reservation that is due decision.wait_ns from now (their headers); the
// other algorithms, and shadow rules, answer at once.
Decision acquire(const Rule& rule, std::span<std::atomic<uint64_t>> state, int64_t now_ns,
                 int64_t cost, int64_t max_wait_ns = 0);

// Reports what acquiring `cost` units would answer now, spending nothing.
// peek(rule, state, now, 0) is the wire method `peek`.
Decision peek(const Rule& rule, std::span<const std::atomic<uint64_t>> state, int64_t now_ns,
              int64_t cost);

// Gives back `cost` units held on a concurrency rule (the units whose hold
// expires soonest). Releasing more than is held releases what is held. On
// other algorithms it does nothing and reports like peek().
Decision release(const Rule& rule, std::span<std::atomic<uint64_t>> state, int64_t now_ns,
                 int64_t cost);

// Gives back `cost` units that acquire() spent on every limit of `rule` (a
// group that must spend all or nothing, and could not).
void refund(const Rule& rule, std::span<std::atomic<uint64_t>> state, int64_t now_ns,
            int64_t cost);

// Settles a reservation of `rule` whose units were spent at spent_ns
// (reservations.h): gives back `refund` units to every limit, or spends
// `debt` more on every limit even past it. Returns the state afterwards as
// peek(rule, state, now_ns, 0) reports it: `remaining` is negative while the
// key is in debt, and nothing new passes until it is paid back. A debt is
// charged only as far as leaves the key owing at most debtBound(rule, limit)
// on each limit; *charged (when not null) is what was charged on the limit
// that took the least, debt - *charged is unpaid. Only rules whose
// algorithm settles (algorithmTraits().settles); others are left as they
// are.
Decision settle(const Rule& rule, std::span<std::atomic<uint64_t>> state, int64_t spent_ns,
                int64_t now_ns, int64_t refund, int64_t debt, int64_t* charged = nullptr);

// True when the state is indistinguishable from a fresh key's at now_ns
// (buckets full, windows passed, nothing held): the entry may be dropped.
bool isIdle(const Rule& rule, std::span<const std::atomic<uint64_t>> state, int64_t now_ns);

// The decision reported for a rule of several limits, from its limits' own
// decisions (decision.h): a denial over any allowance, among denials the one
// that can never pass and then the longest retry_after, among allowances the
// fewest remaining; ties keep the earlier limit. acquire() and peek() report
// this way; so does the dispatcher for a global rule decided on its parts
// (RuleSet::parts). Add decisions without the shadow conversion.
class MostRestrictive {
 public:
  // Folds in one limit's decision; true when it is now the one reported.
  bool add(const Decision& d);
  // The one reported (a default Decision before any add).
  const Decision& decision() const { return kept_; }

 private:
  Decision kept_;
  bool have_ = false;
};

// One item of an all-or-nothing request. `decision` is filled in.
struct AcquireItem {
  const Rule* rule = nullptr;
  std::span<std::atomic<uint64_t>> state;
  int64_t cost = 1;
  Decision decision;
};

// Spends every item's cost, or none. Returns true when all were allowed.
// On a denial each item's decision says what that item alone would answer.
bool acquireAll(std::span<AcquireItem> items, int64_t now_ns);

}  // namespace sluice

// Entry: the layout of a key-table entry's words, and which rules lease
// (docs/design.md, "The middle layer", has who writes which words).
//
// A key entry holds, in order: the rule's state (a leasable global rule's
// slice, slice.h; a global concurrency rule's holding, holding.h; else the
// limiter's words, stateWords), then for a global rule's share one word of
// units admitted in fallback and not yet debited to Redis, then the
// penalty's words, then the override word. This header is the one place
// that says so; each part's own header says what its words mean, and only
// its own source file reads or writes them by index.
//
// Thread-safety: pure functions of the rule, but decidingRule(), which
// records the override word on first use (racing callers store the same
// value). No clock read.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "rules.h"

namespace sluice {

// Whether a rule's keys lease a slice from Redis: a global rule with one
// limit whose algorithm has a rate lease script (token bucket, GCRA, the
// windows and the sliding log). A global concurrency rule of one limit leases
// a holding instead (leasesHolding, holding.h). A global rate rule of several
// limits leases through its parts (RuleSet::parts), each a leasable rule of
// one limit.
// Inline: every decision asks.
inline bool leasable(const Rule& rule) {
  return rule.scope == Scope::kGlobal && rule.limits.size() == 1 &&
         hasRateLeaseScript(rule.algorithm);
}
inline bool leasesHolding(const Rule& rule) {
  return rule.scope == Scope::kGlobal && rule.limits.size() == 1 &&
         algorithmTraits(rule.algorithm).holds;
}

// Units of one limit the whole fleet may hold at once: burst for the
// buckets, limit for the windows.
inline int64_t leaseCapacity(const Limit& limit) {
  return limit.burst > 0 ? limit.burst : limit.limit;
}

// The words of a key-table entry of `rule`, in order:
//  - its state: for a leasable global rule its slice (slice::kWords), for
//    a global concurrency rule its holding (holding::words: the slice's
//    words, then its own and one slot per unit), else the limiter's words
//    (stateWords);
//  - for a global rule's share (id with kFallbackIdBit), one word counting
//    units admitted in fallback and not yet debited to Redis
//    (addUndebited(), takeUndebited());
//  - with a penalty, penalty::kWords words (penalty.h): penaltyWords() is
//    their number, 0 without one, and penaltyState() their span. A global
//    rule keeps them in its slice entry, whatever mode decides the key;
//  - with overrides, one word: which override decides the key
//    (RuleSet::matchOverride + 1; 0 until resolved).
// entryWords() is their number; take it from the configured rule or share,
// never from a variant (which has no overrides).
size_t entryWords(const Rule& rule);

// A share entry's undebited word (`words` are the entry's, `share` its
// rule, not a variant), read and written only through these: what fallback
// admitted, to debit to Redis once it is back. Thread-safe (atomic).
// Adds `units` admitted.
void addUndebited(const Rule& share, std::span<std::atomic<uint64_t>> words, int64_t units);
// Takes what is counted, leaving 0 (the recovery's debit).
int64_t takeUndebited(const Rule& share, std::span<std::atomic<uint64_t>> words);
// What is counted (an entry with undebited units is not idle).
int64_t undebited(const Rule& share, std::span<const std::atomic<uint64_t>> words);
size_t penaltyWords(const Rule& rule);
std::span<std::atomic<uint64_t>> penaltyState(const Rule& rule,
                                              std::span<std::atomic<uint64_t>> words);
// decidingRule() reads the override word, resolving and recording it on
// first use, and returns the rule that decides the key (the rule itself, or
// an override's variant); `words` are the entry's, entryWords(rule) of them.
const Rule& decidingRule(const RuleSet& rules, const Rule& rule, std::string_view key,
                         std::span<std::atomic<uint64_t>> words);
// The override recorded in an entry of `rule` (0: none, or not resolved yet).
uint32_t storedOverride(const Rule& rule, std::span<const std::atomic<uint64_t>> words);

}  // namespace sluice

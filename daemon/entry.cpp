// Entry: the layout of a key-table entry's words; see entry.h.
#include "entry.h"

#include "holding.h"
#include "limiter.h"
#include "penalty.h"
#include "slice.h"

namespace sluice {

namespace {

// Where the words after a rule's state begin.
size_t stateEnd(const Rule& rule) {
  if (leasable(rule)) return slice::kWords;
  if (leasesHolding(rule)) return holding::words(rule.limits.front());
  return stateWords(rule);
}

size_t overrideWord(const Rule& rule) { return entryWords(rule) - 1; }

size_t undebitedWord(const Rule& share) { return stateWords(share); }

}  // namespace

void addUndebited(const Rule& share, std::span<std::atomic<uint64_t>> words, int64_t units) {
  words[undebitedWord(share)].fetch_add(static_cast<uint64_t>(units), std::memory_order_acq_rel);
}

int64_t takeUndebited(const Rule& share, std::span<std::atomic<uint64_t>> words) {
  size_t word = undebitedWord(share);
  if (words.size() <= word) return 0;
  return static_cast<int64_t>(words[word].exchange(0, std::memory_order_acq_rel));
}

int64_t undebited(const Rule& share, std::span<const std::atomic<uint64_t>> words) {
  size_t word = undebitedWord(share);
  if (words.size() <= word) return 0;
  return static_cast<int64_t>(words[word].load(std::memory_order_acquire));
}

size_t entryWords(const Rule& rule) {
  size_t words = stateEnd(rule) + penaltyWords(rule);
  if ((rule.id & kFallbackIdBit) != 0) ++words;  // undebited
  if (!rule.overrides.empty()) ++words;
  return words;
}

size_t penaltyWords(const Rule& rule) { return rule.penalty ? size_t{penalty::kWords} : 0; }

std::span<std::atomic<uint64_t>> penaltyState(const Rule& rule,
                                              std::span<std::atomic<uint64_t>> words) {
  return words.subspan(stateEnd(rule), penaltyWords(rule));
}

const Rule& decidingRule(const RuleSet& rules, const Rule& rule, std::string_view key,
                         std::span<std::atomic<uint64_t>> words) {
  if (rule.overrides.empty()) return rule;
  // Every variant has the rule's layout (rules.h), so the word follows it.
  std::atomic<uint64_t>& which = words[overrideWord(rule)];
  uint64_t stored = which.load(std::memory_order_relaxed);
  if (stored == 0) {
    // Racing creators compute the same answer, so the last store is fine.
    stored = rules.matchOverride(rule, key) + 1;
    which.store(stored, std::memory_order_relaxed);
  }
  return rules.variant(rule, static_cast<uint32_t>(stored - 1));
}

uint32_t storedOverride(const Rule& rule, std::span<const std::atomic<uint64_t>> words) {
  if (rule.overrides.empty() || words.size() != entryWords(rule)) return 0;
  uint64_t stored = words[overrideWord(rule)].load(std::memory_order_relaxed);
  // stored: matchOverride + 1, so 1 (the rule itself) to overrides + 1.
  return stored == 0 || stored - 1 > rule.overrides.size() ? 0 : static_cast<uint32_t>(stored - 1);
}

}  // namespace sluice

// Lookup: entries looked at, never created; see lookup.h.
#include "lookup.h"

#include "entry.h"
#include "limiter.h"

namespace sluice {

KeyTable::Entry* currentEntry(KeyTable& keys, const Rule& rule, std::string_view key) {
  KeyTable::Entry* entry = keys.find(rule.id, key);
  // An entry of the rule's old shape, before a reload, is none.
  return entry != nullptr && entry->state().size() == entryWords(rule) ? entry : nullptr;
}

const Rule& decidingFor(const RuleSet& rules, const Rule& rule, std::string_view key,
                        KeyTable::Entry* entry) {
  return entry != nullptr ? decidingRule(rules, rule, key, entry->state())
                          : rules.variant(rule, rules.matchOverride(rule, key));
}

std::span<std::atomic<uint64_t>> FreshState::of(const Rule& rule) {
  size_t words = stateWords(rule);
  if (words_.size() < words) {
    words_ = std::vector<std::atomic<uint64_t>>(words);
  }
  for (size_t i = 0; i < words; ++i) {
    words_[i].store(0, std::memory_order_relaxed);
  }
  return {words_.data(), words};
}

}  // namespace sluice

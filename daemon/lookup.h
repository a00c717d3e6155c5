// Lookup: a key's entry as its rule is now, for the requests that look but
// never create a key (peek, release, reset), and the state of a key that has
// no entry (a fresh key's: all zero).
//
// Called from a worker inside its KeyTable::ReadGuard; an entry returned
// lives until the guard ends. FreshState belongs to one worker.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "key_table.h"
#include "rules.h"

namespace sluice {

// The entry of (rule, key) as the rule is now: nullptr when there is none,
// or when it has the rule's old shape (before a reload). Creates nothing.
KeyTable::Entry* currentEntry(KeyTable& keys, const Rule& rule, std::string_view key);

// The rule that decides `key` of `rule`: from its entry's override word, or
// worked out afresh without an entry.
const Rule& decidingFor(const RuleSet& rules, const Rule& rule, std::string_view key,
                        KeyTable::Entry* entry);

// A fresh key's state for `rule`, in scratch space reused between requests
// (it grows to the largest rule asked for, then never allocates).
class FreshState {
 public:
  std::span<std::atomic<uint64_t>> of(const Rule& rule);

 private:
  std::vector<std::atomic<uint64_t>> words_;
};

}  // namespace sluice

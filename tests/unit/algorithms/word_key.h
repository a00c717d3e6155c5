// Test support for the single-word algorithms (token bucket, GCRA, fixed and
// sliding window): one key's state word and the limit it is judged by, driven
// on a simulated clock.
#pragma once

#include <cstdint>

#include "decision.h"
#include "rules.h"

namespace sluice::test {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kSecond = 1'000 * kMs;

template <Decision (*Acquire)(uint64_t& state, const Limit& limit, int64_t now_ns, int64_t cost)>
struct WordKey {
  Limit limit;
  uint64_t state = 0;

  Decision acquire(int64_t now_ns, int64_t cost = 1) { return Acquire(state, limit, now_ns, cost); }
  // What acquiring `cost` would answer, leaving the state as it is.
  Decision peek(int64_t now_ns, int64_t cost = 0) const {
    uint64_t copy = state;
    return Acquire(copy, limit, now_ns, cost);
  }
  // Acquires one unit at a time until denied; returns how many passed.
  int64_t drain(int64_t now_ns) {
    int64_t granted = 0;
    while (acquire(now_ns).allowed) ++granted;
    return granted;
  }
};

}  // namespace sluice::test

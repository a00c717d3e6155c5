// Test support for the single-word algorithms (token bucket, GCRA, fixed and
// sliding window): one key's state word and the limit it is judged by, driven
// on a simulated clock.
#pragma once

#include <cstdint>
#include <type_traits>

#include "decision.h"
#include "rules.h"

namespace sluice::test {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kSecond = 1'000 * kMs;

// `Acquire` is an algorithm's acquire(state, limit, now_ns, cost), with or
// without a trailing max_wait_ns (token bucket and GCRA can wait).
template <auto Acquire>
struct WordKey {
  static constexpr bool kCanWait =
      std::is_invocable_v<decltype(Acquire), uint64_t&, const Limit&, int64_t, int64_t, int64_t>;

  Limit limit;
  uint64_t state = 0;

  Decision acquire(int64_t now_ns, int64_t cost = 1) { return call(state, now_ns, cost, 0); }
  // Acquires waiting at most max_wait_ns (token bucket and GCRA only).
  Decision reserve(int64_t now_ns, int64_t max_wait_ns, int64_t cost = 1) {
    return call(state, now_ns, cost, max_wait_ns);
  }
  // What acquiring `cost` would answer, leaving the state as it is.
  Decision peek(int64_t now_ns, int64_t cost = 0) const {
    uint64_t copy = state;
    return call(copy, now_ns, cost, 0);
  }
  // Acquires one unit at a time until denied; returns how many passed.
  int64_t drain(int64_t now_ns) {
    int64_t granted = 0;
    while (acquire(now_ns).allowed) ++granted;
    return granted;
  }

 private:
  Decision call(uint64_t& word, int64_t now_ns, int64_t cost, int64_t max_wait_ns) const {
    if constexpr (kCanWait) {
      return Acquire(word, limit, now_ns, cost, max_wait_ns);
    } else {
      return Acquire(word, limit, now_ns, cost);
    }
  }
};

}  // namespace sluice::test

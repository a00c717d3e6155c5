// Slot arrays: the shared state layout of sliding_log and concurrency, one
// 64-bit atomic word per unit of the limit, each saying until when its unit is
// taken.
//
// A slot holds a time encoded with time_math::encodeTime (the zero word is the
// distant past, a never-used slot). Its unit is taken until
//   expiry = decoded time + hold_ns
// (sliding_log stores the admission time and holds for the period;
// concurrency stores the deadline itself and passes hold_ns = 0). A slot is
// free when expiry <= now. An expiry of time_math::kMaxTimeNs means "never":
// such a slot is freed only by being cleared.
//
// Thread-safety: every function may run on any thread at once on the same
// slots. Slots are claimed one by one with compare-and-swap; a claimer that
// cannot get all the units it needs gives back the ones it claimed, so a
// denied request leaves nothing taken. No allocation: scratch space is a fixed
// array on the stack, sized by kMaxSlots (maxLimit of both algorithms).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>

#include "algorithms/time_math.h"
#include "decision.h"

namespace sluice::slots {

// The most slots one limit may have: maxLimit(kSlidingLog / kConcurrency).
constexpr size_t kMaxSlots = 1000;

// Until when the unit of a slot holding `word` is taken.
inline int64_t expiryNs(uint64_t word, int64_t hold_ns) {
  return time_math::clampToI64(static_cast<time_math::i128>(time_math::decodeTime(word)) + hold_ns);
}

inline bool isFree(uint64_t word, int64_t hold_ns, int64_t now_ns) {
  const int64_t expiry_ns = expiryNs(word, hold_ns);
  return expiry_ns <= now_ns && expiry_ns != time_math::kMaxTimeNs;
}

// Reports what taking `cost` units would answer now, from one pass over the
// slots; when `spent` the cost was already taken and the decision is allowed.
//  - remaining: free slots (after the spend);
//  - reset_after_ms: until the last expiring unit is free (units that never
//    expire are left out: only clearing frees them);
//  - retry_after_ms: until enough units expire for `cost`, rounded up; 0
//    when allowed, or when only clearing can free enough.
inline Decision report(std::span<const std::atomic<uint64_t>> slots, int64_t hold_ns, int64_t limit,
                       int64_t now_ns, int64_t cost, bool spent) {
  std::array<int64_t, kMaxSlots> expiries_ns;
  size_t expiring = 0;
  int64_t free_units = 0;
  int64_t last_ns = now_ns;
  for (size_t i = 0; i < slots.size() && i < kMaxSlots; ++i) {
    const uint64_t word = slots[i].load(std::memory_order_acquire);
    const int64_t expiry_ns = expiryNs(word, hold_ns);
    if (isFree(word, hold_ns, now_ns)) {
      ++free_units;
    } else if (expiry_ns != time_math::kMaxTimeNs) {
      expiries_ns[expiring++] = expiry_ns;
      last_ns = std::max(last_ns, expiry_ns);
    }
  }
  Decision d;
  d.limit = limit;
  d.remaining = free_units;
  d.reset_after_ms = time_math::ceilMs(static_cast<time_math::i128>(last_ns) - now_ns);
  if (cost > limit) {
    d.cost_exceeds_limit = true;
  } else if (spent || free_units >= cost) {
    d.allowed = true;
    if (!spent) d.remaining -= cost;
  } else {
    const size_t needed = static_cast<size_t>(cost - free_units);
    if (needed <= expiring) {
      std::nth_element(expiries_ns.begin(), expiries_ns.begin() + (needed - 1), expiries_ns.begin() + expiring);
      d.retry_after_ms = time_math::ceilMs(static_cast<time_math::i128>(expiries_ns[needed - 1]) - now_ns);
    }
  }
  return d;
}

// Takes `cost` free slots by writing `taken_word` into each, or none. Returns
// whether all were taken.
inline bool claim(std::span<std::atomic<uint64_t>> slots, int64_t hold_ns, int64_t now_ns, int64_t cost,
                  uint64_t taken_word) {
  std::array<uint16_t, kMaxSlots> claimed_at;
  std::array<uint64_t, kMaxSlots> old_words;
  size_t claimed = 0;
  for (size_t i = 0; i < slots.size() && i < kMaxSlots && static_cast<int64_t>(claimed) < cost; ++i) {
    uint64_t word = slots[i].load(std::memory_order_acquire);
    // A failed CAS reloads the word; retry while the slot is still free.
    while (isFree(word, hold_ns, now_ns)) {
      if (slots[i].compare_exchange_weak(word, taken_word, std::memory_order_acq_rel, std::memory_order_acquire)) {
        claimed_at[claimed] = static_cast<uint16_t>(i);
        old_words[claimed] = word;
        ++claimed;
        break;
      }
    }
  }
  if (static_cast<int64_t>(claimed) == cost) return true;
  // Give back what was claimed, restoring the old (free) words exactly so that
  // a thread whose clock reads earlier sees what it saw before. A slot that
  // changed meanwhile was taken legitimately by someone else and is left alone.
  for (size_t k = 0; k < claimed; ++k) {
    uint64_t expected = taken_word;
    slots[claimed_at[k]].compare_exchange_strong(expected, old_words[k], std::memory_order_acq_rel);
  }
  return false;
}

// Clears up to `cost` slots holding exactly `taken_word`: undoes a claim()
// made with that word. Slots with the same word are interchangeable.
inline void unclaim(std::span<std::atomic<uint64_t>> slots, int64_t cost, uint64_t taken_word) {
  for (size_t i = 0; i < slots.size() && cost > 0; ++i) {
    uint64_t expected = taken_word;
    if (slots[i].compare_exchange_strong(expected, 0, std::memory_order_acq_rel)) --cost;
  }
}

inline bool allFree(std::span<const std::atomic<uint64_t>> slots, int64_t hold_ns, int64_t now_ns) {
  for (const auto& slot : slots) {
    if (!isFree(slot.load(std::memory_order_acquire), hold_ns, now_ns)) return false;
  }
  return true;
}

}  // namespace sluice::slots

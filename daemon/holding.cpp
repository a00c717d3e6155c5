// Holding: a global concurrency rule's leased units and local slots; see
// holding.h.
#include "holding.h"

#include <algorithm>
#include <array>

#include "algorithms/concurrency.h"
#include "algorithms/slots.h"
#include "algorithms/time_math.h"

namespace sluice::holding {

namespace {

using Words = std::span<std::atomic<uint64_t>>;
using ConstWords = std::span<const std::atomic<uint64_t>>;

// The word a slot holds for a unit held from now_ns: its deadline, or
// "never" for a rule without a period. Never 0 (a free slot).
uint64_t heldWord(const Limit& limit, int64_t now_ns) {
  if (limit.period_ns <= 0) return time_math::encodeTime(time_math::kMaxTimeNs);
  return time_math::encodeTime(
      time_math::clampToI64(static_cast<time_math::i128>(now_ns) + limit.period_ns));
}

bool expired(uint64_t word, int64_t now_ns) {
  if (word == 0) return false;
  int64_t deadline_ns = time_math::decodeTime(word);
  return deadline_ns <= now_ns && deadline_ns != time_math::kMaxTimeNs;
}

Words slotsOf(Words words) { return words.subspan(kSlots); }
ConstWords slotsOf(ConstWords words) { return words.subspan(kSlots); }

// Clears slot i, which held the expired `word`, into the pool; true when
// this caller cleared it.
bool reclaimSlot(Words words, size_t i, uint64_t word) {
  if (!slotsOf(words)[i].compare_exchange_strong(word, 0, std::memory_order_acq_rel)) return false;
  words[slice::kUnits].fetch_add(1, std::memory_order_acq_rel);
  return true;
}

// Claims `cost` free slots with `word`, reclaiming expired ones it meets;
// all or none.
bool claim(Words words, int64_t now_ns, int64_t cost, uint64_t word, int64_t* reclaimed) {
  Words slots = slotsOf(words);
  int64_t claimed = 0;
  for (size_t i = 0; i < slots.size() && claimed < cost; ++i) {
    uint64_t seen = slots[i].load(std::memory_order_acquire);
    if (expired(seen, now_ns)) {
      if (!reclaimSlot(words, i, seen)) continue;
      ++*reclaimed;
      seen = 0;
    }
    // seq_cst, with overCap's loads: see there.
    if (seen == 0 && slots[i].compare_exchange_strong(seen, word, std::memory_order_seq_cst)) {
      ++claimed;
    }
  }
  if (claimed == cost) return true;
  slots::unclaim(slots, claimed, word);
  return false;
}

// Whether the units held here at now_ns exceed `cap`, read after the
// caller's claim: of two racing claimers that both pass, the later reader
// saw the other's claim, so together they stay within cap. The claims' CAS
// and these loads are all seq_cst, so they fall in one total order (a fence
// would do the same, but ThreadSanitizer does not understand fences).
bool overCap(Words words, int64_t now_ns, int64_t cap) {
  int64_t held = 0;
  for (const auto& slot : slotsOf(words)) {
    uint64_t word = slot.load(std::memory_order_seq_cst);
    if (word != 0 && !expired(word, now_ns)) ++held;
  }
  return held > cap;
}

}  // namespace

size_t words(const Limit& limit) { return kSlots + concurrency::stateWords(limit); }

int64_t pool(ConstWords words) {
  return static_cast<int64_t>(words[slice::kUnits].load(std::memory_order_acquire));
}

int64_t live(ConstWords words, int64_t now_ns) {
  int64_t held = 0;
  for (const auto& slot : slotsOf(words)) {
    uint64_t word = slot.load(std::memory_order_acquire);
    if (word != 0 && !expired(word, now_ns)) ++held;
  }
  return held;
}

int64_t reclaim(Words words, int64_t now_ns) {
  Words slots = slotsOf(words);
  int64_t reclaimed = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    uint64_t seen = slots[i].load(std::memory_order_acquire);
    if (expired(seen, now_ns) && reclaimSlot(words, i, seen)) ++reclaimed;
  }
  return reclaimed;
}

Acquired acquire(Words words, const Limit& limit, int64_t now_ns, int64_t cost, bool again,
                 int64_t cap) {
  Acquired result;
  // Expired units first, so that the pool counts them.
  if (limit.period_ns > 0) result.reclaimed = reclaim(words, now_ns);
  result.taken = slice::take(words.first(slice::kWords), now_ns, cost, again);
  if (result.taken.outcome != slice::Outcome::kTaken) return result;
  notePool(words, result.taken.left);
  uint64_t word = heldWord(limit, now_ns);
  bool held = claim(words, now_ns, cost, word, &result.reclaimed);
  if (held && cap > 0 && overCap(words, now_ns, cap)) {
    slots::unclaim(slotsOf(words), cost, word);
    held = false;
  }
  if (!held) {
    // The cap (or, which the invariant rules out, no free slot): the units
    // go back to the pool, and the request is denied.
    slice::refund(words, cost);
    result.taken.outcome = slice::Outcome::kDenied;
    result.taken.until_ns = 0;
    result.capped = true;
  }
  return result;
}

bool acquireLocal(Words words, const Limit& limit, int64_t now_ns, int64_t cost, int64_t cap,
                  int64_t* reclaimed) {
  *reclaimed = limit.period_ns > 0 ? reclaim(words, now_ns) : 0;
  uint64_t word = heldWord(limit, now_ns);
  if (!claim(words, now_ns, cost, word, reclaimed)) return false;
  if (overCap(words, now_ns, cap)) {
    slots::unclaim(slotsOf(words), cost, word);
    return false;
  }
  words[slice::kUnits].fetch_sub(static_cast<uint64_t>(cost), std::memory_order_acq_rel);
  return true;
}

void refund(Words words, const Limit& limit, int64_t now_ns, int64_t cost) {
  slots::unclaim(slotsOf(words), cost, heldWord(limit, now_ns));
  slice::refund(words, cost);
}

int64_t release(Words words, int64_t now_ns, int64_t cost) {
  int64_t freed = reclaim(words, now_ns);
  Words slots = slotsOf(words);
  while (cost > 0) {
    // The held unit with the soonest deadline; a racing release or acquire
    // may change it before our CAS, in which case we look again.
    size_t soonest = slots.size();
    uint64_t soonest_word = 0;
    for (size_t i = 0; i < slots.size(); ++i) {
      uint64_t word = slots[i].load(std::memory_order_acquire);
      if (word == 0 || expired(word, now_ns)) continue;
      if (soonest == slots.size() ||
          time_math::decodeTime(word) < time_math::decodeTime(soonest_word)) {
        soonest = i;
        soonest_word = word;
      }
    }
    if (soonest == slots.size()) break;
    if (slots[soonest].compare_exchange_strong(soonest_word, 0, std::memory_order_acq_rel)) {
      words[slice::kUnits].fetch_add(1, std::memory_order_acq_rel);
      ++freed;
      --cost;
    }
  }
  return freed;
}

void notePool(Words words, int64_t left) {
  // A plain load and store: a racing worker may keep the higher of two
  // values, which only returns a unit more at the next pass, and the pool
  // never gives out units it does not hold.
  auto low = static_cast<int64_t>(words[kPoolLow].load(std::memory_order_relaxed));
  if (left < low) words[kPoolLow].store(static_cast<uint64_t>(left), std::memory_order_relaxed);
}

int64_t takeSurplus(Words words) {
  uint64_t units = words[slice::kUnits].load(std::memory_order_acquire);
  auto low = static_cast<int64_t>(words[kPoolLow].exchange(units, std::memory_order_relaxed));
  int64_t surplus = std::min(low, static_cast<int64_t>(units));
  while (surplus > 0) {
    int64_t take = std::min(surplus, static_cast<int64_t>(units));
    if (take <= 0) return 0;
    if (words[slice::kUnits].compare_exchange_weak(units, units - static_cast<uint64_t>(take),
                                                   std::memory_order_acq_rel)) {
      words[kPoolLow].store(units - static_cast<uint64_t>(take), std::memory_order_relaxed);
      return take;
    }
  }
  return 0;
}

bool claimLease(Words words) {
  uint64_t flags = words[slice::kFlags].load(std::memory_order_relaxed);
  while ((flags & slice::kInFlight) == 0) {
    if (words[slice::kFlags].compare_exchange_weak(flags, flags | slice::kInFlight,
                                                   std::memory_order_acq_rel)) {
      return true;
    }
  }
  return false;
}

slice::Batch nextBatch(Words words, int64_t now_ns, int64_t cost, const Rule& rule,
                       uint32_t nodes, int64_t lease_interval_ns) {
  slice::Batch batch =
      slice::nextBatch(words.first(slice::kWords), now_ns, cost, rule, nodes, lease_interval_ns);
  int64_t limit = rule.limits.front().limit;
  // What the pool lacks for `cost`, its debt included; a refill asked for
  // at the low-water mark takes whatever Redis has.
  batch.need = std::clamp<int64_t>(cost - pool(words), 1, limit);
  batch.n = std::clamp<int64_t>(batch.n, batch.need, limit);
  return batch;
}

Decision decide(ConstWords words, const Limit& limit, int64_t now_ns, int64_t cost,
                int64_t free_units, bool allowed, int64_t retry_ns, int64_t others_back_ns) {
  std::array<int64_t, slots::kMaxSlots> deadlines_ns;
  size_t expiring = 0;
  int64_t last_ns = now_ns;
  for (const auto& slot : slotsOf(words)) {
    uint64_t word = slot.load(std::memory_order_acquire);
    if (word == 0 || expired(word, now_ns)) continue;
    int64_t deadline_ns = time_math::decodeTime(word);
    if (deadline_ns == time_math::kMaxTimeNs || expiring == deadlines_ns.size()) continue;
    deadlines_ns[expiring++] = deadline_ns;
    last_ns = std::max(last_ns, deadline_ns);
  }
  Decision decision;
  decision.limit = limit.limit;
  decision.allowed = allowed;
  decision.remaining = std::max<int64_t>(free_units, 0);
  decision.reset_after_ms = time_math::ceilMs(static_cast<time_math::i128>(last_ns) - now_ns);
  if (!allowed) {
    auto needed = static_cast<size_t>(std::max<int64_t>(cost - free_units, 1));
    if (needed <= expiring) {
      std::nth_element(deadlines_ns.begin(), deadlines_ns.begin() + (needed - 1),
                       deadlines_ns.begin() + expiring);
      decision.retry_after_ms =
          time_math::ceilMs(static_cast<time_math::i128>(deadlines_ns[needed - 1]) - now_ns);
    }
    int64_t held_here = static_cast<int64_t>(words[kHeld].load(std::memory_order_acquire));
    if (others_back_ns > 0 && held_here < limit.limit) {
      int64_t back_ms = time_math::ceilMs(others_back_ns);
      decision.retry_after_ms =
          decision.retry_after_ms > 0 ? std::min(decision.retry_after_ms, back_ms) : back_ms;
    }
    decision.retry_after_ms = std::max(decision.retry_after_ms, time_math::ceilMs(retry_ns));
    decision.reset_after_ms = std::max(decision.reset_after_ms, decision.retry_after_ms);
  }
  return decision;
}

int64_t held(ConstWords words) {
  return static_cast<int64_t>(words[kHeld].load(std::memory_order_acquire));
}

void applyGrant(Words words, int64_t granted) {
  words[kHeld].fetch_add(static_cast<uint64_t>(granted), std::memory_order_acq_rel);
  words[slice::kUnits].fetch_add(static_cast<uint64_t>(granted), std::memory_order_acq_rel);
  words[slice::kDenyUntil].store(0, std::memory_order_release);
  words[slice::kFlags].fetch_or(slice::kWarm, std::memory_order_acq_rel);
}

void returned(Words words, int64_t units) {
  words[kHeld].fetch_sub(static_cast<uint64_t>(units), std::memory_order_acq_rel);
}

int64_t reconcile(Words words, int64_t redis_held) {
  int64_t believed = held(words);
  if (redis_held >= believed) return 0;
  int64_t lost = believed - redis_held;
  words[slice::kUnits].fetch_sub(static_cast<uint64_t>(lost), std::memory_order_acq_rel);
  words[kHeld].store(static_cast<uint64_t>(redis_held), std::memory_order_release);
  return lost;
}

int64_t takeAll(Words words) {
  auto held_units = static_cast<int64_t>(words[kHeld].exchange(0, std::memory_order_acq_rel));
  words[slice::kUnits].store(0, std::memory_order_release);
  return held_units;
}

}  // namespace sluice::holding

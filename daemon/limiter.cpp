// Limiter: runs a rule's algorithms on one key's state words (see limiter.h).
//
// Concurrency model: the limiter holds no state of its own. Single-word
// algorithms (token bucket, GCRA, fixed and sliding window) compute a new word
// from a snapshot and publish it with a compare-and-swap, recomputing from the
// fresh value when another thread won the race. Slot algorithms (sliding log,
// concurrency) claim slots one CAS at a time (algorithms/slots.h). No lock, no
// allocation, no clock read.
//
// Layout: the rule's limits, in order, each own a contiguous run of words:
// one word for single-word algorithms, `limit` words for slot algorithms.
#include "limiter.h"

#include <algorithm>

#include "algorithms/concurrency.h"
#include "algorithms/fixed_window.h"
#include "algorithms/gcra.h"
#include "algorithms/sliding_log.h"
#include "algorithms/sliding_window.h"
#include "algorithms/token_bucket.h"

namespace sluice {
namespace {

// One single-word algorithm's functions, so the CAS loops are written once.
struct WordAlgorithm {
  Decision (*acquire)(uint64_t& state, const Limit& limit, int64_t now_ns, int64_t cost,
                      int64_t max_wait_ns);
  uint64_t (*refund)(uint64_t state, const Limit& limit, int64_t now_ns, int64_t cost);
  bool (*is_idle)(uint64_t state, const Limit& limit, int64_t now_ns);
  // A settle's transitions (settle()).
  uint64_t (*refund_spent)(uint64_t state, const Limit& limit, int64_t spent_ns, int64_t now_ns,
                           int64_t cost);
  uint64_t (*charge)(uint64_t state, const Limit& limit, int64_t now_ns, int64_t cost);
  // Units a bucket owes (its remaining reads 0 then); null for the windows,
  // whose remaining goes negative itself.
  int64_t (*owed)(uint64_t state, const Limit& limit, int64_t now_ns);
};

// nullptr for the slot algorithms.
const WordAlgorithm* wordAlgorithm(Algorithm algorithm) {
  static constexpr WordAlgorithm kTokenBucket{token_bucket::acquire, token_bucket::refund, token_bucket::isIdle,
                                                  token_bucket::refundSpent, token_bucket::charge,
                                                  token_bucket::owed};
  static constexpr WordAlgorithm kGcra{gcra::acquire, gcra::refund, gcra::isIdle, gcra::refundSpent,
                                          gcra::charge, gcra::owed};
  // The window algorithms answer at once: a window cannot be reserved ahead.
  static constexpr WordAlgorithm kFixedWindow{
      [](uint64_t& state, const Limit& limit, int64_t now_ns, int64_t cost, int64_t) {
        return fixed_window::acquire(state, limit, now_ns, cost);
      },
      fixed_window::refund, fixed_window::isIdle, fixed_window::refundSpent, fixed_window::charge,
      nullptr};
  static constexpr WordAlgorithm kSlidingWindow{
      [](uint64_t& state, const Limit& limit, int64_t now_ns, int64_t cost, int64_t) {
        return sliding_window::acquire(state, limit, now_ns, cost);
      },
      sliding_window::refund, sliding_window::isIdle, sliding_window::refundSpent,
      sliding_window::charge, nullptr};
  switch (algorithm) {
    case Algorithm::kTokenBucket: return &kTokenBucket;
    case Algorithm::kGcra: return &kGcra;
    case Algorithm::kFixedWindow: return &kFixedWindow;
    case Algorithm::kSlidingWindow: return &kSlidingWindow;
    case Algorithm::kSlidingLog:
    case Algorithm::kConcurrency: return nullptr;
  }
  return nullptr;
}

size_t limitWords(Algorithm algorithm, const Limit& limit) {
  switch (algorithmTraits(algorithm).state) {
    case StateShape::kOneWord: return 1;
    case StateShape::kWordPerUnit:
      return algorithm == Algorithm::kSlidingLog ? sliding_log::stateWords(limit)
                                                 : concurrency::stateWords(limit);
  }
  return 1;  // not reached: the switch covers every shape
}

// Calls fn(limit, words) for each limit of the rule with its run of words.
// A state span shorter than stateWords(rule) is a caller bug; the limits it
// does not cover are skipped rather than read out of bounds.
template <typename Words, typename Fn>
void forEachLimit(const Rule& rule, Words state, Fn&& fn) {
  size_t offset = 0;
  for (const Limit& limit : rule.limits) {
    const size_t words = limitWords(rule.algorithm, limit);
    if (offset + words > state.size()) return;
    if (!fn(limit, state.subspan(offset, words))) return;
    offset += words;
  }
}

Decision acquireLimit(Algorithm algorithm, const Limit& limit, std::span<std::atomic<uint64_t>> words,
                      int64_t now_ns, int64_t cost, int64_t max_wait_ns) {
  if (const WordAlgorithm* alg = wordAlgorithm(algorithm)) {
    std::atomic<uint64_t>& word = words[0];
    uint64_t seen = word.load(std::memory_order_acquire);
    for (;;) {
      uint64_t next = seen;
      const Decision d = alg->acquire(next, limit, now_ns, cost, max_wait_ns);
      if (!d.allowed || next == seen) return d;
      if (word.compare_exchange_weak(seen, next, std::memory_order_acq_rel, std::memory_order_acquire)) return d;
    }
  }
  if (algorithm == Algorithm::kSlidingLog) return sliding_log::acquire(words, limit, now_ns, cost);
  return concurrency::acquire(words, limit, now_ns, cost);
}

Decision peekLimit(Algorithm algorithm, const Limit& limit, std::span<const std::atomic<uint64_t>> words,
                   int64_t now_ns, int64_t cost) {
  if (const WordAlgorithm* alg = wordAlgorithm(algorithm)) {
    uint64_t snapshot = words[0].load(std::memory_order_acquire);
    return alg->acquire(snapshot, limit, now_ns, cost, 0);
  }
  if (algorithm == Algorithm::kSlidingLog) return sliding_log::peek(words, limit, now_ns, cost);
  return concurrency::peek(words, limit, now_ns, cost);
}

void refundLimit(Algorithm algorithm, const Limit& limit, std::span<std::atomic<uint64_t>> words, int64_t now_ns,
                 int64_t cost) {
  if (const WordAlgorithm* alg = wordAlgorithm(algorithm)) {
    std::atomic<uint64_t>& word = words[0];
    uint64_t seen = word.load(std::memory_order_acquire);
    for (;;) {
      const uint64_t next = alg->refund(seen, limit, now_ns, cost);
      if (next == seen) return;
      if (word.compare_exchange_weak(seen, next, std::memory_order_acq_rel, std::memory_order_acquire)) return;
    }
  }
  if (algorithm == Algorithm::kSlidingLog) {
    sliding_log::refund(words, limit, now_ns, cost);
  } else {
    concurrency::refund(words, limit, now_ns, cost);
  }
}

// Gives back `cost` on the first `count` limits of the rule.
void refundLimits(const Rule& rule, std::span<std::atomic<uint64_t>> state, int64_t now_ns, int64_t cost,
                  size_t count) {
  size_t index = 0;
  forEachLimit(rule, state, [&](const Limit& limit, std::span<std::atomic<uint64_t>> words) {
    if (index++ >= count) return false;
    refundLimit(rule.algorithm, limit, words, now_ns, cost);
    return true;
  });
}

// A shadow rule's denial is reported as allowed; the caller spent nothing.
Decision applyShadow(const Rule& rule, Decision d) {
  if (rule.shadow && !d.allowed) {
    d.allowed = true;
    d.shadow_denied = true;
    d.retry_after_ms = 0;
  }
  return d;
}

Decision peekRule(const Rule& rule, std::span<const std::atomic<uint64_t>> state, int64_t now_ns, int64_t cost) {
  MostRestrictive kept;
  forEachLimit(rule, state, [&](const Limit& limit, std::span<const std::atomic<uint64_t>> words) {
    kept.add(peekLimit(rule.algorithm, limit, words, now_ns, cost));
    return true;
  });
  return kept.decision();
}

// acquire() without the shadow conversion: spends on every limit or none.
// Waiting, each limit reserves its own units; the request is due when the
// last of them is.
Decision acquireRule(const Rule& rule, std::span<std::atomic<uint64_t>> state, int64_t now_ns, int64_t cost,
                     int64_t max_wait_ns) {
  if (cost <= 0) return peekRule(rule, state, now_ns, 0);
  MostRestrictive kept;
  size_t spent = 0;
  bool denied = false;
  int64_t wait_ns = 0;
  forEachLimit(rule, state, [&](const Limit& limit, std::span<std::atomic<uint64_t>> words) {
    // After a denial the remaining limits are only looked at, so the report
    // names the most restrictive of all of them.
    const Decision d = denied ? peekLimit(rule.algorithm, limit, words, now_ns, cost)
                              : acquireLimit(rule.algorithm, limit, words, now_ns, cost, max_wait_ns);
    if (!d.allowed) {
      denied = true;
    } else if (!denied) {
      ++spent;
      wait_ns = std::max(wait_ns, d.wait_ns);
    }
    kept.add(d);
    return true;
  });
  Decision decision = kept.decision();
  if (denied) {
    refundLimits(rule, state, now_ns, cost, spent);
  } else {
    decision.wait_ns = wait_ns;
  }
  return decision;
}

}  // namespace

bool MostRestrictive::add(const Decision& d) {
  auto rank = [](const Decision& x) { return x.allowed ? 0 : (x.cost_exceeds_limit ? 2 : 1); };
  bool keep = !have_ || rank(d) > rank(kept_) ||
              (rank(d) == rank(kept_) &&
               (d.allowed ? d.remaining < kept_.remaining : d.retry_after_ms > kept_.retry_after_ms));
  if (keep) kept_ = d;
  have_ = true;
  return keep;
}

size_t wordPerUnitStateWords(const Rule& rule) {
  size_t words = 0;
  for (const Limit& limit : rule.limits) words += limitWords(rule.algorithm, limit);
  return words;
}

Decision acquire(const Rule& rule, std::span<std::atomic<uint64_t>> state, int64_t now_ns, int64_t cost,
                 int64_t max_wait_ns) {
  // A shadow rule only observes: it never holds a request back.
  const Decision d = acquireRule(rule, state, now_ns, cost, rule.shadow ? 0 : max_wait_ns);
  return applyShadow(rule, d);
}

Decision peek(const Rule& rule, std::span<const std::atomic<uint64_t>> state, int64_t now_ns, int64_t cost) {
  return applyShadow(rule, peekRule(rule, state, now_ns, cost));
}

Decision release(const Rule& rule, std::span<std::atomic<uint64_t>> state, int64_t now_ns, int64_t cost) {
  if (rule.algorithm == Algorithm::kConcurrency && cost > 0) {
    forEachLimit(rule, state, [&](const Limit& limit, std::span<std::atomic<uint64_t>> words) {
      concurrency::release(words, limit, now_ns, cost);
      return true;
    });
  }
  return peek(rule, state, now_ns, 0);
}

void refund(const Rule& rule, std::span<std::atomic<uint64_t>> state, int64_t now_ns,
            int64_t cost) {
  if (cost > 0) refundLimits(rule, state, now_ns, cost, rule.limits.size());
}

namespace {

// One limit's state as a settle reports it: its remaining, negative by what
// the key owes (a bucket's remaining reads 0 while it owes: owed()).
Decision settledDecision(const WordAlgorithm& alg, uint64_t word, const Limit& limit,
                         int64_t now_ns) {
  Decision d = alg.acquire(word, limit, now_ns, 0, 0);
  if (alg.owed != nullptr) {
    if (const int64_t owed = alg.owed(word, limit, now_ns)) d.remaining = -owed;
  }
  return d;
}

}  // namespace

Decision settle(const Rule& rule, std::span<std::atomic<uint64_t>> state, int64_t spent_ns,
                int64_t now_ns, int64_t refund, int64_t debt, int64_t* charged) {
  const WordAlgorithm* alg = wordAlgorithm(rule.algorithm);
  if (charged != nullptr) *charged = 0;
  if (alg == nullptr) return peekRule(rule, state, now_ns, 0);
  MostRestrictive kept;
  int64_t least_charged = debt;
  forEachLimit(rule, state, [&](const Limit& limit, std::span<std::atomic<uint64_t>> words) {
    std::atomic<uint64_t>& word = words[0];
    uint64_t seen = word.load(std::memory_order_acquire);
    uint64_t next = seen;
    int64_t charging = 0;
    for (;;) {
      if (refund > 0) {
        next = alg->refund_spent(seen, limit, spent_ns, now_ns, refund);
      } else if (debt > 0) {
        // Charging x units moves remaining down by x, so the key owes at
        // most debtBound after a charge of bound + remaining (remaining is
        // negative while it owes already).
        const int64_t remaining = settledDecision(*alg, seen, limit, now_ns).remaining;
        charging = std::clamp<int64_t>(debtBound(rule, limit) + remaining, 0, debt);
        next = charging > 0 ? alg->charge(seen, limit, now_ns, charging) : seen;
      }
      if (next == seen || word.compare_exchange_weak(seen, next, std::memory_order_acq_rel,
                                                     std::memory_order_acquire)) {
        break;
      }
    }
    least_charged = std::min(least_charged, charging);
    kept.add(settledDecision(*alg, next, limit, now_ns));
    return true;
  });
  if (charged != nullptr && debt > 0) *charged = least_charged;
  // Not peek(): a shadow rule's debt is reported as it stands.
  return kept.decision();
}

bool isIdle(const Rule& rule, std::span<const std::atomic<uint64_t>> state, int64_t now_ns) {
  bool idle = true;
  forEachLimit(rule, state, [&](const Limit& limit, std::span<const std::atomic<uint64_t>> words) {
    if (const WordAlgorithm* alg = wordAlgorithm(rule.algorithm)) {
      idle = alg->is_idle(words[0].load(std::memory_order_acquire), limit, now_ns);
    } else if (rule.algorithm == Algorithm::kSlidingLog) {
      idle = sliding_log::isIdle(words, limit, now_ns);
    } else {
      idle = concurrency::isIdle(words, limit, now_ns);
    }
    return idle;
  });
  return idle;
}

bool acquireAll(std::span<AcquireItem> items, int64_t now_ns) {
  size_t done = 0;
  bool denied = false;
  for (; done < items.size(); ++done) {
    AcquireItem& item = items[done];
    item.decision = acquire(*item.rule, item.state, now_ns, item.cost);
    if (!item.decision.allowed) {
      denied = true;
      break;
    }
  }
  if (!denied) return true;
  // Undo the earlier items' spends. A shadow item that denied spent nothing.
  for (size_t i = 0; i < done; ++i) {
    const AcquireItem& item = items[i];
    if (!item.decision.shadow_denied) refund(*item.rule, item.state, now_ns, item.cost);
  }
  // The items after the denial were not tried: report what each alone would answer.
  for (size_t i = done + 1; i < items.size(); ++i) {
    AcquireItem& item = items[i];
    item.decision = peek(*item.rule, item.state, now_ns, item.cost);
  }
  return false;
}

}  // namespace sluice

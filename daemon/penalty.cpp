// Penalty: the denial window and the block on a key's words (see penalty.h).
#include "penalty.h"

#include <algorithm>

namespace sluice::penalty {
namespace {

constexpr int kCountBits = 20;  // holds the largest `denials` the config allows
constexpr uint64_t kCountMask = (uint64_t{1} << kCountBits) - 1;
constexpr int64_t kNsPerMs = 1'000'000;

// The window word's start (ms + 1, 0: no window) and count.
uint64_t startOf(uint64_t word) { return word >> kCountBits; }
uint64_t countOf(uint64_t word) { return word & kCountMask; }

bool windowOpen(uint64_t word, const Penalty& penalty, int64_t now_ns) {
  uint64_t start = startOf(word);
  return start != 0 &&
         now_ns / kNsPerMs + 1 - static_cast<int64_t>(start) < penalty.window_ns / kNsPerMs;
}

}  // namespace

int64_t blockedFor(std::span<const std::atomic<uint64_t>> words, int64_t now_ns) {
  auto until = static_cast<int64_t>(words[kBlockedUntil].load(std::memory_order_acquire));
  return until > now_ns ? until - now_ns : 0;
}

bool recordDenial(const Penalty& penalty, std::span<std::atomic<uint64_t>> words, int64_t now_ns) {
  std::atomic<uint64_t>& window = words[kDenials];
  uint64_t seen = window.load(std::memory_order_acquire);
  for (;;) {
    uint64_t start = startOf(seen);
    uint64_t count = countOf(seen);
    if (!windowOpen(seen, penalty, now_ns)) {
      start = static_cast<uint64_t>(now_ns / kNsPerMs + 1);
      count = 0;
    }
    ++count;
    bool blocks = static_cast<int64_t>(count) >= penalty.denials;
    // A block starts the count afresh: the next window opens after it.
    uint64_t next = blocks ? 0 : start << kCountBits | count;
    if (window.compare_exchange_weak(seen, next, std::memory_order_acq_rel,
                                     std::memory_order_acquire)) {
      if (blocks) {
        words[kBlockedUntil].store(static_cast<uint64_t>(now_ns + penalty.block_ns),
                                   std::memory_order_release);
      }
      return blocks;
    }
  }
}

void setBlockedUntil(std::span<std::atomic<uint64_t>> words, int64_t until_ns) {
  words[kBlockedUntil].store(static_cast<uint64_t>(std::max<int64_t>(until_ns, 0)),
                             std::memory_order_release);
}

bool isIdle(const Penalty& penalty, std::span<const std::atomic<uint64_t>> words, int64_t now_ns) {
  return blockedFor(words, now_ns) == 0 &&
         !windowOpen(words[kDenials].load(std::memory_order_acquire), penalty, now_ns);
}

}  // namespace sluice::penalty

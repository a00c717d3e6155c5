// Penalty: blocking a key that its rule keeps denying (rules.h, Penalty).
//
// State: kWords words of the key's entry, after the algorithm's state (entry.h
// has the layout), all zero for a key without denials:
//  - kDenials: the denials counted in the current window, with the window's
//    start: (start_ms + 1) << kCountBits | count. A window starts at the
//    first denial after the previous one ended, so "D denials within W" is
//    counted from the first of them.
//  - kBlockedUntil: monotonic ns when the block ends; 0: not blocked.
// Pure functions of the words and the time, updated with CAS; any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>

#include "rules.h"

namespace sluice::penalty {

enum Word : size_t { kDenials = 0, kBlockedUntil, kWords };

// Nanoseconds until the block on the key ends; 0 when it is not blocked.
int64_t blockedFor(std::span<const std::atomic<uint64_t>> words, int64_t now_ns);

// Counts one denial at now_ns; when it is the penalty's D-th within its
// window, blocks the key for the penalty's block time and returns true.
bool recordDenial(const Penalty& penalty, std::span<std::atomic<uint64_t>> words, int64_t now_ns);

// Sets when the key's block ends (0: lifts it): for a global rule, as Redis
// reports it (slice.h, kBlockRecheckNs).
void setBlockedUntil(std::span<std::atomic<uint64_t>> words, int64_t until_ns);

// True when nothing is counted or blocked any more at now_ns (the words may
// be dropped with the key).
bool isIdle(const Penalty& penalty, std::span<const std::atomic<uint64_t>> words, int64_t now_ns);

}  // namespace sluice::penalty

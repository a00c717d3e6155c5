// Verdict: what a decision path answers for one entry of a request it did
// not leave waiting: a decision, in a mode, with how long the request waited
// for it (-1: it was not allowed to wait), and what the acquire took (Taken),
// or an error with a stable code and a static message. The group path
// (group_path.h) keeps or gives back what was taken, all or nothing; the
// dispatcher (dispatch.h) counts and answers it.
//
// Plain values; any thread. The spans point into key-table entries and are
// valid only under the caller's KeyTable::ReadGuard.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string_view>

#include "decision.h"
#include "rpc.h"

namespace sluice {

struct Rule;

// What an allowed acquire took, for its group to keep or give back: `cost`
// units from a slice (slice.h), held in a holding (holding.h), or spent by
// the limiter on a rule's state (a local rule's key, a global rule's share);
// and a fallback share's spend to note once the group keeps it
// (PolicyPath::noteFallbackSpend). An empty span or null rule: nothing of
// that kind. A denial, a shadow denial and a policy's answer take nothing.
struct Taken {
  int64_t cost = 0;
  std::span<std::atomic<uint64_t>> slice;  // the slice's entry words
  std::span<std::atomic<uint64_t>> held;   // the holding's entry words
  const Rule* limited = nullptr;           // the rule the limiter spent on
  std::span<std::atomic<uint64_t>> state;  // ...and the state it spent
  const Rule* share = nullptr;             // a fallback share to note
  std::span<std::atomic<uint64_t>> share_words;  // ...and its entry's words
  bool on_rate = false;  // the slice's units came from its rate while Redis was unreachable
};

struct Verdict {
  Decision decision;
  Mode mode = Mode::kLocal;
  int64_t waited_ms = -1;
  Taken taken;
  bool failed = false;  // an error answers it: `error`, `message`
  rpc::ErrorCode error = rpc::ErrorCode::kInternal;
  std::string_view message;  // static text

  void decide(const Decision& d, Mode m, int64_t waited = -1) {
    decision = d;
    mode = m;
    waited_ms = waited;
  }
  void fail(rpc::ErrorCode code, std::string_view text) {
    failed = true;
    error = code;
    message = text;
  }
};

// The message of OVERLOADED when the key table cannot take another key.
inline constexpr std::string_view kTableFull =
    "the key table is full and no key could be evicted; raise [keys] max_keys or max_memory";

}  // namespace sluice

// Verdict: what a decision path answers for one request it did not leave
// waiting: a decision, in a mode, with how long the request waited for it
// (-1: it was not allowed to wait), or an error with a stable code and a
// static message. The front (dispatch.h) counts and encodes it.
//
// Plain values; any thread.
#pragma once

#include <cstdint>
#include <string_view>

#include "decision.h"
#include "rpc.h"

namespace sluice {

struct Verdict {
  Decision decision;
  Mode mode = Mode::kLocal;
  int64_t waited_ms = -1;
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

// Decision: the answer to "may this key spend `cost` units now?", in the
// wire contract's units (docs/design.md, "Protocol"). Plain values; any thread.
#pragma once

#include <cstdint>
#include <string_view>

namespace sluice {

// Which path produced a decision; reported as the result's `mode`.
enum class Mode {
  kNormal,    // a global rule, decided on leased quota
  kFallback,  // a global rule while Redis is down, on the node's local share
  kOpen,      // a global rule while Redis is down, policy "open": allowed
  kClosed,    // a global rule while Redis is down, policy "closed": denied
  kShadow,    // a shadow rule: decided and counted, always allowed
  kLocal,     // a local-only rule
  kBlocked,   // a key blocked by its rule's penalty: denied until the block ends
};

inline std::string_view modeName(Mode mode) {
  switch (mode) {
    case Mode::kNormal: return "normal";
    case Mode::kFallback: return "fallback";
    case Mode::kOpen: return "open";
    case Mode::kClosed: return "closed";
    case Mode::kShadow: return "shadow";
    case Mode::kLocal: return "local";
    case Mode::kBlocked: return "blocked";
  }
  return "unknown";
}

// For a rule with several limits it reports the most restrictive limit: the
// one that denied (largest retry_after) or, when allowed, the one with the
// fewest units remaining.
struct Decision {
  bool allowed = false;
  int64_t remaining = 0;       // units that could still be spent now
  int64_t limit = 0;           // the reported limit's `limit`
  int64_t reset_after_ms = 0;  // until the reported limit is back to full
  int64_t retry_after_ms = 0;  // until `cost` could pass; 0 when allowed
  // The rule is in shadow mode and denied: `allowed` was forced to true and
  // nothing was spent.
  bool shadow_denied = false;
  // The cost can never pass (cost > limit or burst): retry_after_ms is 0, as
  // retrying cannot help.
  bool cost_exceeds_limit = false;
  // Allowed on a reservation (bounded waiting, token bucket and GCRA): the
  // units are spent now and become due this long from now; the caller answers
  // then. 0 for an answer that holds at once.
  int64_t wait_ns = 0;
};

}  // namespace sluice

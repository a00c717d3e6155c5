// Failure: the error policy of the request path; see failure.h.
#include "failure.h"

#include <spdlog/spdlog.h>

#include <cstdlib>

namespace sluice {

void answerError(MetricsShard& metrics, rpc::MsgId msgid, rpc::ErrorCode code,
                 std::string_view message, std::string* out) {
  metrics.errors[static_cast<size_t>(code)].add();
  rpc::writeError(out, msgid, code, message);
}

void impossible(std::string_view what) {
  spdlog::critical("impossible state, a bug: {}", what);
  if constexpr (kImpossibleAborts) std::abort();
}

std::string unknownRule(std::string_view name) {
  // Built only on this error path, so the allocation does not matter.
  return "no rule named \"" + std::string(name) + "\"";
}

}  // namespace sluice

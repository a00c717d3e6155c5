// Failure: the error policy of the request path; see failure.h.
#include "failure.h"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>

namespace sluice {

void answerError(MetricsShard& metrics, rpc::MsgId msgid, rpc::ErrorCode code,
                 std::string_view message, std::string* out) {
  metrics.errors[static_cast<size_t>(code)].add();
  rpc::writeError(out, msgid, code, message);
}

void impossible(std::string_view what) {
  spdlog::critical("impossible state, a bug: {}", what);
  if constexpr (kImpossibleAborts) {
    // The log may go anywhere (stdout by default): the reason of the abort
    // goes to stderr too, where a crash report looks for it.
    spdlog::default_logger()->flush();
    std::fprintf(stderr, "impossible state, a bug: %.*s\n", static_cast<int>(what.size()),
                 what.data());
    std::abort();
  }
}

std::string unknownRule(std::string_view name) {
  // Built only on this error path, so the allocation does not matter.
  return "no rule named \"" + std::string(name) + "\"";
}

}  // namespace sluice

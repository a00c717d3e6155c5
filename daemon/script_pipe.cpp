// ScriptPipe: script calls through a bounded pipeline; see script_pipe.h.
#include "script_pipe.h"

namespace sluice {

namespace {

// The result of a call that never reached Redis; callbacks get this very
// object, so neverSent() tells it from a call lost on its way.
const RedisResult kNotSent{RedisStatus::kDisconnected, nullptr, "redis is down", 0};

}  // namespace

bool ScriptPipe::neverSent(const RedisResult& result) { return &result == &kNotSent; }

ScriptPipe::ScriptPipe(RedisTarget& link, std::function<void()> answered)
    : link_(link), answered_(std::move(answered)) {}

void ScriptPipe::call(RedisTarget::ScriptId script, std::vector<std::string> keys,
                      std::vector<std::string> argv, int64_t timeout_ms, RedisCallback on_result) {
  waiting_.push_back({script, std::move(keys), std::move(argv), timeout_ms, std::move(on_result)});
  sendWaiting();
}

void ScriptPipe::sendWaiting() {
  while (in_flight_ < kMaxScriptsInFlight && !waiting_.empty()) {
    Call call = std::move(waiting_.front());
    waiting_.pop_front();
    std::vector<std::string_view> args(call.argv.begin(), call.argv.end());
    std::vector<std::string_view> keys(call.keys.begin(), call.keys.end());
    RedisCallback on_result = std::move(call.on_result);
    ++in_flight_;
    bool sent = link_.evalsha(
        call.script, keys, args,
        [this, on_result](const RedisResult& result) {
          --in_flight_;
          on_result(result);
          sendWaiting();
          if (answered_) answered_();
        },
        call.timeout_ms);
    if (!sent) {
      --in_flight_;
      on_result(kNotSent);
    }
  }
}

void ScriptPipe::dropWaiting() {
  std::deque<Call> dropped;
  dropped.swap(waiting_);
  for (Call& call : dropped) call.on_result(kNotSent);
}

}  // namespace sluice

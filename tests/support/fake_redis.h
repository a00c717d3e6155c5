// FakeRedis: a RedisTarget for unit tests of the control thread's code
// (lease manager, breaker, script pipe). It keeps every command and script
// call until the test answers it, with a string (INFO) or an array of
// integers (what the Lua scripts return), so tests run on a simulated clock
// with no redis-server and no loop. Refuses calls while `up` is false, as a
// link that is down does (the callback is then never called).
#pragma once

#include <hiredis/hiredis.h>

#include <deque>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "redis_link.h"

namespace sluice::test {

class FakeRedis : public RedisTarget {
 public:
  struct Call {
    bool script = false;
    std::vector<std::string> argv;  // a command's words, or a script's args
    std::vector<std::string> keys;  // a script's keys
    RedisCallback callback;
  };

  void onConnected(std::function<void()>) override {}
  void onDisconnected(std::function<void(std::string_view)>) override {}
  ScriptId registerScript(std::string, std::string) override { return scripts_++; }
  void start() override {}
  void close(std::function<void()> on_closed) override { on_closed(); }
  bool connected() const override { return up; }
  std::string address() const override { return "fake:0"; }
  const RedisLinkOptions& options() const override { return options_; }
  bool command(std::span<const std::string_view> argv, RedisCallback callback,
               int64_t) override {
    if (!up) return false;
    calls.push_back({false, {argv.begin(), argv.end()}, {}, std::move(callback)});
    return true;
  }
  bool evalsha(ScriptId, std::span<const std::string_view> keys,
               std::span<const std::string_view> args, RedisCallback callback, int64_t) override {
    if (!up) return false;
    calls.push_back({true, {args.begin(), args.end()}, {keys.begin(), keys.end()},
                     std::move(callback)});
    return true;
  }

  // Takes the oldest call out, unanswered.
  Call take() {
    Call call = std::move(calls.front());
    calls.pop_front();
    return call;
  }
  // Answers the oldest call with a string (INFO) or integers (a script).
  void answerString(const std::string& text) {
    Call call = take();
    redisReply reply{};
    reply.type = REDIS_REPLY_STRING;
    reply.str = const_cast<char*>(text.data());
    reply.len = text.size();
    RedisReply view(&reply);
    call.callback({RedisStatus::kOk, &view, "", 100});
  }
  void answerIntegers(std::vector<long long> values) {
    Call call = take();
    std::vector<redisReply> elements(values.size());
    std::vector<redisReply*> pointers;
    for (size_t i = 0; i < values.size(); ++i) {
      elements[i].type = REDIS_REPLY_INTEGER;
      elements[i].integer = values[i];
      pointers.push_back(&elements[i]);
    }
    redisReply reply{};
    reply.type = REDIS_REPLY_ARRAY;
    reply.elements = values.size();
    reply.element = pointers.data();
    RedisReply view(&reply);
    call.callback({RedisStatus::kOk, &view, "", 100});
  }

  bool up = true;
  std::deque<Call> calls;

 private:
  ScriptId scripts_ = 0;
  RedisLinkOptions options_;
};

}  // namespace sluice::test

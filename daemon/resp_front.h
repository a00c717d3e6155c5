// RespFront: the Redis protocol front (`[resp] listen`), an adapter over the
// decision seam for every Redis client library: CL.THROTTLE as redis-cell
// answers it, SLUICE.ACQUIRE and SLUICE.PEEK for configured rules, and
// enough of the rest (PING, HELLO, SELECT 0, ...) for stock clients.
//
// Its connections live on the worker loops beside the MessagePack-RPC
// ones: the server's main loop accepts them on the [resp] listener and
// hands each to a worker (server.h), whose Connection reads it through a
// RespCodec. A pipelined batch is decided on that loop and answered in one
// write, with no thread between the socket and the decision. Replies go
// out in request order: a question that waits (a lease, a line) holds the
// commands after it until it is answered (connection.h).
//
// CL.THROTTLE's parameters travel with each call: the server keeps one
// GCRA rule per distinct (max_burst, count, period), named by
// resp::throttleRuleName, at most [resp] max_parameter_sets of them
// (Server::ensureThrottleRule). A worker's RespFront remembers which it
// has; the first call naming one asks the server for it and installs the
// rule set it returns on this worker's dispatcher at once, so the call is
// decided on it (the other workers get it through their queues).
//
// A TCP listener is unauthenticated (no peer credentials); on a Unix-socket
// listener [access] decides each connection at accept, and one it does not
// allow is answered -FORBIDDEN and closed (the server does that).
//
// One RespFront per worker, and its codecs, on that worker's thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "codec.h"
#include "dispatch.h"
#include "question.h"
#include "resp_codec.h"

namespace sluice {

class RespFront {
 public:
  // The rule set holding CL.THROTTLE's rule of `throttle`, added if it is
  // not there; null with `error` (the reply's text) when it cannot be. Any
  // thread (the server's lock).
  using EnsureRule = std::function<RuleSetPtr(const resp::Throttle& throttle, std::string* error)>;

  RespFront(Dispatcher& dispatcher, const resp::Limits& limits, EnsureRule ensure_rule)
      : dispatcher_(dispatcher), limits_(limits), ensure_rule_(std::move(ensure_rule)) {}

  // A new connection's codec.
  std::unique_ptr<Codec> makeCodec();

  const resp::Limits& limits() const { return limits_; }

  // The name of CL.THROTTLE's rule of `throttle`, on this worker's
  // dispatcher; false with `error` when it cannot be had.
  bool throttleRule(const resp::Throttle& throttle, std::string_view* name, std::string* error);

 private:
  Dispatcher& dispatcher_;
  const resp::Limits& limits_;
  EnsureRule ensure_rule_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::string> throttle_rules_;
};

// The Redis protocol as a connection's codec. Replies go in request order
// (inOrder). A question's tag carries how to write its answer: the shape in
// bit 0, CL.THROTTLE's max_burst above it.
class RespCodec final : public Codec {
 public:
  explicit RespCodec(RespFront& front) : front_(front) {}

  Frame read(std::span<const uint8_t> bytes, int64_t now_ns, std::string* out) override;
  // A command is parsed from its first byte whenever more comes; it is at
  // most max_command_bytes.
  bool frameReady(std::span<const uint8_t>) override { return true; }
  void restartFrame() override {}
  void writeAnswer(std::string* out, MsgId tag, const Answer& answer) override;
  bool inOrder() const override { return true; }

 private:
  RespFront& front_;
  std::vector<std::string_view> args_;  // the command being read
  resp::Command command_;               // reused for every command
  Item item_;                           // the question's, viewing args_ or the rule's name
};

}  // namespace sluice

// RespFront: the Redis protocol front (`[resp] listen`), an adapter over the
// decision seam for every Redis client library: CL.THROTTLE as redis-cell
// answers it, SLUICE.ACQUIRE and SLUICE.PEEK for configured rules, and
// enough of the rest (PING, HELLO, SELECT 0, ...) for stock clients.
//
// It runs its own libuv loop on a thread of its own. Each connection's
// commands are parsed by the codec (resp_codec.h); a command that asks is
// handed to the connection's worker through `submit` (Worker::submit), and
// the worker calls back receive() with the Answer, which comes back to
// this loop through a queue and a uv_async_t. Replies go out in request
// order: each command holds a slot, and the slots are written from the
// oldest as they fill. No decision is made here.
//
// CL.THROTTLE's parameters travel with each call: `ensure_rule` (the
// server) keeps one GCRA rule per distinct (max_burst, count, period),
// named by resp::throttleRuleName, installed on every worker before the
// call is submitted, at most [resp] max_parameter_sets of them.
//
// A TCP listener is unauthenticated (no peer credentials); on a Unix-socket
// listener `admit` ([access]) decides each connection, and one it does not
// allow is answered an error and closed.
//
// Thread-safety: start() and stop() on one thread (the server's); receive()
// on the workers' threads. stop() must come after the workers have stopped,
// so that no answer arrives after it.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "question.h"
#include "resp_codec.h"

namespace sluice {

class RespFront final : public Recipient {
 public:
  struct Options {
    std::string listen;  // "HOST:PORT" or "unix:/path" (parseFrontAddress)
    resp::Limits limits;
    size_t max_connections = 4096;
    size_t max_output_bytes = 1 << 20;  // unsent replies before a disconnect
    size_t max_in_flight = 1024;        // a connection's unanswered questions; reading pauses
  };
  // Hands a question to worker `worker` (Worker::submit); any thread.
  using Submit = std::function<void(size_t worker, HeldQuestion, Recipient*, MsgId)>;
  // The rule of CL.THROTTLE's parameters, installed on every worker before
  // it returns; false with `error` (the reply's text) when it cannot be.
  using EnsureRule = std::function<bool(const resp::Throttle&, std::string* error)>;
  using Admit = std::function<bool(int fd)>;

  RespFront() = default;
  ~RespFront();
  RespFront(const RespFront&) = delete;
  RespFront& operator=(const RespFront&) = delete;

  bool start(const Options& options, size_t workers, Submit submit, EnsureRule ensure_rule,
             Admit admit, std::string* error);
  void stop();

  // Recipient: a worker's answer; any worker thread.
  void receive(MsgId tag, const Answer& answer) override;

  struct Connection;

 private:
  // An answer as it crosses threads: its one decision, no vectors to copy.
  struct Arrived {
    MsgId tag;
    bool failed = false;
    ErrorCode error = ErrorCode::kInternal;
    std::string message;
    Decision decision;
    Mode mode = Mode::kLocal;
  };
  void run();
  void onConnection();
  // Reads into the connection's scratch buffer, to onRead().
  void startReading(Connection* connection);
  void onRead(Connection* connection, ssize_t size);
  void onArrived();
  void serve(Connection* connection);
  void flush(Connection* connection);
  void close(Connection* connection);

  Options options_;
  size_t workers_ = 1;
  Submit submit_;
  EnsureRule ensure_rule_;
  Admit admit_;
  std::string unix_path_;

  uv_loop_t loop_{};
  union {
    uv_tcp_t tcp;
    uv_pipe_t pipe;
  } listener_{};
  uv_async_t wakeup_{};
  std::thread thread_;
  bool started_ = false;

  std::mutex mutex_;  // guards arrived_, stopping_
  std::vector<Arrived> arrived_;
  bool stopping_ = false;
  std::vector<Arrived> taken_;  // loop thread only
  Answer answer_;               // loop thread only: an Arrived, to encode

  // Loop thread only.
  std::unordered_map<uint64_t, Connection*> connections_;
  uint64_t next_connection_ = 1;
  size_t next_worker_ = 0;
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::string> throttle_rules_;
  std::vector<std::string_view> args_;
};

}  // namespace sluice

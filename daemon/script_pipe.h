// ScriptPipe: the control thread's script calls to Redis (EVALSHA of the
// lease, return, debit and penalty scripts) through a pipeline of bounded
// depth. At most kMaxScriptsInFlight calls wait on Redis at once; the rest
// wait here, in order, and go out as answers make room.
//
// Invariant: every call() gets its callback exactly once: with Redis's
// answer, a timeout or a lost connection (from the link), or with
// kNotSent when Redis went down before it could be sent (dropWaiting(), or
// the link refused it). neverSent() tells that last case from a call lost
// on its way, which may have run.
//
// Thread model: the control thread only, as its RedisTarget. Callbacks run
// from the link's loop, or from inside call() / dropWaiting() for calls
// never sent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "redis_link.h"

namespace sluice {

// Script calls (leases, returns, debits) waiting on Redis at once; the rest
// wait, in order. Redis runs scripts one at a time, so a deeper pipeline adds
// only queueing delay: 10,000 keys going idle (or starting) together would
// otherwise queue 10,000 scripts, whose last ones wait longer than
// lease_timeout, and a command past its deadline makes the link drop the
// connection as if Redis were dead. A call's deadline starts when it is sent.
//
// The workers' and the sweep's requests wait as LeaseRequests (in the
// broker's queue, or taken and not served yet), and become script calls
// (argv, Redis keys, callback: some 400 bytes more each) only when the
// pipeline has room for them (ScriptPipe::hasRoom). A sweep submits one
// return per key gone idle, thousands every sweep interval; as script calls
// all at once they took megabytes of the control thread's malloc arena each
// time, memory the arena kept, fragmented, and grew in steps as larger
// bursts came (bench/soak).
constexpr size_t kMaxScriptsInFlight = 128;

class ScriptPipe {
 public:
  // `answered` runs after each answered call's callback: the owner's cue to
  // turn more of its requests into calls. `link` outlives the pipe.
  ScriptPipe(RedisTarget& link, std::function<void()> answered);
  ScriptPipe(const ScriptPipe&) = delete;
  ScriptPipe& operator=(const ScriptPipe&) = delete;

  // Sends (or queues) an EVALSHA of `script`.
  void call(RedisTarget::ScriptId script, std::vector<std::string> keys,
            std::vector<std::string> argv, int64_t timeout_ms, RedisCallback on_result);
  // Fails every queued call with kNotSent (Redis went down).
  void dropWaiting();
  // Whether a new call would be sent at once.
  bool hasRoom() const { return in_flight_ < kMaxScriptsInFlight && waiting_.empty(); }
  size_t inFlight() const { return in_flight_; }
  size_t waiting() const { return waiting_.size(); }

  // The result a call that never reached Redis gets.
  static bool neverSent(const RedisResult& result);

 private:
  void sendWaiting();

  struct Call {
    RedisTarget::ScriptId script;
    std::vector<std::string> keys;
    std::vector<std::string> argv;
    int64_t timeout_ms;
    RedisCallback on_result;
  };
  RedisTarget& link_;
  std::function<void()> answered_;
  std::deque<Call> waiting_;  // in order; sent as in_flight_ allows
  size_t in_flight_ = 0;      // calls sent and not answered
};

}  // namespace sluice

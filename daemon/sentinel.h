// Sentinel: where the master of a Redis Sentinel deployment is, for the
// control thread's RedisLink (redis_link.h, resolveWith), following Redis's
// "Sentinel client guidelines".
//
// resolve() asks the configured sentinels one at a time, starting with the
// one that answered last, `SENTINEL get-master-addr-by-name <name>`, each
// through a short-lived RedisLink (the sentinels' own AUTH, the link's
// connect deadline, then command_timeout_ms for the answer). The first
// address wins. A sentinel that is unreachable, late, answers an error or
// does not know the master is skipped; when none answers, resolve() answers
// no address with every sentinel's reason, and the master link retries with
// its backoff. The master link's handshake then checks with ROLE that the
// address is a master (RedisLinkOptions::require_master).
//
// Meanwhile a watch link stays subscribed to +switch-master on one sentinel
// (the next one in the list after each loss, with the link's backoff). A
// message about our master calls onSwitch() with the new address, and the
// next resolve() answers that address at once, without asking. The watch
// link PINGs its sentinel every kWatchProbeIntervalMs (redis_link.h,
// probe_interval_ms): a sentinel that hangs with the subscription open
// (stopped, or its host gone without a reset) leaves a PING unanswered past
// command_timeout_ms, and the link moves on to the next sentinel.
//
// Invariant: a resolve()'s `done` is called exactly once (close() calls a
// pending one with no address); a newer resolve() supersedes an older one,
// whose `done` gets no address at once.
//
// Threads: none of this is thread-safe; everything runs on the loop's thread
// (the control thread), and so do the callbacks.
//
// Lifetime: the Sentinel owns its links. Call close() once; `on_closed` runs
// once every link has closed (at once when none was open); only then may it
// be destroyed.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config.h"
#include "redis_link.h"

namespace sluice {

// The pub/sub channel on which sentinels announce a new master:
// "<name> <old ip> <old port> <new ip> <new port>".
inline constexpr std::string_view kSwitchMasterChannel = "+switch-master";

// How often the watch link checks that its sentinel still answers (a hung
// one is left within this plus command_timeout_ms).
inline constexpr int64_t kWatchProbeIntervalMs = 1000;

class Sentinel {
 public:
  // `config` names the master and the sentinels, and their AUTH
  // (RedisConfig::sentinel_*). `link_options` are the links' connect
  // deadline and backoff; `command_timeout_ms` bounds one sentinel's answer.
  Sentinel(uv_loop_t* loop, const RedisConfig& config, RedisLinkOptions link_options,
           int64_t command_timeout_ms);
  ~Sentinel();  // aborts unless close()'s callback has run
  Sentinel(const Sentinel&) = delete;
  Sentinel& operator=(const Sentinel&) = delete;

  // Set before start(): called with the new address on +switch-master for
  // our master.
  void onSwitch(std::function<void(const RedisAddress& master)> callback) {
    on_switch_ = std::move(callback);
  }

  // Starts the watch link. Once.
  void start();

  // Finds the master's address now; see the file comment.
  void resolve(RedisLink::AddressCallback done);

  void close(std::function<void()> on_closed);

 private:
  void askNext();
  void probeFailed(const RedisAddress& sentinel, std::string_view reason);
  void finishResolve(std::optional<RedisAddress> master, std::string_view reason);
  void onSwitchMessage(std::string_view payload);
  // Called when the last retired link has closed.
  void onLinksDrained();
  RedisConfig sentinelConfig(const RedisAddress& sentinel) const;

  uv_loop_t* loop_;
  const std::string master_name_;
  const std::vector<RedisAddress> sentinels_;
  const std::string username_;
  const std::string password_;
  const RedisLinkOptions link_options_;
  const int64_t command_timeout_ms_;
  std::function<void(const RedisAddress&)> on_switch_;

  // The resolve under way, if `pending_` is set.
  RedisLink::AddressCallback pending_;
  std::unique_ptr<RedisLink> probe_;  // asking sentinels_[(first_ + asked_ - 1) % n]
  size_t first_ = 0;                  // the sentinel asked first: the last that answered
  size_t asked_ = 0;
  std::string reasons_;               // why each sentinel asked so far had no answer
  // From +switch-master, not handed out by resolve() yet.
  std::optional<RedisAddress> announced_;

  std::unique_ptr<RedisLink> watch_;
  size_t watch_next_ = 0;  // the sentinel the watch link tries next

  RetiredLinks retired_{[this] { onLinksDrained(); }};
  bool closing_ = false;
  bool closed_ = false;
  std::function<void()> on_closed_;
};

}  // namespace sluice

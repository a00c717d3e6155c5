// RedisCluster: the control thread's way into a Redis Cluster. It loads the
// slot map (CLUSTER SLOTS) from the configured seed nodes or any master it
// knows, keeps one RedisLink per master (each with its own AUTH, deadlines,
// reconnects and script loads), and sends each script call to the master of
// its first key's slot (redis_keys.h: every key of one call shares a slot).
//
// Redirections, as the cluster spec asks of a client:
//  - MOVED <slot> <host:port>: the slot has a new owner for good. The slot
//    is pointed at that node at once, the whole map is reloaded, and the
//    call is sent again to the new owner when a link to it is up (otherwise
//    it fails with `disconnected`, and the caller tries again later).
//  - ASK <slot> <host:port>: the slot is being migrated and this key is on
//    the target already. The call is sent once to the target, preceded by
//    ASKING on the same connection; the map does not change.
// At most kMaxRedirects redirections per call.
//  - TRYAGAIN: a call of several keys (a penalty rule's state and block)
//    while its slot migrates, its keys not all on one node yet. The call
//    is sent again to the slot's owner after kTryAgainDelayMs, at most
//    kMaxTryAgains times and only while that stays within its timeout (as
//    redis-py and hiredis-cluster retry it), counted (tryAgains()); then
//    the error reaches the caller.
//
// Up and down: the cluster is connected() while at least one master's link
// is; onConnected runs when the first link comes up, onDisconnected when the
// last goes down. A call whose slot's master is unreachable (or has no
// master in the map) is refused, as RedisLink refuses a call on a dead link:
// the lease path sends that key to its on_redis_down policy while keys on
// healthy masters keep leasing. While any slot lacks a connected master, the
// map is reloaded every kRefreshIntervalMs, so a failover's new master is
// found within that time of the cluster electing it.
//
// Commands without keys (PING, INFO) go to the master of `home_key`'s slot,
// the slot of the members set, so that the lease path's INFO run_id check
// keeps asking one server.
//
// Threads: none of this is thread-safe; everything runs on the loop's thread
// (the control thread), and so do the callbacks.
//
// Lifetime: the cluster owns its links and its refresh timer. Call close()
// once; `on_closed` runs once every link and the timer are closed; only then
// may it be destroyed.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config.h"
#include "redis_keys.h"
#include "redis_link.h"

namespace sluice {

// How often the slot map is reloaded while a slot has no connected master.
constexpr int64_t kRefreshIntervalMs = 250;
// Redirections (MOVED, ASK) one call follows before its error reaches the caller.
constexpr int kMaxRedirects = 5;
// A call answered -TRYAGAIN is sent again this long after, at most this
// many times.
constexpr int64_t kTryAgainDelayMs = 20;
constexpr int kMaxTryAgains = 3;

class RedisCluster : public RedisTarget {
 public:
  // `config` names the seed nodes (cluster_addresses) and the masters' AUTH;
  // `link_options` are every link's knobs; `command_timeout_ms` bounds a
  // CLUSTER SLOTS answer; keyless commands go to `home_key`'s master.
  RedisCluster(uv_loop_t* loop, RedisConfig config, RedisLinkOptions link_options,
               int64_t command_timeout_ms, std::string home_key);
  ~RedisCluster() override;  // aborts unless close()'s callback has run
  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;

  void onConnected(std::function<void()> callback) override {
    on_connected_ = std::move(callback);
  }
  void onDisconnected(std::function<void(std::string_view reason)> callback) override {
    on_disconnected_ = std::move(callback);
  }
  // Set before start(): called when the set of masters changed (address()).
  void onMastersChanged(std::function<void()> callback) {
    on_masters_changed_ = std::move(callback);
  }
  ScriptId registerScript(std::string name, std::string source) override;
  void start() override;
  void close(std::function<void()> on_closed) override;
  bool connected() const override { return connected_links_ > 0; }
  // The masters, "host:port" each, by their first slot, comma-separated.
  std::string address() const override;
  const RedisLinkOptions& options() const override { return link_options_; }
  // Calls sent again after a -TRYAGAIN, since the start.
  uint64_t tryAgains() const { return try_agains_; }
  using RedisTarget::command;
  [[nodiscard]] bool command(std::span<const std::string_view> argv, RedisCallback callback,
                             int64_t timeout_ms) override;
  [[nodiscard]] bool evalsha(ScriptId script, std::span<const std::string_view> keys,
                             std::span<const std::string_view> args, RedisCallback callback,
                             int64_t timeout_ms) override;

 private:
  struct Call;
  struct Master {
    std::unique_ptr<RedisLink> link;
    bool up = false;
  };

  // Reloads the map now, unless a reload is under way.
  void refresh();
  void probeNext();
  void probeFailed(std::string_view reason);
  // Applies a CLUSTER SLOTS reply got from `from`; false when malformed.
  bool applySlots(const RedisReply& reply, const RedisAddress& from);
  // The link to `address`, made (and started) when there is none.
  Master& masterAt(const std::string& address);
  void onMasterUp(Master& master);
  void onMasterDown(Master& master, std::string_view reason);
  void dropUnusedMasters();
  bool allSlotsUp() const;
  // Sends `call` on `master`'s link (after ASKING when `asking`); false when
  // the link refused it, and then its callback is not called.
  bool send(const std::shared_ptr<Call>& call, Master* master, bool asking);
  void onCallResult(const std::shared_ptr<Call>& call, const RedisResult& result);
  // Sends again the calls whose -TRYAGAIN delay is over.
  void sendAgain();
  void maybeClosed();
  RedisConfig nodeConfig(const RedisAddress& address) const;

  uv_loop_t* loop_;
  const RedisConfig config_;
  const RedisLinkOptions link_options_;
  const int64_t command_timeout_ms_;
  const uint16_t home_slot_;
  std::function<void()> on_connected_;
  std::function<void(std::string_view)> on_disconnected_;
  std::function<void()> on_masters_changed_;

  struct Script {
    std::string name;
    std::string source;
  };
  std::vector<Script> scripts_;  // registered on every master's link, in order
  bool started_ = false;

  std::map<std::string, Master> masters_;  // by "host:port"
  std::vector<Master*> slots_;             // kClusterSlots entries; nullptr: no master known
  size_t connected_links_ = 0;

  // The reload under way: a short-lived link asking candidates_ in turn.
  std::unique_ptr<RedisLink> probe_;
  std::vector<RedisAddress> candidates_;
  size_t next_candidate_ = 0;
  std::string probe_reasons_;
  bool refresh_again_ = false;  // a MOVED came during a reload
  std::optional<RedisAddress> last_answered_;  // asked first next time
  std::string last_map_error_;                 // logged once until it changes

  uv_timer_t refresh_timer_;
  bool timer_closed_ = false;
  // Calls answered -TRYAGAIN, in order, each with when it is sent again
  // (uv_now ms); the timer runs while there are any.
  std::vector<std::pair<uint64_t, std::shared_ptr<Call>>> again_;
  uv_timer_t again_timer_;
  bool again_timer_closed_ = false;
  uint64_t try_agains_ = 0;
  RetiredLinks retired_{[this] { maybeClosed(); }};
  bool closing_ = false;
  bool closed_ = false;
  std::function<void()> on_closed_;
};

}  // namespace sluice

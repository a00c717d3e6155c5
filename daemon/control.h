// Control: the control thread. It owns the daemon's connection to Redis
// (RedisLink) and learns three things for the rest of the daemon: whether
// Redis is up, how many nodes are alive (N), and how far Redis's clock is
// from our monotonic clock. With a lease context it also runs the lease path
// (lease_manager.h), whose breaker follows the health described below.
// A Server has a Control only when its config has a [redis] section.
//
// Thread model (the daemon's is in worker.h; this is the control thread's):
//  - One thread, one libuv loop, started by start(). The loop, its handles,
//    the RedisLink and the clock estimator belong to that thread; nothing
//    else touches them.
//  - Other threads read what it learns only through snapshot(): three
//    atomics, each published on its own (release) and read on its own
//    (acquire), and the address of the Redis it last connected to, under
//    address_mutex_. They are independent facts, so no lock ties them
//    together.
//  - Other threads reach it only through stop(): an atomic flag plus a
//    uv_async_t that wakes the loop.
//  - The onNodesChanged callback runs on the control thread.
//
// Health: Redis is up from the moment the link's handshake completes (it ends
// with a PING) until the link reports a lost connection, or a PING is answered
// with an error (up again at the next PING answered without one). A PING goes
// out every health_interval_ms; any command of ours (PING, heartbeat) that is
// unanswered after health_timeout_ms makes the link drop the connection. So a
// dead Redis is noticed at once (the socket closes) and a stalled one within
// health_interval_ms + health_timeout_ms. After a loss, the link reconnects
// with backoff (up to 2 s between attempts); the next completed handshake is
// the probe that brings Redis back up.
//
// Membership: every heartbeat_interval_ms, and at once on each (re)connect,
// lua/heartbeat.lua "beat" puts this node into the sorted set
// <key_prefix>members for kHeartbeatTtlIntervals intervals and returns the
// live count N. N starts as expected_nodes and changes only when a heartbeat
// answers, so while Redis is down the last known N stays in force; for one
// heartbeat TTL after each (re)connect N may grow but not shrink, as the
// other nodes may not have beaten again yet. With each beat the lease
// manager claims the fleet marker (checkFleet, breaker.h), which lives as
// long as a member does.
//
// Sentinel mode ([redis] sentinel_master): the link asks a Sentinel
// (sentinel.h) where the master is before every connection attempt, checks
// with ROLE that it is one, and drops the connection on a READONLY reply; a
// +switch-master for our master makes it reconnect at once to the new
// address. A new master is a new Redis process, so the lease path's INFO
// check sees a new run_id and starts learning mode (lease_manager.h).
//
// Cluster mode ([redis] cluster_nodes): a RedisCluster (cluster.h) stands
// where the link stands: Redis is up while any master's link is, script
// calls go to their key's master, PING and INFO to the master of the members
// set's slot; keys whose master is unreachable follow on_redis_down alone
// (lease_manager.h).
//
// Holdings: with a lease context, every lease_ttl / kRenewalsPerTtl the
// lease manager renews the concurrency holdings that made no call of their
// own (lease_manager.h).
//
// Clock: each heartbeat reply carries Redis's TIME in ms; ClockOffsetEstimator
// (clock.h, which documents the method) keeps redis_time - monotonic_time.
//
// Stopping: stop() asks the thread to stop its timers, return every slice's
// unused units (bounded by kLeaveTimeoutMs), remove this node from
// the members (heartbeat "leave", with a deadline of kLeaveTimeoutMs, sent
// only while connected, so a dead Redis costs nothing and a stalled one at
// most that long), close the link and every handle. The loop then ends and
// closes with nothing open, and the thread exits; join() waits for it.
//
// Units: durations in ms of the loop's clock; clock offsets in µs.
#pragma once

#include <uv.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>

#include "clock.h"
#include "cluster.h"
#include "config.h"
#include "lease_manager.h"
#include "redis_link.h"
#include "sentinel.h"

namespace sluice {

// A heartbeat keeps this node counted for this many heartbeat intervals, so
// one or two lost beats do not drop it.
constexpr int64_t kHeartbeatTtlIntervals = 3;
// The longest a graceful stop waits for Redis to answer "leave".
constexpr int64_t kLeaveTimeoutMs = 200;

// What the control thread has published; see Control::snapshot().
struct ControlSnapshot {
  bool redis_up = false;
  uint32_t nodes = 1;  // live nodes N (expected_nodes until a heartbeat answers)
  // redis_time - monotonic_time in µs; nullopt until a heartbeat answers.
  std::optional<int64_t> clock_offset_us;
  // The Redis of the last completed handshake ("host:port", "unix:/path");
  // "" before the first. In Sentinel mode, the master last found; in Cluster
  // mode, the masters of the slot map ("host:port,host:port,...").
  std::string address;
  // Calls sent again after Redis Cluster answered -TRYAGAIN (cluster.h),
  // since the start, as of the last health tick; 0 in the other modes.
  uint64_t try_agains = 0;
};

class Control {
 public:
  // Nothing runs before start(). `link_options` are the link's own knobs
  // (connect timeout, backoff).
  // `clock` stamps heartbeats (the clock offset is Redis's time minus it)
  // and connections.
  explicit Control(RedisConfig config, RedisLinkOptions link_options = {},
                   MonotonicClock clock = monotonicNowNs);
  // Stops and joins the thread when the owner has not.
  ~Control();
  Control(const Control&) = delete;
  Control& operator=(const Control&) = delete;

  // Called on the control thread whenever N changes, with the new N; set
  // before start().
  void onNodesChanged(std::function<void(uint32_t nodes)> callback) {
    on_nodes_changed_ = std::move(callback);
  }

  // Runs the lease path (lease_manager.h) on this thread; call before
  // start(). Without it the thread only checks health and counts nodes.
  void attachLeases(LeaseContext context) { lease_context_ = std::move(context); }

  // Starts the thread. Once only.
  void start();
  // Any thread, any number of times: begins the graceful stop described above.
  void stop();
  // Waits for the thread to end (after stop()); returns at once when start()
  // never ran. Returns false when the loop still had handles open at the end
  // (a defect, also logged).
  bool join();

  // Any thread, lock-free.
  ControlSnapshot snapshot() const;
  // This node's id in the members set, and that set's key. Immutable.
  const std::string& nodeId() const { return node_id_; }
  const std::string& membersKey() const { return members_key_; }
  // The Redis state version this node writes (redis_keys.h; the tests' seam
  // SLUICE_TEST_STATE_VERSION may set another). Immutable.
  int64_t stateVersion() const { return state_version_; }
  // The loop's open handles (openHandles) as of its last health tick; any
  // thread (relaxed).
  size_t handles() const { return handle_count_.load(std::memory_order_relaxed); }
  // "standalone", "sentinel" or "cluster", from the config. Immutable.
  std::string_view mode() const {
    return config_.cluster() ? "cluster" : config_.sentinel() ? "sentinel" : "standalone";
  }

 private:
  static constexpr int64_t kNoOffset = std::numeric_limits<int64_t>::min();

  void run();
  void onWakeup();
  void onConnected();
  // The address health reports (ControlSnapshot::address).
  void publishAddress(std::string address);
  void startRenewWatch();
  void setUp(bool up, std::string_view reason);
  void ping();
  void beat();
  void onHeartbeat(const RedisResult& result, int64_t sent_us);
  void beginStop();
  void leave();
  void closeLink();

  const RedisConfig config_;
  const RedisLinkOptions link_options_;
  const MonotonicClock clock_ns_;
  int64_t nowUs() const { return clock_ns_() / 1000; }
  const std::string node_id_;
  const std::string members_key_;
  const int64_t state_version_;
  std::function<void(uint32_t)> on_nodes_changed_;

  // Control thread only (set up by start() before the thread exists).
  uv_loop_t loop_;
  uv_async_t wakeup_;
  uv_timer_t health_timer_;
  uv_timer_t heartbeat_timer_;
  uv_timer_t renew_timer_;  // concurrency holdings (LeaseManager::renewHoldings)
  uv_timer_t sweep_timer_;  // rate holders whose demand fell (LeaseManager::sweepIdleRates)
  std::unique_ptr<RedisLink> link_;        // standalone and Sentinel mode
  std::unique_ptr<RedisCluster> cluster_;  // Cluster mode
  RedisTarget* redis_ = nullptr;           // link_ or cluster_
  std::unique_ptr<Sentinel> sentinel_;     // Sentinel mode only
  // Subscribed to Redis's `renew` channel (redis_keys.h) with leases on:
  // the config's address, else where the main link is connected (Sentinel:
  // the master; Cluster: any master, PUBLISH reaches every node).
  std::unique_ptr<RedisLink> renew_watch_;
  LeaseContext lease_context_;            // set before start()
  std::unique_ptr<LeaseManager> leases_;  // with a lease context only
  RedisLink::ScriptId heartbeat_script_ = 0;
  ClockOffsetEstimator clock_;
  int64_t connected_at_us_ = 0;  // the last completed handshake (monotonic)
  bool reconnected_ = false;     // that handshake followed an earlier one
  bool ping_in_flight_ = false;
  bool beat_in_flight_ = false;
  bool stopping_ = false;
  bool link_closed_ = false;
  std::string connected_to_;  // the address of the last completed handshake
  // Cluster: every master the slot map has named, those it names now, and
  // those it stopped naming since the last failover was noticed.
  std::set<std::string> known_masters_, current_masters_, lost_masters_;
  std::string last_heartbeat_error_;  // logged once until it changes

  std::thread thread_;  // the owner's thread: start(), join()
  int loop_close_rc_ = 0;  // written by the control thread before it ends

  // Published by the control thread, read by any.
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> up_{false};
  std::atomic<size_t> handle_count_{0};
  std::atomic<uint32_t> nodes_;
  std::atomic<int64_t> clock_offset_us_{kNoOffset};
  std::atomic<uint64_t> try_agains_{0};  // cluster_->tryAgains() at the last health tick
  mutable std::mutex address_mutex_;
  std::string address_;  // guarded by address_mutex_; see ControlSnapshot::address
};

// "<hostname>:<pid>", the node id when the config sets none.
std::string defaultNodeId();

}  // namespace sluice

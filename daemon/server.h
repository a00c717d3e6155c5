// Server: the daemon as a whole. Owns the listening socket, the workers, the
// key table and the metrics, and runs the main loop on the calling thread.
//
// The main loop accepts connections, on the socket, [resp] listen and
// [http] listen alike, and hands each to the worker with the fewest; it
// handles SIGTERM/SIGINT (graceful stop) and SIGHUP (reload), and sweeps
// idle keys out of the key table, then hands the pages malloc holds free
// back to the system (every thread allocates from one malloc arena, so
// that all of them can go back). The thread model is written down in
// worker.h.
//
// With a [redis] section the server also runs the control thread (control.h):
// it starts after the workers, and when it reports a new number of live nodes
// the server rebuilds the rule set's fallback shares and hands it to every
// worker, as a reload does.
//
// Under systemd (systemd.h) it reports READY=1 once the socket listens and
// the workers run, a STATUS= line whenever the mode changes (normal,
// recovering, learning, fallback), RELOADING=1 around a reload and
// STOPPING=1; it pings the watchdog only while every worker's loop answers
// the main loop's pings. A socket passed by systemd is served as it is: its
// mode and owner are systemd's, and stopping leaves it in place.
//
// Stopping: stop accepting and remove the socket file, let every worker
// answer what it has read and close its connections (bounded by
// shutdown_timeout_ms), then let the control thread return the slices'
// unused units and leave the members set (bounded by kLeaveTimeoutMs each);
// join them, close every handle, exit 0.
#pragma once

#include <uv.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "access.h"
#include "config.h"
#include "control.h"
#include "envoy_front.h"
#include "http_front.h"
#include "resp_front.h"
#include "status.h"
#include "key_table.h"
#include "metrics.h"
#include "prometheus.h"
#include "worker.h"

namespace sluice {

class Server : public DaemonStatus {
 public:
  // `clock` is the one the server, its control thread and its lease path
  // read (the sweep, health, stats, uptime); workers read their own.
  explicit Server(Config config, MonotonicClock clock = monotonicNowNs);
  ~Server() override;
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the socket, starts the workers and serves until a stop signal.
  // Returns the process exit code (0 after a graceful stop).
  int run();

  // DaemonStatus
  int64_t uptimeMs() const override;
  size_t workers() const override { return workers_.size(); }
  MetricsSnapshot metrics() const override { return metrics_.snapshot(); }
  size_t connections() const override;
  size_t handles() const override;
  RedisHealth redisHealth() const override;
  LeaseStats leaseStats() const override;
  std::vector<RuleSnapshot> ruleMetrics() const override { return metrics_.ruleSnapshots(); }
  HistogramSnapshot leaseLatency() const override;
  std::vector<RuleOvershoot> overshootBounds() const override;
  bool reload(std::string* error) override;

 private:
  bool listen(std::string* error);
  bool reloadLocked(std::string* error);
  // Polls the listeners (the socket, [resp] and [http] listen) for
  // connections.
  void startAccepting();
  // Accepts what waits on `listen_fd`, whose clients speak `protocol`, and
  // hands each connection to the worker with the fewest.
  void onAcceptable(int listen_fd, Protocol protocol);
  // Closes a connection refused at accept, after one error in `protocol`
  // that tells the client why, and counts it.
  void refuse(int fd, RefuseReason reason, std::string_view why, Protocol protocol);
  void logForbidden(const Peer& peer);
  void onSignal(int signum);
  void sweepKeys();
  // Gives the pages malloc holds free back to the system (after a sweep).
  void releaseFreeMemory();
  // Sends a global rule's slice's unspent units back to Redis (unless their
  // window ended), leaving it empty.
  void returnSlice(const Rule& rule, std::string_view key,
                   std::span<std::atomic<uint64_t>> words, int64_t now_ns);
  // A worker's insert evicted an entry from the full table: a slice returns
  // its units.
  void onForcedEviction(uint32_t rule_id, std::string_view key,
                        std::span<std::atomic<uint64_t>> words);
  void beginStop();
  // Every second (or half the watchdog interval): the watchdog and STATUS=.
  void onStatusTimer();
  std::string statusLine() const;
  MetricsView metricsView() const;  // any thread
  // Control thread: N changed; rebuilds the fallback shares.
  void onNodesChanged(uint32_t nodes);
  // Starts Envoy's rate limit service ([envoy]) on the running workers.
  bool startEnvoy(std::string* error);
  // Any thread: adds `rule` (an Envoy limit override's, a CL.THROTTLE
  // parameter set's) to the running rule set, and to every rule set a
  // reload installs, with an id from its name; true when it is there.
  bool addRule(const Rule& rule);
  // addRule() for a rule not in the set; the caller holds reload_mutex_.
  void addRuleLocked(const Rule& rule);
  // `rules` and `added` together: an added rule whose name the file now
  // gives is left out; one whose id a rule of the file took gets another.
  static std::vector<Rule> withAddedRules(std::vector<Rule> rules, const std::vector<Rule>& added);
  // Installs `rules` on every worker; the caller holds reload_mutex_.
  void installRules(RuleSetPtr rules);
  // Binds [http] listen (http_front.h), whose connections the main loop
  // accepts once startAccepting() runs; false with `error`.
  bool startHttp(std::string* error);
  // Binds [resp] listen (resp_front.h), whose connections the main loop
  // accepts once startAccepting() runs; false with `error`.
  bool startResp(std::string* error);
  // The rule set with the rule of CL.THROTTLE's parameters, added on every
  // worker (addRule) if it was not there; null with `error` past [resp]
  // max_parameter_sets. Any thread (a worker's RespFront).
  RuleSetPtr ensureThrottleRule(const resp::Throttle& throttle, std::string* error);

  Config config_;           // guarded by reload_mutex_ after run() starts
  std::mutex reload_mutex_;
  // config_.rules, for the threads that read it without waiting on a reload
  // (a worker's forced eviction, the control thread, the sweep).
  std::atomic<RuleSetPtr> rules_;
  // [access] as the daemon started (a reload warns that it needs a restart);
  // the main loop decides each connection with them.
  const Access access_;
  UserConnections user_connections_;
  int64_t forbidden_logged_ms_ = -1;  // when a refused peer was last logged
  std::unique_ptr<KeyTable> keys_;
  Metrics metrics_;
  std::vector<std::unique_ptr<Worker>> workers_;
  const MonotonicClock clock_ns_;
  int64_t started_ms_ = 0;
  // Set in the constructor when the config has [redis], never replaced: any
  // thread may read its snapshot() and the broker.
  std::unique_ptr<LeaseBroker> broker_;
  std::unique_ptr<Control> control_;
  // Rules added while running (addRule), with their ids; guarded by reload_mutex_.
  std::vector<Rule> added_rules_;
  // Envoy's rate limit service, with an [envoy] section; null otherwise.
  std::unique_ptr<EnvoyFront> envoy_;

  uv_loop_t loop_;
  int listen_fd_ = -1;
  uv_poll_t listener_;
  uv_timer_t accept_pause_;  // restarts accepting after running out of fds
  uv_signal_t sigterm_;
  uv_signal_t sigint_;
  uv_signal_t sighup_;
  uv_timer_t key_sweep_;
  uv_timer_t status_timer_;
  MetricsEndpoint metrics_endpoint_;
  // [http] listen: bound after the workers start, polled by the main loop
  // like the socket, closed at the stop.
  int http_fd_ = -1;
  uv_poll_t http_listener_;
  std::string http_unix_path_;  // a Unix [http] listen's socket file, removed at the stop
  // [resp] listen: bound after the workers start, polled by the main loop
  // like the socket, closed at the stop.
  int resp_fd_ = -1;
  uv_poll_t resp_listener_;
  std::string resp_unix_path_;  // a Unix [resp] listen's socket file, removed at the stop
  size_t throttle_sets_ = 0;  // CL.THROTTLE's rules in added_rules_; guarded by reload_mutex_
  std::string serving_path_;       // the socket's path, as logged and reported
  bool socket_inherited_ = false;  // systemd passed the socket; it is not ours to remove
  uint64_t watchdog_us_ = 0;       // 0: no watchdog
  std::atomic<size_t> handle_count_{0};  // the main loop's, as of the last status tick
  uint64_t ping_seq_ = 0;          // the last ping sent to the workers
  bool worker_stuck_ = false;      // a worker missed a ping; logged once until it answers
  std::string last_status_;
  bool stopping_ = false;  // guarded by reload_mutex_
};

// Number of workers for a configured value (0: one per core).
size_t workerCount(uint32_t configured);

}  // namespace sluice

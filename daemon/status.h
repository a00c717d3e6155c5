// Status: what the daemon as a whole tells the admin methods (admin.h) and
// the Prometheus endpoint (prometheus.h): Redis's health and the server's
// counters. Plain values and one interface, implemented by the server; every
// method of DaemonStatus may be called from any worker thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "breaker.h"
#include "lease.h"
#include "metrics.h"
#include "overshoot.h"

namespace sluice {

// What `health` says about Redis (control.h owns the facts).
struct RedisHealth {
  bool configured = false;  // the config has a [redis] section
  bool up = false;
  Breaker breaker = Breaker::kOpen;
  bool learning = false;    // some rule is in learning mode
  std::vector<LearningRule> learning_rules;  // which, and for how long (breaker.h)
  // Leased units this node holds and has not spent (an estimate: granted
  // minus returned minus spent).
  int64_t leased_units = 0;
  // The Redis state version this node writes, the fleet marker's as last
  // read (0: not read yet), and whether this node refuses to lease because
  // they differ (breaker.h).
  int64_t state_version = 0;
  int64_t fleet_state_version = 0;
  bool state_refused = false;
  uint32_t nodes = 1;       // live nodes N, or expected_nodes before heartbeats
  std::string_view mode;    // "standalone", "sentinel" or "cluster" ("" without Redis)
  // The Redis last connected to, "host:port" or "unix:/path" (in Sentinel
  // mode the master last found); "" before the first connection.
  std::string address;
  // Redis's TIME minus this host's wall clock, from the heartbeats; nullopt
  // before the first heartbeat answers (and without Redis).
  std::optional<int64_t> clock_offset_ms;
  // Calls sent again after Redis Cluster answered -TRYAGAIN (a slot
  // migrating with the call's keys split), since the start; 0 outside
  // Cluster mode.
  uint64_t try_agains = 0;
};

// What health, stats and reload need from the daemon as a whole. Implemented
// by the server; every method may be called from any worker thread.
class DaemonStatus {
 public:
  virtual ~DaemonStatus() = default;
  virtual int64_t uptimeMs() const = 0;
  virtual size_t workers() const = 0;
  virtual MetricsSnapshot metrics() const = 0;
  // Open client connections.
  virtual size_t connections() const = 0;
  // Open libuv handles of every loop (uv_handles.h), each as its loop last
  // counted them: the workers and the main loop about once a second, the
  // control thread every health_interval.
  virtual size_t handles() const = 0;
  // Redis as the control thread last saw it.
  virtual RedisHealth redisHealth() const = 0;
  // The lease path's counters (all zero without Redis).
  virtual LeaseStats leaseStats() const = 0;
  // Decisions of each rule, summed over workers.
  virtual std::vector<RuleSnapshot> ruleMetrics() const = 0;
  // The overshoot bound of each configured global rule (overshoot.h), in
  // the rule set's order; empty without Redis.
  virtual std::vector<RuleOvershoot> overshootBounds() const { return {}; }
  // Round trips of lease scripts to Redis (empty without Redis).
  virtual HistogramSnapshot leaseLatency() const = 0;
  // Re-reads the config file and installs its rules on every worker. Returns
  // false with a message when the file is refused (the old rules stay).
  virtual bool reload(std::string* error) = 0;
};

}  // namespace sluice

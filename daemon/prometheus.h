// Prometheus text exposition (format 0.0.4) of the daemon's metrics, and the
// HTTP endpoint that serves it (`[daemon] metrics`, GET /metrics).
//
// Names follow Prometheus's conventions: sluice_ prefix, _total for
// counters, base units (seconds, bytes). Labels carry rule names, modes,
// results, error codes and close reasons, never key text: a label per key
// would let clients grow the scrape without bound.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "status.h"
#include "key_table.h"
#include "lease.h"
#include "metrics.h"

struct MHD_Daemon;

namespace sluice {

// Everything one scrape shows, read from the daemon's snapshots.
struct MetricsView {
  MetricsSnapshot totals;
  std::vector<RuleSnapshot> rules;
  size_t connections = 0;
  size_t handles = 0;  // DaemonStatus::handles
  KeyTableStats keys;
  uint64_t uptime_ms = 0;
  // Set when the config has [redis].
  std::optional<RedisHealth> redis;
  LeaseStats leases;
  HistogramSnapshot lease_latency;
  std::vector<RuleOvershoot> overshoot;  // DaemonStatus::overshootBounds
};

std::string renderPrometheus(const MetricsView& view);

// GET /metrics over HTTP on one address, served by libmicrohttpd's own
// thread; `render` runs on that thread for each scrape. Anything but GET
// /metrics gets 404 or 405; at most a few scrapes are served at once.
class MetricsEndpoint {
 public:
  MetricsEndpoint() = default;
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // `address` is "HOST:PORT" with a numeric IPv4 host or a bracketed IPv6
  // one, as the config validates it. False with `error` when it cannot
  // listen there.
  bool start(const std::string& address, std::function<std::string()> render, std::string* error);
  void stop();

 private:
  MHD_Daemon* daemon_ = nullptr;
  std::function<std::string()> render_;
};

}  // namespace sluice

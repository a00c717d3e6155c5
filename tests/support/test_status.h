// TestStatus: the server's side of the admin methods (status.h) for tests
// of one process's workers, with no server: health and stats read the
// metrics given; reload is refused.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "metrics.h"
#include "status.h"

namespace sluice {

class TestStatus final : public DaemonStatus {
 public:
  explicit TestStatus(const Metrics& metrics, size_t workers = 1)
      : metrics_(metrics), workers_(workers) {}
  int64_t uptimeMs() const override { return 1000; }
  size_t workers() const override { return workers_; }
  MetricsSnapshot metrics() const override { return metrics_.snapshot(); }
  size_t connections() const override { return 1; }
  size_t handles() const override { return 0; }
  RedisHealth redisHealth() const override { return {}; }
  LeaseStats leaseStats() const override { return {}; }
  std::vector<RuleSnapshot> ruleMetrics() const override { return metrics_.ruleSnapshots(); }
  HistogramSnapshot leaseLatency() const override { return {}; }
  bool reload(std::string* error) override {
    *error = "reload is not part of these tests";
    return false;
  }

 private:
  const Metrics& metrics_;
  size_t workers_;
};

}  // namespace sluice

// Metrics: per-worker counter shards and their sum.
#include "metrics.h"

namespace sluice {

std::string_view closeReasonName(CloseReason reason) {
  switch (reason) {
    case CloseReason::kPeerClosed: return "peer_closed";
    case CloseReason::kIdle: return "idle";
    case CloseReason::kPartialFrame: return "partial_frame";
    case CloseReason::kOutputCap: return "output_cap";
    case CloseReason::kUnreadable: return "unreadable";
    case CloseReason::kShutdown: return "shutdown";
    case CloseReason::kError: return "error";
  }
  return "unknown";
}

uint64_t MetricsSnapshot::decisions() const {
  uint64_t total = 0;
  for (size_t i = 0; i < kModes; ++i) {
    total += allowed[i] + denied[i];
  }
  return total;
}

Metrics::Metrics(size_t shards) : shards_(shards) {}

MetricsSnapshot Metrics::snapshot() const {
  MetricsSnapshot sum;
  for (const MetricsShard& shard : shards_) {
    for (size_t i = 0; i < kModes; ++i) {
      sum.allowed[i] += shard.allowed[i].get();
      sum.denied[i] += shard.denied[i].get();
    }
    sum.shadow_denied += shard.shadow_denied.get();
    sum.requests += shard.requests.get();
    for (size_t i = 0; i < kErrorCodes; ++i) {
      sum.errors[i] += shard.errors[i].get();
    }
    sum.connections_accepted += shard.connections_accepted.get();
    for (size_t i = 0; i < kCloseReasons; ++i) {
      sum.connections_closed[i] += shard.connections_closed[i].get();
    }
    sum.lease_units_spent += shard.lease_units_spent.get();
    sum.lease_units_dropped += shard.lease_units_dropped.get();
    sum.lease_negative_hits += shard.lease_negative_hits.get();
    sum.lease_deferred += shard.lease_deferred.get();
    sum.lease_deferred_expired += shard.lease_deferred_expired.get();
  }
  sum.connections_refused = connections_refused_.get();
  return sum;
}

}  // namespace sluice

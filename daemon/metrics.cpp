// Metrics: per-worker counter shards and their sum.
#include "metrics.h"

#include <cmath>

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

std::string_view refuseReasonName(RefuseReason reason) {
  switch (reason) {
    case RefuseReason::kMaxConnections: return "max_connections";
    case RefuseReason::kMaxPerUser: return "max_connections_per_user";
  }
  return "unknown";
}

uint64_t HistogramSnapshot::count() const {
  uint64_t total = 0;
  for (uint64_t n : buckets) total += n;
  return total;
}

std::optional<uint64_t> HistogramSnapshot::quantileBoundUs(double q) const {
  uint64_t total = count();
  if (total == 0) return std::nullopt;
  // The smallest bucket whose cumulative count reaches ceil(q * total).
  auto rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(total)));
  uint64_t seen = 0;
  for (size_t i = 0; i < kLatencyBucketsUs.size(); ++i) {
    seen += buckets[i];
    if (seen >= rank) return kLatencyBucketsUs[i];
  }
  return std::nullopt;
}

uint64_t MetricsSnapshot::decisions() const {
  uint64_t total = 0;
  for (size_t i = 0; i < kModes; ++i) {
    total += allowed[i] + denied[i];
  }
  return total;
}

Metrics::Metrics(size_t shards) : shards_(shards) {
  for (size_t i = 0; i < shards; ++i) {
    shards_[i].owner = this;
    shards_[i].index = i;
  }
}

RuleShard* Metrics::ruleShard(std::string_view name, size_t shard) {
  std::lock_guard<std::mutex> lock(rules_mutex_);
  auto it = rules_.find(name);
  if (it == rules_.end()) {
    it = rules_.emplace(std::string(name), std::make_unique<RuleShard[]>(shards_.size())).first;
  }
  return &it->second[shard];
}

std::vector<RuleSnapshot> Metrics::ruleSnapshots() const {
  std::lock_guard<std::mutex> lock(rules_mutex_);
  std::vector<RuleSnapshot> out;
  out.reserve(rules_.size());
  for (const auto& [name, shards] : rules_) {
    RuleSnapshot& rule = out.emplace_back();
    rule.name = name;
    // Each shard's counters are read apart: a close counted before its
    // open was read is held at 0 open.
    uint64_t opened = 0;
    uint64_t closed = 0;
    for (size_t s = 0; s < shards_.size(); ++s) {
      for (size_t i = 0; i < kModes; ++i) {
        rule.allowed[i] += shards[s].allowed[i].get();
        rule.denied[i] += shards[s].denied[i].get();
      }
      rule.near_limit += shards[s].near_limit.get();
      rule.shadow_denied += shards[s].shadow_denied.get();
      opened += shards[s].reservations_opened.get();
      closed += shards[s].reservations_closed.get();
    }
    rule.reservations_open = opened > closed ? opened - closed : 0;
  }
  return out;
}

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
    sum.lease_units_released += shard.lease_units_released.get();
    sum.lease_negative_hits += shard.lease_negative_hits.get();
    sum.lease_deferred += shard.lease_deferred.get();
    sum.lease_deferred_expired += shard.lease_deferred_expired.get();
    sum.penalty_blocks += shard.penalty_blocks.get();
    sum.unknown_fields += shard.unknown_fields.get();
    sum.reservations_opened += shard.reservations_opened.get();
    sum.reservations_settled += shard.reservations_settled.get();
    sum.reservations_cancelled += shard.reservations_cancelled.get();
    sum.reservations_expired += shard.reservations_expired.get();
    sum.reservation_refunded_units += shard.reservation_refunded_units.get();
    sum.reservation_debt_units += shard.reservation_debt_units.get();
    sum.reservation_unpaid_units += shard.reservation_unpaid_units.get();
    sum.reservations_unpaid += shard.reservations_unpaid.get();
    sum.decision_latency.add(shard.decision_latency);
  }
  for (size_t i = 0; i < kRefuseReasons; ++i) {
    sum.connections_refused[i] = connections_refused_[i].get();
  }
  sum.connections_forbidden = connections_forbidden_.get();
  sum.envoy_overrides_refused = envoy_overrides_refused_.get();
  sum.envoy_deadline_exceeded = envoy_deadline_exceeded_.get();
  return sum;
}

}  // namespace sluice

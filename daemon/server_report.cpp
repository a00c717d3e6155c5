// Server: what it reports of itself (health, overshoot bounds, lease
// statistics, the metrics view and the status line); see server.h and
// status.h.
#include "server.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "algorithm.h"
#include "breaker.h"
#include "clock.h"
#include "overshoot.h"
#include "rate_lease.h"
#include "slice.h"

namespace sluice {

int64_t Server::uptimeMs() const { return (clock_ns_() / 1'000'000) - started_ms_; }

size_t Server::connections() const {
  size_t open = 0;
  for (const auto& worker : workers_) {
    open += worker->connections();
  }
  return open;
}

size_t Server::handles() const {
  size_t open = handle_count_.load(std::memory_order_relaxed);
  for (const auto& worker : workers_) {
    open += worker->handles();
  }
  return control_ ? open + control_->handles() : open;
}

RedisHealth Server::redisHealth() const {
  RedisHealth health;
  if (!control_) return health;
  ControlSnapshot snapshot = control_->snapshot();
  health.configured = true;
  health.up = snapshot.redis_up;
  health.nodes = snapshot.nodes;
  health.mode = control_->mode();
  health.address = std::move(snapshot.address);
  health.try_agains = snapshot.try_agains;
  int64_t now_ns = clock_ns_();
  health.breaker = broker_->breaker();
  health.state_version = control_->stateVersion();
  health.fleet_state_version = broker_->fleetVersion();
  health.state_refused = broker_->refused();
  health.learning = broker_->learningAny(now_ns);
  if (RuleSetPtr rules = rules_.load(std::memory_order_acquire)) {
    health.learning_rules = learningRules(*rules, *broker_, now_ns);
  }
  LeaseStats leases = broker_->stats(now_ns);
  MetricsSnapshot metrics = metrics_.snapshot();
  // A concurrency holding's units come back into its pool (released or
  // reclaimed) and may be spent again; those Redis stopped holding for us
  // are gone.
  health.leased_units = std::max<int64_t>(
      static_cast<int64_t>(leases.granted_units) - static_cast<int64_t>(leases.returned_units) -
          static_cast<int64_t>(metrics.lease_units_spent) -
          static_cast<int64_t>(metrics.lease_units_dropped) +
          static_cast<int64_t>(metrics.lease_units_released + leases.released_units) -
          static_cast<int64_t>(leases.lost_units),
      0);
  if (snapshot.clock_offset_us) {
    // The estimate is against the monotonic clock; an operator compares
    // clocks by wall time, and on one host this is about 0.
    int64_t wall_us = *snapshot.clock_offset_us - realtimeMinusMonotonicUs();
    health.clock_offset_ms = (wall_us >= 0 ? wall_us + 500 : wall_us - 500) / 1000;
  }
  return health;
}

std::vector<RuleOvershoot> Server::overshootBounds() const {
  std::vector<RuleOvershoot> bounds;
  RuleSetPtr rules = rules_.load(std::memory_order_acquire);
  if (!control_ || !rules) return bounds;
  int64_t now_ns = clock_ns_();
  auto stamped = [](const Rule& rule) {
    return leasable(rule) && algorithmTraits(rule.algorithm).stamps_lease;
  };
  auto settling = [](const Rule& rule) {
    return leasable(rule) && algorithmTraits(rule.algorithm).settles;
  };
  // Reservations open by rule name, from the workers' counters.
  std::unordered_map<std::string, int64_t> open;
  for (const RuleSnapshot& rule : metrics_.ruleSnapshots()) {
    if (rule.reservations_open > 0) open[rule.name] = static_cast<int64_t>(rule.reservations_open);
  }
  // The most units one key holds leased (only stamped leases' count) and
  // owes (only once a settle charged a debt), by configured rule id: a walk
  // of the key table, only when one of them may be other than 0.
  // Likewise the most units one key's rate lease lets escape Redis's count
  // (rateEscapeUnits: its slice's cap less its share of the burst), and
  // while the breaker is not closed or a rule learns the most its last
  // rate refills in a period, for the rules whose keys may hold rates.
  std::unordered_map<uint32_t, int64_t> held;
  std::unordered_map<uint32_t, int64_t> owed;
  std::unordered_map<uint32_t, int64_t> rated;
  std::unordered_map<uint32_t, int64_t> rate_periods;
  const bool leasing = broker_->leasing();
  const bool learning_any = broker_->learningAny(now_ns);
  bool any_stamped = false;
  bool any_settling = false;
  for (const Rule& rule : rules->rules()) {
    any_stamped = any_stamped || stamped(rule) || rate_lease::eligible(rule) ||
                  std::any_of(rules->parts(rule).begin(), rules->parts(rule).end(), stamped);
    any_settling = any_settling || settling(rule);
  }
  const bool debts = any_settling && metrics_.snapshot().reservation_debt_units > 0;
  if (any_stamped || debts) {
    keys_->visit([&](KeyTable::Entry& entry) {
      const Rule* rule = rules->findById(entry.ruleId());
      if (rule == nullptr || entry.state().size() != entryWords(*rule)) return;
      const uint32_t id = entry.ruleId() & kRuleIdMask;
      if (stamped(*rule)) {
        int64_t& most = held[id];
        most = std::max(most, slice::heldUnits(entry.state(), now_ns));
      } else if (rate_lease::eligible(*rule)) {
        int64_t& most = rated[id];
        most = std::max(most, rateEscapeUnits(rule->limits.front(), slice::rateCapUnits(entry.state(), now_ns),
                                              slice::rateNsPerUnit(entry.state(), now_ns)));
        if (!leasing || learning_any) {
          int64_t& period = rate_periods[id];
          period = std::max(period, slice::ratePerPeriod(entry.state(), rule->limits.front().period_ns));
        }
      }
      if (debts && settling(*rule)) {
        int64_t& most = owed[id];
        most = std::max(most, slice::owed(entry.state(), now_ns));
      }
    });
  }
  auto most = [](const std::unordered_map<uint32_t, int64_t>& by_id, uint32_t id) {
    auto found = by_id.find(id);
    return found != by_id.end() ? found->second : 0;
  };
  for (const Rule& rule : rules->rules()) {
    const Rule* share = rules->fallbackShare(rule);
    if (share == nullptr) continue;
    bool learning = broker_->learning(rule, now_ns);
    for (const Rule& part : rules->parts(rule)) learning = learning || broker_->learning(part, now_ns);
    auto opened = open.find(rule.name);
    OvershootInput input{.leasing = leasing,
                         .learning = learning,
                         .held_units = most(held, rule.id),
                         .open_reservations = opened != open.end() ? opened->second : 0,
                         .owed_units = most(owed, rule.id),
                         .rate_escape_units = most(rated, rule.id),
                         .rate_period_units = most(rate_periods, rule.id)};
    bounds.push_back({rule.name, overshootBound(rule, *share, input)});
  }
  return bounds;
}

LeaseStats Server::leaseStats() const {
  return broker_ ? broker_->stats(clock_ns_()) : LeaseStats{};
}

HistogramSnapshot Server::leaseLatency() const {
  HistogramSnapshot latency;
  if (broker_) latency.add(broker_->counters().latency);
  return latency;
}

MetricsView Server::metricsView() const {
  MetricsView view;
  view.totals = metrics_.snapshot();
  view.rules = ruleMetrics();
  view.connections = connections();
  view.handles = handles();
  view.keys = keys_->stats();
  view.uptime_ms = static_cast<uint64_t>(uptimeMs());
  if (control_) {
    view.redis = redisHealth();
    view.leases = leaseStats();
    view.lease_latency = leaseLatency();
    view.overshoot = overshootBounds();
  }
  return view;
}

std::string Server::statusLine() const {
  if (!control_) {
    return "normal: serving " + serving_path_ + ", local rules only";
  }
  RedisHealth health = redisHealth();
  switch (health.breaker) {
    case Breaker::kOpen:
      return "fallback: Redis unreachable, global rules follow on_redis_down";
    case Breaker::kHalfOpen:
      return "recovering: Redis is back, debiting what fallback admitted";
    case Breaker::kClosed: break;
  }
  if (health.learning) {
    return "learning: Redis lost its state, leasing cautiously";
  }
  return "normal: leasing from Redis, " + std::to_string(health.nodes) + " live nodes";
}

}  // namespace sluice

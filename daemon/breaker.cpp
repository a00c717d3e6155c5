// CircuitBreaker: Redis down, half-open, learning; see breaker.h.
#include "breaker.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "entry.h"
#include "lease.h"

namespace sluice {

std::string_view breakerName(Breaker breaker) {
  switch (breaker) {
    case Breaker::kClosed: return "closed";
    case Breaker::kOpen: return "open";
    case Breaker::kHalfOpen: return "half_open";
  }
  return "unknown";
}

std::optional<RedisIdentity> parseInfo(std::string_view info) {
  auto field = [&](std::string_view name) {
    // Fields are "name:value" lines; the first line is a section header.
    std::string needle = "\n" + std::string(name) + ":";
    size_t at = info.find(needle);
    if (at == std::string_view::npos) return std::string();
    std::string_view rest = info.substr(at + needle.size());
    return std::string(rest.substr(0, rest.find_first_of("\r\n")));
  };
  RedisIdentity identity{field("run_id"), field("master_replid"), field("master_replid2")};
  if (identity.run_id.empty()) return std::nullopt;
  return identity;
}

int64_t learningSpanNs(const Rule& rule, int64_t holding_memory_ns, int64_t reconnect_ns) {
  int64_t memory_ns = 0;
  if (leasesHolding(rule)) {
    // Every node renews its holdings as it comes back, and finds within a
    // lease_ttl what Redis lost.
    memory_ns = holding_memory_ns;
  } else if (!rule.limits.empty()) {
    // A window remembers one period; a bucket (capacity over limit) takes
    // longer to refill from empty when its burst is above its limit.
    const Limit& limit = rule.limits.front();
    double refill = static_cast<double>(limit.period_ns) *
                    static_cast<double>(leaseCapacity(limit)) / static_cast<double>(limit.limit);
    memory_ns = std::max<int64_t>(limit.period_ns, static_cast<int64_t>(refill));
  }
  // The other nodes come back each on its own reconnect backoff and spend
  // their fallback shares until then: holding to its share until the last of
  // them is back keeps the fleet's sum at the limit.
  return std::max(memory_ns, reconnect_ns);
}

std::vector<LearningRule> learningRules(const RuleSet& rules, const LeaseBroker& broker,
                                        int64_t now_ns) {
  std::vector<LearningRule> learning;
  for (const Rule& rule : rules.rules()) {
    int64_t until_ns = 0;
    auto consider = [&](const Rule& leased) {
      if (leasable(leased) || leasesHolding(leased)) {
        until_ns = std::max(until_ns, broker.learningUntilNs(leased));
      }
    };
    consider(rule);
    for (const Rule& part : rules.parts(rule)) consider(part);
    if (until_ns > now_ns) learning.push_back({rule.name, (until_ns - now_ns + 999'999) / 1'000'000});
  }
  return learning;
}

CircuitBreaker::CircuitBreaker(LeaseBroker& broker, BreakerActions& actions, Options options,
                               std::function<RuleSetPtr()> rules)
    : broker_(broker), actions_(actions), options_(options), rules_(std::move(rules)) {}

void CircuitBreaker::publish(Breaker state, int64_t now_ns) {
  state_ = state;
  broker_.setBreaker(state, now_ns);
}

void CircuitBreaker::down(int64_t now_ns) {
  ++epoch_;
  pending_ = 0;
  if (state_ != Breaker::kOpen) open_since_ns_ = now_ns;
  publish(Breaker::kOpen, now_ns);
  spdlog::warn("lease: breaker open; global rules follow on_redis_down");
  broker_.notifyWorkers();
}

void CircuitBreaker::up(int64_t now_ns) {
  ++epoch_;
  // The fallback span: since the breaker opened, or nothing at the start.
  if (state_ != Breaker::kOpen || open_since_ns_ == 0) open_since_ns_ = now_ns;
  publish(Breaker::kHalfOpen, now_ns);
  pending_ = 1;  // the identity
  uint64_t epoch = epoch_;
  if (!actions_.askIdentity(epoch)) identified(epoch, std::nullopt, now_ns);
}

void CircuitBreaker::identified(uint64_t epoch, const std::optional<RedisIdentity>& identity,
                                int64_t now_ns, std::optional<int64_t> fleet_version) {
  bool state_lost = false;
  if (identity) {
    bool changed = known_ && identity->run_id != last_.run_id;
    // Kept until a recovery runs: a refused or superseded one asks INFO
    // again, which then reads the new run_id as the last one.
    master_changed_ = master_changed_ || changed;
    bool failed_over = changed && !last_.master_replid.empty() &&
                       identity->master_replid2 == last_.master_replid;
    state_lost = changed && !failed_over;
    if (changed) {
      if (failed_over) {
        spdlog::warn("lease: redis run_id changed ({} -> {}): a replica of the last master took "
                     "over, without the writes it had not replicated; learning mode, each node "
                     "also holds to its share for one period, and until every node can have "
                     "reconnected; fallback admissions are debited to it",
                     last_.run_id, identity->run_id);
      } else {
        spdlog::warn("lease: redis run_id changed ({} -> {}): it restarted without the fleet's "
                     "state; learning mode, each node also holds to its share for one period, "
                     "and until every node can have reconnected; fallback admissions are not "
                     "debited to the new state",
                     last_.run_id, identity->run_id);
      }
      startLearning(now_ns);
    }
    known_ = true;
    last_ = *identity;
  }
  if (epoch != epoch_) return;  // a newer transition owns the breaker
  // Refused: the identity stays pending, so the breaker stays half-open
  // until LeaseManager::checkFleet finds the marker this node's.
  if (!admit(fleet_version)) return;
  int64_t span_ms = std::max<int64_t>(now_ns - open_since_ns_, 0) / 1'000'000;
  const bool master_changed = master_changed_;
  master_changed_ = false;
  actions_.recover(epoch, state_lost, master_changed, span_ms);
  answered(epoch, now_ns);  // the identity
}

void CircuitBreaker::checked(std::optional<int64_t> fleet_version, int64_t now_ns) {
  if (state_ != Breaker::kClosed || !fleet_version || *fleet_version == 0) return;
  if (*fleet_version == options_.state_version) return;
  // What this node admits from now on is debited, once it leases again, as
  // after an outage that began now.
  ++epoch_;
  open_since_ns_ = now_ns;
  publish(Breaker::kHalfOpen, now_ns);
  pending_ = 1;  // the identity, asked again by the next checkFleet
  admit(fleet_version);
}

bool CircuitBreaker::admit(std::optional<int64_t> fleet_version) {
  int64_t fleet = fleet_version.value_or(0);
  bool refuse = fleet != options_.state_version;
  broker_.setFleetVersion(fleet, refuse);
  if (!refuse) {
    if (refused_) {
      spdlog::info("lease: the fleet on key_prefix \"{}\" now runs this daemon's Redis state "
                   "version {}; leasing resumes", options_.key_prefix, fleet);
    }
    refused_ = false;
    refused_by_ = -1;
    return true;
  }
  if (refused_by_ != fleet) {
    if (fleet == 0) {
      spdlog::error("lease: refusing to lease: the fleet marker \"{}version\" could not be "
                    "claimed; this daemon writes Redis state version {}; global rules follow "
                    "on_redis_down meanwhile (docs/operations.md, \"Upgrading the Redis state\")",
                    options_.key_prefix, options_.state_version);
    } else {
      spdlog::error("lease: refusing to lease: the fleet on key_prefix \"{}\" runs Redis state "
                    "version {} and this daemon writes version {}; global rules follow "
                    "on_redis_down until no daemon of version {} is left "
                    "(docs/operations.md, \"Upgrading the Redis state\")",
                    options_.key_prefix, fleet, options_.state_version, fleet);
    }
  }
  refused_ = true;
  refused_by_ = fleet;
  broker_.notifyWorkers();
  return false;
}

void CircuitBreaker::expect(uint64_t epoch, size_t calls) {
  if (epoch == epoch_) pending_ += calls;
}

void CircuitBreaker::answered(uint64_t epoch, int64_t now_ns) {
  if (epoch != epoch_ || pending_ == 0) return;
  --pending_;
  closeWhenDone(now_ns);
}

void CircuitBreaker::closeWhenDone(int64_t now_ns) {
  if (state_ != Breaker::kHalfOpen || pending_ > 0) return;
  publish(Breaker::kClosed, now_ns);
  spdlog::info("lease: breaker closed; global rules lease from redis");
  broker_.notifyWorkers();
}

void CircuitBreaker::newMaster(int64_t now_ns) { startLearning(now_ns); }

void CircuitBreaker::startLearning(int64_t now_ns) {
  // The fleet-wide end, for health's `learning`: the last rule's.
  int64_t longest_ns = options_.reconnect_ns;
  if (RuleSetPtr rules = rules_ ? rules_() : nullptr) {
    auto remember = [&](const Rule& rule) {
      if (leasable(rule) || leasesHolding(rule)) {
        longest_ns = std::max(longest_ns, learningSpanNs(rule, options_.holding_memory_ns,
                                                         options_.reconnect_ns));
      }
    };
    for (const Rule& rule : rules->rules()) remember(rule);
    for (const Rule& part : rules->parts()) remember(part);
  }
  broker_.startLearning(now_ns, options_.holding_memory_ns, options_.reconnect_ns, longest_ns);
}

}  // namespace sluice

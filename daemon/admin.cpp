// Admin: health, stats, rules, reload and reset; see admin.h.
#include "admin.h"

#include <algorithm>

#include "failure.h"
#include "holding.h"
#include "limiter.h"
#include "msgpack.h"
#include "policy.h"

namespace sluice {

namespace {

constexpr std::string_view kVersion = SLUICE_VERSION;

// The most overrides of one rule that `rules` lists.
constexpr size_t kMaxListedOverrides = 100;

}  // namespace

void Admin::handle(const RuleSet& rules, const rpc::Request& request, const Peer& peer,
                   int64_t now_ns, std::string* out) {
  switch (request.method) {
    case rpc::Method::kHealth: writeHealth(request.msgid, out); break;
    case rpc::Method::kStats: writeStats(request.msgid, out); break;
    case rpc::Method::kRules: writeRules(rules, request.msgid, out); break;
    case rpc::Method::kReload: reload(request.msgid, peer, out); break;
    case rpc::Method::kReset: reset(rules, request, peer, now_ns, out); break;
    default:
      impossible("Admin::handle called for a method that is not an admin method");
      answerError(metrics_, request.msgid, rpc::ErrorCode::kInternal,
                  "internal error: a request reached the wrong handler", out);
      break;
  }
}

void Admin::writeHealth(rpc::MsgId msgid, std::string* out) {
  RedisHealth redis = status_.redisHealth();
  rpc::writeResultHeader(out, msgid);
  msgpack::Writer w(out);
  w.writeMapHeader(17);
  w.writeStr("status");
  w.writeStr(redis.configured && (!redis.up || redis.state_refused) ? "degraded" : "ok");
  w.writeStr("redis");
  w.writeStr(!redis.configured ? "none" : redis.up ? "up" : "down");
  w.writeStr("breaker");
  if (redis.configured) {
    w.writeStr(breakerName(redis.breaker));
  } else {
    w.writeNil();
  }
  w.writeStr("redis_mode");
  if (redis.configured) {
    w.writeStr(redis.mode);
  } else {
    w.writeNil();
  }
  w.writeStr("redis_address");
  if (!redis.address.empty()) {
    w.writeStr(redis.address);
  } else {
    w.writeNil();
  }
  // The state versions: this node's, and the fleet marker's when read (nil
  // without Redis, or before the first claim answers).
  w.writeStr("state_version");
  if (redis.configured) {
    w.writeInt(redis.state_version);
  } else {
    w.writeNil();
  }
  w.writeStr("fleet_state_version");
  if (redis.fleet_state_version > 0) {
    w.writeInt(redis.fleet_state_version);
  } else {
    w.writeNil();
  }
  w.writeStr("learning");
  w.writeBool(redis.learning);
  w.writeStr("learning_rules");
  w.writeMapHeader(static_cast<uint32_t>(redis.learning_rules.size()));
  for (const LearningRule& rule : redis.learning_rules) {
    w.writeStr(rule.name);
    w.writeInt(rule.left_ms);
  }
  w.writeStr("leased_units");
  w.writeInt(redis.leased_units);
  w.writeStr("nodes");
  w.writeUint(redis.nodes);
  w.writeStr("clock_offset_ms");
  if (redis.clock_offset_ms) {
    w.writeInt(*redis.clock_offset_ms);
  } else {
    w.writeNil();
  }
  w.writeStr("version");
  w.writeStr(kVersion);
  w.writeStr("uptime_ms");
  w.writeInt(status_.uptimeMs());
  w.writeStr("connections");
  w.writeUint(status_.connections());
  w.writeStr("handles");
  w.writeUint(status_.handles());
  w.writeStr("keys");
  w.writeUint(keys_.size());
}

namespace {

// A latency histogram for a person: how many, the mean, and the bucket bounds
// that the median, p99 and p999 fall under (nil beyond the last bound).
void writeLatency(msgpack::Writer& w, const HistogramSnapshot& latency) {
  uint64_t count = latency.count();
  w.writeMapHeader(5);
  w.writeStr("count");
  w.writeUint(count);
  w.writeStr("mean_us");
  w.writeUint(count > 0 ? latency.sum_us / count : 0);
  for (auto [name, q] : {std::pair{"p50_us_le", 0.5}, {"p99_us_le", 0.99}, {"p999_us_le", 0.999}}) {
    w.writeStr(name);
    if (auto bound = latency.quantileBoundUs(q)) {
      w.writeUint(*bound);
    } else {
      w.writeNil();
    }
  }
}

// Counts by mode, leaving out the modes with none.
void writeNonZeroModes(msgpack::Writer& w, const std::array<uint64_t, kModes>& counts) {
  w.writeMapHeader(static_cast<uint32_t>(std::count_if(counts.begin(), counts.end(),
                                                       [](uint64_t n) { return n > 0; })));
  for (size_t i = 0; i < kModes; ++i) {
    if (counts[i] == 0) continue;
    w.writeStr(modeName(static_cast<Mode>(i)));
    w.writeUint(counts[i]);
  }
}

void writeLimits(msgpack::Writer& w, const std::vector<Limit>& limits) {
  w.writeArrayHeader(static_cast<uint32_t>(limits.size()));
  for (const Limit& limit : limits) {
    const bool on_calendar = limit.window != calendar::Span::kNone;
    w.writeMapHeader(on_calendar ? 5 : 3);
    w.writeStr("limit");
    w.writeInt(limit.limit);
    w.writeStr("period_ms");
    w.writeInt(limit.period_ns / 1'000'000);
    w.writeStr("burst");
    w.writeInt(limit.burst);
    if (on_calendar) {
      w.writeStr("window");
      w.writeStr(calendar::spanName(limit.window));
      w.writeStr("time_zone");
      w.writeStr(limit.time_zone.name());
    }
  }
}

}  // namespace

void Admin::writeStats(rpc::MsgId msgid, std::string* out) {
  MetricsSnapshot s = status_.metrics();
  LeaseStats leases = status_.leaseStats();
  const uint64_t try_agains = status_.redisHealth().try_agains;
  rpc::writeResultHeader(out, msgid);
  msgpack::Writer w(out);
  w.writeMapHeader(16);
  w.writeStr("reservations");
  std::pair<std::string_view, uint64_t> reservation_fields[] = {
      {"open", s.reservationsOpen()},
      {"opened", s.reservations_opened},
      {"settled", s.reservations_settled},
      {"cancelled", s.reservations_cancelled},
      {"expired", s.reservations_expired},
      {"refunded_units", s.reservation_refunded_units},
      {"debt_units", s.reservation_debt_units},
      {"unpaid_units", s.reservation_unpaid_units},
      {"unpaid", s.reservations_unpaid},
  };
  w.writeMapHeader(static_cast<uint32_t>(std::size(reservation_fields)));
  for (auto [name, value] : reservation_fields) {
    w.writeStr(name);
    w.writeUint(value);
  }
  w.writeStr("leases");
  std::pair<std::string_view, uint64_t> lease_fields[] = {
      {"requested", leases.requested},
      {"granted", leases.granted},
      {"empty", leases.empty},
      {"failed", leases.failed},
      {"granted_units", leases.granted_units},
      {"spent_units", s.lease_units_spent},
      {"returned_units", leases.returned_units},
      {"dropped_units", s.lease_units_dropped},
      {"debited_units", leases.debited_units},
      {"released_units", s.lease_units_released + leases.released_units},
      {"lost_units", leases.lost_units},
      {"renewed", leases.renewed},
      {"renew_words", leases.renew_words},
      {"negative_cache_hits", s.lease_negative_hits},
      {"deferred", s.lease_deferred},
      {"deferred_expired", s.lease_deferred_expired},
      {"latency_us_avg", leases.requested - leases.failed > 0
                             ? leases.latency_us_sum / (leases.requested - leases.failed)
                             : 0},
      {"latency_us_max", leases.latency_us_max},
      {"fallback_entries", leases.fallback_entries},
      {"fallback_ms", leases.fallback_ms},
      {"learning_entries", leases.learning_entries},
      {"tryagains", try_agains},
  };
  w.writeMapHeader(static_cast<uint32_t>(std::size(lease_fields)) + 1);
  for (auto [name, value] : lease_fields) {
    w.writeStr(name);
    w.writeUint(value);
  }
  w.writeStr("latency");
  writeLatency(w, status_.leaseLatency());
  w.writeStr("decisions");
  w.writeUint(s.decisions());
  w.writeStr("requests");
  w.writeUint(s.requests);
  w.writeStr("allowed");
  w.writeMapHeader(kModes);
  for (size_t i = 0; i < kModes; ++i) {
    w.writeStr(modeName(static_cast<Mode>(i)));
    w.writeUint(s.allowed[i]);
  }
  w.writeStr("denied");
  w.writeMapHeader(kModes);
  for (size_t i = 0; i < kModes; ++i) {
    w.writeStr(modeName(static_cast<Mode>(i)));
    w.writeUint(s.denied[i]);
  }
  w.writeStr("shadow_denied");
  w.writeUint(s.shadow_denied);
  w.writeStr("penalty_blocks");
  w.writeUint(s.penalty_blocks);
  w.writeStr("decision_latency");
  writeLatency(w, s.decision_latency);
  // Only rules that have decided something: a reload keeps dropped rules'
  // totals (metrics.h), and a person wants to see where traffic went.
  std::vector<RuleSnapshot> rules = status_.ruleMetrics();
  std::erase_if(rules, [](const RuleSnapshot& rule) {
    auto none = [](const auto& counts) {
      return std::all_of(counts.begin(), counts.end(), [](uint64_t n) { return n == 0; });
    };
    return none(rule.allowed) && none(rule.denied);
  });
  w.writeStr("rules");
  w.writeMapHeader(static_cast<uint32_t>(rules.size()));
  for (const RuleSnapshot& rule : rules) {
    w.writeStr(rule.name);
    w.writeMapHeader(2);
    w.writeStr("allowed");
    writeNonZeroModes(w, rule.allowed);
    w.writeStr("denied");
    writeNonZeroModes(w, rule.denied);
  }
  // Every global rule, whether it decided or not: an idle rule's bound is
  // part of the fleet's sum too. nil: no bound.
  std::vector<RuleOvershoot> bounds = status_.overshootBounds();
  w.writeStr("overshoot_bound");
  w.writeMapHeader(static_cast<uint32_t>(bounds.size()));
  for (const RuleOvershoot& bound : bounds) {
    w.writeStr(bound.name);
    if (bound.units) {
      w.writeInt(*bound.units);
    } else {
      w.writeNil();
    }
  }
  w.writeStr("errors");
  w.writeMapHeader(kErrorCodes);
  for (size_t i = 0; i < kErrorCodes; ++i) {
    w.writeStr(rpc::errorCodeName(static_cast<rpc::ErrorCode>(i)));
    w.writeUint(s.errors[i]);
  }
  w.writeStr("unknown_fields");
  w.writeUint(s.unknown_fields);
  w.writeStr("connections");
  w.writeMapHeader(5);
  w.writeStr("accepted");
  w.writeUint(s.connections_accepted);
  w.writeStr("refused");  // over [limits] max_connections
  w.writeUint(s.connections_refused[static_cast<size_t>(RefuseReason::kMaxConnections)]);
  w.writeStr("refused_per_user");
  w.writeUint(s.connections_refused[static_cast<size_t>(RefuseReason::kMaxPerUser)]);
  w.writeStr("forbidden");
  w.writeUint(s.connections_forbidden);
  w.writeStr("closed");
  w.writeMapHeader(kCloseReasons);
  for (size_t i = 0; i < kCloseReasons; ++i) {
    w.writeStr(closeReasonName(static_cast<CloseReason>(i)));
    w.writeUint(s.connections_closed[i]);
  }
  KeyTableStats keys = keys_.stats();
  w.writeStr("keys");
  w.writeMapHeader(6);
  w.writeStr("count");
  w.writeUint(keys.size);
  w.writeStr("bytes");
  w.writeUint(keys.bytes);
  w.writeStr("inserts");
  w.writeUint(keys.inserts);
  w.writeStr("idle_evictions");
  w.writeUint(keys.idle_evictions);
  w.writeStr("forced_evictions");
  w.writeUint(keys.forced_evictions);
  w.writeStr("retired");
  w.writeUint(keys.retired);
  w.writeStr("uptime_ms");
  w.writeInt(status_.uptimeMs());
}

void Admin::writeRules(const RuleSet& rule_set, rpc::MsgId msgid, std::string* out) {
  rpc::writeResultHeader(out, msgid);
  msgpack::Writer w(out);
  const auto& rules = rule_set.rules();
  w.writeArrayHeader(static_cast<uint32_t>(rules.size()));
  for (const Rule& rule : rules) {
    w.writeMapHeader(11);
    w.writeStr("name");
    w.writeStr(rule.name);
    w.writeStr("algorithm");
    w.writeStr(algorithmName(rule.algorithm));
    w.writeStr("scope");
    w.writeStr(scopeName(rule.scope));
    w.writeStr("on_redis_down");
    w.writeStr(redisDownPolicyName(rule.on_redis_down));
    w.writeStr("shadow");
    w.writeBool(rule.shadow);
    w.writeStr("max_wait_ms");
    w.writeInt(rule.max_wait_ns / 1'000'000);
    w.writeStr("pace");
    w.writeBool(rule.pace);
    w.writeStr("limits");
    writeLimits(w, rule.limits);
    w.writeStr("penalty");
    if (rule.penalty) {
      w.writeMapHeader(3);
      w.writeStr("denials");
      w.writeInt(rule.penalty->denials);
      w.writeStr("window_ms");
      w.writeInt(rule.penalty->window_ns / 1'000'000);
      w.writeStr("block_ms");
      w.writeInt(rule.penalty->block_ns / 1'000'000);
    } else {
      w.writeNil();
    }
    // A rule may have many exact-key overrides; the answer must stay far
    // below max_output_bytes, so it lists the first ones and the count.
    size_t listed = std::min(rule.overrides.size(), kMaxListedOverrides);
    w.writeStr("override_count");
    w.writeUint(rule.overrides.size());
    w.writeStr("overrides");
    w.writeArrayHeader(static_cast<uint32_t>(listed));
    for (const Override& override : std::span(rule.overrides).first(listed)) {
      w.writeMapHeader(2);
      w.writeStr(override.match == Override::Match::kKey      ? "key"
                 : override.match == Override::Match::kPrefix ? "prefix"
                                                              : "glob");
      w.writeStr(override.pattern);
      w.writeStr("limits");
      writeLimits(w, override.limits);
    }
  }
}

void Admin::reload(rpc::MsgId msgid, const Peer& peer, std::string* out) {
  if (!peer.admin) {
    answerError(metrics_, msgid, rpc::ErrorCode::kForbidden,
                "reload is for root, the daemon's user and members of [access] admin_group", out);
    return;
  }
  std::string message;
  if (!status_.reload(&message)) {
    answerError(metrics_, msgid, rpc::ErrorCode::kBadRequest, message, out);
    return;
  }
  rpc::writeResultHeader(out, msgid);
  msgpack::Writer w(out);
  w.writeMapHeader(1);
  w.writeStr("reloaded");
  w.writeBool(true);
}

// An admin forgets a key's state, so that its next request is a fresh key's
// (a key blocked by mistake, a test account). The words are zeroed one by
// one: an acquire racing with the reset sees the old state or the fresh one
// (for a rule of several limits, each limit's), never more than a fresh key
// may spend. For a global rule that leases (each part of one decided on its
// parts), the state and the block in Redis are reset too (penalty.lua),
// which needs Redis up; other nodes see
// the block lifted within slice::kBlockRecheckNs (slice.h), and keep the units
// their slices hold. A global rule that does not lease keeps its state in
// this node's share. The answer is peek's on the fresh state.
void Admin::reset(const RuleSet& rules, const rpc::Request& request, const Peer& peer,
                  int64_t now_ns, std::string* out) {
  if (!peer.admin) {
    answerError(metrics_, request.msgid, rpc::ErrorCode::kForbidden,
                "reset is for root, the daemon's user and members of [access] admin_group", out);
    return;
  }
  const rpc::Item& item = request.items.front();
  const Rule* rule = rules.find(item.rule);
  if (rule == nullptr) {
    answerError(metrics_, request.msgid, rpc::ErrorCode::kUnknownRule, unknownRule(item.rule),
                out);
    return;
  }
  if (broker_ != nullptr && leasesHolding(*rule)) {
    // A holding is this node's part of the fleet's units: the reset frees
    // the units callers hold here into the pool (the other nodes' holdings
    // are theirs), and the pool goes back to Redis as usual.
    KeyTable::Entry* entry = keys_.find(rule->id, item.key);
    if (entry != nullptr && entry->state().size() == entryWords(*rule)) {
      int64_t freed = holding::release(entry->state(), now_ns, rule->limits.front().limit);
      if (freed > 0) metrics_.lease_units_released.add(static_cast<uint64_t>(freed));
    }
    rpc::writeDecision(out, request.msgid, peek(*rule, fresh_.of(*rule), now_ns, 0),
                       broker_->leasing() ? leasedMode(*rule) : route(rules, *rule).mode);
    return;
  }
  // A rule decided on its parts resets each of them as a rule that leases.
  std::span<const Rule> parts = broker_ != nullptr ? rules.parts(*rule) : std::span<const Rule>();
  if (leasable(*rule) || !parts.empty()) {
    if (broker_ == nullptr || !broker_->leasing()) {
      answerError(metrics_, request.msgid, rpc::ErrorCode::kOverloaded,
                  "redis is unreachable, and the state of global rule \"" + rule->name +
                      "\" lives there; retry once health says redis is up",
                  out);
      return;
    }
    for (const Rule& leased : parts.empty() ? std::span<const Rule>(rule, 1) : parts) {
      LeaseRequest reset;
      reset.kind = LeaseRequest::Kind::kReset;
      reset.rule_id = leased.id;
      reset.key = std::string(item.key);
      broker_->submit(std::move(reset));
      forgetKey(leased, item.key);
    }
  } else {
    // A global rule that does not lease keeps its state in its share.
    forgetKey(rule->scope == Scope::kGlobal ? *rules.fallbackShare(*rule) : *rule, item.key);
  }
  const Rule& deciding = decidingFor(rules, *rule, item.key, nullptr);
  // A rule that leases decides the fresh key on its lease (Redis is up).
  Mode mode = leasable(*rule) || !parts.empty() ? leasedMode(*rule) : route(rules, *rule).mode;
  rpc::writeDecision(out, request.msgid, peek(deciding, fresh_.of(deciding), now_ns, 0), mode);
}

void Admin::forgetKey(const Rule& rule, std::string_view key) {
  // The state and the penalty's words (a block is lifted) start afresh;
  // the override word after them stays, and so does a slice's in-flight
  // bit (its lease's answer clears it).
  KeyTable::Entry* entry = currentEntry(keys_, rule, key);
  if (entry == nullptr) return;
  size_t words = entryWords(rule) - (rule.overrides.empty() ? 0 : 1);
  auto state = entry->state().first(words);
  size_t from = 0;
  if (leasable(rule)) {
    slice::forget(state);
    from = slice::kWords;
  }
  for (std::atomic<uint64_t>& word : state.subspan(from)) word.store(0, std::memory_order_relaxed);
}

}  // namespace sluice

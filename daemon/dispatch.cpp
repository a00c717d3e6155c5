// Dispatch: one request in, one response out; see dispatch.h.
#include "dispatch.h"

#include <algorithm>

#include "msgpack.h"

namespace sluice {

namespace {

constexpr std::string_view kVersion = SLUICE_VERSION;

// The answer of a global rule whose policy is "open" or "closed" while Redis
// is unreachable; nothing is spent.
Decision policyDecision(const Rule& rule, Mode mode) {
  Decision decision;
  decision.allowed = mode == Mode::kOpen;
  decision.limit = rule.limits.front().limit;
  decision.remaining = decision.allowed ? decision.limit : 0;
  int64_t period_ms = rule.limits.front().period_ns / 1'000'000;
  decision.reset_after_ms = period_ms;
  decision.retry_after_ms = decision.allowed ? 0 : std::max<int64_t>(period_ms, 1);
  if (rule.shadow && !decision.allowed) {
    decision.allowed = true;
    decision.shadow_denied = true;
    decision.retry_after_ms = 0;
  }
  return decision;
}

std::string unknownRule(std::string_view name) {
  // Built only on this error path, so the allocation does not matter.
  return "no rule named \"" + std::string(name) + "\"";
}

constexpr std::string_view kTableFull =
    "the key table is full and no key could be evicted; raise [keys] max_keys or max_memory";

}  // namespace

Dispatcher::Dispatcher(KeyTable& keys, MetricsShard& metrics, DaemonStatus& status)
    : keys_(keys), metrics_(metrics), status_(status) {}

void Dispatcher::error(uint32_t msgid, rpc::ErrorCode code, std::string_view message,
                       std::string* out) {
  metrics_.errors[static_cast<size_t>(code)].add();
  rpc::writeError(out, msgid, code, message);
}

void Dispatcher::handleParseError(const rpc::ParseResult& result, std::string* out) {
  if (result.has_msgid) {
    error(result.msgid, result.error, result.message, out);
  } else {
    metrics_.errors[static_cast<size_t>(result.error)].add();
  }
}

Dispatcher::Route Dispatcher::route(const Rule& rule) const {
  Mode shadow_or = rule.shadow ? Mode::kShadow : Mode::kLocal;
  if (rule.scope == Scope::kLocal) {
    return {&rule, shadow_or};
  }
  // There are no leases yet (the lease path is the next step), so a global
  // rule always answers as its on_redis_down policy says (DESIGN.md,
  // "Fallback"), even while the control thread reports Redis up: the mode says
  // so ("fallback", "open", "closed", never "normal"). What Redis already
  // changes is N, the number of nodes the local share divides by.
  switch (rule.on_redis_down) {
    case RedisDownPolicy::kLocal:
      return {rules_->fallbackShare(rule), rule.shadow ? Mode::kShadow : Mode::kFallback};
    case RedisDownPolicy::kOpen: return {nullptr, rule.shadow ? Mode::kShadow : Mode::kOpen};
    case RedisDownPolicy::kClosed: return {nullptr, rule.shadow ? Mode::kShadow : Mode::kClosed};
  }
  return {nullptr, Mode::kClosed};
}

void Dispatcher::count(const Decision& decision, Mode mode) {
  auto index = static_cast<size_t>(mode);
  if (decision.allowed) {
    metrics_.allowed[index].add();
  } else {
    metrics_.denied[index].add();
  }
  if (decision.shadow_denied) {
    metrics_.shadow_denied.add();
  }
}

void Dispatcher::handle(const rpc::Request& request, const Peer& peer, int64_t now_ns,
                        std::string* out) {
  metrics_.requests.add();
  // A notification gets no answer: answer into a scratch buffer and drop it,
  // so a notified acquire or release still takes effect.
  std::string* target = out;
  if (request.notification) {
    message_.clear();
    target = &message_;
  }
  switch (request.method) {
    case rpc::Method::kAcquire:
    case rpc::Method::kPeek:
    case rpc::Method::kRelease: acquireOne(request, now_ns, target); break;
    case rpc::Method::kAcquireAll: acquireAll(request, now_ns, target); break;
    case rpc::Method::kHealth: writeHealth(request.msgid, target); break;
    case rpc::Method::kStats: writeStats(request.msgid, target); break;
    case rpc::Method::kRules: writeRules(request.msgid, target); break;
    case rpc::Method::kReload: reload(request.msgid, peer, target); break;
    case rpc::Method::kUnknown:
      error(request.msgid, rpc::ErrorCode::kUnknownMethod, "no such method", target);
      break;
  }
  if (request.notification) {
    message_.clear();
  }
}

std::span<std::atomic<uint64_t>> Dispatcher::freshState(const Rule& rule) {
  size_t words = stateWords(rule);
  if (fresh_.size() < words) {
    fresh_ = std::vector<std::atomic<uint64_t>>(words);
  }
  for (size_t i = 0; i < words; ++i) {
    fresh_[i].store(0, std::memory_order_relaxed);
  }
  return {fresh_.data(), words};
}

void Dispatcher::acquireOne(const rpc::Request& request, int64_t now_ns, std::string* out) {
  const rpc::Item& item = request.items.front();
  const Rule* configured = rules_->find(item.rule);
  if (configured == nullptr) {
    error(request.msgid, rpc::ErrorCode::kUnknownRule, unknownRule(item.rule), out);
    return;
  }
  auto [rule, mode] = route(*configured);
  bool spends = request.method == rpc::Method::kAcquire && item.cost > 0;
  if (rule == nullptr) {
    Decision decision = policyDecision(*configured, mode);
    if (spends) {
      count(decision, mode);
    }
    rpc::writeDecision(out, request.msgid, decision, mode);
    return;
  }

  Decision decision;
  if (spends) {
    KeyTable::Entry* entry = keys_.findOrInsert(rule->id, item.key, stateWords(*rule), now_ns);
    if (entry == nullptr) {
      error(request.msgid, rpc::ErrorCode::kOverloaded, kTableFull, out);
      return;
    }
    decision = acquire(*rule, entry->state(), now_ns, item.cost);
    count(decision, mode);
  } else {
    // peek, release and cost 0 never create a key: an absent key is fresh.
    KeyTable::Entry* entry = keys_.find(rule->id, item.key);
    if (entry != nullptr && entry->state().size() != stateWords(*rule)) {
      entry = nullptr;  // state of the rule's old shape, before a reload
    }
    auto state = entry != nullptr ? entry->state() : freshState(*rule);
    if (request.method == rpc::Method::kRelease && entry != nullptr) {
      entry->touch(now_ns);
      decision = release(*rule, state, now_ns, item.cost);
    } else {
      decision = peek(*rule, state, now_ns, item.cost);
    }
  }
  rpc::writeDecision(out, request.msgid, decision, mode);
}

void Dispatcher::acquireAll(const rpc::Request& request, int64_t now_ns, std::string* out) {
  items_.clear();
  modes_.clear();
  decisions_.clear();
  // Items a policy answers ("open", "closed") are decided here and spend
  // nothing; the rest go to the limiter, all or nothing.
  bool policy_denied = false;
  for (const rpc::Item& item : request.items) {
    const Rule* configured = rules_->find(item.rule);
    if (configured == nullptr) {
      error(request.msgid, rpc::ErrorCode::kUnknownRule, unknownRule(item.rule), out);
      return;
    }
    auto [rule, mode] = route(*configured);
    modes_.push_back(mode);
    AcquireItem acquire_item;
    acquire_item.cost = item.cost;
    if (rule == nullptr) {
      acquire_item.decision = policyDecision(*configured, mode);
      policy_denied = policy_denied || !acquire_item.decision.allowed;
    } else {
      KeyTable::Entry* entry = keys_.findOrInsert(rule->id, item.key, stateWords(*rule), now_ns);
      if (entry == nullptr) {
        error(request.msgid, rpc::ErrorCode::kOverloaded, kTableFull, out);
        return;
      }
      acquire_item.rule = rule;
      acquire_item.state = entry->state();
    }
    items_.push_back(acquire_item);
  }

  // The limiter's items are the ones with a rule; a policy denial means none
  // of them may spend, so they are only looked at.
  limited_.clear();
  for (AcquireItem& item : items_) {
    if (item.rule != nullptr) {
      limited_.push_back(item);
    }
  }
  bool allowed = !policy_denied;
  if (policy_denied) {
    for (AcquireItem& item : limited_) {
      item.decision = peek(*item.rule, item.state, now_ns, item.cost);
    }
  } else {
    allowed = sluice::acquireAll(limited_, now_ns);
  }
  for (size_t i = 0, next = 0; i < items_.size(); ++i) {
    const Decision& decision =
        items_[i].rule != nullptr ? limited_[next++].decision : items_[i].decision;
    decisions_.push_back(decision);
    count(decision, modes_[i]);
  }
  rpc::writeDecisions(out, request.msgid, allowed, decisions_, modes_);
}

void Dispatcher::writeHealth(uint32_t msgid, std::string* out) {
  RedisHealth redis = status_.redisHealth();
  rpc::writeResultHeader(out, msgid);
  msgpack::Writer w(out);
  w.writeMapHeader(8);
  w.writeStr("status");
  w.writeStr(redis.configured && !redis.up ? "degraded" : "ok");
  w.writeStr("redis");
  w.writeStr(!redis.configured ? "none" : redis.up ? "up" : "down");
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
  w.writeStr("keys");
  w.writeUint(keys_.size());
}

void Dispatcher::writeStats(uint32_t msgid, std::string* out) {
  MetricsSnapshot s = status_.metrics();
  rpc::writeResultHeader(out, msgid);
  msgpack::Writer w(out);
  w.writeMapHeader(9);
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
  w.writeStr("errors");
  w.writeMapHeader(kErrorCodes);
  for (size_t i = 0; i < kErrorCodes; ++i) {
    w.writeStr(rpc::errorCodeName(static_cast<rpc::ErrorCode>(i)));
    w.writeUint(s.errors[i]);
  }
  w.writeStr("connections");
  w.writeMapHeader(3);
  w.writeStr("accepted");
  w.writeUint(s.connections_accepted);
  w.writeStr("refused");
  w.writeUint(s.connections_refused);
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

void Dispatcher::writeRules(uint32_t msgid, std::string* out) {
  rpc::writeResultHeader(out, msgid);
  msgpack::Writer w(out);
  const auto& rules = rules_->rules();
  w.writeArrayHeader(static_cast<uint32_t>(rules.size()));
  for (const Rule& rule : rules) {
    w.writeMapHeader(6);
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
    w.writeStr("limits");
    w.writeArrayHeader(static_cast<uint32_t>(rule.limits.size()));
    for (const Limit& limit : rule.limits) {
      w.writeMapHeader(3);
      w.writeStr("limit");
      w.writeInt(limit.limit);
      w.writeStr("period_ms");
      w.writeInt(limit.period_ns / 1'000'000);
      w.writeStr("burst");
      w.writeInt(limit.burst);
    }
  }
}

void Dispatcher::reload(uint32_t msgid, const Peer& peer, std::string* out) {
  if (!status_.isAdmin(peer)) {
    error(msgid, rpc::ErrorCode::kForbidden, "reload is for root or the daemon's own user", out);
    return;
  }
  std::string message;
  if (!status_.reload(&message)) {
    error(msgid, rpc::ErrorCode::kBadRequest, message, out);
    return;
  }
  rpc::writeResultHeader(out, msgid);
  msgpack::Writer w(out);
  w.writeMapHeader(1);
  w.writeStr("reloaded");
  w.writeBool(true);
}

}  // namespace sluice

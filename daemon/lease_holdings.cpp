// LeaseManager's global concurrency rules: the holdings it leases, renews,
// returns and reconciles with what Redis holds (holding.h,
// lua/concurrency.lua); see lease_manager.h.
#include <algorithm>

#include <spdlog/spdlog.h>

#include "entry.h"
#include "holding.h"
#include "lease_manager.h"
#include "slice.h"

namespace sluice {

namespace {

using Words = std::span<std::atomic<uint64_t>>;

// A concurrency entry's words, when `entry` is one of `rule`'s.
std::optional<Words> holdingWords(KeyTable::Entry* entry, const Rule& rule) {
  if (entry == nullptr || entry->state().size() != entryWords(rule)) return std::nullopt;
  return entry->state();
}

}  // namespace

void LeaseManager::callHolding(const Rule& rule, const RuleSetPtr& rules, std::string_view key,
                               scripts::Op op, int64_t n, int64_t need, int64_t timeout_ms,
                               HoldingDone then) {
  HeldKey at{rule.id, std::string(key)};
  Holding& holding = holdings_[at];
  ++holding.in_flight;
  holding.last_call_ns = now();
  pipe_.call(concurrency_, {stateKey(rule.name, key)},
             scripts::concurrencyArgv(op, n, need, rule.limits.front(), config_.lease_ttl_ms,
                                      context_.node_id),
             timeout_ms,
             [this, at = std::move(at), &rule, rules, then = std::move(then)](
                 const RedisResult& result) {
               std::optional<scripts::LeaseReply> reply;
               if (result.status == RedisStatus::kOk) {
                 if (auto values = result.reply->integers()) {
                   reply = scripts::parseLeaseReply(*values, scripts::Script::kConcurrency);
                 }
               }
               if (auto it = holdings_.find(at); it != holdings_.end()) --it->second.in_flight;
               if (then) then(reply ? &*reply : nullptr, result);
               if (reply) reconcile(rule, rules, at.key, *reply);
             });
}

void LeaseManager::sendHoldingLease(const LeaseRequest& request, const Rule& rule,
                                    const RuleSetPtr& rules, std::function<void()> done) {
  context_.broker->counters().requested.fetch_add(1, std::memory_order_relaxed);
  callHolding(
      rule, rules, request.key, scripts::Op::kLease, request.n, request.need,
      config_.lease_timeout_ms,
      [this, request, &rule, done = std::move(done)](const scripts::LeaseReply* reply,
                                                     const RedisResult& result) {
        if (reply == nullptr || reply->granted > request.n) {
          leaseFailed(request, result);
          if (done) done();
          return;
        }
        countLease(*reply, result);
        int64_t now_ns = now();
        finish(request.rule_id, request.key, [&](Words words) {
          if (words.size() != entryWords(rule)) return;
          slice::noteGrant(words, reply->granted, reply->remaining, false);
          slice::noteRedisLeft(words, rule, reply->remaining, now_ns);
          if (reply->granted == 0) {
            // Redis's retry_after is when holdings expire, but a return may
            // free units sooner: ask again after a lease interval at most.
            int64_t wait_ms = std::clamp<int64_t>(reply->retry_after_ms, 1,
                                                  config_.lease_interval_ms);
            slice::applyEmpty(words, now_ns, wait_ms * 1'000'000);
            return;
          }
          holding::applyGrant(words, reply->granted);
        });
        if (done) done();
      });
}

void LeaseManager::leaseDebts(const std::function<void()>& answered,
                              const std::function<void(size_t)>& expect) {
  RuleSetPtr rules = context_.rules();
  std::vector<std::pair<const Rule*, LeaseRequest>> leases;
  context_.keys->visit([&](KeyTable::Entry& entry) {
    const Rule* rule = rules->findById(entry.ruleId());
    if (rule == nullptr || !leasesHolding(*rule)) return;
    auto words = holdingWords(&entry, *rule);
    if (!words || holding::pool(*words) >= 0 || !holding::claimLease(*words)) return;
    LeaseRequest request;
    request.rule_id = rule->id;
    request.key = std::string(entry.key());
    request.n = std::min(-holding::pool(*words), rule->limits.front().limit);
    request.need = 1;
    leases.emplace_back(rule, std::move(request));
  });
  if (leases.empty()) return;
  expect(leases.size());  // before any answer: one may come at once
  spdlog::info("lease: leasing back the units {} keys' callers acquired in fallback",
               leases.size());
  for (auto& [rule, request] : leases) sendHoldingLease(request, *rule, rules, answered);
}

bool LeaseManager::serveHoldingReturn(const LeaseRequest& request, const Rule& rule,
                                      const RuleSetPtr& rules, bool room) {
  if (breaker_.redisUp() && !room) return false;
  {
    KeyTable::ReadGuard guard(*context_.keys, reader_);
    if (auto words = holdingWords(context_.keys->find(rule.id, request.key), rule)) {
      if (!breaker_.redisUp()) {
        // Not sent: the units stay this node's, back in the pool they left.
        slice::refund(*words, request.n);
        return true;
      }
      holding::returned(*words, request.n);
    }
  }
  // (An entry gone with Redis down leaves its units to expire in Redis.)
  if (breaker_.redisUp()) sendHoldingReturn(rule, rules, request.key, request.n, true, nullptr);
  return true;
}

void LeaseManager::sendHoldingReturn(const Rule& rule, const RuleSetPtr& rules,
                                     std::string_view key, int64_t units, bool counted,
                                     std::function<void()> done) {
  callHolding(rule, rules, key, scripts::Op::kReturn, units, 0, config_.lease_timeout_ms,
              [this, units, counted, done = std::move(done)](const scripts::LeaseReply* reply,
                                                             const RedisResult&) {
                if (reply != nullptr && counted) {
                  context_.broker->counters().returned_units.fetch_add(
                      static_cast<uint64_t>(units), std::memory_order_relaxed);
                }
                if (done) done();
              });
}

void LeaseManager::reconcile(const Rule& rule, const RuleSetPtr& rules, const std::string& key,
                             const scripts::LeaseReply& reply) {
  auto it = holdings_.find(HeldKey{rule.id, key});
  if (it == holdings_.end()) return;
  Holding& held = it->second;
  held.redis_held = reply.held;
  if (held.in_flight > 0) return;  // the last answer tells what Redis holds after all of them
  int64_t excess = reply.held;     // with no entry, nothing here needs them
  int64_t believed = 0;
  int64_t lost = 0;
  bool debt = false;
  {
    KeyTable::ReadGuard guard(*context_.keys, reader_);
    if (auto words = holdingWords(context_.keys->find(rule.id, key), rule)) {
      // A holding that expired in Redis (or shrank) lost units, and the
      // units callers hold here beyond what is left are a debt.
      lost = holding::reconcile(*words, reply.held);
      believed = holding::held(*words);
      excess = reply.held - believed;
      debt = holding::pool(*words) < 0;
    }
  }
  if (lost > 0) {
    context_.broker->counters().lost_units.fetch_add(static_cast<uint64_t>(lost),
                                                      std::memory_order_relaxed);
    int64_t now_ns = now();
    if (now_ns - lost_logged_ns_ >= 10'000'000'000) {  // at most every 10 s
      lost_logged_ns_ = now_ns;
      spdlog::warn("lease: redis no longer holds {} units of rule {} for this node (the holding "
                   "expired: redis stalled, restarted or was unreachable longer than lease_ttl); "
                   "units callers hold here are leased again before new ones are handed out",
                   lost, rule.name);
    }
  }
  if (excess > 0) {
    // Units Redis holds that this node does not know of: given back.
    if (breaker_.redisUp()) sendHoldingReturn(rule, rules, key, excess, false, nullptr);
    return;
  }
  if (reply.held == 0 && believed == 0 && !debt) holdings_.erase(it);
}

void LeaseManager::renewHoldings() {
  if (!breaker_.redisUp() || context_.broker->breaker() != Breaker::kClosed) return;
  passHoldings(false, nullptr, nullptr);
}

void LeaseManager::passHoldings(bool recovering, const std::function<void()>& answered,
                                const std::function<void(size_t)>& expect) {
  if (holdings_.empty()) return;
  RuleSetPtr rules = context_.rules();
  int64_t now_ns = now();
  int64_t renew_ns = config_.lease_ttl_ms * 1'000'000 / kRenewalsPerTtl;
  struct Call {
    const Rule* rule;
    std::string key;
    scripts::Op op;
    int64_t n;
  };
  std::vector<Call> calls;  // returns and renewals
  std::vector<std::pair<const Rule*, LeaseRequest>> debts;
  {
    KeyTable::ReadGuard guard(*context_.keys, reader_);
    for (auto it = holdings_.begin(); it != holdings_.end();) {
      const auto& [at, held] = *it;
      const Rule* rule = rules->findById(at.rule_id);
      if (rule == nullptr || !leasesHolding(*rule)) {
        // The rule changed: its old holdings expire in Redis.
        it = holdings_.erase(it);
        continue;
      }
      if (held.in_flight > 0) {  // its answer renews it, and reconciles
        ++it;
        continue;
      }
      auto words = holdingWords(context_.keys->find(at.rule_id, at.key), *rule);
      if (!words) {
        // The key went (idle, evicted): what Redis still holds goes back.
        if (held.redis_held > 0) {
          calls.push_back({rule, at.key, scripts::Op::kReturn, held.redis_held});
          ++it;
        } else {
          it = holdings_.erase(it);
        }
        continue;
      }
      if (int64_t reclaimed = holding::reclaim(*words, now_ns)) {
        context_.broker->counters().released_units.fetch_add(static_cast<uint64_t>(reclaimed),
                                                             std::memory_order_relaxed);
      }
      int64_t surplus = recovering ? 0 : holding::takeSurplus(*words);
      if (int64_t pool = holding::pool(*words); pool < 0) {
        // Units acquired in fallback (the key's lease failed or came late)
        // beyond its pool: leased back, which also renews the holding. A
        // lease on the way already asks for them.
        if (!recovering && holding::claimLease(*words)) {
          LeaseRequest request;
          request.rule_id = rule->id;
          request.key = at.key;
          request.n = std::min(-pool, rule->limits.front().limit);
          request.need = 1;
          debts.emplace_back(rule, std::move(request));
        }
      } else if (surplus > 0) {
        holding::returned(*words, surplus);
        calls.push_back({rule, at.key, scripts::Op::kReturn, surplus});
      } else if (holding::held(*words) > 0 || held.redis_held > 0) {
        if (recovering || now_ns - held.last_call_ns >= renew_ns / 2) {
          calls.push_back({rule, at.key, scripts::Op::kRenew, 0});
        }
      } else {
        it = holdings_.erase(it);
        continue;
      }
      ++it;
    }
  }
  for (auto& [rule, request] : debts) sendHoldingLease(request, *rule, rules);
  if (expect) expect(calls.size());  // before any answer: one may come at once
  auto then = [answered](const scripts::LeaseReply*, const RedisResult&) {
    if (answered) answered();
  };
  for (const Call& call : calls) {
    if (call.op == scripts::Op::kRenew) {
      context_.broker->counters().renewed.fetch_add(1, std::memory_order_relaxed);
      callHolding(*call.rule, rules, call.key, call.op, 0, 0, config_.lease_timeout_ms, then);
    } else {
      sendHoldingReturn(*call.rule, rules, call.key, call.n, true,
                        [answered] {
                          if (answered) answered();
                        });
    }
  }
}

}  // namespace sluice

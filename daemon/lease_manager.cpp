// LeaseManager: leases, returns, debits and the breaker's calls; see lease_manager.h.
#include "lease_manager.h"

#include <algorithm>
#include <cstdlib>
#include <memory>

#include <spdlog/spdlog.h>

#include "entry.h"
#include "holding.h"
#include "limiter.h"
#include "penalty.h"
#include "rate_lease.h"
#include "redis_keys.h"
#include "slice.h"

namespace sluice {

namespace {

using Words = std::span<std::atomic<uint64_t>>;

int64_t periodMs(const Limit& limit) { return (limit.period_ns + 999'999) / 1'000'000; }

// The rule a request of `rule` is for: the variant of the override that
// decides its key, whose limits the script is called with (same name, id
// and algorithm, so the same Redis key).
const Rule& variantOf(const RuleSet& rules, const Rule& rule, uint32_t variant) {
  return variant <= rule.overrides.size() ? rules.variant(rule, variant) : rule;
}

}  // namespace

LeaseManager::LeaseManager(RedisTarget& link, const RedisConfig& config, LeaseContext context)
    : link_(link),
      config_(config),
      context_(std::move(context)),
      reader_(context_.keys->registerReader()),
      version_key_(redisVersionKey(config.key_prefix)),
      pipe_(link, [this] { serveTaken(); }),
      breaker_(*context_.broker, *this,
               {config.lease_ttl_ms * 1'000'000,
                static_cast<int64_t>(link.options().longestBackoffMs() * 1e6),
                context_.state_version, config.key_prefix},
               context_.rules) {
  auto add = [&](scripts::Script script) {
    const scripts::ScriptSource& source = scripts::get(script);
    return link_.registerScript(std::string(source.name), std::string(source.source));
  };
  for (const AlgorithmTraits& algorithm : kAlgorithmTraits) {
    if (!algorithm.leases_slice) continue;
    slice_scripts_[static_cast<size_t>(algorithm.algorithm)] =
        add(*scripts::forAlgorithm(algorithm.algorithm));
  }
  concurrency_ = add(scripts::Script::kConcurrency);
  penalty_ = add(scripts::Script::kPenalty);
  fleet_version_ = add(scripts::Script::kFleetVersion);
}

std::string LeaseManager::stateKey(std::string_view rule_name, std::string_view key) const {
  return redisStateKey(config_.key_prefix, rule_name, key, context_.state_version);
}

std::string LeaseManager::blockKey(std::string_view rule_name, std::string_view key) const {
  return redisBlockKey(config_.key_prefix, rule_name, key, context_.state_version);
}

RedisLink::ScriptId LeaseManager::scriptFor(Algorithm algorithm) const {
  if (!algorithmTraits(algorithm).leases_slice) {
    // Only a rule that leases a slice (leasable) is sent here.
    spdlog::critical("no slice lease script for a {} rule", algorithmName(algorithm));
    std::abort();
  }
  return slice_scripts_[static_cast<size_t>(algorithm)];
}

void LeaseManager::onWakeup() { serveTaken(); }

void LeaseManager::serveTaken(bool all) {
  if (serving_) return;  // a reply during serve(): the loop below goes on by itself
  serving_ = true;
  RuleSetPtr rules;
  while (true) {
    if (taken_next_ == taken_.size()) {
      if (taken_.capacity() > kMaxKeptRequests) std::vector<LeaseRequest>().swap(taken_);
      taken_next_ = 0;
      context_.broker->takeRequests(&taken_);
      if (taken_.empty()) break;
    }
    if (!rules) rules = context_.rules();
    // With the pipeline full, the rest wait where they are, in order, until
    // a reply makes room (each answer serves on: the pipe's `answered`).
    bool room = all || pipe_.hasRoom();
    if (!serve(taken_[taken_next_], rules, room)) break;
    ++taken_next_;
  }
  serving_ = false;
}

bool LeaseManager::serve(const LeaseRequest& request, const RuleSetPtr& rules, bool room) {
  const Rule* rule = rules->findById(request.rule_id);
  if (rule != nullptr) rule = &variantOf(*rules, *rule, request.variant);
  switch (request.kind) {
    case LeaseRequest::Kind::kReturn:
      if (rule != nullptr && leasesHolding(*rule)) {
        return serveHoldingReturn(request, *rule, rules, room);
      }
      if (rule == nullptr || !breaker_.redisUp()) return true;
      if (!room) return false;
      sendReturn(*rule, request.key, request.n, request.lease_now_ms, config_.lease_timeout_ms,
                 nullptr);
      return true;
    case LeaseRequest::Kind::kDebit:
      if (rule == nullptr || !leasable(*rule) || !breaker_.redisUp()) return true;
      if (!room) return false;
      sendDebitNow(*rule, request.variant, request.key, request.n);
      return true;
    case LeaseRequest::Kind::kBlock:
    case LeaseRequest::Kind::kReset: {
      bool block = request.kind == LeaseRequest::Kind::kBlock;
      if (rule == nullptr || !leasable(*rule) || !breaker_.redisUp() || (block && !rule->penalty)) return true;
      if (!room) return false;
      sendPenalty(*rule, request.key,
                  block ? scripts::PenaltyOp::kBlock : scripts::PenaltyOp::kReset, request.n);
      return true;
    }
    case LeaseRequest::Kind::kLease: break;
  }
  if (rule == nullptr || !(leasable(*rule) || leasesHolding(*rule)) || !breaker_.redisUp() ||
      !context_.broker->leasing()) {
    // Not now: the workers decide by on_redis_down until the breaker closes.
    finish(request.rule_id, request.key, nullptr);
    return true;
  }
  if (!room) return false;
  if (leasesHolding(*rule)) {
    sendHoldingLease(request, *rule, rules);
  } else {
    sendLease(request, *rule, rules);
  }
  return true;
}

void LeaseManager::callScript(const Rule& rule, std::string_view key, std::vector<std::string> argv,
                              int64_t timeout_ms, RedisCallback on_result) {
  pipe_.call(scriptFor(rule.algorithm), {stateKey(rule.name, key)}, std::move(argv), timeout_ms,
             std::move(on_result));
}

void LeaseManager::sendLease(const LeaseRequest& request, const Rule& rule, RuleSetPtr rules) {
  const Limit& limit = rule.limits.front();
  context_.broker->counters().requested.fetch_add(1, std::memory_order_relaxed);
  int64_t deadline_us = 0;
  if (context_.redis_now_us) {
    if (std::optional<int64_t> now_us = context_.redis_now_us()) {
      deadline_us = *now_us + std::max(kMinLeaseDeadlineUs, 2 * config_.lease_timeout_ms * 1000);
    }
  }
  std::vector<std::string> argv =
      request.rate >= 0
          ? rate_lease::rateArgv(request.rate, request.n, limit, deadline_us, context_.node_id, rateLeaseMs())
          : scripts::leaseArgv(request.n, request.need, limit, deadline_us);
  // A rule with a penalty asks for the key's block too (the script's KEYS[2]).
  std::vector<std::string> keys = {stateKey(rule.name, request.key)};
  if (rule.penalty) keys.push_back(blockKey(rule.name, request.key));
  pipe_.call(scriptFor(rule.algorithm), std::move(keys), std::move(argv),
             config_.lease_timeout_ms,
             [this, request, &rule, rules = std::move(rules), sent_ns = now()](const RedisResult& result) {
               onLeaseReply(request, rule, result, sent_ns);
             });
}

int64_t LeaseManager::rateLeaseMs() const {
  return std::clamp<int64_t>(config_.lease_ttl_ms, 1, rate_lease::kMaxLeaseMs);
}

void LeaseManager::sendPenalty(const Rule& rule, std::string_view key, scripts::PenaltyOp op,
                               int64_t block_ms) {
  pipe_.call(penalty_, {stateKey(rule.name, key), blockKey(rule.name, key)},
             scripts::penaltyArgv(op, block_ms), config_.lease_timeout_ms,
             [this, op](const RedisResult& result) {
               if (result.status == RedisStatus::kOk) return;
               std::string error(result.error);
               if (error != last_error_) {  // logged once until it changes
                 spdlog::error("penalty: a {} did not reach redis: {}",
                               op == scripts::PenaltyOp::kBlock ? "block" : "reset", error);
                 last_error_ = error;
               }
             });
}

void LeaseManager::leaseFailed(const LeaseRequest& request, const RedisResult& result, const Rule* rate_rule) {
  int64_t now_ns = now();
  context_.broker->counters().failed.fetch_add(1, std::memory_order_relaxed);
  // A timeout or a lost connection opens the breaker (the link reports
  // it first); an answer we cannot use sends this key to its policy for a
  // while. So does a call that failed while Redis as a whole is still up:
  // in Cluster mode, this key's master alone is unreachable (cluster.h).
  bool answered = result.status == RedisStatus::kOk || result.status == RedisStatus::kRedisError;
  bool master_lost = !answered && breaker_.redisUp();
  if (answered || master_lost) {
    std::string error = result.status == RedisStatus::kOk ? "a reply that is not a lease"
                        : master_lost ? "that the key's master is unreachable (" +
                                            std::string(result.error) + ")"
                                      : std::string(result.error);
    if (error != last_error_) {  // logged once until it changes
      spdlog::error("lease: redis answered {}; the key follows on_redis_down for {} ms", error,
                    kLeaseErrorBackoffNs / 1'000'000);
      last_error_ = error;
    }
  }
  finish(request.rule_id, request.key, [&](Words words) {
    if (answered || master_lost) slice::failUntil(words, now_ns + kLeaseErrorBackoffNs);
    if (rate_rule != nullptr && request.rate >= 0) {
      // Redis may have run the op (the reply is what was lost, as when it
      // dies): a renewal that shrank the rate holds the node to the smaller
      // one, through the outage hold too, so the key never spends faster
      // than Redis may charge it.
      const Limit& limit = rate_rule->limits.front();
      const int64_t ns_per_unit = request.rate > 0 ? rate_lease::nsPerUnit(limit, request.rate) : 0;
      slice::holdAtMostRate(words, ns_per_unit,
                            rate_lease::capUnits(limit, request.rate, context_.broker->leaseIntervalNs()),
                            now_ns);
    }
  });
}

void LeaseManager::countLease(const scripts::LeaseReply& reply, const RedisResult& result) {
  LeaseBroker::Counters& counters = context_.broker->counters();
  uint64_t rtt = result.rtt_us;
  counters.latency.observe(rtt);
  counters.latency_us_sum.fetch_add(rtt, std::memory_order_relaxed);
  uint64_t max = counters.latency_us_max.load(std::memory_order_relaxed);
  while (rtt > max && !counters.latency_us_max.compare_exchange_weak(max, rtt)) {
  }
  if (reply.granted == 0) {
    counters.empty.fetch_add(1, std::memory_order_relaxed);
  } else {
    counters.granted.fetch_add(1, std::memory_order_relaxed);
    counters.granted_units.fetch_add(static_cast<uint64_t>(reply.granted), std::memory_order_relaxed);
  }
}

void LeaseManager::onLeaseReply(const LeaseRequest& request, const Rule& rule,
                                const RedisResult& result, int64_t sent_ns) {
  const Limit& limit = rule.limits.front();
  int64_t now_ns = now();
  std::optional<scripts::LeaseReply> reply;
  int64_t rate = 0;     // a rate lease's grant, units per period
  bool unmet = false;   // the rate op's reply: some node's demand is unmet
  if (result.status == RedisStatus::kOk) {
    if (auto values = result.reply->integers()) {
      if (request.rate >= 0) {
        if (auto rated = rate_lease::parseReply(*values, limit.limit)) {
          reply = rated->lease;
          rate = rated->rate;
          unmet = rated->unmet;
        }
      } else {
        reply = scripts::parseLeaseReply(*values);
      }
    }
    if (reply && reply->granted > request.n) reply.reset();  // more than asked: not our script
  }
  if (!reply) {
    leaseFailed(request, result, request.rate >= 0 ? &rule : nullptr);
    return;
  }
  countLease(*reply, result);

  bool applied = false;
  finish(request.rule_id, request.key, [&](Words words) {
    applied = true;
    if (rule.penalty) {
      // The key's block, as Redis has it: held here until it ends, but asked
      // again after slice::kBlockRecheckNs (the slice's negative cache,
      // which the workers read as the time to recheck while a block holds),
      // so that a reset lifts it.
      auto block = penaltyState(rule, words);
      if (reply->blocked_ms > 0) {
        int64_t left_ns = reply->blocked_ms * 1'000'000;
        penalty::setBlockedUntil(block, now_ns + left_ns);
        slice::block(words, now_ns, left_ns);
        return;
      }
      // A recheck found no block (lifted, or ended in Redis first). A lease
      // sent before this node blocked the key answers before its recheck
      // time, and leaves the block alone.
      if (penalty::blockedFor(block, now_ns) > 0 && now_ns >= slice::deniedUntilNs(words)) {
        penalty::setBlockedUntil(block, 0);
      }
    }
    slice::noteGrant(words, reply->granted, reply->remaining,
                     slice::untouched(words, rule, sent_ns, reply->granted, reply->remaining));
    slice::noteShort(words, request.n, reply->granted);
    slice::noteRedisLeft(words, rule, reply->remaining, now_ns);
    if (request.rate >= 0) {
      // Held in Redis from when it ran, after sent_ns, for rateLeaseMs():
      // here it ends no later. Renewed at the next lease interval while
      // some node's demand is unmet or when the rate rose (rate_lease::
      // rose), else after rate_lease::kMaxRenewNs (rate_lease::renewAtNs)
      // or sooner while its asks settle (rate_lease::settleNs): a renewal
      // is how a holder learns of new demand (its share shrinks).
      const int64_t lease_ns = rateLeaseMs() * 1'000'000;
      const int64_t interval_ns = context_.broker->leaseIntervalNs();
      const int64_t ns_per_unit = rate > 0 ? rate_lease::nsPerUnit(limit, rate) : 0;
      const bool rose = rate_lease::rose(slice::rateNsPerUnit(words, now_ns), ns_per_unit);
      // Short of its ask while others hold more than their shares: it asks
      // again soon for a while (rate_lease::kQuickRenewIntervals).
      const bool quick = slice::noteRateShort(words, unmet && rate < request.rate, now_ns, interval_ns,
                                              rate_lease::kQuickRenewIntervals);
      // Short of its ask (every node of a contended fleet): it renews once
      // its demand brought rate_lease::kShortRenewUnits, to take up rate
      // that another node freed meanwhile.
      const int64_t short_ns = rate_lease::shortRenewNs(limit, request.rate, rate, interval_ns);
      const int64_t previous_sent_ns = slice::rateSentNs(words, now_ns, lease_ns);
      const int64_t settle_ns =
          rate_lease::settleNs(previous_sent_ns > 0 ? sent_ns - previous_sent_ns : 0, interval_ns);
      slice::applyRate(words, ns_per_unit, rate_lease::capUnits(limit, rate, interval_ns),
                       sent_ns + lease_ns,
                       rate_lease::renewAtNs(sent_ns, lease_ns, unmet || rose, interval_ns, quick,
                                             short_ns > 0 ? std::min(short_ns, settle_ns) : settle_ns),
                       now_ns);
      slice::noteAsked(words, limit, rate > 0 ? request.rate : 0, interval_ns, now_ns);
      // The answer may have moved the key's idle time and demand window
      // sooner (noteAsked): the next pass looks.
      if (rate > 0) rate_keys_[{request.rule_id, request.key}] = now_ns;
      if (rate > 0 && reply->granted == 0) return;  // the rate refills the slice
      if (request.rate == 0) return;  // given up (sweepIdleRates): the next take leases anew
      if (rate == 0 && reply->granted == 0) {
        // Its demand is recorded, and the holders hear it is unmet and give
        // up their share of it at their next lease interval: ask again
        // within one, not at Redis's wait (the holders' ends).
        const int64_t wait_ms = rate_lease::reaskAfterMs(reply->retry_after_ms, config_.lease_interval_ms, quick);
        slice::applyEmpty(words, now_ns, wait_ms * 1'000'000);
        return;
      }
    }
    if (reply->granted == 0) {
      // Nothing until retry_after_ms: deny locally until then (but asked
      // again after slice::kEmptyRecheckNs), so an over-limit key costs
      // Redis little. "Never" waits a period. The wait runs from when the
      // script ran, which is after sent_ns: counted from the reply's
      // arrival, every denial would add the reply's way back to the time
      // units come free, and a saturated key would lease them late each
      // time (a sliding log's periods would start later and later; it
      // waits a ms less than Redis's rounded wait, slice::emptyWaitMs).
      int64_t wait_ms = reply->never ? periodMs(limit) : slice::emptyWaitMs(rule, reply->retry_after_ms);
      const int64_t interval_ns = context_.broker->leaseIntervalNs();
      if (!reply->never && request.rate < 0 && rate_lease::eligible(rule) &&
          rate_lease::wants(limit,
                            std::max(slice::demandPerInterval(words, now_ns, interval_ns),
                                     static_cast<double>(request.n)),
                            slice::drained(words), interval_ns)) {
        // Its next lease asks for a rate (the bucket ran dry: the others'
        // rates may hold the whole limit, and Redis's wait is then their
        // ends): asked within one lease interval, it records the key's
        // demand, and the holders give up their share of it by the next.
        wait_ms = rate_lease::reaskAfterMs(wait_ms, config_.lease_interval_ms);
      }
      slice::applyEmpty(words, sent_ns, wait_ms * 1'000'000);
      return;
    }
    int64_t expires_ns = 0;
    bool new_window = false;
    if (algorithmTraits(rule.algorithm).windowed) {
      // The units count in the window the lease was granted in; they may
      // be spent only until it ends. Units of an older window are dropped.
      int64_t window_end_ms = scripts::leaseWindowEndMs(reply->now_ms, limit);
      new_window = scripts::leaseWindow(slice::leaseNowMs(words), limit) !=
                   scripts::leaseWindow(reply->now_ms, limit);
      expires_ns = now_ns + (window_end_ms - reply->now_ms) * 1'000'000;
    } else if (algorithmTraits(rule.algorithm).stamps_lease) {
      // The units entered the log stamped at the lease and leave it one
      // period later: spent after that they would count nowhere. A grant
      // extends the slice's older units too; the overshoot bound counts
      // every unit held (docs/design.md, "The sliding log in Redis").
      expires_ns = now_ns + limit.period_ns;
    }
    slice::applyGrant(words, reply->granted, reply->now_ms, expires_ns, new_window);
  });
  if (!applied && reply->granted > 0) {
    // The key was evicted while its lease was in flight: give the units back.
    if (breaker_.redisUp()) sendReturn(rule, request.key, reply->granted, reply->now_ms, config_.lease_timeout_ms, nullptr);
  }
}

void LeaseManager::finish(uint32_t rule_id, std::string_view key,
                          const std::function<void(Words)>& apply) {
  {
    KeyTable::ReadGuard guard(*context_.keys, reader_);
    KeyTable::Entry* entry = context_.keys->find(rule_id, key);
    // (Ids name one definition: an entry of this id is this rule's slice.)
    if (entry != nullptr && entry->state().size() >= slice::kWords) {
      Words words = entry->state();
      if (apply) apply(words);
      slice::unclaim(words);
    }
  }
  context_.broker->notifyWorkers();
}

void LeaseManager::sendReturn(const Rule& rule, std::string_view key, int64_t units,
                              int64_t lease_now_ms, int64_t timeout_ms,
                              std::function<void()> done) {
  const Limit& limit = rule.limits.front();
  callScript(rule, key,
             scripts::returnArgv(units, limit, scripts::returnMark(lease_now_ms, rule.algorithm, limit)),
             timeout_ms, [this, units, done](const RedisResult& result) {
               if (result.status == RedisStatus::kOk) {
                 context_.broker->counters().returned_units.fetch_add(
                     static_cast<uint64_t>(units), std::memory_order_relaxed);
               }
               if (done) done();
             });
}

void LeaseManager::sendDebit(const Rule& rule, std::string_view key, int64_t units,
                             int64_t span_ms, std::function<void(const RedisResult&)> done) {
  callScript(rule, key, scripts::rateArgv(scripts::Op::kDebit, units, span_ms, rule.limits.front()),
             config_.lease_timeout_ms + config_.health_timeout_ms,
             [this, units, done](const RedisResult& result) {
               if (result.status == RedisStatus::kOk) {
                 context_.broker->counters().debited_units.fetch_add(
                     static_cast<uint64_t>(units), std::memory_order_relaxed);
               }
               if (done) done(result);
             });
}

void LeaseManager::sendDebitNow(const Rule& rule, uint32_t variant, std::string_view key,
                                int64_t units) {
  sendDebit(rule, key, units, 0,
            [this, id = rule.id, variant, key = std::string(key), units](const RedisResult& result) {
              // A call lost on its way may have run: only one never sent waits.
              if (!ScriptPipe::neverSent(result)) return;
              DebitKey at{id, variant, key};
              auto it = unsent_debits_.find(at);
              if (it != unsent_debits_.end()) {
                it->second += units;
              } else if (unsent_debits_.size() < kMaxUnsentDebits) {
                unsent_debits_.emplace(std::move(at), units);
              } else if (last_error_ != "unsent debits") {
                spdlog::error("lease: {} keys' debits wait for redis; dropping more",
                              kMaxUnsentDebits);
                last_error_ = "unsent debits";
              }
            });
}

void LeaseManager::retryDebits() {
  if (unsent_debits_.empty() || !breaker_.redisUp()) return;
  RuleSetPtr rules = context_.rules();
  std::map<DebitKey, int64_t> debits;
  debits.swap(unsent_debits_);
  for (auto& [at, units] : debits) {
    const Rule* rule = rules->findById(at.rule_id);
    if (rule == nullptr || !leasable(*rule)) continue;  // the rule changed: nothing to charge
    sendDebitNow(variantOf(*rules, *rule, at.variant), at.variant, at.key, units);
  }
}

void LeaseManager::onDown() {
  breaker_.down(now());
  pipe_.dropWaiting();
  serveTaken();  // sends nothing now: the leases waiting are finished, the rest dropped
}

void LeaseManager::onUp() { breaker_.up(now()); }

int64_t LeaseManager::sweepIntervalMs(int64_t lease_interval_ms) {
  return std::max<int64_t>(lease_interval_ms / slice::kIdleWindowsPerInterval / 2, 1);
}

void LeaseManager::sweepIdleRates() {
  if (rate_keys_.empty() || !breaker_.redisUp()) return;
  RuleSetPtr rules = context_.rules();
  const int64_t now_ns = now();
  const int64_t interval_ns = context_.broker->leaseIntervalNs();
  std::vector<LeaseRequest> due;
  {
    KeyTable::ReadGuard guard(*context_.keys, reader_);
    for (auto it = rate_keys_.begin(); it != rate_keys_.end();) {
      if (it->second > now_ns) {
        ++it;
        continue;
      }
      const auto& [rule_id, key] = it->first;
      const Rule* rule = rules->findById(rule_id);
      KeyTable::Entry* entry = rule != nullptr ? context_.keys->find(rule_id, key) : nullptr;
      if (entry == nullptr || !rate_lease::eligible(*rule) || entry->state().size() != entryWords(*rule) ||
          !slice::holdsRate(entry->state(), now_ns)) {
        it = rate_keys_.erase(it);
        continue;
      }
      Words words = entry->state();
      const int64_t last_use_ns = entry->lastUsedNs();
      if (slice::claimMovedRenewal(words, now_ns, last_use_ns)) {
        LeaseRequest request;
        request.rule_id = rule_id;
        request.key = key;
        request.variant = storedOverride(*rule, words);
        const Rule& variant = variantOf(*rules, *rule, request.variant);
        // The window's demand (demandMoved made it the key's): none gives
        // the rate up.
        const double demand = slice::demandPerInterval(words, now_ns, interval_ns);
        request.rate = demand > 0 ? rate_lease::askedRate(variant.limits.front(), demand, interval_ns) : 0;
        due.push_back(std::move(request));
      }
      // A key with a lease on the way is looked at again next pass, as
      // claimMovedRenewal passes it by; the others at the first pass when
      // they can be due, and within a lease interval whatever their words
      // say.
      it->second = slice::inFlight(words)
                       ? now_ns
                       : std::min(slice::moveCheckDueNs(words, last_use_ns), now_ns + interval_ns);
      ++it;
    }
  }
  for (const LeaseRequest& request : due) {
    const Rule* rule = rules->findById(request.rule_id);
    sendLease(request, variantOf(*rules, *rule, request.variant), rules);
  }
}

void LeaseManager::renewHeard(std::string_view state_key) {
  context_.broker->counters().renew_words.fetch_add(1, std::memory_order_relaxed);
  std::optional<StateKeyPair> pair = parseRedisStateKey(state_key, config_.key_prefix, context_.state_version);
  if (!pair) return;  // another prefix's or version's key
  RuleSetPtr rules = context_.rules();
  const Rule* rule = rules->find(pair->rule_name);
  if (rule == nullptr || !rate_lease::eligible(*rule)) return;
  const int64_t now_ns = now();
  KeyTable::ReadGuard guard(*context_.keys, reader_);
  KeyTable::Entry* entry = context_.keys->find(rule->id, pair->key);
  if (entry != nullptr && entry->state().size() == entryWords(*rule)) {
    slice::renewRateNow(entry->state(), now_ns);
  }
}

void LeaseManager::newMaster(std::string_view master) {
  spdlog::warn("lease: cluster master {} took over slots: a replica promoted without the writes "
               "it had not replicated, or a node added; learning mode, each node also holds to "
               "its share for one period, and until every node can have reconnected",
               master);
  // It may lack the last renewal of a rate this node holds on its slots.
  endRates();
  breaker_.newMaster(now());
}

bool LeaseManager::askIdentity(uint64_t epoch) {
  // INFO's default sections hold server (run_id) and replication.
  bool sent = link_.command(
      {"INFO"},
      [this, epoch](const RedisResult& result) {
        std::optional<RedisIdentity> identity;
        if (result.status == RedisStatus::kOk) identity = parseInfo(result.reply->str());
        // Then the fleet marker: the breaker weighs both at once.
        auto done = [this, epoch, identity](std::optional<int64_t> fleet) {
          --identities_in_flight_;
          breaker_.identified(epoch, identity, now(), fleet);
        };
        if (!claimFleet(done)) done(std::nullopt);
      },
      config_.lease_timeout_ms + config_.health_timeout_ms);
  if (sent) ++identities_in_flight_;
  return sent;
}

bool LeaseManager::claimFleet(std::function<void(std::optional<int64_t>)> done) {
  std::vector<std::string> argv = scripts::fleetVersionArgv(
      scripts::FleetVersionOp::kClaim, context_.state_version, context_.fleet_ttl_ms);
  std::vector<std::string_view> args(argv.begin(), argv.end());
  std::string_view keys[] = {version_key_};
  return link_.evalsha(
      fleet_version_, keys, args,
      [this, done = std::move(done)](const RedisResult& result) {
        std::optional<int64_t> fleet;
        if (result.status == RedisStatus::kOk) {
          if (auto values = result.reply->integers()) fleet = scripts::parseFleetVersionReply(*values);
        }
        if (!fleet && result.status != RedisStatus::kDisconnected) {
          std::string error = result.status == RedisStatus::kOk ? "a reply that is not a version"
                                                                : std::string(result.error);
          if (error != last_error_) {  // logged once until it changes
            spdlog::error("lease: the fleet marker {} answered {}", version_key_, error);
            last_error_ = error;
          }
        }
        done(fleet);
      },
      config_.lease_timeout_ms + config_.health_timeout_ms);
}

void LeaseManager::checkFleet() {
  if (!breaker_.redisUp()) return;
  if (breaker_.refused()) {
    if (identities_in_flight_ == 0) askIdentity(breaker_.epoch());
    return;
  }
  if (breaker_.state() != Breaker::kClosed || claim_in_flight_) return;
  claim_in_flight_ = claimFleet([this](std::optional<int64_t> fleet) {
    claim_in_flight_ = false;
    breaker_.checked(fleet, now());
  });
}

void LeaseManager::recover(uint64_t epoch, bool state_lost, bool master_changed,
                           int64_t fallback_span_ms) {
  auto answered = [this, epoch] { breaker_.answered(epoch, now()); };
  auto expect = [this, epoch](size_t calls) { breaker_.expect(epoch, calls); };
  if (master_changed) endRates();
  debitFallback(state_lost, fallback_span_ms, answered, expect);
  passHoldings(true, answered, expect);
  leaseDebts(answered, expect);
}

void LeaseManager::endRates() {
  RuleSetPtr rules = context_.rules();
  const int64_t now_ns = now();
  std::vector<std::pair<const Rule*, std::string>> held;
  context_.keys->visit([&](KeyTable::Entry& entry) {
    const Rule* rule = rules->findById(entry.ruleId());
    if (rule == nullptr || !rate_lease::eligible(*rule) || entry.state().size() != entryWords(*rule)) return;
    if (slice::holdsRate(entry.state(), now_ns)) {
      held.emplace_back(&variantOf(*rules, *rule, storedOverride(*rule, entry.state())), entry.key());
    }
    slice::endRate(entry.state(), now_ns);
  });
  // A new master that did get the rate's last renewal would charge it until
  // it ends, refilling the bucket at what it leaves of the limit while the
  // node no longer spends it: each is given up there (a rate op of 0).
  for (const auto& [rule, key] : held) {
    callScript(*rule, key,
               rate_lease::rateArgv(0, 0, rule->limits.front(), 0, context_.node_id, rateLeaseMs()),
               config_.lease_timeout_ms, [](const RedisResult&) {});
  }
  if (!held.empty()) spdlog::info("lease: the master changed; {} rate leases given up", held.size());
}

void LeaseManager::debitFallback(bool state_lost, int64_t span_ms,
                                 const std::function<void()>& answered,
                                 const std::function<void(size_t)>& expect) {
  // Each global rule's share entries count what fallback admitted.
  RuleSetPtr rules = context_.rules();
  struct Debit {
    const Rule* rule;
    std::string key;
    int64_t units;
  };
  std::vector<Debit> debits;
  // A key whose rate ended during the outage admitted on its rate, then on
  // its share: one debit of both, as a span's debits of one key do not add.
  std::map<std::pair<const Rule*, std::string>, size_t> debit_of;
  auto add = [&](const Rule& rule, std::string_view key, int64_t units) {
    auto [at, fresh] = debit_of.try_emplace({&rule, std::string(key)}, debits.size());
    if (fresh) {
      debits.push_back({&rule, std::string(key), units});
    } else {
      debits[at->second].units += units;
    }
  };
  context_.keys->visit([&](KeyTable::Entry& entry) {
    if ((entry.ruleId() & kFallbackIdBit) == 0) {
      // A slice that spent its rate lease while Redis was unreachable.
      const Rule* rule = rules->findById(entry.ruleId());
      if (rule == nullptr || !leasable(*rule) || leasesHolding(*rule) ||
          entry.state().size() != entryWords(*rule)) {
        return;
      }
      int64_t units = slice::takeRateFallback(entry.state());
      if (units > 0) add(variantOf(*rules, *rule, storedOverride(*rule, entry.state())), entry.key(), units);
      return;
    }
    const Rule* share = rules->findById(entry.ruleId());
    const Rule* global = rules->findById(entry.ruleId() & ~kFallbackIdBit);
    if (share == nullptr || global == nullptr || !leasable(*global)) return;
    int64_t units = takeUndebited(*share, entry.state());
    if (units > 0) add(variantOf(*rules, *global, storedOverride(*share, entry.state())), entry.key(), units);
  });
  // A Redis that lost the state starts full: the others' leases and the
  // shares' spending since it came back already account for the time, and
  // what was admitted before it came back has no state to be charged to.
  if (state_lost || debits.empty()) return;
  expect(debits.size());  // before any answer: one may come at once
  // The units were admitted over the whole fallback span, which the shares
  // held to the limit: charged over it, they leave no debt for the span.
  for (const Debit& debit : debits) {
    sendDebit(*debit.rule, debit.key, debit.units, span_ms,
              [answered](const RedisResult&) { answered(); });
  }
  spdlog::info("lease: debiting {} keys' fallback admissions of the last {} ms", debits.size(),
               span_ms);
}

void LeaseManager::returnAll(int64_t timeout_ms, std::function<void()> done) {
  // The returns and debits already asked for go first, as they would have.
  serveTaken(/*all=*/true);
  RuleSetPtr rules = context_.rules();
  struct Return {
    const Rule* rule;
    std::string key;
    int64_t units;
    int64_t lease_now_ms;
    bool holding;  // a concurrency holding's, every unit of it: the node is leaving
  };
  std::vector<Return> returns;
  std::vector<std::pair<const Rule*, std::string>> rates;  // held rates, given up
  int64_t now_ns = now();
  context_.keys->visit([&](KeyTable::Entry& entry) {
    const Rule* rule = rules->findById(entry.ruleId());
    if (rule != nullptr && leasesHolding(*rule) && entry.state().size() == entryWords(*rule)) {
      int64_t held = holding::takeAll(entry.state());
      if (held > 0) returns.push_back({rule, std::string(entry.key()), held, 0, true});
      return;
    }
    if (rule == nullptr || !leasable(*rule) || entry.state().size() != entryWords(*rule)) return;
    Words words = entry.state();
    const Rule& variant = variantOf(*rules, *rule, storedOverride(*rule, words));
    slice::Taken back = slice::takeBack(words, now_ns);
    if (back.units > 0) {
      returns.push_back({&variant, std::string(entry.key()), back.units, back.lease_now_ms, false});
    }
    if (rate_lease::eligible(*rule) && slice::holdsRate(words, now_ns)) {
      // Redis would charge it until its end, refilling the bucket only at
      // what it leaves of the limit, while the other nodes could spend it.
      rates.emplace_back(&variant, entry.key());
      slice::applyRate(words, 0, 0, 0, 0, now_ns);
    }
  });
  if (!breaker_.redisUp() || (returns.empty() && rates.empty())) {
    done();
    return;
  }
  auto pending = std::make_shared<size_t>(returns.size() + rates.size());
  auto one_done = [pending, done] {
    if (--*pending == 0) done();
  };
  size_t units = 0;
  for (const Return& r : returns) {
    units += static_cast<size_t>(r.units);
    if (r.holding) {
      sendHoldingReturn(*r.rule, rules, r.key, r.units, true, one_done);
    } else {
      sendReturn(*r.rule, r.key, r.units, r.lease_now_ms, timeout_ms, one_done);
    }
  }
  for (const auto& [rule, key] : rates) {
    callScript(*rule, key,
               rate_lease::rateArgv(0, 0, rule->limits.front(), 0, context_.node_id, rateLeaseMs()),
               timeout_ms, [one_done](const RedisResult&) { one_done(); });
  }
  spdlog::info("lease: returning {} unused units of {} keys, giving up {} rate leases", units,
               returns.size(), rates.size());
}

}  // namespace sluice

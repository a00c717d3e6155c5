// Lease path: leasable global rules on their slices; see lease_path.h.
#include "lease_path.h"

#include <algorithm>
#include <optional>
#include <string>

#include "limiter.h"
#include "penalty.h"
#include "rate_lease.h"

namespace sluice {

namespace {

int64_t ceilMs(int64_t ns) { return ns <= 0 ? 0 : (ns + 999'999) / 1'000'000; }

}  // namespace

Decision sliceDecision(const Rule& rule, const slice::TakeResult& taken, slice::ConstWords words,
                       int64_t now_ns) {
  const Limit& limit = rule.limits.front();
  const int64_t capacity = leaseCapacity(limit);
  Decision decision;
  decision.limit = limit.limit;
  decision.allowed = taken.outcome == slice::Outcome::kTaken;
  if (decision.allowed) {
    // What Redis has left counts only while the slice's own units fall
    // short of the capacity.
    const int64_t held = std::min(taken.left, capacity);
    decision.remaining =
        held == capacity ? capacity
                         : std::min(capacity, held + slice::redisLeft(words, rule, now_ns));
  }
  if (taken.outcome == slice::Outcome::kDenied || taken.outcome == slice::Outcome::kQueued) {
    // In line behind waiters (until_ns 0): as soon as they are served.
    decision.retry_after_ms = std::max<int64_t>(ceilMs(taken.until_ns - now_ns), 1);
  }
  // Until the global state is full again, as far as this node can tell:
  // at once when nothing is missing.
  int64_t missing = std::max<int64_t>(capacity - decision.remaining, 0);
  decision.reset_after_ms = decision.retry_after_ms;
  if (missing > 0) {
    double period_ms = static_cast<double>(limit.period_ns) / 1e6;
    decision.reset_after_ms = std::max(
        decision.retry_after_ms,
        static_cast<int64_t>(static_cast<double>(missing) * period_ms / static_cast<double>(limit.limit) + 0.999));
  }
  return decision;
}


Outcome LeasePath::acquire(const RuleSet& rules, const Rule& rule, const rpc::Item& item,
                           int64_t now_ns, const Asker& asker, Verdict* verdict) {
  // A request that may wait for its units (max_wait): its wait, from its
  // arrival; a retry brings its own. Answers say how long it waited.
  Wait wait;
  const bool may_wait_for_units = asker.may_wait && asker.may_wait_for_units;
  if (may_wait_for_units && asker.wait.until_ns != 0) {
    wait = asker.wait;
  } else if (int64_t max_wait_ns = may_wait_for_units ? maxWaitNs(rule, item) : 0) {
    wait = {now_ns, now_ns + max_wait_ns, waiting_.nextSeq(), 0};
  }
  KeyTable::Entry* entry = keys_.findOrInsert(rule.id, item.key, entryWords(rule), now_ns);
  if (entry == nullptr) {
    waiting_.leaveLine(wait.ticket);
    verdict->fail(rpc::ErrorCode::kOverloaded, kTableFull);
    return Outcome::kAnswered;
  }
  auto entry_words = entry->state();
  Outcome outcome = spend(rules, rule, item, now_ns, entry_words, wait, asker, verdict);
  // Answered: whatever became of it, it no longer stands in line.
  if (outcome == Outcome::kAnswered) {
    waiting_.leaveLine(wait.ticket, slice::of(entry_words));
  }
  return outcome;
}

slice::TakeResult LeasePath::take(const Rule& rule, std::string_view key,
                                  std::span<std::atomic<uint64_t>> words, int64_t now_ns,
                                  int64_t cost, bool again, bool first_in_line) {
  slice::TakeResult taken = slice::take(words, now_ns, cost, again, first_in_line);
  if (taken.outcome == slice::Outcome::kQueued && !broker_->lines().standing(rule.id, key, words)) {
    taken = slice::take(words, now_ns, cost, true, first_in_line);  // demand counted already
  }
  return taken;
}

Outcome LeasePath::spend(const RuleSet& rules, const Rule& rule, const rpc::Item& item,
                         int64_t now_ns, std::span<std::atomic<uint64_t>> entry_words, Wait& wait,
                         const Asker& asker, Verdict* verdict) {
  Mode mode = rule.shadow ? Mode::kShadow : Mode::kNormal;
  const Rule& deciding = decidingRule(rules, rule, item.key, entry_words);
  auto words = slice::of(entry_words);
  // Its wait has not ended: it may stand in the key's line.
  const bool waits = wait.until_ns > now_ns;
  const int64_t waited_ms = wait.until_ns != 0 ? (now_ns - wait.since_ns) / 1'000'000 : -1;
  // A blocked key is answered here, until its block is due to be asked of
  // Redis again (slice::kBlockRecheckNs): then its lease says whether it stands.
  int64_t blocked_ns = activePenalty(rule) != nullptr
                           ? penalty::blockedFor(penaltyState(rule, entry_words), now_ns)
                           : 0;
  if (blocked_ns > 0) {
    if (now_ns < slice::deniedUntilNs(words) || !asker.may_wait) {
      Decision blocked = blockedDecision(deciding, blocked_ns);
      verdict->decide(blocked, Mode::kBlocked, waited_ms);
      return Outcome::kAnswered;
    }
    slice::recheckBlock(words, now_ns);  // drops a lease's units, granted late
  }
  Decision decision;
  int64_t due_ns = 0;  // a denial: when Redis said it has units again (exactly)
  if (item.cost > leaseCapacity(deciding.limits.front())) {
    decision = exceedsCapacity(deciding);
  } else if (Decision share; learnsOnShare(deciding, words, now_ns) &&
             (!(share = lookShare(rules, rule, item.key, now_ns, item.cost)).allowed ||
              share.shadow_denied)) {
    // Learning, and the share has nothing for it: the slice is left alone,
    // so the node leases nothing past its share.
    decision = share;
    decision.allowed = false;
    decision.shadow_denied = false;
  } else {
    bool first = wait.ticket != 0 && broker_->lines().first(wait.ticket);
    slice::TakeResult taken = take(rule, item.key, words, now_ns, item.cost, asker.again, first);
    if (taken.outcome == slice::Outcome::kQueued && waits && asker.may_wait) {
      // Others of this node wait for the key's units, and came first: it
      // waits for its turn behind them.
      int64_t ahead = 0;
      if (!stand(wait, rule, deciding, item.key, words, item.cost, &ahead)) {
        // More wait ahead of it than its wait could bring: the normal
        // denial, at once, and a retry hint of the line's turn at the
        // fleet's rate.
        const Limit& limit = deciding.limits.front();
        taken.until_ns = std::max(taken.until_ns, now_ns + static_cast<int64_t>(
            static_cast<double>(ahead) * static_cast<double>(limit.period_ns) /
            static_cast<double>(limit.limit)));
        wait.until_ns = 0;
      } else if (!broker_->lines().first(wait.ticket)) {
        if (waiting_.waitInLine(asker, wait)) return Outcome::kWaitsInLine;
        verdict->fail(rpc::ErrorCode::kOverloaded, Waiting::tooManyWaiting());
        return Outcome::kAnswered;
      } else {
        // The line emptied between the two: it leads the line now.
        taken = slice::take(words, now_ns, item.cost, true, true);
      }
    }
    afterTake(rules, rule, deciding, item.key, entry_words, now_ns, item.cost, taken);
    switch (taken.outcome) {
      case slice::Outcome::kTaken: {
        decision = sliceDecision(deciding, taken, words, now_ns);
        if (learnsOnShare(deciding, words, now_ns)) {
          // Redis came back without the fleet's state: hold to the share too.
          std::optional<Decision> share =
              policy_.acquireShare(rules, *rules.fallbackShare(rule), item.key, now_ns,
                                   item.cost, false, &verdict->taken);
          if (!share || !share->allowed || share->shadow_denied) {
            slice::refund(words, item.cost);
            if (!share) {
              verdict->fail(rpc::ErrorCode::kOverloaded, kTableFull);
              return Outcome::kAnswered;
            }
            decision = *share;
            decision.allowed = false;
            decision.shadow_denied = false;
            break;
          }
        }
        verdict->taken.cost = item.cost;
        verdict->taken.slice = words;
        break;
      }
      case slice::Outcome::kDenied:
        metrics_.lease_negative_hits.add();
        decision = sliceDecision(deciding, taken, words, now_ns);
        due_ns = taken.until_ns;
        break;
      case slice::Outcome::kQueued:
        // Others of this node wait for the key's units. One that does not
        // wait may wait for the lease under way, and has what the line
        // leaves of it.
        if (taken.until_ns == 0 && wait.until_ns == 0 && waiting_.waitForLease(asker, wait)) {
          return Outcome::kWaitsForLease;
        }
        decision = sliceDecision(deciding, taken, words, now_ns);
        break;
      case slice::Outcome::kEmpty:
        // A waiter stands in line while its lease comes, so that requests
        // after it do not spend what the lease brings for it.
        if (waits && asker.may_wait) {
          int64_t ahead = 0;
          stand(wait, rule, deciding, item.key, words, item.cost, &ahead);  // leads an empty line
        }
        if (waiting_.waitForLease(asker, wait)) return Outcome::kWaitsForLease;
        [[fallthrough]];
      case slice::Outcome::kFallback: {
        // No lease in time, or the key's lease failed: the policy decides.
        auto [share, policy_mode] = route(rules, rule);
        if (share == nullptr) {
          decision = policyDecision(rule, policy_mode);
        } else {
          std::optional<Decision> shared = policy_.acquireShare(rules, *share, item.key, now_ns,
                                                                item.cost, true, &verdict->taken);
          if (!shared) {
            verdict->fail(rpc::ErrorCode::kOverloaded, kTableFull);
            return Outcome::kAnswered;
          }
          decision = *shared;
        }
        policy_.countDenial(rule, item.key, entry_words, decision, now_ns);
        verdict->decide(decision, policy_mode, waited_ms);
        return Outcome::kAnswered;
      }
    }
  }
  applyShadow(rule, &decision);
  // Redis has no units until retry_after_ms: a request that may wait that
  // long stands in the key's line, parked, and is asked again then (and
  // counts as one decision, once answered). Those that come after it queue
  // behind it (kQueued).
  if (due_ns == 0) due_ns = now_ns + decision.retry_after_ms * 1'000'000;
  if (wait.until_ns != 0 && !decision.allowed && !decision.cost_exceeds_limit &&
      decision.retry_after_ms > 0 && due_ns <= wait.until_ns) {
    int64_t ahead = 0;
    if (stand(wait, rule, deciding, item.key, words, item.cost, &ahead)) {
      if (waiting_.waitUntilDue(asker, wait, due_ns)) return Outcome::kWaitsUntilDue;
      verdict->fail(rpc::ErrorCode::kOverloaded, Waiting::tooManyWaiting());
      return Outcome::kAnswered;
    }
  }
  policy_.countDenial(rule, item.key, entry_words, decision, now_ns);
  verdict->decide(decision, mode, waited_ms);
  return Outcome::kAnswered;
}

void LeasePath::askForLease(const RuleSet& rules, const Rule& rule, const rpc::Item& item,
                            int64_t now_ns, bool again) {
  if (item.cost <= 0 || policy_.globalBlockedFor(rule, item.key, now_ns) > 0) return;
  KeyTable::Entry* entry = keys_.findOrInsert(rule.id, item.key, entryWords(rule), now_ns);
  if (entry == nullptr) return;
  const Rule& deciding = decidingRule(rules, rule, item.key, entry->state());
  if (item.cost > leaseCapacity(deciding.limits.front())) return;
  auto words = slice::of(entry->state());
  slice::TakeResult taken = take(rule, item.key, words, now_ns, item.cost, again, false);
  afterTake(rules, rule, deciding, item.key, entry->state(), now_ns, item.cost, taken);
  if (taken.outcome == slice::Outcome::kTaken) slice::refund(words, item.cost);
}

Verdict LeasePath::settle(const RuleSet& rules, const Rule& rule, std::string_view key,
                          int64_t spent_ns, int64_t refund, int64_t debt, int64_t now_ns,
                          int64_t* charged) {
  Verdict verdict;
  *charged = 0;
  const Mode mode = rule.shadow ? Mode::kShadow : Mode::kNormal;
  KeyTable::Entry* entry = debt > 0 ? keys_.findOrInsert(rule.id, key, entryWords(rule), now_ns)
                                    : currentEntry(keys_, rule, key);
  if (entry == nullptr && debt > 0) {
    verdict.fail(rpc::ErrorCode::kOverloaded, kTableFull);
    return verdict;
  }
  const Rule& deciding = decidingFor(rules, rule, key, entry);
  if (entry == nullptr) {
    // The key was swept and gave its units back to Redis: so did the refund.
    verdict.decide(peek(deciding, fresh_.of(deciding), now_ns, 0), mode);
    return verdict;
  }
  auto words = slice::of(entry->state());
  entry->touch(now_ns);
  slice::refundSpent(words, refund, spent_ns, now_ns, deciding.limits.front().period_ns);
  // Redis is unreachable: the units back in the slice were not admitted
  // (a reservation on a rate lease counted its estimate as the rate's
  // fallback spend), and are counted again if the rate spends them.
  if (!broker_->leasing()) slice::unnoteRateFallback(words, refund);
  if (debt > 0) *charged = slice::charge(words, debt, debtBound(deciding, deciding.limits.front()));
  slice::TakeResult looked;
  looked.outcome = slice::Outcome::kTaken;
  looked.left = slice::balance(words, now_ns);
  Decision decision = sliceDecision(deciding, looked, words, now_ns);
  if (looked.left < 0) decision.remaining = looked.left;  // in debt: what the key owes
  decision.allowed = looked.left >= 0;  // not in debt; a lease may bring more
  verdict.decide(decision, mode);
  return verdict;
}

Decision LeasePath::look(const RuleSet& rules, const Rule& rule, std::string_view key,
                         int64_t now_ns, int64_t cost, Mode* mode) {
  *mode = rule.shadow ? Mode::kShadow : Mode::kNormal;
  KeyTable::Entry* entry = currentEntry(keys_, rule, key);
  const Rule& deciding = decidingFor(rules, rule, key, entry);
  Decision decision;
  if (int64_t blocked_ns = policy_.globalBlockedFor(rule, key, now_ns)) {
    decision = blockedDecision(deciding, blocked_ns);
    *mode = Mode::kBlocked;
  } else if (cost > leaseCapacity(deciding.limits.front())) {
    decision = exceedsCapacity(deciding);
  } else if (entry == nullptr) {
    // No slice: report a fresh key, as a local rule does.
    decision = peek(deciding, fresh_.of(deciding), now_ns, cost);
  } else {
    auto words = slice::of(entry->state());
    slice::TakeResult looked = slice::look(words, now_ns, cost);
    if (looked.outcome == slice::Outcome::kQueued && !broker_->lines().standing(rule.id, key, words)) {
      looked = slice::look(words, now_ns, cost);  // the line had gone
    }
    if (looked.outcome == slice::Outcome::kEmpty) {
      // Nothing held here, and Redis has not said no: a lease would be asked for.
      looked.outcome = slice::Outcome::kTaken;
      looked.left = 0;
    }
    decision = sliceDecision(deciding, looked, words, now_ns);
  }
  applyShadow(rule, &decision);
  return decision;
}

std::optional<Outcome> LeasePath::acquireOnRate(const RuleSet& rules, const Rule& rule,
                                                const rpc::Item& item, int64_t now_ns, Verdict* verdict) {
  if (rule.on_redis_down != RedisDownPolicy::kLocal) return std::nullopt;
  KeyTable::Entry* entry = currentEntry(keys_, rule, item.key);
  if (entry == nullptr) return std::nullopt;
  const Rule& deciding = decidingFor(rules, rule, item.key, entry);
  if (!rate_lease::eligible(deciding)) return std::nullopt;
  auto words = slice::of(entry->state());
  slice::TakeResult taken = slice::takeOnRate(words, now_ns, item.cost, outage());
  if (taken.outcome == slice::Outcome::kFallback) return std::nullopt;
  if (taken.outcome == slice::Outcome::kTaken) {
    verdict->taken.cost = item.cost;
    verdict->taken.slice = words;
    verdict->taken.on_rate = true;
  }
  Decision decision = sliceDecision(deciding, taken, words, now_ns);
  policy_.countDenial(rule, item.key, entry->state(), decision, now_ns);
  applyShadow(rule, &decision);
  verdict->decide(decision, rule.shadow ? Mode::kShadow : Mode::kFallback);
  return Outcome::kAnswered;
}

std::optional<Decision> LeasePath::lookOnRate(const RuleSet& rules, const Rule& rule, std::string_view key,
                                              int64_t now_ns, int64_t cost, Mode* mode) {
  if (rule.on_redis_down != RedisDownPolicy::kLocal) return std::nullopt;
  KeyTable::Entry* entry = currentEntry(keys_, rule, key);
  if (entry == nullptr) return std::nullopt;
  const Rule& deciding = decidingFor(rules, rule, key, entry);
  if (!rate_lease::eligible(deciding)) return std::nullopt;
  auto words = slice::of(entry->state());
  slice::TakeResult looked = slice::lookOnRate(words, now_ns, cost, outage());
  if (looked.outcome == slice::Outcome::kFallback) return std::nullopt;
  Decision decision = sliceDecision(deciding, looked, words, now_ns);
  applyShadow(rule, &decision);
  *mode = rule.shadow ? Mode::kShadow : Mode::kFallback;
  return decision;
}

slice::Outage LeasePath::outage() const {
  const int64_t opened_ns = broker_->openSinceNs();
  if (opened_ns == 0) return {};
  int64_t began_ns = broker_->lastOpenedNs();
  if (began_ns == 0 || began_ns > opened_ns) began_ns = opened_ns;
  return {.opened_ns = opened_ns, .began_ns = began_ns, .hold_until_ns = began_ns + rate_lease::kFallbackHoldNs};
}

bool LeasePath::learnsOnShare(const Rule& deciding, slice::ConstWords words, int64_t now_ns) const {
  return broker_->learning(deciding, now_ns) && !slice::holdsRate(words, now_ns);
}

int64_t LeasePath::learnedRate(const Rule& deciding, slice::ConstWords words, int64_t now_ns) const {
  const int64_t opened_ns = broker_->lastOpenedNs();
  if (opened_ns == 0 || !rate_lease::eligible(deciding)) return 0;
  const int64_t hold_until_ns = opened_ns + rate_lease::kFallbackHoldNs;
  // Held now (asked again since), or held at the opening and within the
  // hold: lookOnRate's kFallback says neither.
  if (!slice::holdsRate(words, now_ns) &&
      slice::lookOnRate(words, now_ns, 0, {.opened_ns = opened_ns, .began_ns = opened_ns, .hold_until_ns = hold_until_ns})
              .outcome == slice::Outcome::kFallback) {
    return 0;
  }
  if (now_ns >= hold_until_ns) return 0;
  return slice::ratePerPeriod(words, deciding.limits.front().period_ns);
}

bool LeasePath::stand(Wait& wait, const Rule& rule, const Rule& deciding, std::string_view key,
                      std::span<std::atomic<uint64_t>> words, int64_t cost, int64_t* ahead) {
  *ahead = 0;
  if (wait.ticket != 0) return true;
  // What the fleet could give the line within the wait, at the most.
  const Limit& limit = deciding.limits.front();
  double refill = static_cast<double>(limit.limit) * static_cast<double>(wait.until_ns - wait.since_ns) /
                  static_cast<double>(limit.period_ns);
  int64_t servable = leaseCapacity(limit) + static_cast<int64_t>(refill);
  wait.ticket = broker_->lines().join(rule.id, key, words, cost, servable - cost, ahead);
  return wait.ticket != 0;
}

Decision LeasePath::lookShare(const RuleSet& rules, const Rule& rule, std::string_view key,
                              int64_t now_ns, int64_t cost) {
  const Rule& share = *rules.fallbackShare(rule);
  KeyTable::Entry* entry = currentEntry(keys_, share, key);
  const Rule& deciding = decidingFor(rules, share, key, entry);
  return peek(deciding,
              entry != nullptr ? entry->state().first(stateWords(deciding)) : fresh_.of(deciding),
              now_ns, cost);
}

void LeasePath::afterTake(const RuleSet& rules, const Rule& rule, const Rule& deciding,
                          std::string_view key, std::span<std::atomic<uint64_t>> entry_words,
                          int64_t now_ns, int64_t cost, const slice::TakeResult& taken) {
  if (taken.dropped > 0) metrics_.lease_units_dropped.add(static_cast<uint64_t>(taken.dropped));
  if (taken.must_request && taken.outcome == slice::Outcome::kTaken &&
      slice::windowEndsFirst(entry_words, deciding, now_ns, broker_->leaseIntervalNs())) {
    // A refill ahead whose units the key would not spend before they
    // expire: counted in the window, they would deny other nodes.
    slice::unclaim(entry_words);
    return;
  }
  if (taken.must_request) {
    requestLease(rules, rule, deciding, key, entry_words, now_ns, cost,
                 taken.outcome == slice::Outcome::kTaken ? cost : 0);
  }
}

void LeasePath::requestLease(const RuleSet& rules, const Rule& rule, const Rule& deciding,
                             std::string_view key, std::span<std::atomic<uint64_t>> words,
                             int64_t now_ns, int64_t cost, int64_t spent) {
  // Learning: no more than the share allows once this request has spent,
  // so that what this node may not spend stays in Redis for the others.
  // A key that held a rate when Redis went away asks the fresh state for
  // that rate again (learnedRate): the rates held never summed past the
  // limit, and Redis then counts what the key spends on it.
  int64_t share_left = INT64_MAX;
  const bool learning = broker_->learning(deciding, now_ns);
  const int64_t learned_rate = learning ? learnedRate(deciding, words, now_ns) : 0;
  if (learning) {
    share_left = lookShare(rules, rule, key, now_ns, 0).remaining - spent;  // cost 0: what it holds now
    if (learned_rate > 0) {
      // The rate alone, no tokens beside it: a holder does not spend the
      // share, which would then give it tokens at every renewal.
      share_left = 0;
    } else if (share_left < (spent > 0 ? 1 : cost)) {
      slice::unclaim(words);
      return;
    }
  }
  slice::Batch batch = slice::nextBatch(words, now_ns, cost, deciding, rules.fallbackNodes(),
                                        broker_->leaseIntervalNs());
  batch.n = std::min(batch.n, share_left);
  batch.need = std::min(batch.need, batch.n);
  LeaseRequest request;
  // A key that holds a rate renews it; one whose last lease found Redis's
  // bucket drained asks for one (rate_lease::wants). While learning only
  // the rate learned, at most: the share bounds the others.
  if ((!learning || learned_rate > 0) && rate_lease::eligible(deciding)) {
    const Limit& limit = deciding.limits.front();
    const double demand = std::max(slice::demandPerInterval(words, now_ns, broker_->leaseIntervalNs()),
                                   static_cast<double>(cost));
    if (learned_rate > 0) {
      // The rate itself: the demand measured spans the outage, in which
      // the rate's spends were not counted as demand. The renewals follow
      // the demand again (slice::demandMoved).
      request.rate = learned_rate;
    } else if (slice::holdsRate(words, now_ns) ||
               rate_lease::wants(limit, demand, slice::drained(words), broker_->leaseIntervalNs())) {
      request.rate = rate_lease::askedRate(limit, demand, broker_->leaseIntervalNs());
    }
  }
  request.rule_id = rule.id;
  request.variant = storedOverride(rule, words);
  request.key = std::string(key);
  request.n = batch.n;
  request.need = batch.need;
  broker_->submit(std::move(request));
}

}  // namespace sluice

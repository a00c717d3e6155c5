// Dispatch: the decision seam, one question in, its answer out; see dispatch.h.
#include "dispatch.h"

#include <algorithm>
#include <optional>
#include <string>

#include "holding.h"
#include "msgpack.h"
#include "penalty.h"

namespace sluice {

namespace {

// A release names a rule whose units come back with time, not by a release.
std::string notReleasable(const Rule& rule) {
  // Built only on this error path, so the allocation does not matter.
  return "release gives back units of concurrency rules, and rule \"" + rule.name + "\" is " +
         std::string(algorithmName(rule.algorithm)) + ": its units come back with time";
}

// max_wait_ms names a rule whose requests cannot wait for units.
std::string cannotWait(const Rule& rule) {
  return "max_wait_ms applies to token_bucket and gcra rules of one limit, and rule \"" +
         rule.name + "\" is " + std::string(scopeName(rule.scope)) + " " +
         std::string(algorithmName(rule.algorithm)) +
         (rule.limits.size() > 1 ? " of several limits" : "");
}

// Whether `asker` carries `question` itself (askerFor with the question):
// then ask() passes it on as it is, without a copy.
bool holds(const Asker& asker, const Question& question) {
  return asker.question.items.data() == question.items.data() &&
         asker.question.items.size() == question.items.size() &&
         asker.question.method == question.method;
}

}  // namespace

Dispatcher::Dispatcher(KeyTable& keys, MetricsShard& metrics, LeaseBroker* broker,
                       int64_t lease_timeout_ns, uint32_t worker_index,
                       Reservations::Bounds reservation_bounds)
    : metrics_(metrics),
      broker_(broker),
      waiting_(metrics, broker, lease_timeout_ns),
      policy_(keys, metrics, broker),
      lease_(keys, metrics, broker, waiting_, policy_),
      local_(keys, waiting_, policy_),
      holding_(keys, metrics, broker, waiting_),
      group_(keys, metrics, broker, waiting_, policy_, local_, lease_, holding_),
      reservations_(worker_index, reservation_bounds) {
  waiting_.onAskAgain([this](const Question& question, int64_t now_ns, const Asker& asker,
                             Answer* answer) { return decide(question, now_ns, asker, answer); });
}

void Dispatcher::setRules(RuleSetPtr rules) {
  rules_ = std::move(rules);
  rule_shards_.clear();
  if (metrics_.owner == nullptr) return;
  for (const Rule& rule : rules_->rules()) {
    rule_shards_.push_back(metrics_.owner->ruleShard(rule.name, metrics_.index));
  }
}

void Dispatcher::count(const Rule& configured, const Decision& decision, Mode mode) {
  auto index = static_cast<size_t>(mode);
  RuleShard* by_rule = shardOf(configured);
  if (decision.allowed) {
    metrics_.allowed[index].add();
    if (by_rule != nullptr) {
      by_rule->allowed[index].add();
      if (decision.remaining * 5 < decision.limit) by_rule->near_limit.add();
    }
  } else {
    metrics_.denied[index].add();
    if (by_rule != nullptr) by_rule->denied[index].add();
  }
  if (decision.shadow_denied) {
    metrics_.shadow_denied.add();
    if (by_rule != nullptr) by_rule->shadow_denied.add();
  }
}

Outcome Dispatcher::ask(const Question& question, int64_t now_ns, const Asker& asker,
                        Answer* answer) {
  answer->clear();
  if (!decides(question.method) || question.items.empty() ||
      (question.method != Method::kAcquireAll && question.items.size() != 1)) {
    answer->fail(ErrorCode::kBadRequest,
                 "a question is acquire, peek, release, reserve, settle or cancel of one item, or "
                 "acquire_all of one or more");
  } else {
    Outcome outcome;
    if (holds(asker, question)) {
      outcome = decide(question, now_ns, asker, answer);
    } else {
      Asker asking = asker;
      asking.question = question;
      outcome = decide(question, now_ns, asking, answer);
    }
    if (outcome != Outcome::kAnswered) return outcome;
  }
  if (answer->failed) metrics_.errors[static_cast<size_t>(answer->error)].add();
  return Outcome::kAnswered;
}

const Item* Dispatcher::removedByReload(const Question& question) const {
  if (settles(question.method)) return nullptr;  // a reservation names no rule
  for (const Item& item : question.items) {
    if (rules_->find(item.rule) == nullptr) return &item;
  }
  return nullptr;
}

Outcome Dispatcher::decide(const Question& question, int64_t now_ns, const Asker& asker,
                           Answer* answer) {
  answer->method = question.method;
  if (const Item* removed = asker.again ? removedByReload(question) : nullptr) {
    // Known when it was asked, since it waited: a reload removed it. That
    // is not the client's mistake (an unknown rule), and asking again
    // later may find it back: OVERLOADED, which clients retry. Its place
    // in a line, if it had one, goes to the next.
    waiting_.leaveLine(asker.wait.ticket);
    answer->fail(ErrorCode::kOverloaded,
                 "rule \"" + std::string(removed->rule) +
                     "\" was removed by a reload while this request waited; retry, and check "
                     "the daemon's rules if it is not back");
    return Outcome::kAnswered;
  }
  switch (question.method) {
    case Method::kReserve: return reserve(question, now_ns, asker, answer);
    case Method::kSettle:
    case Method::kCancel: return settle(question, now_ns, asker, answer);
    default: break;
  }
  const Item& item = question.items.front();
  if (question.method != Method::kAcquireAll &&
      (question.method != Method::kAcquire || item.cost <= 0)) {
    return look(question, now_ns, answer);
  }
  if (question.method == Method::kAcquire) return acquire(item, now_ns, asker, answer);
  // Every acquire_all: all or nothing on its entries (group_path.h).
  Outcome outcome = group_.acquire(*rules_, question.items, now_ns, asker, answer);
  if ((outcome == Outcome::kAnswered && !answer->failed) ||
      outcome == Outcome::kWaitsReserved) {
    for (size_t i = 0; i < answer->decisions.size(); ++i) {
      count(group_.configured(i), answer->decisions[i], answer->modes[i]);
    }
  }
  // A reservation's answer is Waiting's to give, when its units are due.
  if (outcome == Outcome::kWaitsReserved) answer->clear();
  return outcome;
}

// Inline: decide() is its one caller.
inline Outcome Dispatcher::acquire(const Item& item, int64_t now_ns, const Asker& asker,
                                   Answer* answer) {
  const Rule* configured = rules_->find(item.rule);
  if (configured == nullptr) {
    waiting_.leaveLine(asker.wait.ticket);  // asked again: the rule went in a reload
    answer->fail(ErrorCode::kUnknownRule, unknownRule(item.rule));
    return Outcome::kAnswered;
  }
  if (item.max_wait_ms > 0 && !canWait(*configured)) {
    answer->fail(ErrorCode::kBadRequest, cannotWait(*configured));
    return Outcome::kAnswered;
  }
  // An acquire_all of one item (group_path.h), without a group to build.
  Outcome outcome = group_.acquireOne(*rules_, *configured, item, now_ns, asker, answer);
  if ((outcome == Outcome::kAnswered && !answer->failed) ||
      outcome == Outcome::kWaitsReserved) {
    count(*configured, answer->decisions.front(), answer->modes.front());
  }
  // A reservation's answer is Waiting's to give, when its units are due.
  if (outcome == Outcome::kWaitsReserved) answer->clear();
  return outcome;
}

// --- reserve, settle, cancel (reservations.h) ---------------------------------

namespace {

// A reserve names a rule whose state cannot be settled later.
std::string notSettling(const Rule& rule, bool several_global_limits) {
  return "reserve applies to token_bucket, gcra, fixed_window and sliding_window rules" +
         std::string(several_global_limits ? " (a global one of one limit)" : "") + ", and rule \"" +
         rule.name + "\" is " + std::string(scopeName(rule.scope)) + " " +
         std::string(algorithmName(rule.algorithm)) +
         (several_global_limits ? " of several limits" : "");
}

std::string refusalMessage(Reservations::Refusal refusal) {
  return refusal == Reservations::Refusal::kTableFull
             ? "this worker holds the most open reservations it may; settle or cancel some first"
             : "this key holds the most open reservations one key may; settle or cancel some "
               "first";
}

}  // namespace

Outcome Dispatcher::reserve(const Question& question, int64_t now_ns, const Asker& asker,
                            Answer* answer) {
  const Item& item = question.items.front();
  const Rule* configured = rules_->find(item.rule);
  if (configured == nullptr) {
    answer->fail(ErrorCode::kUnknownRule, unknownRule(item.rule));
    return Outcome::kAnswered;
  }
  const bool several = broker_ != nullptr && configured->part_count > 0;
  if (!algorithmTraits(configured->algorithm).settles || several) {
    answer->fail(ErrorCode::kBadRequest, notSettling(*configured, several));
    return Outcome::kAnswered;
  }
  if (std::optional<Reservations::Refusal> refusal =
          reservations_.refusal(configured->id, item.key)) {
    answer->fail(ErrorCode::kOverloaded, refusalMessage(*refusal));
    return Outcome::kAnswered;
  }
  // A reserve decides like an acquire of its estimate: it may wait for a
  // lease (and is asked again here when it comes), never for units.
  Asker for_lease = asker;
  for_lease.may_wait_for_units = false;
  Item spend = item;
  spend.max_wait_ms = 0;
  const bool leases = leasing(*configured);
  Outcome outcome = group_.acquireOne(*rules_, *configured, spend, now_ns, for_lease, answer);
  if (outcome != Outcome::kAnswered || answer->failed) return outcome;
  const Decision& decision = answer->decisions.front();
  const Mode mode = answer->modes.front();
  count(*configured, decision, mode);
  if (decision.allowed) {
    // A shadow rule's denial spent nothing, nor did a policy's "open": the
    // reservation is of 0 units, and a settle charges the actual as debt.
    const bool spent_nothing = decision.shadow_denied || mode == Mode::kOpen;
    const int64_t spent = spent_nothing ? 0 : item.cost;
    const int64_t ttl_ms = item.ttl_ms > 0 ? item.ttl_ms : kDefaultReservationTtlMs;
    // Spent from the slice unless the lease path fell back to the policy,
    // or from the key's rate lease while Redis is unreachable: settled
    // there too.
    const bool on_slice = (leases && mode != Mode::kFallback && mode != Mode::kOpen &&
                           mode != Mode::kClosed) ||
                          group_.spentOnRate();
    answer->reservation = reservations_.open(configured->id, item.key, spent, ttl_ms * 1'000'000,
                                             now_ns, on_slice);
    metrics_.reservations_opened.add();
    if (RuleShard* by_rule = shardOf(*configured)) by_rule->reservations_opened.add();
  }
  return Outcome::kAnswered;
}

Outcome Dispatcher::settle(const Question& question, int64_t now_ns, const Asker& asker,
                           Answer* answer) {
  const Item& item = question.items.front();
  const uint64_t id = item.reservation;
  if (Reservations::workerOf(id) != reservations_.workerIndex()) {
    // The worker that holds it answers; a notification has nowhere to go.
    if (router_ && asker.recipient != nullptr &&
        router_(Reservations::workerOf(id), question, asker.recipient, asker.tag)) {
      return Outcome::kRouted;
    }
    answer->fail(ErrorCode::kUnknownReservation,
                 "reservation " + std::to_string(id) +
                     " belongs to a worker this daemon does not have, or could not be reached: "
                     "settle it on the daemon that reserved it");
    return Outcome::kAnswered;
  }
  std::optional<Reservations::Reservation> taken = reservations_.take(id);
  if (!taken) {
    answer->fail(ErrorCode::kUnknownReservation,
                 "no open reservation " + std::to_string(id) +
                     ": it was settled or cancelled already, expired (settled at its estimate) "
                     "or never opened");
    return Outcome::kAnswered;
  }
  // Taken: closed, whatever the settle finds below.
  (question.method == Method::kCancel ? metrics_.reservations_cancelled
                                      : metrics_.reservations_settled)
      .add();
  const Rule* configured = rules_->findById(taken->rule_id);
  closed(configured);
  if (configured == nullptr) {
    answer->fail(ErrorCode::kUnknownRule,
                 "the rule of reservation " + std::to_string(id) +
                     " was changed or removed by a reload; its keys started afresh, so there is "
                     "nothing to settle");
    return Outcome::kAnswered;
  }
  // cancel gives it all back: a settle of 0.
  const Settlement settlement =
      settlementOf(taken->estimate, question.method == Method::kCancel ? 0 : item.cost);
  // Back where the estimate was spent: the key's slice (which needs no
  // Redis call), or the state this node decides alone (a local rule, or a
  // global rule's share while Redis is down).
  // A debt is charged up to the key's bound (debtBound); the rest is
  // unpaid. The request has run and its cost is spent either way, so the
  // settle still closes the reservation and answers the key's state: an
  // error would leave the caller nothing to do but let it expire at the
  // estimate, which charges less still.
  Verdict verdict;
  int64_t charged = 0;
  auto [rule, mode] = route(*configured);
  if (taken->leased) {
    verdict = lease_.settle(*rules_, *configured, taken->key, taken->opened_ns, settlement.refund,
                            settlement.debt, now_ns, &charged);
  } else if (rule == nullptr) {
    // "open" and "closed" count nothing: nothing is owed, nothing unpaid.
    verdict.decide(policyDecision(*configured, mode), mode);
    charged = settlement.debt;
  } else {
    verdict = local_.settle(*rules_, *rule, mode, taken->key, taken->opened_ns, settlement.refund,
                            settlement.debt, now_ns, &charged);
  }
  if (verdict.failed) {
    answer->fail(verdict.error, verdict.message);
    return Outcome::kAnswered;
  }
  // The key's state afterwards: allowed says whether it may spend again now.
  answer->decide(verdict.decision, verdict.mode);
  answer->reservation = id;
  if (settlement.refund > 0) {
    metrics_.reservation_refunded_units.add(static_cast<uint64_t>(settlement.refund));
  }
  if (charged > 0) metrics_.reservation_debt_units.add(static_cast<uint64_t>(charged));
  const int64_t unpaid = settlement.debt - charged;
  if (unpaid > 0) {
    metrics_.reservation_unpaid_units.add(static_cast<uint64_t>(unpaid));
    metrics_.reservations_unpaid.add();
  }
  answer->refunded = settlement.refund;
  answer->debt = charged;
  answer->unpaid = unpaid;
  return Outcome::kAnswered;
}

size_t Dispatcher::expireReservations(int64_t now_ns) {
  // The estimate was spent when it was reserved; expiry only closes it.
  const std::vector<Reservations::Reservation> expired = reservations_.expire(now_ns);
  if (expired.empty()) return 0;
  metrics_.reservations_expired.add(expired.size());
  for (const Reservations::Reservation& r : expired) closed(rules_->findById(r.rule_id));
  return expired.size();
}

RuleShard* Dispatcher::shardOf(const Rule& configured) const {
  // `configured` is one of rules_->rules(): its position finds its counters.
  const Rule* first = rules_->rules().data();
  if (&configured < first || &configured >= first + rules_->rules().size()) return nullptr;
  auto position = static_cast<size_t>(&configured - first);
  return position < rule_shards_.size() ? rule_shards_[position] : nullptr;
}

void Dispatcher::closed(const Rule* configured) {
  if (configured == nullptr) return;
  if (RuleShard* by_rule = shardOf(*configured)) by_rule->reservations_closed.add();
}

// --- peek, release, and an acquire of cost 0: they take nothing ---------------

Outcome Dispatcher::look(const Question& question, int64_t now_ns, Answer* answer) {
  const Item& item = question.items.front();
  const bool release = question.method == Method::kRelease;
  const Rule* configured = rules_->find(item.rule);
  if (configured == nullptr) {
    answer->fail(ErrorCode::kUnknownRule, unknownRule(item.rule));
    return Outcome::kAnswered;
  }
  if (release && configured->algorithm != Algorithm::kConcurrency) {
    answer->fail(ErrorCode::kBadRequest, notReleasable(*configured));
    return Outcome::kAnswered;
  }
  if (item.max_wait_ms > 0 && !canWait(*configured)) {
    answer->fail(ErrorCode::kBadRequest, cannotWait(*configured));
    return Outcome::kAnswered;
  }
  Mode mode = Mode::kNormal;
  Decision decision;
  if (broker_ != nullptr && leasesHolding(*configured)) {
    decision = holding_.look(*rules_, *configured, item, release, now_ns, &mode);
    applyShadow(*configured, &decision);
  } else if (broker_ != nullptr && configured->part_count > 0) {
    decision = group_.peek(*rules_, *configured, item, now_ns, &mode);
  } else if (leasing(*configured)) {
    decision = lease_.look(*rules_, *configured, item.key, now_ns, item.cost, &mode);
  } else if (std::optional<Decision> rated;
             broker_ != nullptr && leasable(*configured) &&
             (rated = lease_.lookOnRate(*rules_, *configured, item.key, now_ns, item.cost, &mode))) {
    // Redis is unreachable and the key holds a rate: as an acquire decides.
    decision = *rated;
  } else if (auto [rule, routed_mode] = route(*configured); rule == nullptr) {
    decision = policyDecision(*configured, routed_mode);
    mode = routed_mode;
  } else {
    Verdict verdict = local_.look(*rules_, *configured, *rule, routed_mode, item, release, now_ns);
    decision = verdict.decision;
    mode = verdict.mode;
  }
  answer->decide(decision, mode);
  return Outcome::kAnswered;
}

}  // namespace sluice

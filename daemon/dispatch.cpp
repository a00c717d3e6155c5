// Dispatch: the decision seam, one question in, its answer out; see dispatch.h.
#include "dispatch.h"

#include <algorithm>

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

}  // namespace

Dispatcher::Dispatcher(KeyTable& keys, MetricsShard& metrics, LeaseBroker* broker,
                       int64_t lease_timeout_ns)
    : metrics_(metrics),
      broker_(broker),
      waiting_(metrics, broker, lease_timeout_ns),
      policy_(keys, metrics, broker),
      lease_(keys, metrics, broker, waiting_, policy_),
      local_(keys, waiting_, policy_),
      holding_(keys, metrics, broker, waiting_),
      group_(keys, metrics, broker, waiting_, policy_, local_, lease_, holding_) {
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
  // `configured` is one of rules_->rules(): its position finds its counters.
  auto position = static_cast<size_t>(&configured - rules_->rules().data());
  RuleShard* by_rule = position < rule_shards_.size() ? rule_shards_[position] : nullptr;
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
                 "a question is acquire, peek or release of one item, or acquire_all of one or "
                 "more");
  } else {
    Asker asking = asker;
    asking.question = question;
    Outcome outcome = decide(question, now_ns, asking, answer);
    if (outcome != Outcome::kAnswered) return outcome;
  }
  if (answer->failed) metrics_.errors[static_cast<size_t>(answer->error)].add();
  return Outcome::kAnswered;
}

Outcome Dispatcher::decide(const Question& question, int64_t now_ns, const Asker& asker,
                           Answer* answer) {
  answer->method = question.method;
  const Item& item = question.items.front();
  if (question.method != Method::kAcquireAll &&
      (question.method != Method::kAcquire || item.cost <= 0)) {
    return look(question, now_ns, answer);
  }
  if (question.method == Method::kAcquire && item.max_wait_ms > 0) {
    // An unknown rule is the group path's to refuse.
    const Rule* configured = rules_->find(item.rule);
    if (configured != nullptr && !canWait(*configured)) {
      answer->fail(ErrorCode::kBadRequest, cannotWait(*configured));
      return Outcome::kAnswered;
    }
  }
  // Every acquire: all or nothing on its entries (group_path.h).
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

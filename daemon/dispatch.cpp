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

}  // namespace

Dispatcher::Dispatcher(KeyTable& keys, MetricsShard& metrics, LeaseBroker* broker,
                       int64_t lease_timeout_ns)
    : keys_(keys),
      metrics_(metrics),
      broker_(broker),
      waiting_(metrics, broker, lease_timeout_ns),
      policy_(keys, metrics, broker),
      lease_(keys, metrics, broker, waiting_, policy_),
      local_(keys, waiting_, policy_),
      holding_(keys, metrics, broker, waiting_),
      group_(keys, metrics, broker, waiting_, policy_, lease_, holding_) {
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
    if (by_rule != nullptr) by_rule->allowed[index].add();
  } else {
    metrics_.denied[index].add();
    if (by_rule != nullptr) by_rule->denied[index].add();
  }
  if (decision.shadow_denied) {
    metrics_.shadow_denied.add();
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

void Dispatcher::answerVerdict(const Rule& configured, const Verdict& verdict, bool counts,
                        Answer* answer) {
  if (verdict.failed) {
    answer->fail(verdict.error, verdict.message);
    return;
  }
  if (counts) count(configured, verdict.decision, verdict.mode);
  answer->decide(verdict.decision, verdict.mode, verdict.waited_ms);
}

Outcome Dispatcher::decide(const Question& question, int64_t now_ns, const Asker& asker,
                           Answer* answer) {
  answer->method = question.method;
  return question.method == Method::kAcquireAll ? acquireAll(question, now_ns, asker, answer)
                                                : acquireOne(question, now_ns, asker, answer);
}

Outcome Dispatcher::acquireOne(const Question& question, int64_t now_ns, const Asker& asker,
                               Answer* answer) {
  const Item& item = question.items.front();
  const Rule* configured = rules_->find(item.rule);
  if (configured == nullptr) {
    waiting_.leaveLine(asker.wait.ticket);  // the rule went in a reload
    answer->fail(ErrorCode::kUnknownRule, unknownRule(item.rule));
    return Outcome::kAnswered;
  }
  if (question.method == Method::kRelease && configured->algorithm != Algorithm::kConcurrency) {
    waiting_.leaveLine(asker.wait.ticket);
    answer->fail(ErrorCode::kBadRequest, notReleasable(*configured));
    return Outcome::kAnswered;
  }
  bool spends = question.method == Method::kAcquire && item.cost > 0;
  if (item.max_wait_ms > 0 && !canWait(*configured)) {
    answer->fail(ErrorCode::kBadRequest,
                 "max_wait_ms applies to token_bucket and gcra rules of one limit, and rule \"" +
                     configured->name + "\" is " + std::string(scopeName(configured->scope)) +
                     " " + std::string(algorithmName(configured->algorithm)) +
                     (configured->limits.size() > 1 ? " of several limits" : ""));
    return Outcome::kAnswered;
  }
  if (broker_ != nullptr && leasesHolding(*configured)) {
    return holdOne(question, *configured, now_ns, asker, answer);
  }
  if (leasing(*configured) && spends) {
    Verdict verdict;
    Outcome outcome = lease_.acquire(*rules_, *configured, item, now_ns, asker, &verdict);
    if (outcome == Outcome::kAnswered) answerVerdict(*configured, verdict, true, answer);
    return outcome;
  }
  // A request that stood in a global rule's line is asked again, and the
  // rule no longer leases: it leaves the line.
  waiting_.leaveLine(asker.wait.ticket);
  if (broker_ != nullptr && configured->part_count > 0) {
    // An acquire_all of one item.
    if (spends) return acquireAll(question, now_ns, asker, answer);
    Mode mode = Mode::kLocal;
    Decision decision = group_.peek(*rules_, *configured, item, now_ns, &mode);
    answer->decide(decision, mode);
    return Outcome::kAnswered;
  }
  if (leasing(*configured)) {
    peekLeased(item, *configured, now_ns, answer);
    return Outcome::kAnswered;
  }
  auto [rule, mode] = route(*configured);
  if (rule == nullptr) {
    Decision decision = policyDecision(*configured, mode);
    if (spends) {
      count(*configured, decision, mode);
    }
    answer->decide(decision, mode);
    return Outcome::kAnswered;
  }

  Verdict verdict;
  if (spends) {
    Outcome outcome =
        local_.acquire(*rules_, *configured, *rule, mode, item, now_ns, asker, &verdict);
    if (outcome == Outcome::kWaitsReserved) {
      count(*configured, verdict.decision, verdict.mode);
      return outcome;
    }
    answerVerdict(*configured, verdict, true, answer);
    return Outcome::kAnswered;
  }
  verdict = local_.look(*rules_, *configured, *rule, mode, item,
                        question.method == Method::kRelease, now_ns);
  answerVerdict(*configured, verdict, false, answer);
  return Outcome::kAnswered;
}

void Dispatcher::peekLeased(const Item& item, const Rule& rule, int64_t now_ns, Answer* answer) {
  Mode mode = Mode::kNormal;
  Decision decision = lease_.look(*rules_, rule, item.key, now_ns, item.cost, &mode);
  answer->decide(decision, mode);
}

// --- Global concurrency rules: holdings (holding.h) ---------------------------

Outcome Dispatcher::holdOne(const Question& question, const Rule& rule, int64_t now_ns,
                            const Asker& asker, Answer* answer) {
  const Item& item = question.items.front();
  Decision decision;
  Mode mode = Mode::kNormal;
  if (question.method == Method::kAcquire && item.cost > 0) {
    std::span<std::atomic<uint64_t>> held;
    switch (holding_.acquire(*rules_, rule, item, now_ns, asker, &decision, &mode, &held)) {
      case HoldingPath::Held::kWaitsForLease: return Outcome::kWaitsForLease;
      case HoldingPath::Held::kTableFull:
        answer->fail(ErrorCode::kOverloaded, kTableFull);
        return Outcome::kAnswered;
      case HoldingPath::Held::kHeld:
      case HoldingPath::Held::kAnswered: break;
    }
    applyShadow(rule, &decision);
    count(rule, decision, mode);
    answer->decide(decision, mode);
    return Outcome::kAnswered;
  }
  decision = holding_.look(*rules_, rule, item, question.method == Method::kRelease, now_ns,
                           &mode);
  applyShadow(rule, &decision);
  answer->decide(decision, mode);
  return Outcome::kAnswered;
}

// --- acquire_all, and rules decided on their parts (group_path.h) -------------

Outcome Dispatcher::acquireAll(const Question& question, int64_t now_ns, const Asker& asker,
                               Answer* answer) {
  Outcome outcome = group_.acquire(*rules_, question.items, now_ns, asker, answer);
  if (outcome == Outcome::kAnswered && !answer->failed) {
    for (size_t i = 0; i < answer->decisions.size(); ++i) {
      count(group_.configured(i), answer->decisions[i], answer->modes[i]);
    }
  }
  return outcome;
}

}  // namespace sluice

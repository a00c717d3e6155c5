// Dispatch: the decision seam. One question (question.h) in, from any
// front, its Answer out, or the question left waiting.
//
// The request path reads one way: a front (rpc_front.h for MessagePack-RPC)
// turns what its client sent into a Question and asks the dispatcher; the
// dispatcher routes each item to the decision path its units come from and
// fills the Answer from what the path answers (a Verdict, verdict.h), or
// leaves the question waiting (Outcome, waiting.h); the front encodes the
// Answer. Every acquire is an acquire_all (an acquire is one of one item):
// the group path (group_path.h) decides its entries all or nothing, each
// on the path its units come from, each in its own file:
//   - local state, by the limiter: a local rule's key, or a global rule's
//     fallback share (local_path.h);
//   - a leasable global rule's leased slice, while Redis is up
//     (lease_path.h);
//   - a global concurrency rule's held pool (holding_path.h);
//   - policy: routing, "open", "closed", blocks and the share's debits
//     (policy.h).
// peek and release (and an acquire of cost 0) take nothing: the dispatcher
// asks the same paths what an acquire would answer, or gives units back.
//
// reserve decides like an acquire of its estimate and, when allowed, opens a
// reservation in this worker's table (reservations.h); settle and cancel
// take it from there and give back or charge the difference on the key's
// state, by the path that decides the key now. Expiry (expireReservations,
// from the worker's timer) settles at the estimate: it stays spent.
//
// A question that cannot be answered yet waits (waiting.h has the model):
// ask() returns how it waits and fills nothing; its Answer goes later to
// the asker's Recipient, with its tag. Errors (an unknown rule, a full key
// table) are answers too, counted by code here, whichever front asked.
//
// A Dispatcher belongs to one worker thread and is called only from that
// worker's loop. The caller must hold a KeyTable::ReadGuard around ask()
// and retryDeferred(), so that the entries they look up stay alive until
// the decision is made. On a warm key it allocates nothing: its scratch
// vectors and the caller's Answer keep their capacity between questions.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "failure.h"
#include "group_path.h"
#include "holding_path.h"
#include "key_table.h"
#include "lease.h"
#include "lease_path.h"
#include "limiter.h"
#include "local_path.h"
#include "lookup.h"
#include "metrics.h"
#include "policy.h"
#include "question.h"
#include "reservations.h"
#include "rules.h"
#include "verdict.h"
#include "waiting.h"

namespace sluice {

class Dispatcher {
 public:
  // `broker` is null without Redis; lease_timeout_ns bounds a deferral.
  // worker_index names the worker in its reservations' ids.
  Dispatcher(KeyTable& keys, MetricsShard& metrics, LeaseBroker* broker = nullptr,
             int64_t lease_timeout_ns = 50'000'000, uint32_t worker_index = 0,
             Reservations::Bounds reservation_bounds = {});

  // Installs the rule set that later questions see (after a reload).
  void setRules(RuleSetPtr rules);
  const RuleSet& rules() const { return *rules_; }

  // Decides `question` (acquire, acquire_all, peek, release, reserve,
  // settle or cancel: decides())
  // into `answer`, or leaves it waiting. now_ns is the monotonic time it was
  // read at. asker.recipient and asker.tag say where a later answer goes;
  // without a recipient (or with !asker.may_wait) it never waits.
  // `question` is held if it waits: asker.question is `question` itself
  // (askerFor with the question, which spares ask() a copy of the Asker) or
  // anything else, which ask() replaces. A question asked again whose rule
  // a reload removed while it waited is answered OVERLOADED, naming the
  // rule as removed by a reload (not UNKNOWN_RULE: the client named a rule
  // that was there).
  Outcome ask(const Question& question, int64_t now_ns, const Asker& asker, Answer* answer);
  // An Asker for a question read at now_ns that may wait when it has a
  // recipient; with the question it asks for, the Asker ask() uses as it is.
  Asker askerFor(Recipient* recipient, MsgId tag, int64_t now_ns) const {
    Asker asker;
    asker.recipient = recipient;
    asker.tag = tag;
    asker.deadline_ns = now_ns + waiting_.leaseTimeoutNs();
    asker.may_wait = recipient != nullptr;
    return asker;
  }
  Asker askerFor(const Question& question, Recipient* recipient, MsgId tag, int64_t now_ns) const {
    Asker asker = askerFor(recipient, tag, now_ns);
    asker.question = question;
    return asker;
  }

  // Answers the deferred requests that can be answered now: those waiting
  // for a lease whose lease has come or whose deadline has passed, and those
  // waiting for reserved units that are due. With `all` (the worker is
  // stopping) every one is answered: a lease wait by its policy, a unit wait
  // with a denial (retry_after_ms says when its units would have been due).
  // (waiting.h has the model.)
  void retryDeferred(int64_t now_ns, bool all) { waiting_.askAgain(now_ns, all); }
  // Drops the deferred questions of a recipient that has gone away.
  void forget(const Recipient* recipient) { waiting_.forget(recipient); }
  bool hasDeferred() const { return waiting_.any(); }
  bool awaitsLeaseNews() const { return waiting_.awaitsNews(); }
  // The earliest deadline or due time of a deferred request (hasDeferred() only).
  int64_t nextDeadlineNs() const { return waiting_.nextDeadlineNs(); }
  // The requests waiting, by kind (tests).
  const Waiting& waiting() const { return waiting_; }

  // Settles at their estimate the reservations whose TTL has passed at
  // now_ns: the estimate stays spent. Returns how many.
  size_t expireReservations(int64_t now_ns);
  const Reservations& reservations() const { return reservations_; }
  // Hands a settle or cancel of another worker's reservation (`worker`,
  // Reservations::workerOf) to that worker, to answer to recipient with
  // tag; false when it cannot, and the settle is answered
  // UNKNOWN_RESERVATION here.
  using Router = std::function<bool(uint32_t worker, const Question& question,
                                    Recipient* recipient, MsgId tag)>;
  void routeSettlesWith(Router router) { router_ = std::move(router); }

 private:
  // A question asked again (it waited) whose item names a rule that a
  // reload removed since: that item; else null.
  const Item* removedByReload(const Question& question) const;
  // acquire_all through the group path (group_path.h), counted; acquire
  // through acquire(); the rest through look().
  Outcome decide(const Question& question, int64_t now_ns, const Asker& asker, Answer* answer);
  // acquire of a cost over 0: acquire_all of its one item (group_path.h),
  // counted.
  Outcome acquire(const Item& item, int64_t now_ns, const Asker& asker, Answer* answer);
  // peek, release, and acquire of cost 0: one item, taking nothing.
  Outcome look(const Question& question, int64_t now_ns, Answer* answer);
  // reserve, and settle or cancel (reservations.h).
  Outcome reserve(const Question& question, int64_t now_ns, const Asker& asker, Answer* answer);
  Outcome settle(const Question& question, int64_t now_ns, const Asker& asker, Answer* answer);
  // Whether a global rule decides on leases right now.
  bool leasing(const Rule& rule) const {
    return broker_ != nullptr && leasable(rule) && broker_->leasing();
  }
  Route route(const Rule& rule) const { return sluice::route(*rules_, rule); }
  // Counts a decision on `configured`, the rule the request named.
  void count(const Rule& configured, const Decision& decision, Mode mode);
  // The per-rule counters of `configured`, one of rules_->rules(); null
  // for any other rule.
  RuleShard* shardOf(const Rule& configured) const;
  // Counts a reservation of `configured` closed (null: its rule is gone).
  void closed(const Rule* configured);

  MetricsShard& metrics_;
  LeaseBroker* broker_;
  RuleSetPtr rules_;
  std::vector<RuleShard*> rule_shards_;  // per-rule counters, by position in rules_
  Waiting waiting_;
  PolicyPath policy_;
  LeasePath lease_;
  LocalPath local_;
  HoldingPath holding_;
  GroupPath group_;  // every acquire and reserve, over the paths above
  Reservations reservations_;
  Router router_;
};

}  // namespace sluice

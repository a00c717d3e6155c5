// Waiting: requests answered later; see waiting.h for the model.
#include "waiting.h"

#include <algorithm>

#include "failure.h"

namespace sluice {

Waiting::Waiting(MetricsShard& metrics, LeaseBroker* broker, int64_t lease_timeout_ns)
    : metrics_(metrics), broker_(broker), lease_timeout_ns_(lease_timeout_ns) {}

bool Waiting::waitForLease(const Asker& asker, const Wait& wait) {
  if (!asker.may_wait || lease_.size() >= kMaxDeferred) return false;
  if (asker.kept) return true;
  // A first wait: hold the question (the front's buffer will be reused).
  size_t bytes = HeldQuestion::bytesOf(asker.question);
  if (lease_bytes_ + bytes > kMaxDeferredBytes) return false;
  lease_bytes_ += bytes;
  metrics_.lease_deferred.add();
  Waiter waiter;
  waiter.kind = WaitKind::kLease;
  waiter.due_ns = asker.deadline_ns;
  waiter.wait = wait;
  waiter.recipient = asker.recipient;
  waiter.tag = asker.tag;
  waiter.question.assign(asker.question);
  lease_.push_back(std::move(waiter));
  return true;
}

bool Waiting::waitUntilDue(const Asker& asker, const Wait& wait, int64_t due_ns) {
  if (due_.size() + line_.size() >= kMaxWaiters) return false;
  Waiter waiter;
  waiter.kind = WaitKind::kDue;
  waiter.due_ns = due_ns;
  waiter.wait = wait;
  waiter.recipient = asker.recipient;
  waiter.tag = asker.tag;
  waiter.question.assign(asker.question);
  due_.push_back(std::move(waiter));
  std::push_heap(due_.begin(), due_.end());
  return true;
}

bool Waiting::waitInLine(const Asker& asker, const Wait& wait) {
  if (due_.size() + line_.size() >= kMaxWaiters) return false;
  Waiter waiter;
  waiter.kind = WaitKind::kLine;
  waiter.wait = wait;
  waiter.recipient = asker.recipient;
  waiter.tag = asker.tag;
  waiter.question.assign(asker.question);
  line_.push_back(std::move(waiter));
  return true;
}

void Waiting::reserve(Recipient* recipient, MsgId tag, const Decision& decision, Mode mode,
                      int64_t since_ns, int64_t due_ns) {
  Waiter waiter;
  waiter.kind = WaitKind::kReserved;
  waiter.due_ns = due_ns;
  waiter.wait.since_ns = since_ns;
  waiter.wait.seq = nextSeq();
  waiter.recipient = recipient;
  waiter.tag = tag;
  waiter.decision = decision;
  waiter.mode = mode;
  reserved_.push_back(std::move(waiter));
  std::push_heap(reserved_.begin(), reserved_.end());
}

void Waiting::leaveLine(uint64_t ticket, std::span<std::atomic<uint64_t>> words) {
  if (ticket != 0 && broker_ != nullptr && broker_->lines().leave(ticket, words)) {
    broker_->notifyWorkers();
  }
}

void Waiting::askAgain(int64_t now_ns, bool all) {
  answerReserved(now_ns, all);
  askDue(now_ns, all);
  askLine(now_ns, all);
  askLease(now_ns, all);
  // The first in a line, served from a lease that came, made the next first.
  askLine(now_ns, all);
}

Outcome Waiting::ask(const Waiter& waiter, int64_t now_ns, const Asker& asker) {
  Asker again = asker;
  again.recipient = waiter.recipient;
  again.tag = waiter.tag;
  again.question = waiter.question.question();
  answer_.clear();
  return ask_again_(again.question, now_ns, again, &answer_);
}

void Waiting::answerReserved(int64_t now_ns, bool all) {
  while (!reserved_.empty() && (all || reserved_.front().due_ns <= now_ns)) {
    std::pop_heap(reserved_.begin(), reserved_.end());
    Waiter waiter = std::move(reserved_.back());
    reserved_.pop_back();
    Decision decision = waiter.decision;
    if (waiter.due_ns > now_ns) {
      // Stopping before its units are due: the normal denial.
      decision.allowed = false;
      decision.retry_after_ms = (waiter.due_ns - now_ns + 999'999) / 1'000'000;
    }
    answer_.clear();
    answer_.method = Method::kAcquire;
    answer_.decide(decision, waiter.mode,
                   (std::min(now_ns, waiter.due_ns) - waiter.wait.since_ns) / 1'000'000);
    deliver(waiter, answer_);
  }
}

void Waiting::askDue(int64_t now_ns, bool all) {
  while (!due_.empty() && (all || due_.front().due_ns <= now_ns)) {
    std::pop_heap(due_.begin(), due_.end());
    Waiter waiter = std::move(due_.back());
    due_.pop_back();
    Asker asker;
    asker.deadline_ns = now_ns + lease_timeout_ns_;
    asker.again = true;
    if (all) {
      // Stopping: answered at once, as a request that does not wait.
      leaveLine(waiter.wait.ticket);
      waiter.wait = Wait{};
    } else {
      asker.wait = waiter.wait;
      asker.may_wait = true;
    }
    if (ask(waiter, now_ns, asker) == Outcome::kAnswered) deliver(waiter, answer_);
  }
}

void Waiting::askLine(int64_t now_ns, bool all) {
  if (line_.empty() || broker_ == nullptr) return;
  WaitLines& lines = broker_->lines();
  // A request served leaves its line, and the next may be on this worker:
  // look again while a pass asked any.
  for (bool asked = true; asked && !line_.empty();) {
    asked = false;
    uint64_t promotions = lines.promotions();
    bool promoted = promotions != seen_promotions_;
    seen_promotions_ = promotions;
    asking_.clear();
    asking_.swap(line_);
    for (Waiter& waiter : asking_) {
      bool ended = all || now_ns >= waiter.wait.until_ns;
      if (!ended && !(promoted && lines.first(waiter.wait.ticket))) {
        line_.push_back(std::move(waiter));
        continue;
      }
      asked = true;
      if (ended) {
        // Its wait is over: asked as a request that waits no longer.
        leaveLine(waiter.wait.ticket);
        waiter.wait.ticket = 0;
        waiter.wait.until_ns = now_ns;
      }
      Asker asker;
        asker.deadline_ns = now_ns + lease_timeout_ns_;
      asker.again = true;
      if (!all) {
        asker.wait = waiter.wait;
        asker.may_wait = true;
      }
      if (ask(waiter, now_ns, asker) == Outcome::kAnswered) deliver(waiter, answer_);
    }
  }
  asking_.clear();
}

void Waiting::askLease(int64_t now_ns, bool all) {
  if (lease_.empty()) return;
  asking_.clear();
  for (Waiter& waiter : lease_) asking_.push_back(std::move(waiter));
  lease_.clear();
  lease_bytes_ = 0;  // counted again for those that wait on
  for (Waiter& waiter : asking_) {
    bool expired = all || now_ns >= waiter.due_ns;
    Asker asker;
    asker.deadline_ns = waiter.due_ns;
    asker.again = true;
    if (expired) {
      // Asked as a request that does not wait: its policy answers.
      metrics_.lease_deferred_expired.add();
      leaveLine(waiter.wait.ticket);
      waiter.wait = Wait{};
    } else {
      // It keeps its place if it waits on for its lease.
      asker.wait = waiter.wait;
      asker.may_wait = true;
      asker.kept = true;
    }
    switch (ask(waiter, now_ns, asker)) {
      case Outcome::kWaitsForLease:
        lease_bytes_ += waiter.question.bytes();
        lease_.push_back(std::move(waiter));
        break;
      case Outcome::kWaitsUntilDue:
      case Outcome::kWaitsInLine:
      case Outcome::kWaitsReserved:
      case Outcome::kRouted: break;  // it waits on, elsewhere
      case Outcome::kAnswered: {
        // It arrived lease_timeout before its deadline.
        int64_t waited_ns = now_ns - (waiter.due_ns - lease_timeout_ns_);
        metrics_.decision_latency.observe(
            static_cast<uint64_t>(std::max<int64_t>(waited_ns, 0)) / 1000);
        deliver(waiter, answer_);
        break;
      }
    }
  }
  asking_.clear();
}

void Waiting::forget(const Recipient* recipient) {
  std::erase_if(lease_, [&](const Waiter& waiter) {
    if (waiter.recipient != recipient) return false;
    lease_bytes_ -= waiter.question.bytes();
    leaveLine(waiter.wait.ticket);
    return true;
  });
  if (std::erase_if(reserved_, [recipient](const Waiter& waiter) { return waiter.recipient == recipient; }) >
      0) {
    std::make_heap(reserved_.begin(), reserved_.end());
  }
  if (std::erase_if(due_, [&](const Waiter& waiter) {
        if (waiter.recipient != recipient) return false;
        leaveLine(waiter.wait.ticket);
        return true;
      }) > 0) {
    std::make_heap(due_.begin(), due_.end());
  }
  std::erase_if(line_, [&](const Waiter& waiter) {
    if (waiter.recipient != recipient) return false;
    leaveLine(waiter.wait.ticket);
    return true;
  });
}

int64_t Waiting::nextDeadlineNs() const {
  int64_t next = INT64_MAX;
  if (!lease_.empty()) next = lease_.front().due_ns;
  if (!reserved_.empty()) next = std::min(next, reserved_.front().due_ns);
  if (!due_.empty()) next = std::min(next, due_.front().due_ns);
  for (const Waiter& waiter : line_) next = std::min(next, waiter.wait.until_ns);
  return next;
}

size_t Waiting::count(WaitKind kind) const {
  switch (kind) {
    case WaitKind::kLease: return lease_.size();
    case WaitKind::kDue: return due_.size();
    case WaitKind::kLine: return line_.size();
    case WaitKind::kReserved: return reserved_.size();
  }
  return 0;
}

}  // namespace sluice

// Waiting: the requests one worker answers later, and why each one waits.
//
// The waiting model. A question (question.h) is answered when it is asked,
// unless its answer depends on something that has not happened yet. Then
// it becomes a Waiter of one of four kinds, and the worker answers it later:
// its Answer goes to the Recipient that asked (a connection of any front),
// with the question's tag:
//
//   kLease     its key's slice (or holding) is empty while a lease is on the
//              way. It is asked again when a lease reply has come (the worker
//              is woken) or, at the latest, lease_timeout after it was read,
//              when it is asked as a request that may not wait (its rule's
//              on_redis_down policy answers it). Kept in deadline order.
//   kDue       Redis said its key has no units until due_ns, and the request
//              may wait that long (max_wait): it stands in the key's line
//              (WaitLines) and is asked again at due_ns.
//   kLine      others of this node wait for the same key and came first: it
//              stands in the key's line behind them and is asked again when
//              it becomes first, or when its wait ends (then as a request
//              that waits no longer).
//   kReserved  allowed on a reservation (bounded waiting on a local rule):
//              its units are spent already, and its decision, made when it
//              was asked, is answered at due_ns.
//
// Asking again: a waiter of the first three kinds keeps its question (a
// HeldQuestion, which owns its bytes) and is decided again, by the
// dispatcher's ask-again callback, with an Asker that says what it may still wait for and that its
// demand was counted when it was first asked (Asker::again). What the
// decision returns (Outcome) says whether it was answered or waits on, and
// for which kind: a kLease waiter that still waits for its lease keeps its
// place (Asker::kept), one that now waits for a due time or its turn moves.
//
// Bounds (per worker): kMaxDeferred requests and kMaxDeferredBytes of their
// questions' bytes wait for leases (beyond them a cold key is answered at once, by its
// policy); kMaxWaiters wait for a due time or their turn, and kMaxWaiters
// more on reservations (beyond them a request that would wait is refused
// with OVERLOADED).
//
// Stopping (askAgain with `all`): every waiter is answered at once, as a
// request that may not wait; a reservation not yet due with the denial it
// would have had (retry_after_ms says when its units would have been due).
//
// A Waiting belongs to one worker and is called only from that worker's
// loop, inside its KeyTable::ReadGuard (asking again decides on entries).
// Times are the daemon's monotonic clock in ns, passed in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "decision.h"
#include "lease.h"
#include "metrics.h"
#include "question.h"

namespace sluice {

// Most requests one worker keeps waiting for a lease at once, and most bytes
// of their questions (an acquire_all may carry max_items keys of up to
// max_key_bytes each); beyond either, cold keys are answered at once by their
// on_redis_down policy.
constexpr size_t kMaxDeferred = 65'536;
constexpr size_t kMaxDeferredBytes = 16u << 20;
// Most requests one worker holds waiting for a due time or their turn, and
// most on reservations; beyond it, a request that would have to wait is
// refused with OVERLOADED. Per key, waiting is bounded by the rule's rate
// times max_wait.
constexpr size_t kMaxWaiters = 65'536;

enum class WaitKind { kLease, kDue, kLine, kReserved };

// What became of a question: answered (into the caller's Answer), or
// waiting, of a kind (see above), to be answered to its Recipient.
enum class Outcome {
  kAnswered,
  kWaitsForLease,
  kWaitsUntilDue,
  kWaitsInLine,
  kWaitsReserved,
  // Handed to another worker (a settle of a reservation it holds): the
  // answer comes back through the asker's recipient.
  kRouted,
};

// What a request that may wait for its units (max_wait) has of its wait:
// when it arrived, when the wait ends (0: it does not wait), its place in
// arrival order, and on a global rule its ticket in the key's line once it
// stands in one (WaitLines; 0: it does not). Carried along while it waits.
struct Wait {
  int64_t since_ns = 0;
  int64_t until_ns = 0;
  uint64_t seq = 0;
  uint64_t ticket = 0;
};

// Who asks, and what the question may wait for: the Recipient that gets a
// later answer, with the question's tag, and the question (held while it
// waits); the deadline of a wait for a lease; its wait so far.
struct Asker {
  Recipient* recipient = nullptr;
  MsgId tag;
  Question question;
  int64_t deadline_ns = 0;
  Wait wait;
  // It may wait (it has a recipient, is not a notification, and is not asked
  // again as a question that may wait no longer).
  bool may_wait = false;
  // Beyond a lease, it may wait for its units (max_wait: a due time, its
  // turn in a line, a reservation). Only a question of one entry may: the
  // group path (group_path.h) clears it for a group of several.
  bool may_wait_for_units = true;
  // Asked again: its demand was counted when it was first asked.
  bool again = false;
  // A kLease waiter asked again: it keeps its place if it waits on.
  bool kept = false;
};

// A request waiting, of any kind.
struct Waiter {
  WaitKind kind = WaitKind::kLease;
  // kLease: its deadline; kDue, kReserved: when it is due; kLine: unused
  // (its wait's until_ns ends it).
  int64_t due_ns = 0;
  Wait wait;  // kReserved: since_ns and seq only
  Recipient* recipient = nullptr;
  MsgId tag;
  HeldQuestion question;  // kLease, kDue, kLine
  Decision decision;  // kReserved
  Mode mode = Mode::kLocal;  // kReserved
  // The heaps' order (kDue, kReserved): the earliest due first, then arrival.
  bool operator<(const Waiter& other) const {
    return due_ns != other.due_ns ? due_ns > other.due_ns : wait.seq > other.wait.seq;
  }
};

class Waiting {
 public:
  // Decides a waiter's question again, answering into `answer` unless it
  // waits on.
  using AskAgain = std::function<Outcome(const Question& question, int64_t now_ns,
                                         const Asker& asker, Answer* answer)>;

  // `broker` is null without Redis (then nothing stands in a line);
  // lease_timeout_ns bounds a wait for a lease.
  Waiting(MetricsShard& metrics, LeaseBroker* broker, int64_t lease_timeout_ns);

  void onAskAgain(AskAgain ask_again) { ask_again_ = std::move(ask_again); }
  int64_t leaseTimeoutNs() const { return lease_timeout_ns_; }

  // The next place in arrival order.
  uint64_t nextSeq() { return seq_++; }

  // Keeps a request that waits for its key's lease. False (nothing kept)
  // when it may not wait or a bound is reached: the caller answers it now.
  // A kept request (asker.kept) is the caller's to keep: true, nothing done.
  bool waitForLease(const Asker& asker, const Wait& wait);
  // Keeps a request until due_ns (kDue) or its turn in line (kLine); false
  // when too many wait: the caller answers OVERLOADED (tooManyWaiting()).
  bool waitUntilDue(const Asker& asker, const Wait& wait, int64_t due_ns);
  bool waitInLine(const Asker& asker, const Wait& wait);
  // Whether a reservation may be held (kMaxWaiters); the caller refuses the
  // request with OVERLOADED otherwise.
  bool mayReserve() const { return reserved_.size() < kMaxWaiters; }
  // Holds the answer of a request allowed on a reservation until due_ns.
  void reserve(Recipient* recipient, MsgId tag, const Decision& decision, Mode mode,
               int64_t since_ns, int64_t due_ns);
  static constexpr std::string_view tooManyWaiting() {
    return "too many requests are waiting for units on this worker; retry later";
  }

  // Takes a ticket out of its line and wakes the workers when another
  // request became first; `words` are the key's slice words, if at hand.
  void leaveLine(uint64_t ticket, std::span<std::atomic<uint64_t>> words = {});

  // Answers the waiters that can be answered now (every one with `all`).
  void askAgain(int64_t now_ns, bool all);
  // Drops the waiters of a recipient that has gone away.
  void forget(const Recipient* recipient);
  bool any() const {
    return !lease_.empty() || !reserved_.empty() || !due_.empty() || !line_.empty();
  }
  // The earliest deadline or due time of a waiter (any() only).
  int64_t nextDeadlineNs() const;
  // Whether a waiter waits for news of the lease path: a lease's answer
  // (kLease) or a promotion in its line (kLine). kDue and kReserved wait
  // for their time alone.
  bool awaitsNews() const { return !lease_.empty() || !line_.empty(); }

  // Waiters of each kind (tests and stats).
  size_t count(WaitKind kind) const;

 private:
  void answerReserved(int64_t now_ns, bool all);
  void askDue(int64_t now_ns, bool all);
  void askLine(int64_t now_ns, bool all);
  void askLease(int64_t now_ns, bool all);
  // Asks a waiter's question again, answering into answer_ unless it waits on.
  Outcome ask(const Waiter& waiter, int64_t now_ns, const Asker& asker);
  static void deliver(const Waiter& waiter, const Answer& answer) {
    if (waiter.recipient != nullptr) waiter.recipient->receive(waiter.tag, answer);
  }

  MetricsShard& metrics_;
  LeaseBroker* broker_;
  const int64_t lease_timeout_ns_;
  AskAgain ask_again_;
  std::deque<Waiter> lease_;       // kLease, in deadline order (one timeout for all)
  size_t lease_bytes_ = 0;         // of lease_'s questions
  std::vector<Waiter> reserved_;   // kReserved: a heap (std::push_heap), earliest due on top
  std::vector<Waiter> due_;        // kDue: a heap too
  std::vector<Waiter> line_;       // kLine, in no particular order (tickets order them)
  std::vector<Waiter> asking_;     // askLine's and askLease's scratch
  uint64_t seen_promotions_ = 0;   // WaitLines::promotions() when last looked
  uint64_t seq_ = 0;
  Answer answer_;                  // a waiter's answer
};

}  // namespace sluice

// Dispatch: turns one parsed request into its response.
//
// A Dispatcher belongs to one worker thread and is called only from that
// worker's loop. It looks the rule up in the worker's current rule set, the
// key in the shared key table, runs the limiter and appends the encoded
// response to the connection's output. On a warm key it allocates nothing:
// its scratch vectors keep their capacity between requests.
//
// The caller must hold a KeyTable::ReadGuard around handle() and
// retryDeferred(), so that the entries they look up stay alive until the
// decision is made.
//
// Global rules (with a LeaseBroker): while the breaker is closed, a leasable
// rule's acquire spends from the key's slice (lease.h), and a global
// concurrency rule's acquire holds units from the key's holding
// (holding.h), which in fallback also decides at the node's share. A global
// rule of several limits decides on its parts (RuleSet::parts), each a
// leasable rule of one of its limits, as acquire_all decides its items: all
// or nothing, reported as one decision. A key whose slice is
// empty while its lease is on the way is deferred: handle() keeps a copy of
// the request's frame and answers it later, from retryDeferred(), when a
// lease reply has arrived (the worker is woken) or, at the latest,
// lease_timeout after it was read, by the rule's on_redis_down policy. Other
// requests on the same loop are served meanwhile. Answers to deferred
// requests go to the deliver callback, with the owner (the connection) that
// handle() was given.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "access.h"
#include "admin.h"
#include "failure.h"
#include "key_table.h"
#include "lease.h"
#include "limiter.h"
#include "lookup.h"
#include "metrics.h"
#include "policy.h"
#include "rpc.h"
#include "rules.h"
#include "status.h"

namespace sluice {

// Most requests one worker keeps deferred at once, and most bytes of their
// frames (a frame may be up to max_frame_bytes, padded with entries the
// parser skips); beyond either, cold keys are answered at once by their
// on_redis_down policy.
constexpr size_t kMaxDeferred = 65'536;
constexpr size_t kMaxDeferredBytes = 16u << 20;
// Most requests one worker holds waiting for reserved units (bounded
// waiting); beyond it, a request that would have to wait is refused with
// OVERLOADED. Per key, waiting is bounded by the rule's rate times max_wait.
constexpr size_t kMaxWaiters = 65'536;

class Dispatcher {
 public:
  // `broker` is null without Redis; lease_timeout_ns bounds a deferral.
  Dispatcher(KeyTable& keys, MetricsShard& metrics, DaemonStatus& status,
             LeaseBroker* broker = nullptr, int64_t lease_timeout_ns = 50'000'000);

  // Installs the rule set that later requests see (after a reload).
  void setRules(RuleSetPtr rules);

  // Where answers to deferred requests go: (owner, encoded response).
  using Deliver = std::function<void(void* owner, std::string_view response)>;
  void onDeliver(Deliver deliver) { deliver_ = std::move(deliver); }

  // Answers `request` into `out` (nothing for a notification). now_ns is the
  // monotonic time of the read that carried the request. With an owner and
  // the request's frame, a request waiting for a lease may be deferred:
  // handle() then writes nothing and returns true.
  bool handle(const rpc::Request& request, const Peer& peer, int64_t now_ns, std::string* out,
              void* owner = nullptr, std::span<const uint8_t> frame = {});

  // Answers the deferred requests that can be answered now: those waiting
  // for a lease whose lease has come or whose deadline has passed, and those
  // waiting for reserved units that are due. With `all` (the worker is
  // stopping) every one is answered: a lease wait by its policy, a unit wait
  // with a denial (retry_after_ms says when its units would have been due).
  void retryDeferred(int64_t now_ns, bool all);
  // Drops the deferred requests of an owner that has gone away.
  void forget(void* owner);
  bool hasDeferred() const {
    return !deferred_.empty() || !waiters_.empty() || !parked_.empty() || !queued_.empty();
  }
  // The earliest deadline or due time of a deferred request (hasDeferred() only).
  int64_t nextDeadlineNs() const;

  // Answers a request that could not be parsed.
  void handleParseError(const rpc::ParseResult& result, std::string* out);

 private:
  // What a request that may wait for its units (max_wait) has of its wait:
  // when it arrived, when the wait ends (0: it does not wait), its place in
  // arrival order, and on a global rule its ticket in the key's line once
  // it stands in one (WaitLines; 0: it does not). Carried along while it is
  // deferred, parked and queued.
  struct Wait {
    int64_t since_ns = 0;
    int64_t until_ns = 0;
    uint64_t seq = 0;
    uint64_t ticket = 0;
  };
  // A request that may wait for a lease: who to answer, its bytes, and
  // whether it is already in deferred_ (a retry: a deferral keeps its place).
  struct DeferTo {
    void* owner;
    std::span<const uint8_t> frame;
    int64_t deadline_ns;
    bool held = false;
    Wait wait;  // a waiting request's, when it comes back
  };
  struct Deferred {
    void* owner;
    std::string frame;
    int64_t deadline_ns;
    Wait wait;
  };
  // A request on a global rule that waits for units Redis will have at
  // due_ns (its lease said "nothing until then"): asked again then, with
  // what is left of its wait.
  struct Parked {
    int64_t due_ns;
    Wait wait;
    void* owner;
    std::string frame;
    // The heap's order: the earliest due first, then arrival order.
    bool operator<(const Parked& other) const {
      return due_ns != other.due_ns ? due_ns > other.due_ns : wait.seq > other.wait.seq;
    }
  };
  // A request on a global rule that stands in its key's line behind others:
  // asked again when it becomes first, or answered when its wait ends.
  struct Queued {
    Wait wait;
    void* owner;
    std::string frame;
  };
  // A request allowed on a reservation, answered when its units are due.
  struct Waiter {
    int64_t due_ns;
    uint64_t seq;  // arrival order, for requests due at the same time
    int64_t since_ns;
    void* owner;
    uint32_t msgid;
    Decision decision;
    Mode mode;
    // The heap's order: the earliest due first.
    bool operator<(const Waiter& other) const {
      return due_ns != other.due_ns ? due_ns > other.due_ns : seq > other.seq;
    }
  };
  // How long a request on `rule` may wait for its units: its max_wait_ms,
  // else the rule's max_wait; 0 when it cannot wait.
  int64_t maxWaitNs(const Rule& rule, const rpc::Item& item) const;
  void answerWaiters(int64_t now_ns, bool all);
  // Asks again for the parked requests that are due (every one with `all`).
  void retryParked(int64_t now_ns, bool all);
  // Asks again for the requests deferred for a lease (each one with `all`).
  void retryDeferredLeases(int64_t now_ns, bool all);
  // Asks again for the queued requests that became first in their line,
  // and answers those whose wait ended (every one with `all`).
  void retryQueued(int64_t now_ns, bool all);
  // Parses a held frame into retry_request_ again (with bounds that admit
  // it: it parsed once already); false if it does not (it cannot).
  bool reparse(std::string_view frame);
  // Both return true when they deferred the request (defer non-null only).
  bool acquireOne(const rpc::Request& request, int64_t now_ns, std::string* out,
                  const DeferTo* defer);
  bool acquireAll(const rpc::Request& request, int64_t now_ns, std::string* out,
                  const DeferTo* defer);
  bool acquireLeased(const rpc::Request& request, const Rule& rule, int64_t now_ns,
                     std::string* out, const DeferTo* defer);
  // acquireLeased's decision on the key's entry; `wait` gets the request's
  // ticket when it joins the key's line.
  bool spendLeased(const rpc::Request& request, const Rule& rule, int64_t now_ns,
                   std::span<std::atomic<uint64_t>> entry_words, Wait& wait, std::string* out,
                   const DeferTo* defer);
  // slice::take() for a key of `rule`, clearing a line mark its line has
  // outlived (and taking again).
  slice::TakeResult takeSlice(const Rule& rule, std::string_view key,
                              std::span<std::atomic<uint64_t>> words, int64_t now_ns, int64_t cost,
                              bool first_in_line);
  // Puts a waiting request for `cost` units of a key of `rule` (`deciding`
  // its limits) in the key's line, if it is not in it yet. False when more
  // units wait ahead of it (`ahead`) than the fleet could give the line
  // within its wait: it is refused.
  bool stand(Wait& wait, const Rule& rule, const Rule& deciding, std::string_view key,
             std::span<std::atomic<uint64_t>> words, int64_t cost, int64_t* ahead);
  // Takes a ticket out of its line and wakes the workers when another
  // request became first; `words` are the key's slice words, if at hand.
  void leaveLine(uint64_t ticket, std::span<std::atomic<uint64_t>> words = {});
  // Queues a waiting request behind the others in its key's line; false
  // (and an OVERLOADED answer in `out`) when too many wait on this worker.
  bool queue(const DeferTo& to, const Wait& wait, uint32_t msgid, std::string* out);
  void peekLeased(const rpc::Request& request, const Rule& rule, int64_t now_ns,
                  std::string* out);
  // What an acquire of `cost` would answer on a key of a leasable `rule`,
  // spending and claiming nothing; `mode` gets its mode.
  Decision lookLeased(const Rule& rule, std::string_view key, int64_t now_ns, int64_t cost,
                      Mode* mode);
  bool defer(const DeferTo* to, const Wait& wait);
  bool defer(const DeferTo* to) { return defer(to, Wait{}); }
  // Parks a waiting request until due_ns; false (and an OVERLOADED answer in
  // `out`) when too many are parked.
  bool park(const DeferTo& to, const Wait& wait, int64_t due_ns, uint32_t msgid, std::string* out);
  // Sends a lease request for a key of `rule` whose in-flight bit the
  // caller claimed; `deciding` is the rule's variant for the key, `words`
  // the entry's.
  void requestLease(const Rule& rule, const Rule& deciding, std::string_view key,
                    std::span<std::atomic<uint64_t>> words, int64_t now_ns, int64_t cost);
  // Global concurrency rules (holding.h): acquire, peek and release.
  bool holdOne(const rpc::Request& request, const Rule& rule, int64_t now_ns, std::string* out,
               const DeferTo* defer);
  // What an acquire on a holding came to: its units are held (the decision
  // allows; refund them with holding::refund if the group fails), it is
  // answered (denied, or by a policy, holding nothing), deferred for a
  // lease, or the key table is full.
  enum class Held { kHeld, kAnswered, kDeferred, kTableFull };
  Held acquireHeld(const Rule& rule, const rpc::Item& item, int64_t now_ns, const DeferTo* defer,
                   Decision* decision, Mode* mode, std::span<std::atomic<uint64_t>>* words);
  // What an acquire of `cost` would answer on a holding, holding nothing.
  Decision peekHeld(const Rule& rule, std::span<const std::atomic<uint64_t>> words,
                    int64_t now_ns, int64_t cost, Mode* mode);
  // Sends a lease request for a holding whose in-flight bit the caller claimed.
  void requestHolding(const Rule& rule, std::string_view key,
                      std::span<std::atomic<uint64_t>> words, int64_t now_ns, int64_t cost);
  // acquire_all, and acquire on a rule decided on its parts (RuleSet::parts),
  // in three steps. collectItem() decides a request item on its rule, or
  // on each of its rule's parts: an entry each (items_ and the vectors
  // beside it). settleEntries() spends all entries' units or none. Then
  // groupDecision() reports an item's entries as one decision.
  //
  // An entry spends from its slice (a rule that leases), holds units of its
  // holding (a global concurrency rule), or goes to the limiter on its
  // share (fallback, learning) or its own state (a local rule); a policy
  // answers it ("open", "closed") or a block denies it.
  enum class Collected { kOk, kDeferred, kTableFull };
  // A request item's entries (groups_).
  struct Group {
    const Rule* configured;  // the rule the item named
    std::string_view key;
    size_t first;  // its first entry
    size_t count;  // its entries: 1, or its rule's parts
  };
  void startEntries();
  // Adds the entries of one request item on `configured`. Whatever it
  // returns, the caller refunds (refundEntries) unless it settles. `denied`
  // is set when an entry denies without the limiter (it stays set).
  Collected collectItem(const Rule& configured, const rpc::Item& item, int64_t now_ns,
                        const DeferTo* defer, bool* denied);
  Collected collectEntry(const Rule& rule, const rpc::Item& item, int64_t now_ns,
                         const DeferTo* defer, bool* denied);
  // Gives back what the entries took from slices and holdings.
  void refundEntries(int64_t now_ns);
  // Spends every entry's units or none; each entry's decision is then in
  // items_. True when all were allowed.
  bool settleEntries(int64_t now_ns, bool denied);
  // A shadow rule's parts: gives back what they spent when one denied.
  void refundShadowGroup(const Group& group, int64_t now_ns);
  // The decision and mode reported for a request item.
  Decision groupDecision(const Group& group, Mode* mode) const;
  // acquire and peek on a rule decided on its parts.
  bool acquireParts(const rpc::Request& request, const Rule& configured, int64_t now_ns,
                    std::string* out, const DeferTo* defer);
  void peekParts(const rpc::Request& request, const Rule& configured, int64_t now_ns,
                 std::string* out);
  // Whether a global rule decides on leases right now.
  bool leasing(const Rule& rule) const {
    return broker_ != nullptr && leasable(rule) && broker_->leasing();
  }
  // A limiter decision on the share entry of a global rule; counts what
  // fallback admits (undebited) when `count_undebited`. nullopt: table full.
  std::optional<Decision> acquireShare(const Rule& share, std::string_view key, int64_t now_ns,
                                       int64_t cost, bool count_undebited);
  // Records units a share admitted for a leasable global rule: debited at
  // once while Redis is up, else counted in the entry for the recovery.
  // `share` is the share itself (not a variant); `words` its entry's.
  void noteFallbackSpend(const Rule& share, std::string_view key,
                         std::span<std::atomic<uint64_t>> words, int64_t cost);
  // Counts a denial toward `configured`'s penalty in the words of the entry
  // that holds it (the key's, or for a global rule its slice entry); at the
  // D-th, blocks the key, for a global rule across the fleet (lease.h).
  void countDenial(const Rule& configured, std::string_view key,
                   std::span<std::atomic<uint64_t>> entry_words, const Decision& decision,
                   int64_t now_ns);
  // How long a global rule's key stays blocked, as this node knows (0: not).
  int64_t globalBlockedFor(const Rule& configured, std::string_view key, int64_t now_ns);
  void error(uint32_t msgid, rpc::ErrorCode code, std::string_view message, std::string* out) {
    answerError(metrics_, msgid, code, message, out);
  }
  Route route(const Rule& rule) const { return sluice::route(*rules_, rule); }
  KeyTable::Entry* currentEntry(const Rule& rule, std::string_view key) {
    return sluice::currentEntry(keys_, rule, key);
  }
  const Rule& decidingFor(const Rule& rule, std::string_view key, KeyTable::Entry* entry) {
    return sluice::decidingFor(*rules_, rule, key, entry);
  }
  std::span<std::atomic<uint64_t>> freshState(const Rule& rule) { return fresh_.of(rule); }
  // Counts a decision on `configured`, the rule the request named.
  void count(const Rule& configured, const Decision& decision, Mode mode);

  KeyTable& keys_;
  MetricsShard& metrics_;
  LeaseBroker* broker_;
  const int64_t lease_timeout_ns_;
  RuleSetPtr rules_;
  Admin admin_;
  std::vector<RuleShard*> rule_shards_;  // per-rule counters, by position in rules_
  Deliver deliver_;
  std::deque<Deferred> deferred_;  // in deadline order (one timeout for all)
  size_t deferred_bytes_ = 0;      // of deferred_'s frames
  std::vector<Waiter> waiters_;    // a heap (std::push_heap), earliest due on top
  std::vector<Parked> parked_;     // a heap too
  std::vector<Queued> queued_;     // in no particular order (tickets order them)
  std::vector<Queued> requeuing_;  // retryQueued's scratch
  uint64_t seen_promotions_ = 0;   // WaitLines::promotions() when last looked
  bool just_parked_ = false;       // the last acquire parked its request
  bool asking_again_ = false;      // retrying a deferred or parked request
  uint64_t waiter_seq_ = 0;
  std::vector<Deferred> retrying_;
  rpc::Request retry_request_;
  // Entries (collectItem), each: its limiter item (the decision, and the
  // share or state the limiter spends on, if it does), its mode, its rule
  // (the configured rule or a part), units taken from its slice, the
  // slice's words, the share and its entry's words when fallback spends on
  // it (else none), and the holding's words when it holds units (else none).
  struct ShareSpend {
    const Rule* share = nullptr;
    std::span<std::atomic<uint64_t>> words;
  };
  std::vector<AcquireItem> items_;
  std::vector<Mode> modes_;
  std::vector<const Rule*> entry_rules_;
  std::vector<int64_t> taken_;
  std::vector<std::span<std::atomic<uint64_t>>> slices_;
  std::vector<ShareSpend> shares_;
  std::vector<std::span<std::atomic<uint64_t>>> held_;
  std::vector<Group> groups_;

  // Scratch space reused between requests.
  std::vector<AcquireItem> limited_;
  std::vector<Decision> decisions_;  // acquire_all: by request item
  std::vector<Mode> item_modes_;
  FreshState fresh_;  // a fresh key's state, for peek
  std::string message_;
};

}  // namespace sluice

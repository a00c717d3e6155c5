// Group path: decisions made all or nothing on several entries: acquire_all
// (each item an entry, or several), and an acquire on a global rule of
// several limits decided on its parts (RuleSet::parts, each a leasable rule
// of one limit). An acquire on such a rule is an acquire_all of one item.
//
// In three steps. collectItem() turns a request item into its entries (one,
// or one per part of its rule); collectEntry() decides what an entry can
// decide alone and takes what it takes: an entry spends from its slice (a
// rule that leases: LeasePath::take and afterTake, as an acquire does),
// holds units of its holding (a global concurrency rule: HoldingPath), or
// goes to the limiter on its share (fallback, learning) or its own state (a
// local rule); a policy answers it ("open", "closed") or a block denies it. settleEntries() then spends every
// entry's units or none (the limiter's acquireAll for those that go to it;
// what slices and holdings gave is refunded when any entry denies), and
// groupDecision() reports an item's entries as one decision, as the limits
// of a local rule report (limiter.h).
//
// Waiting: a cold key's entry waits for its lease (Waiting, kLease) and the
// whole question with it; the parts after it are still asked, without
// waiting, so that their leases come within the same round trip. Nothing of
// a group stands in a line or waits for units (max_wait applies to one item
// of one limit: lease_path.h, local_path.h).
//
// A GroupPath belongs to one worker (its Dispatcher), is called only from
// that worker's loop inside its KeyTable::ReadGuard, and allocates nothing
// on a warm key (its vectors keep their capacity). now_ns is the daemon's
// monotonic clock, passed in.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "decision.h"
#include "holding_path.h"
#include "key_table.h"
#include "lease.h"
#include "lease_path.h"
#include "limiter.h"
#include "lookup.h"
#include "metrics.h"
#include "policy.h"
#include "question.h"
#include "rules.h"
#include "waiting.h"

namespace sluice {

class GroupPath {
 public:
  // `broker` is null without Redis.
  GroupPath(KeyTable& keys, MetricsShard& metrics, LeaseBroker* broker, Waiting& waiting,
            PolicyPath& policy, LeasePath& lease, HoldingPath& holding)
      : keys_(keys),
        metrics_(metrics),
        broker_(broker),
        waiting_(waiting),
        policy_(policy),
        lease_(lease),
        holding_(holding) {}

  // Acquires `items` all or nothing on `rules`: a decision and mode per item
  // into `answer` (an unknown rule or a full key table fails it), or the
  // question waits for a lease (kWaitsForLease). Counts nothing.
  Outcome acquire(const RuleSet& rules, std::span<const Item> items, int64_t now_ns,
                  const Asker& asker, Answer* answer);
  // The rule the i-th item of the last acquire() named.
  const Rule& configured(size_t i) const { return *groups_[i].configured; }
  // What an acquire of item.cost on a rule of parts would answer, spending
  // nothing; `mode` gets the reported part's mode.
  Decision peek(const RuleSet& rules, const Rule& configured, const Item& item, int64_t now_ns,
                Mode* mode);

 private:
  enum class Collected { kOk, kDeferred, kTableFull };
  // A request item's entries (groups_).
  struct Group {
    const Rule* configured;  // the rule the item named
    std::string_view key;
    size_t first;  // its first entry
    size_t count;  // its entries: 1, or its rule's parts
  };
  // An entry: one rule (the configured rule or a part) of a request item.
  struct Entry {
    // Its limiter item: the decision, and the share or state the limiter
    // spends on, if it does (a rule; none when decided without the limiter).
    AcquireItem item;
    Mode mode = Mode::kLocal;
    const Rule* rule = nullptr;  // the configured rule or a part
    int64_t taken = 0;           // units taken from its slice
    std::span<std::atomic<uint64_t>> slice;  // the slice's words, when it has one
    // The share and its entry's words when fallback spends on it (a debit
    // to note once the group is allowed); else none.
    const Rule* share = nullptr;
    std::span<std::atomic<uint64_t>> share_words;
    std::span<std::atomic<uint64_t>> held;  // the holding's words when it holds units
  };

  // Adds the entries of one request item on `configured`. Whatever it
  // returns, the caller refunds (refundEntries) unless it settles. `denied`
  // is set when an entry denies without the limiter (it stays set).
  Collected collectItem(const Rule& configured, const Item& item, int64_t now_ns,
                        const Asker& asker, bool* denied);
  Collected collectEntry(const Rule& rule, const Item& item, int64_t now_ns, const Asker& asker,
                         bool* denied);
  // Gives back what the entries took from slices and holdings.
  void refundEntries(int64_t now_ns);
  // Spends every entry's units or none; each entry's decision is then in
  // entries_. True when all were allowed.
  bool settleEntries(int64_t now_ns, bool denied);
  // A shadow rule's parts: gives back what they spent when one denied.
  void refundShadowGroup(const Group& group, int64_t now_ns);
  // The decision and mode reported for a request item.
  Decision groupDecision(const Group& group, Mode* mode) const;
  // Whether a global rule decides on leases right now.
  bool leasing(const Rule& rule) const {
    return broker_ != nullptr && leasable(rule) && broker_->leasing();
  }
  Route route(const Rule& rule) const { return sluice::route(*rules_, rule); }
  const Rule& decidingFor(const Rule& rule, std::string_view key, KeyTable::Entry* entry) {
    return sluice::decidingFor(*rules_, rule, key, entry);
  }

  KeyTable& keys_;
  MetricsShard& metrics_;
  LeaseBroker* broker_;
  Waiting& waiting_;
  PolicyPath& policy_;
  LeasePath& lease_;
  HoldingPath& holding_;
  const RuleSet* rules_ = nullptr;  // the rules of the call under way
  std::vector<Entry> entries_;
  std::vector<Group> groups_;
  std::vector<AcquireItem> limited_;  // settleEntries' scratch
  FreshState fresh_;                  // a fresh key's state, for peek
};

}  // namespace sluice

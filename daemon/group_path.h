// Group path: every acquire, decided all or nothing on its entries. An
// acquire is an acquire_all of one item; an item is one entry, or one per
// part of a global rule of several limits (RuleSet::parts, each a leasable
// rule of one limit).
//
// Each entry is decided by the path its units come from, which takes them
// at once and says what it took (Verdict, Taken): a global concurrency
// rule's holding (holding_path.h), a leasing rule's slice (lease_path.h),
// local state or a global rule's share (local_path.h), or a policy that
// answers without units (policy.h: "open", "closed"). When every entry
// allows, the group keeps what they took (slice units count as spent,
// fallback spends are noted for their debit); when any denies, each entry
// gives back what it took, and each reports what it alone would answer. A
// shadow rule's entries never deny the group; a shadow rule of several
// parts spends nothing when one of its parts would deny (as the limits of
// a local rule do, limiter.h). An item's entries report as one decision,
// the most restrictive (MostRestrictive).
//
// Waiting. Any entry may wait for its lease (Waiting, kLease): what the
// entries before it took is given back and the whole question waits; the
// parts after it still ask for their leases (LeasePath::askForLease), so
// that all come within one round trip. Only a question of one entry (one
// item on a rule of one limit) may also wait for its units: stand in its
// key's line (kDue, kLine) or be allowed on a reservation (kReserved); a
// group of several entries does not, because a wait would hold the units
// its other entries took, or take them again when it is asked again, and
// max_wait is a property of one rule of one limit (canWait).
//
// A GroupPath belongs to one worker (its Dispatcher), is called only from
// that worker's loop inside its KeyTable::ReadGuard, and allocates nothing
// on a warm key (its vectors keep their capacity). now_ns is the daemon's
// monotonic clock, passed in.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "decision.h"
#include "holding_path.h"
#include "key_table.h"
#include "lease.h"
#include "lease_path.h"
#include "local_path.h"
#include "lookup.h"
#include "metrics.h"
#include "policy.h"
#include "question.h"
#include "rules.h"
#include "verdict.h"
#include "waiting.h"

namespace sluice {

class GroupPath {
 public:
  // `broker` is null without Redis.
  GroupPath(KeyTable& keys, MetricsShard& metrics, LeaseBroker* broker, Waiting& waiting,
            PolicyPath& policy, LocalPath& local, LeasePath& lease, HoldingPath& holding)
      : keys_(keys),
        metrics_(metrics),
        broker_(broker),
        waiting_(waiting),
        policy_(policy),
        local_(local),
        lease_(lease),
        holding_(holding) {}

  // Acquires `items` (each of cost > 0 for an acquire; any for acquire_all)
  // all or nothing on `rules`: a decision and mode per item into `answer`
  // (an unknown rule, a full key table or too many waiters fails it), or
  // the question waits (Outcome). For kWaitsReserved `answer` holds the
  // decision the reservation will answer, for the caller to count and
  // clear. Counts no decisions.
  Outcome acquire(const RuleSet& rules, std::span<const Item> items, int64_t now_ns,
                  const Asker& asker, Answer* answer);
  // acquire() of the one item `item`, whose rule the caller has found
  // (`configured`, one of `rules`): the same decision, without a group to
  // build for a rule of one limit.
  Outcome acquireOne(const RuleSet& rules, const Rule& configured, const Item& item,
                     int64_t now_ns, const Asker& asker, Answer* answer) {
    rules_ = &rules;
    // Only a question of one entry may wait for its units (above).
    if (broker_ == nullptr || configured.part_count == 0) {
      return acquireAlone(configured, item, now_ns, asker, answer);
    }
    return acquireParts(configured, item, now_ns, asker, answer);
  }
  // Whether the last acquireOne() of a rule of one limit spent from its
  // key's rate lease while Redis was unreachable (LeasePath::acquireOnRate):
  // a reservation it opened settles on the slice.
  bool spentOnRate() const { return alone_.verdict.taken.on_rate; }
  // The rule the i-th item of the last acquire() named.
  const Rule& configured(size_t i) const { return *groups_[i].configured; }
  // What an acquire of item.cost on a rule of parts would answer, spending
  // nothing; `mode` gets the reported part's mode.
  Decision peek(const RuleSet& rules, const Rule& configured, const Item& item, int64_t now_ns,
                Mode* mode);

 private:
  // A request item's entries.
  struct Group {
    const Rule* configured;  // the rule the item named
    std::string_view key;
    size_t first = 0;  // its first entry
    size_t count = 0;  // its entries: 1, or its rule's parts
  };
  // An entry: one rule (the configured rule or a part) of a request item.
  struct Entry {
    const Rule* rule = nullptr;  // the configured rule or a part
    Verdict verdict;
  };

  // A question of one entry (one item on a rule of one limit): its group
  // is its entry, which may wait for its units.
  Outcome acquireAlone(const Rule& configured, const Item& item, int64_t now_ns,
                       const Asker& asker, Answer* answer);
  // acquireOne() of a rule of parts: a group of one item.
  Outcome acquireParts(const Rule& configured, const Item& item, int64_t now_ns,
                       const Asker& asker, Answer* answer);
  // Decides the groups_ of `items` (found, one per item), all or nothing.
  Outcome acquireGroups(std::span<const Item> items, int64_t now_ns, const Asker& asker,
                        Answer* answer);
  // Decides the entries of one item (its group's), adding them to entries_.
  Outcome decideItem(const Group& group, const Item& item, int64_t now_ns, const Asker& asker);
  // Decides one entry on `rule` by the path its units come from, into
  // `verdict` (with nothing taken yet).
  inline Outcome decideEntry(const Rule& rule, const Item& item, int64_t now_ns,
                             const Asker& asker, Verdict* verdict);
  // Gives back what an entry took, and forgets it.
  void giveBack(Entry& entry, int64_t now_ns);
  void giveBackAll(int64_t now_ns);
  // Keeps what an entry took: slice units count as spent, a fallback spend
  // is noted for its debit.
  void keep(std::string_view key, const Entry& entry);
  // The decision and mode reported for a request item.
  Decision groupDecision(const Group& group, Mode* mode) const;
  // Whether a global rule decides on leases right now.
  bool leasing(const Rule& rule) const {
    return broker_ != nullptr && leasable(rule) && broker_->leasing();
  }
  Route route(const Rule& rule) const { return sluice::route(*rules_, rule); }

  KeyTable& keys_;
  MetricsShard& metrics_;
  LeaseBroker* broker_;
  Waiting& waiting_;
  PolicyPath& policy_;
  LocalPath& local_;
  LeasePath& lease_;
  HoldingPath& holding_;
  const RuleSet* rules_ = nullptr;  // the rules of the call under way
  std::vector<Entry> entries_;  // a group's
  Entry alone_;                 // acquireAlone's
  std::vector<Group> groups_;
  Asker in_group_;  // the asker of a group's entries: may not wait for units
  FreshState fresh_;  // a fresh key's state, for peek
};

}  // namespace sluice

// Rules: what the operator configured, as immutable values.
//
// A Rule names an algorithm and one or more Limits that must all pass. Rules
// are built once by the config loader (config.h) and shared read-only between
// all threads through std::shared_ptr<const RuleSet>; nothing here changes
// after construction, so any thread may read it without a lock.
//
// Units: periods in nanoseconds of the daemon's monotonic clock (period_ns),
// limits and bursts in units (the "cost" a request spends).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "algorithm.h"
#include "calendar.h"

namespace sluice {

// Where a rule's state lives: only on this node, or shared by the fleet
// through Redis leases.
enum class Scope { kLocal, kGlobal };

// What a global rule does while Redis is unreachable.
enum class RedisDownPolicy {
  kLocal,   // a local limiter at the node's share of the limit
  kOpen,    // allow, counted
  kClosed,  // deny with a retry hint
};

// One limit of a rule: `limit` units per `period_ns`.
//  - token_bucket, gcra: refill at limit/period, capacity `burst`.
//  - fixed_window, sliding_window, sliding_log: `limit` units per window of
//    `period_ns`; `burst` is unused and equals `limit`.
//  - concurrency: `limit` units held at once; `period_ns` is the longest a unit
//    may be held before it is released on its own (0: held until released).
//  - fixed_window with a calendar `window` (calendar.h): `limit` units per
//    day, week or month of `time_zone`; `period_ns` is the longest such a
//    window lasts (calendar::longestNs), for what only needs a bound.
struct Limit {
  int64_t limit = 0;
  int64_t period_ns = 0;
  int64_t burst = 0;
  calendar::Span window = calendar::Span::kNone;
  calendar::Zone time_zone = {};
};

// Keys of a rule that get their own limits (tiers such as "pro:", or one
// partner's key): the pattern is matched against the key's bytes.
struct Override {
  enum class Match {
    kKey,     // the key is exactly `pattern`
    kPrefix,  // the key starts with `pattern`
    kGlob,    // `pattern` with * (any run of bytes) and ? (any one byte)
  };
  Match match = Match::kKey;
  std::string pattern;
  std::vector<Limit> limits;  // replace the rule's limits; never empty
};

// Repeat offenders: a key denied `denials` times within `window_ns` of the
// first of them is blocked for `block_ns`: every acquire is denied, in mode
// "blocked", until the block ends (or an admin resets the key).
struct Penalty {
  int64_t denials = 0;
  int64_t window_ns = 0;
  int64_t block_ns = 0;
};

struct Rule {
  std::string name;
  Algorithm algorithm = Algorithm::kTokenBucket;
  std::vector<Limit> limits;  // never empty
  Scope scope = Scope::kLocal;
  RedisDownPolicy on_redis_down = RedisDownPolicy::kLocal;
  bool shadow = false;  // decide and count, always allow
  // Bounded waiting (token bucket and GCRA; canWait): how long an acquire
  // that does not say (max_wait_ms) may wait for its units; 0: it does not.
  int64_t max_wait_ns = 0;
  // Leaky-bucket shaping: burst 1, so units leave one interval apart.
  bool pace = false;
  // Rules of one-word algorithms (token bucket, GCRA, the windows) only,
  // each with as many limits as the rule, so that every key of the rule has
  // the same state layout; on a global rule, an override's limit is what the
  // fleet shares. Which one applies to a key is worked out
  // once, when its entry is created, and kept in the entry (entry.h,
  // decidingRule); a reload that changes them changes the rule's id.
  std::vector<Override> overrides;
  // On a global rule, only one that leases (entry.h, leasable): the block is shared
  // through Redis. A shadow rule never blocks.
  std::optional<Penalty> penalty;
  // reserve → settle (reservations.h): the most units one key may owe past
  // each limit on this node after a settle's debt; nullopt: the limit's own
  // limit (debtBound). A settle charges up to it; the rest is unpaid.
  std::optional<int64_t> max_debt;

  // Stable identity of this rule's state in the key table. Reloading a file
  // keeps the id of a rule whose definition did not change, so its keys keep
  // their state; a changed rule gets a new id and starts afresh. Ids of
  // configured rules fit kRuleIdMask; the ids RuleSet derives from them are
  // below (partId, fallbackShare).
  uint32_t id = 0;

  // Set by RuleSet for a rule with overrides: where its variants start.
  size_t first_variant = 0;
  // Set by RuleSet for a rule that splitsIntoParts: where its parts start
  // and how many it has (one per limit); 0 parts for any other rule.
  size_t first_part = 0;
  uint32_t part_count = 0;
};

// The most units one key of `rule` may owe past `limit` (Rule::max_debt).
inline int64_t debtBound(const Rule& rule, const Limit& limit) {
  return rule.max_debt.value_or(limit.limit);
}
// max_debt's largest value: the largest cost a settle may name.
constexpr int64_t kMaxDebt = 1'000'000'000;

// More limits than this on one rule is a mistake, not a policy (the config
// loader refuses more).
constexpr size_t kMaxLimitsPerRule = 8;

// Rule ids. A configured rule's id fits kRuleIdMask. RuleSet derives the
// ids of the rules it builds from it, so that they never collide with a
// configured rule's or with each other, and stay as stable as it:
//  - a part (RuleSet::parts) has kPartIdBit, its limit's index at
//    kPartIndexShift, and its rule's id (partId);
//  - a global rule's local share (RuleSet::fallbackShare), and a part's,
//    has the id of what it is the share of with kFallbackIdBit set.
// `id & kRuleIdMask` is the configured rule that a derived id belongs to.
constexpr uint32_t kFallbackIdBit = 0x8000'0000u;
constexpr uint32_t kPartIdBit = 0x4000'0000u;
constexpr int kPartIndexShift = 27;
constexpr uint32_t kRuleIdMask = (1u << kPartIndexShift) - 1;
static_assert(kMaxLimitsPerRule <= (kPartIdBit >> kPartIndexShift),
              "a part's index must fit between kPartIndexShift and kPartIdBit");

constexpr uint32_t partId(uint32_t rule_id, size_t index) {
  return kPartIdBit | static_cast<uint32_t>(index) << kPartIndexShift | (rule_id & kRuleIdMask);
}

// Whether RuleSet splits `rule` into parts: a global rule of several limits
// whose algorithm keeps one state word per limit and has a rate lease
// script (algorithm.h: token bucket, GCRA, the windows). Each part is a
// global rule of one of its limits, which leases from Redis on its own
// (entry.h, leasable); the dispatcher decides the rule on its parts together, all or
// nothing, and reports them as the limiter reports a rule's limits
// (dispatch.h).
bool splitsIntoParts(const Rule& rule);

// The Redis name of part `index` of the rule named `rule_name`: the name,
// the unit separator (0x1f) and the index in decimal. The config loader
// refuses control characters in names, so no configured rule has it.
std::string partName(std::string_view rule_name, size_t index);

// All rules of one configuration, looked up by name. Immutable.
class RuleSet {
 public:
  RuleSet() = default;
  // `fallback_nodes` is the number of nodes a global rule's limit is shared
  // by while Redis is unreachable (the last known N, or expected_nodes).
  explicit RuleSet(std::vector<Rule> rules, uint32_t fallback_nodes = 1);
  // The name index points into rules_, so a RuleSet is never copied.
  RuleSet(const RuleSet&) = delete;
  RuleSet& operator=(const RuleSet&) = delete;

  // Returns nullptr when no rule has this name.
  const Rule* find(std::string_view name) const;
  // Returns nullptr when no rule has this id.
  const Rule* findById(uint32_t id) const;
  const std::vector<Rule>& rules() const { return rules_; }
  // The node count the fallback shares divide by (at least 1).
  uint32_t fallbackNodes() const { return fallback_nodes_; }

  // The local share of a global rule or part (docs/design.md, "Fallback"): the
  // same rule with every limit and burst divided by the number of nodes (at
  // least 1), its overrides' too, scope local, its own id, and no penalty (a
  // global rule's penalty state stays in its slice entries, entry.h).
  // nullptr for a local rule.
  const Rule* fallbackShare(const Rule& rule) const;

  // The parts of a rule that splitsIntoParts, in the order of its limits
  // (empty for any other rule). Part i is the rule with limits = {limits[i]},
  // each override's i-th limit, no penalty and no max_wait, named
  // partName(name, i) (its Redis keys'), with id partId(id, i). Parts are
  // not found by name, are not in rules(), and have shares of their own;
  // findById finds both.
  std::span<const Rule> parts(const Rule& rule) const {
    return {parts_.data() + rule.first_part, rule.part_count};
  }
  // Every rule's parts.
  const std::vector<Rule>& parts() const { return parts_; }

  // Which override of `rule` decides `key`: 0 for none (the rule itself),
  // i + 1 for rule.overrides[i]. An exact key wins, then the longest
  // prefix, then the first glob in the order written. Costs a hash lookup
  // and a scan of the prefixes and globs: call it when a key's entry is
  // created, not per request.
  uint32_t matchOverride(const Rule& rule, std::string_view key) const;
  // The rule that decides keys of `rule` matched by override `which` (0:
  // `rule` itself): the rule with that override's limits.
  const Rule& variant(const Rule& rule, uint32_t which) const {
    return which == 0 ? rule : variants_[rule.first_variant + which - 1];
  }

 private:
  std::vector<Rule> rules_;
  uint32_t fallback_nodes_ = 1;
  std::vector<Rule> parts_;   // by rule in order, built once
  std::vector<Rule> shares_;  // one per global rule and part, built once
  std::vector<Rule> variants_;  // one per override, by rule in order
  // By rule id, of the rules with overrides: the exact keys (key ->
  // override index + 1), and the indices of the prefixes and globs.
  std::unordered_map<uint32_t, std::unordered_map<std::string_view, uint32_t>> exact_;
  std::unordered_map<uint32_t, std::vector<uint32_t>> scanned_;
  std::unordered_map<std::string_view, const Rule*> by_name_;
  std::unordered_map<uint32_t, const Rule*> by_id_;  // rules, parts and shares
};

using RuleSetPtr = std::shared_ptr<const RuleSet>;

// The longest any acquire may wait for its units (a rule's max_wait, a
// request's max_wait_ms).
constexpr int64_t kMaxWaitNs = 60'000'000'000;  // 60 s

// Whether acquires on `rule` may wait for their units: an algorithm that
// waits (algorithm.h: a bucket, as a window cannot be reserved ahead), local,
// or global with one limit (a rule that leases; the waiter asks Redis again
// when its units are due).
inline bool canWait(const Rule& rule) {
  return algorithmTraits(rule.algorithm).waits &&
         (rule.scope == Scope::kLocal || rule.limits.size() == 1);
}

// Whether `key` matches the glob `pattern`: * is any run of bytes, ? any one
// byte, everything else itself (no classes, no escapes).
bool globMatch(std::string_view pattern, std::string_view key);

// Bounds on a limit's period, checked by the config loader.
constexpr int64_t kMinPeriodNs = 1'000'000;                       // 1 ms
constexpr int64_t kMaxPeriodNs = 366LL * 24 * 3600 * 1'000'000'000;  // 366 days

std::string_view scopeName(Scope scope);
std::string_view redisDownPolicyName(RedisDownPolicy policy);

}  // namespace sluice

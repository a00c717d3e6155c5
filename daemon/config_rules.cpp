// ConfigRules: the [[rule]] key table and the reader of one rule (see
// config.h and rules.h).
//
// Every key a [[rule]] may have is a row of kRuleKeys: its type, default,
// one-line doc, which rules it applies to and the member that reads it.
// Rows are read in the table's order, so a row may rely on what the rows
// above it set (every check below knows the rule's algorithm, limits and
// scope). What an algorithm can do is asked of its row in algorithm.h, never
// listed here. conf/sluice.toml documents every key of the table, which
// ConfigTest.ShippedConfigDocumentsEveryRuleKey checks.
#include "config_rules.h"

#include <algorithm>
#include <array>
#include <set>
#include <vector>

namespace sluice::config_detail {
namespace {

constexpr std::array<Scope, 2> kScopes = {Scope::kLocal, Scope::kGlobal};
constexpr std::array<RedisDownPolicy, 3> kRedisDownPolicies = {
    RedisDownPolicy::kLocal, RedisDownPolicy::kOpen, RedisDownPolicy::kClosed};

// Names of algorithms that sluice writes another way, and how.
struct AlgorithmAlias {
  std::string_view name;
  std::string_view instead;
};
constexpr std::array<AlgorithmAlias, 1> kAlgorithmAliases = {{
    {"leaky_bucket",
     "a leaky bucket is algorithm = \"gcra\" with pace = true (one unit per interval, no "
     "burst); add max_wait = \"1s\" to queue requests rather than deny them"},
}};

// Reads a value written as one of `names`; returns its index. `aliases`
// point a known name of something else to how it is written here.
size_t choiceValue(const toml::node& node, const std::string& what,
                   std::span<const std::string_view> names,
                   std::span<const AlgorithmAlias> aliases = {}) {
  const std::string& text = stringValue(node, what, std::string(names.front()));
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == text) return i;
  }
  std::string message = what + " " + quote(text) + " is not one of " + joinQuoted(names);
  auto alias = std::find_if(aliases.begin(), aliases.end(),
                            [&](const AlgorithmAlias& a) { return a.name == text; });
  if (alias != aliases.end()) {
    message += "; " + std::string(alias->instead);
  } else if (auto suggestion = closest(text, names)) {
    message += "; did you mean " + quote(*suggestion) + "?";
  } else {
    message += "; write one of those";
  }
  refuse(node, std::move(message));
}

template <typename Enum, size_t N, typename NameOf>
std::vector<std::string_view> namesOf(const std::array<Enum, N>& values, NameOf name) {
  std::vector<std::string_view> names;
  for (Enum value : values) names.push_back(name(value));
  return names;
}

// --- which rules a key applies to ---------------------------------------------------
// Each returns why `key` does not apply to `rule` as read so far, ending in
// the fix, or nullopt when it applies.

using Refusing = std::optional<std::string> (*)(const Rule& rule, std::string_view key);

std::optional<std::string> globalOnly(const Rule& rule, std::string_view key) {
  if (rule.scope == Scope::kGlobal) return std::nullopt;
  return std::string(key) + " applies only to global rules; remove it, or set scope = \"global\"";
}

// max_wait and pace: bounded waiting, on local rules and on global rules
// that lease (one limit).
std::optional<std::string> waitingOnly(const Rule& rule, std::string_view key) {
  const std::string k(key);
  if (!algorithmTraits(rule.algorithm).waits) {
    return k + " applies only to " +
           algorithmsWhere([](const AlgorithmTraits& row) { return row.waits; }, "and") +
           " (a window cannot be reserved ahead), and this rule is " +
           std::string(algorithmName(rule.algorithm)) + "; remove " + k +
           ", or set algorithm = \"gcra\"";
  }
  if (rule.scope == Scope::kGlobal && rule.limits.size() != 1) {
    return k + " on a global rule needs one limit (a waiter asks Redis again when its units " +
           "are due, and a rule of several limits leases each on its own); remove " + k +
           ", or keep one limit";
  }
  return std::nullopt;
}

// Overrides keep every key of a rule in the same state layout: one word per
// limit.
std::optional<std::string> oneWordOnly(const Rule& rule, std::string_view) {
  if (algorithmTraits(rule.algorithm).state == StateShape::kOneWord) return std::nullopt;
  const std::string list = algorithmsWhere(
      [](const AlgorithmTraits& row) { return row.state == StateShape::kOneWord; }, "and");
  return "overrides apply to " + list + " rules, and this rule is " +
         std::string(algorithmName(rule.algorithm)) + "; remove overrides, or give the keys " +
         "their own rule";
}

// A global rule shares its blocks through its lease script (lease.h).
std::optional<std::string> sharedBlockOnly(const Rule& rule, std::string_view) {
  if (rule.scope != Scope::kGlobal ||
      (rule.limits.size() == 1 && hasRateLeaseScript(rule.algorithm))) {
    return std::nullopt;
  }
  return "penalty on a global rule needs one of one limit that leases from Redis (" +
         algorithmsWhere([](const AlgorithmTraits& row) { return row.leases_slice; }, "or") +
         ": a rule of several limits leases each limit on its own, with no one block to " +
         "share, and a global concurrency rule leases units that are held, not spent, and " +
         "counts no denials across the fleet); remove it, or set scope = \"local\"";
}

// time_zone: the zone of the rule's calendar windows.
bool hasCalendarWindow(const Rule& rule) {
  auto calendar = [](const Limit& limit) { return limit.window != calendar::Span::kNone; };
  return std::any_of(rule.limits.begin(), rule.limits.end(), calendar);
}

std::optional<std::string> calendarOnly(const Rule& rule, std::string_view) {
  if (hasCalendarWindow(rule)) return std::nullopt;
  return "time_zone applies to limits with a calendar window, and this rule has none; add "
         "window = \"month\" (or \"day\", \"week\") in place of period, or remove time_zone";
}

// max_debt: the bound of a settle's debt (reservations.h).
std::optional<std::string> settlingOnly(const Rule& rule, std::string_view key) {
  if (algorithmTraits(rule.algorithm).settles) return std::nullopt;
  const std::string k(key);
  return k + " bounds what a settle charges, which applies only to " +
         algorithmsWhere([](const AlgorithmTraits& row) { return row.settles; }, "and") +
         " rules, and this rule is " + std::string(algorithmName(rule.algorithm)) + "; remove " +
         k + ", or set algorithm = \"fixed_window\"";
}

// --- the key table ------------------------------------------------------------------

// How a key's value is written.
enum class RuleValue {
  kText,       // a string
  kChoice,     // one of a few names
  kCount,      // a whole number
  kDuration,   // "500ms", "10s", "1m", "1h", "1d"
  kFlag,       // true or false
  kLimits,     // an array of { limit, period, burst } tables
  kOverrides,  // an array of override tables
  kPenalty,    // a { denials, window, block } table
};

struct RuleKey {
  std::string_view key;
  RuleValue type;
  // The default as the manual writes it; "" when the key is required or its
  // absence means "none".
  std::string_view default_text = {};
  std::string_view doc = {};  // one line
  // Why the key does not apply to a rule (nullptr: it applies to every rule,
  // or its reader checks, as readLimit does burst with burstOnly).
  Refusing refusing = nullptr;
  // Reads the value (nullptr when the key is absent) into the rule; nullptr
  // for a key that another row's reader reads (limit, period and burst are
  // read with limits).
  void (RuleReader::*read)(const toml::node* node, Rule* rule) = nullptr;
  // For kDuration: the longest value, in nanoseconds (the shortest is "0").
  int64_t max_ns = 0;
};

// The keys of penalty = { ... }: all required, read in this order.
struct PenaltyKey {
  std::string_view key;
  RuleValue type;  // kCount or kDuration
  int64_t min;     // a count, or nanoseconds
  int64_t max;
  int64_t Penalty::*field;
  std::string_view example;
};
constexpr int64_t kDayNs = 24LL * 3600 * 1'000'000'000;
static_assert(366 * kDayNs == kMaxPeriodNs);
constexpr std::array<PenaltyKey, 3> kPenaltyKeys = {{
    {"denials", RuleValue::kCount, 1, 1'000'000, &Penalty::denials, "denials = 5"},
    {"window", RuleValue::kDuration, kMinPeriodNs, kDayNs, &Penalty::window_ns, "window = \"1m\""},
    {"block", RuleValue::kDuration, kMinPeriodNs, 366 * kDayNs, &Penalty::block_ns,
     "block = \"1m\""},
}};
constexpr std::array<std::string_view, 3> kPenaltyKeyNames = {"denials", "window", "block"};

constexpr std::array<RuleKey, 16> kRuleKeys = {{
    {.key = "name", .type = RuleValue::kText,
     .doc = "required; the name clients pick the rule by: unique, printable, at most 128 bytes",
     .read = &RuleReader::readName},
    {.key = "algorithm", .type = RuleValue::kChoice, .default_text = "\"token_bucket\"",
     .doc = "how the rule counts (algorithm.h): token_bucket, gcra, fixed_window, "
            "sliding_window, sliding_log or concurrency",
     .read = &RuleReader::readAlgorithm},
    {.key = "limit", .type = RuleValue::kCount,
     .doc = "units per period (concurrency: held at once), from 1 to the algorithm's maximum"},
    {.key = "period", .type = RuleValue::kDuration,
     .doc = "the limit's period, \"1ms\" to \"366d\"; concurrency: the longest hold (\"0\": none)"},
    {.key = "window", .type = RuleValue::kChoice,
     .doc = "instead of period, a calendar window of time_zone: day, week (from Monday) or "
            "month; fixed_window only"},
    {.key = "burst", .type = RuleValue::kCount, .default_text = "limit",
     .doc = "the units a fresh key may spend at once; algorithms with a burst only (burstOnly)"},
    {.key = "limits", .type = RuleValue::kLimits,
     .doc = "instead of limit/period/burst, several limits that must all pass",
     .read = &RuleReader::readLimits},
    {.key = "scope", .type = RuleValue::kChoice, .default_text = "\"local\"",
     .doc = "local: this node's own limit; global: one limit shared by the fleet (needs [redis])",
     .read = &RuleReader::readScope},
    {.key = "on_redis_down", .type = RuleValue::kChoice, .default_text = "\"local\"",
     .doc = "what a global rule does while Redis is unreachable: local, open or closed",
     .refusing = globalOnly, .read = &RuleReader::readOnRedisDown},
    {.key = "shadow", .type = RuleValue::kFlag, .default_text = "false",
     .doc = "decide and count, but always allow", .read = &RuleReader::readShadow},
    {.key = "max_wait", .type = RuleValue::kDuration, .default_text = "\"0\"",
     .doc = "how long an acquire may wait for its units; algorithms that wait only",
     .refusing = waitingOnly, .read = &RuleReader::readMaxWait,
     .max_ns = kMaxWaitNs},
    {.key = "pace", .type = RuleValue::kFlag, .default_text = "false",
     .doc = "one unit per interval, no burst (leaky-bucket shaping); algorithms that wait only",
     .refusing = waitingOnly, .read = &RuleReader::readPace},
    {.key = "overrides", .type = RuleValue::kOverrides,
     .doc = "keys with limits of their own, by key, prefix or glob; one-word algorithms only",
     .refusing = oneWordOnly, .read = &RuleReader::readOverrides},
    {.key = "penalty", .type = RuleValue::kPenalty,
     .doc = "block a key denied `denials` times within `window` for `block`",
     .refusing = sharedBlockOnly, .read = &RuleReader::readPenalty},
    {.key = "time_zone", .type = RuleValue::kText, .default_text = "\"UTC\"",
     .doc = "the IANA time zone whose calendar the limits' windows follow (\"Europe/Berlin\")",
     .refusing = calendarOnly, .read = &RuleReader::readTimeZone},
    {.key = "max_debt", .type = RuleValue::kCount, .default_text = "limit",
     .doc = "the most units one key may owe past its limit after settles; a settle charges up "
            "to it and answers the rest as unpaid; algorithms that settle only",
     .refusing = settlingOnly, .read = &RuleReader::readMaxDebt},
}};

constexpr std::array<std::string_view, kRuleKeys.size()> kRuleKeyNames = [] {
  std::array<std::string_view, kRuleKeys.size()> names{};
  for (size_t i = 0; i < kRuleKeys.size(); ++i) names[i] = kRuleKeys[i].key;
  return names;
}();

const RuleKey& ruleKey(std::string_view key) {
  for (const RuleKey& row : kRuleKeys) {
    if (row.key == key) return row;
  }
  std::abort();  // every caller names a row of the table
}

}  // namespace

RuleReader::RuleReader(const toml::table& table, size_t index, bool have_redis)
    : table_(table), have_redis_(have_redis) {
  std::optional<std::string> name = table["name"].value<std::string>();
  if (name && !name->empty() && name->size() <= kMaxRuleNameBytes) {
    prefix_ = "rule " + quote(*name) + ": ";
  } else {
    prefix_ = "rule #" + std::to_string(index + 1) + ": ";
  }
}

Rule RuleReader::read() {
  for (auto&& [key, node] : table_) {
    if (std::find(kRuleKeyNames.begin(), kRuleKeyNames.end(), key.str()) == kRuleKeyNames.end()) {
      refuseUnknownKey(key, prefix_, "[[rule]]", kRuleKeyNames);
    }
  }
  Rule rule;
  for (const RuleKey& row : kRuleKeys) {
    if (row.read == nullptr) continue;
    const toml::node* node = table_.get(row.key);
    if (node != nullptr && row.refusing != nullptr) {
      std::optional<std::string> why = row.refusing(rule, row.key);
      if (why) refuse(*node, prefix_ + *why);
    }
    (this->*row.read)(node, &rule);
  }
  return rule;
}

void RuleReader::readName(const toml::node* node, Rule* rule) {
  if (node == nullptr) {
    refuse(table_, prefix_ + "has no name; write name = \"api\" (a name clients use to pick "
                             "the rule)");
  }
  const std::string& name = stringValue(*node, prefix_ + "name", "name = \"api\"");
  if (name.empty()) refuse(*node, prefix_ + "name is empty; write a name, e.g. name = \"api\"");
  if (name.size() > kMaxRuleNameBytes) {
    refuse(*node, prefix_ + "name is " + std::to_string(name.size()) + " bytes long; write at " +
                      "most " + std::to_string(kMaxRuleNameBytes) + " bytes");
  }
  // (Part names, rules.h, rely on this: they hold a control character.)
  for (char c : name) {
    auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      refuse(*node, prefix_ + "name " + quote(name) + " contains a control character; write " +
                        "only printable characters");
    }
  }
  rule->name = name;
}

void RuleReader::readAlgorithm(const toml::node* node, Rule* rule) {
  if (node == nullptr) return;
  std::vector<std::string_view> names;
  for (const AlgorithmTraits& row : kAlgorithmTraits) names.push_back(row.name);
  rule->algorithm =
      kAlgorithmTraits[choiceValue(*node, prefix_ + "algorithm", names, kAlgorithmAliases)]
          .algorithm;
}

void RuleReader::readScope(const toml::node* node, Rule* rule) {
  if (node == nullptr) return;
  rule->scope = kScopes[choiceValue(*node, prefix_ + "scope", namesOf(kScopes, scopeName))];

  if (rule->scope == Scope::kGlobal && !have_redis_) {
    refuse(*node, prefix_ + "scope = \"global\" needs Redis, and this file has no [redis] " +
                      "section; add [redis] with url = \"redis://host:6379\", or set " +
                      "scope = \"local\"");
  }
}

void RuleReader::readOnRedisDown(const toml::node* node, Rule* rule) {
  if (node == nullptr) return;
  rule->on_redis_down = kRedisDownPolicies[choiceValue(
      *node, prefix_ + "on_redis_down", namesOf(kRedisDownPolicies, redisDownPolicyName))];
}

bool RuleReader::flagValue(const toml::node& node, std::string_view key) {
  const auto* value = node.as_boolean();
  if (value == nullptr) {
    const std::string k(key);
    refuse(node, prefix_ + k + " is " + std::string(describe(node)) + "; write " + k +
                     " = true or " + k + " = false, without quotes");
  }
  return value->get();
}

void RuleReader::readShadow(const toml::node* node, Rule* rule) {
  if (node != nullptr) rule->shadow = flagValue(*node, "shadow");
}

void RuleReader::readMaxWait(const toml::node* node, Rule* rule) {
  if (node == nullptr) return;
  const RuleKey& row = ruleKey("max_wait");
  rule->max_wait_ns = durationValue(*node, prefix_ + "max_wait", "max_wait = \"200ms\"");
  if (rule->max_wait_ns > row.max_ns) {
    refuse(*node, prefix_ + "max_wait " + quote(*node->value<std::string>()) +
                      " is above the maximum; write a wait from \"0\" to " +
                      quote(formatDuration(row.max_ns)));
  }
}

void RuleReader::readPace(const toml::node* node, Rule* rule) {
  if (node == nullptr) return;
  rule->pace = flagValue(*node, "pace");
  if (!rule->pace) return;
  bool has_burst = table_.get("burst") != nullptr;
  if (const toml::node* limits = table_.get("limits")) {
    for (const toml::node& element : *limits->as_array()) {
      has_burst = has_burst || element.as_table()->get("burst") != nullptr;
    }
  }
  if (has_burst) {
    refuse(*node, prefix_ + "pace = true lets one unit through per interval, with no " +
                      "burst; remove burst, or set pace = false");
  }
  for (Limit& limit : rule->limits) limit.burst = 1;
}

// max_debt = 0 .. kMaxDebt: a settle past the estimate charges at most this
// far past each limit.
void RuleReader::readMaxDebt(const toml::node* node, Rule* rule) {
  if (node == nullptr) return;
  const int64_t read = integerValue(*node, prefix_ + "max_debt", "max_debt = 100000");
  if (read < 0 || read > kMaxDebt) {
    refuse(*node, prefix_ + "max_debt " + std::to_string(read) + " is out of range; write a " +
                      "count of units from 0 (no debt: a settle never charges past the limit) " +
                      "to " + std::to_string(kMaxDebt));
  }
  rule->max_debt = read;
}

// time_zone = "Europe/Berlin": every calendar window of the rule (its
// limits' and its overrides') follows this zone's calendar.
void RuleReader::readTimeZone(const toml::node* node, Rule* rule) {
  if (node == nullptr) return;
  const std::string& name =
      stringValue(*node, prefix_ + "time_zone", "time_zone = \"Europe/Berlin\"");
  std::optional<calendar::Zone> zone = calendar::Zone::named(name);
  if (!zone) {
    refuse(*node, prefix_ + "time_zone " + quote(name) + " is not a zone of the system's " +
                      "time-zone database (tzdata, /usr/share/zoneinfo); write an IANA name " +
                      "such as \"Europe/Berlin\", \"America/New_York\" or \"UTC\"");
  }
  for (Limit& limit : rule->limits) limit.time_zone = *zone;
  for (Override& override : rule->overrides) {
    for (Limit& limit : override.limits) limit.time_zone = *zone;
  }
}

// penalty = { denials = 5, window = "1m", block = "10m" }
void RuleReader::readPenalty(const toml::node* node, Rule* rule) {
  if (node == nullptr) return;
  const std::string example = "penalty = { denials = 5, window = \"1m\", block = \"10m\" }";
  const toml::table* table = node->as_table();
  if (table == nullptr) {
    refuse(*node, prefix_ + "penalty is " + std::string(describe(*node)) + "; write " + example);
  }
  for (auto&& [key, value] : *table) {
    if (std::find(kPenaltyKeyNames.begin(), kPenaltyKeyNames.end(), key.str()) ==
        kPenaltyKeyNames.end()) {
      refuseUnknownKey(key, prefix_, "penalty", kPenaltyKeyNames);
    }
  }
  for (const PenaltyKey& row : kPenaltyKeys) {
    if (!table->contains(row.key)) {
      refuse(*node, prefix_ + "penalty needs " + std::string(row.key) + "; write " + example);
    }
  }
  Penalty penalty;
  for (const PenaltyKey& row : kPenaltyKeys) {
    const toml::node& value = *table->get(row.key);
    const std::string what = prefix_ + "penalty " + std::string(row.key);
    int64_t read = 0;
    if (row.type == RuleValue::kCount) {
      read = integerValue(value, what, row.example);
      if (read < row.min || read > row.max) {
        refuse(value, what + " " + std::to_string(read) + " is out of range; write a count " +
                          "from " + std::to_string(row.min) + " to " + std::to_string(row.max));
      }
    } else {
      read = durationValue(value, what, row.example);
      if (read < row.min || read > row.max) {
        refuse(value, what + " " + quote(*value.value<std::string>()) + " is out of range; " +
                          "write a duration from " + quote(formatDuration(row.min)) + " to " +
                          quote(formatDuration(row.max)));
      }
    }
    penalty.*row.field = read;
  }
  rule->penalty = penalty;
}

namespace {

// FNV-1a over the parts of a rule that define its state's meaning.
uint32_t fingerprint(const Rule& rule) {
  uint32_t hash = 2166136261u;
  auto mix = [&hash](std::string_view bytes) {
    for (char c : bytes) {
      hash ^= static_cast<unsigned char>(c);
      hash *= 16777619u;
    }
    hash ^= 0xff;  // field separator, so "ab"+"c" differs from "a"+"bc"
    hash *= 16777619u;
  };
  mix(rule.name);
  mix(algorithmName(rule.algorithm));
  for (const Limit& limit : rule.limits) {
    mix(std::to_string(limit.limit));
    mix(std::to_string(limit.period_ns));
    mix(std::to_string(limit.burst));
    if (limit.window != calendar::Span::kNone) {
      mix(calendar::spanName(limit.window));
      mix(limit.time_zone.name());
    }
  }
  mix(scopeName(rule.scope));
  mix(redisDownPolicyName(rule.on_redis_down));
  mix(rule.shadow ? "shadow" : "enforce");
  // A penalty adds words to every key; tuning its numbers keeps the keys
  // (a block under way keeps the end it was given).
  mix(rule.penalty ? "penalty" : "no penalty");
  for (const Override& override : rule.overrides) {
    mix(std::to_string(static_cast<int>(override.match)));
    mix(override.pattern);
    for (const Limit& limit : override.limits) {
      mix(std::to_string(limit.limit));
      mix(std::to_string(limit.period_ns));
      mix(std::to_string(limit.burst));
      if (limit.window != calendar::Span::kNone) mix(calendar::spanName(limit.window));
    }
  }
  return hash;
}

// Gives every rule its fingerprint as id, bumping collisions (and 0, which
// means "no id") deterministically: in name order, so that reordering the file
// does not change any id.
void assignIds(std::vector<Rule>* rules) {
  std::vector<Rule*> by_name;
  for (Rule& rule : *rules) by_name.push_back(&rule);
  std::sort(by_name.begin(), by_name.end(),
            [](const Rule* a, const Rule* b) { return a->name < b->name; });
  std::vector<uint32_t> taken;
  for (Rule* rule : by_name) {
    // Within kRuleIdMask: the ids above are the parts' and shares' (rules.h).
    uint32_t id = fingerprint(*rule) & kRuleIdMask;
    while (id == 0 || std::find(taken.begin(), taken.end(), id) != taken.end()) {
      id = (id + 1) & kRuleIdMask;
    }
    taken.push_back(id);
    rule->id = id;
  }
}

}  // namespace

std::string algorithmsWhere(bool (*has)(const AlgorithmTraits&), std::string_view last_joiner) {
  std::vector<std::string_view> names;
  for (const AlgorithmTraits& row : kAlgorithmTraits) {
    if (has(row)) names.push_back(row.name);
  }
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " " + std::string(last_joiner) + " " : ", ";
    out += names[i];
  }
  return out;
}

void assignRuleIds(std::vector<Rule>* rules) { assignIds(rules); }

std::vector<Rule> loadRules(const toml::node& node, bool have_redis) {
  const toml::array* array = node.as_array();
  if (array == nullptr || !array->is_array_of_tables()) {
    refuse(node, "rule is " + std::string(describe(node)) + "; write each rule as a [[rule]] " +
                     "section (two brackets) followed by its keys");
  }
  std::vector<Rule> rules;
  std::map<std::string, uint32_t> first_line;
  for (size_t i = 0; i < array->size(); ++i) {
    RuleReader reader(*array->get(i)->as_table(), i, have_redis);
    Rule rule = reader.read();
    const toml::node& name_node = *reader.nameNode();
    auto [it, inserted] = first_line.emplace(rule.name, name_node.source().begin.line);
    if (!inserted) {
      refuse(name_node, "rule " + quote(rule.name) + " is defined twice (first on line " +
                            std::to_string(it->second) + "); give each rule its own name");
    }
    rules.push_back(std::move(rule));
  }
  return rules;
}


}  // namespace sluice::config_detail

namespace sluice {

std::vector<RuleKeyInfo> ruleKeys() {
  std::vector<RuleKeyInfo> out;
  for (const config_detail::RuleKey& row : config_detail::kRuleKeys) {
    out.push_back({row.key, row.default_text, row.doc});
  }
  return out;
}

}  // namespace sluice

// ConfigLimits: a rule's limits and overrides, as read from its [[rule]]
// table (see config_rules.h).
#include "config_rules.h"

#include <algorithm>
#include <set>

namespace sluice::config_detail {

// A limit's burst (the rule's own, an element of limits, an override's).
std::optional<std::string> burstOnly(Algorithm algorithm) {
  if (algorithmTraits(algorithm).burst) return std::nullopt;
  return "burst applies only to " +
         algorithmsWhere([](const AlgorithmTraits& row) { return row.burst; }, "and") +
         ", and this rule is " + std::string(algorithmName(algorithm)) +
         "; remove burst, or set algorithm = \"token_bucket\"";
}

// overrides = [{ prefix = "pro:", limit = 1000 }, { key = "acme", ... }]
void RuleReader::readOverrides(const toml::node* node, Rule* rule) {
  if (node == nullptr) return;
  const std::string example = "overrides = [{ prefix = \"pro:\", limit = 1000 }]";
  const toml::array* array = node->as_array();
  if (array == nullptr) {
    refuse(*node, prefix_ + "overrides is " + std::string(describe(*node)) +
                      "; write an array of tables, e.g. " + example);
  }
  if (array->size() > kMaxOverridesPerRule) {
    refuse(*node, prefix_ + "has " + std::to_string(array->size()) + " overrides; write at " +
                      "most " + std::to_string(kMaxOverridesPerRule));
  }
  const std::string rule_prefix = prefix_;
  size_t scanned = 0;
  std::set<std::pair<Override::Match, std::string>> seen;
  for (const toml::node& element : *array) {
    const toml::table* entry = element.as_table();
    if (entry == nullptr) {
      refuse(element, rule_prefix + "an element of overrides is " +
                          std::string(describe(element)) + "; write a table, e.g. { prefix = " +
                          "\"pro:\", limit = 1000 }");
    }
    for (auto&& [key, value] : *entry) {
      if (std::find(kOverrideKeys.begin(), kOverrideKeys.end(), key.str()) ==
          kOverrideKeys.end()) {
        refuseUnknownKey(key, rule_prefix, "overrides", kOverrideKeys);
      }
    }
    Override override = readMatch(*entry, element, rule_prefix);
    prefix_ = rule_prefix + "override " + quote(override.pattern) + ": ";
    if (!seen.emplace(override.match, override.pattern).second) {
      refuse(element, prefix_ + "is given twice; keep one");
    }
    if (override.match != Override::Match::kKey && ++scanned > kMaxScannedOverridesPerRule) {
      refuse(element, prefix_ + "is one more prefix or glob than the " +
                          std::to_string(kMaxScannedOverridesPerRule) + " a rule may have; " +
                          "use exact keys, or fewer tiers");
    }
    override.limits = readOverrideLimits(*entry, element, *rule);
    rule->overrides.push_back(std::move(override));
  }
  prefix_ = rule_prefix;
}

// The key, prefix or glob of one override: exactly one of them.
Override RuleReader::readMatch(const toml::table& entry, const toml::node& where,
                               const std::string& rule_prefix) {
  Override override;
  const toml::node* found = nullptr;
  for (auto [name, match] : {std::pair{"key", Override::Match::kKey},
                             {"prefix", Override::Match::kPrefix},
                             {"glob", Override::Match::kGlob}}) {
    const toml::node* node = entry.get(name);
    if (node == nullptr) continue;
    if (found != nullptr) {
      refuse(*node, rule_prefix + "an override matches by one of key, prefix or glob; " +
                        "write only one of them");
    }
    found = node;
    override.match = match;
    override.pattern = stringValue(*node, rule_prefix + "override " + name,
                                   std::string(name) + " = \"pro:\"");
  }
  if (found == nullptr) {
    refuse(where, rule_prefix + "an override needs the keys it applies to: key = \"acme\" " +
                      "(exactly), prefix = \"pro:\" or glob = \"*-eu\" (* any run, ? one byte)");
  }
  if (override.match == Override::Match::kPrefix && override.pattern.empty()) {
    refuse(*found, rule_prefix + "an empty prefix matches every key; change the rule's own " +
                       "limit instead");
  }
  return override;
}

// An override's limits: as many as the rule has. With one, `limit` (and
// `burst`, `period`) may be given alone, the period defaulting to the
// rule's; with several, `limits = [...]` gives them all.
std::vector<Limit> RuleReader::readOverrideLimits(const toml::table& entry,
                                                  const toml::node& where, const Rule& rule) {
  std::vector<Limit> limits;
  if (const toml::node* node = entry.get("limits")) {
    const toml::array* array = node->as_array();
    if (array == nullptr || array->size() != rule.limits.size()) {
      refuse(*node, prefix_ + "limits must hold as many limits as the rule (" +
                        std::to_string(rule.limits.size()) + "), so that every key keeps " +
                        "the same state; write limits = [{ limit = ..., period = ... }, ...]");
    }
    for (const toml::node& element : *array) {
      const toml::table* table = element.as_table();
      if (table == nullptr) {
        refuse(element, prefix_ + "an element of limits is " + std::string(describe(element)) +
                            "; write a table, e.g. { limit = 1000, period = \"1m\" }");
      }
      limits.push_back(readLimit(*table, element, rule.algorithm));
    }
  } else {
    if (rule.limits.size() != 1) {
      refuse(where, prefix_ + "the rule has " + std::to_string(rule.limits.size()) +
                        " limits; give the override as many: limits = [{ limit = ..., " +
                        "period = ... }, ...]");
    }
    limits.push_back(readLimit(entry, where, rule.algorithm, rule.limits.front().period_ns));
    // Without a period or window of its own, it counts in the rule's window.
    if (!entry.contains("period") && !entry.contains("window")) {
      limits.back().window = rule.limits.front().window;
    }
  }
  if (rule.pace) {
    bool has_burst = entry.contains("burst");
    if (const toml::node* node = entry.get("limits")) {
      for (const toml::node& element : *node->as_array()) {
        has_burst = has_burst || element.as_table()->contains("burst");
      }
    }
    if (has_burst) {
      refuse(where, prefix_ + "the rule has pace = true, one unit per interval with no " +
                        "burst; remove burst");
    }
    for (Limit& limit : limits) limit.burst = 1;
  }
  return limits;
}

void RuleReader::readLimits(const toml::node* limits, Rule* rule) {
  if (limits != nullptr) {
    for (std::string_view single : kLimitKeys) {
      if (table_.get(single) != nullptr) {
        refuse(*table_.get(single),
               prefix_ + std::string(single) + " and limits = [...] cannot both be given; " +
                   "write either limit/period/burst for one limit, or a { limit, period } " +
                   "table for each limit inside limits, not both");
      }
    }
    const toml::array* array = limits->as_array();
    if (array == nullptr) {
      refuse(*limits, prefix_ + "limits is " + std::string(describe(*limits)) +
                          "; write an array of tables, e.g. limits = [{ limit = 100, period = " +
                          "\"1m\" }, { limit = 20, period = \"10s\" }]");
    }
    if (array->empty()) {
      refuse(*limits, prefix_ + "limits is empty; write at least one { limit = 100, " +
                          "period = \"1m\" }");
    }
    if (array->size() > kMaxLimitsPerRule) {
      refuse(*limits, prefix_ + "has " + std::to_string(array->size()) + " limits; write at " +
                          "most " + std::to_string(kMaxLimitsPerRule));
    }
    if (algorithmTraits(rule->algorithm).holds && array->size() > 1) {
      refuse(*limits, prefix_ + "a concurrency rule holds one limit; write one { limit = 4 } " +
                          "or split it into several rules");
    }
    for (const toml::node& element : *array) {
      const toml::table* entry = element.as_table();
      if (entry == nullptr) {
        refuse(element, prefix_ + "an element of limits is " + std::string(describe(element)) +
                            "; write a table, e.g. { limit = 100, period = \"1m\" }");
      }
      for (auto&& [key, node] : *entry) {
        if (std::find(kLimitKeys.begin(), kLimitKeys.end(), key.str()) == kLimitKeys.end()) {
          refuseUnknownKey(key, prefix_, "limits", kLimitKeys);
        }
      }
      Limit limit = readLimit(*entry, element, rule->algorithm);
      for (const Limit& earlier : rule->limits) {
        if (earlier.period_ns == limit.period_ns && earlier.window == limit.window) {
          const std::string what =
              limit.window == calendar::Span::kNone
                  ? "period " + quote(formatDuration(limit.period_ns))
                  : "window " + quote(calendar::spanName(limit.window));
          refuse(element, prefix_ + "two limits have the " + what + "; keep the stricter " +
                              "one or give them different periods");
        }
      }
      rule->limits.push_back(limit);
    }
    return;
  }
  if (table_.get("limit") == nullptr) {
    refuse(table_, prefix_ + "has no limit; write limit = 100 and period = \"1m\", or " +
                       "limits = [{ limit = 100, period = \"1m\" }]");
  }
  rule->limits.push_back(readLimit(table_, table_, rule->algorithm));
}

// window = "month": a calendar window (calendar.h) in place of a period.
void RuleReader::readWindow(const toml::node& node, const toml::node* period_node,
                            Algorithm algorithm, Limit* limit) {
  if (algorithm != Algorithm::kFixedWindow) {
    refuse(node, prefix_ + "window applies only to fixed_window (a calendar window is a " +
                     "fixed window that follows the calendar), and this rule is " +
                     std::string(algorithmName(algorithm)) + "; remove window, or set " +
                     "algorithm = \"fixed_window\"");
  }
  if (period_node != nullptr) {
    refuse(node, prefix_ + "window and period cannot both be given; write window = " +
                     "\"month\" for a calendar window, or period = \"30d\" for a fixed length");
  }
  constexpr std::array<std::string_view, 3> kNames = {"day", "week", "month"};
  const std::string& text = stringValue(node, prefix_ + "window", "window = \"month\"");
  const calendar::Span span = calendar::spanNamed(text);
  if (span == calendar::Span::kNone) {
    std::string message = prefix_ + "window " + quote(text) + " is not one of " +
                          joinQuoted(kNames) + "; ";
    if (auto suggestion = closest(text, kNames)) {
      message += "did you mean " + quote(*suggestion) + "?";
    } else {
      message += std::string("write one of those (with time_zone = \"Europe/Berlin\" for a ") +
                 "local calendar), or period = \"" + text + "\" for a fixed length";
    }
    refuse(node, std::move(message));
  }
  limit->window = span;
  limit->period_ns = calendar::longestNs(span);
}

// One limit from `table` (the rule itself, an element of limits, or an
// override); errors about a missing key point at `where`. A missing period
// is `default_period_ns` when one is given (an override's, the rule's).
Limit RuleReader::readLimit(const toml::table& table, const toml::node& where,
                            Algorithm algorithm, std::optional<int64_t> default_period_ns) {
  const std::string alg = std::string(algorithmName(algorithm));
  const int64_t most = maxLimit(algorithm);
  Limit limit;
  const toml::node* limit_node = table.get("limit");
  if (limit_node == nullptr) {
    refuse(where, prefix_ + "a limit needs limit = <units>, e.g. limit = 100");
  }
  limit.limit = integerValue(*limit_node, prefix_ + "limit", "limit = 100");
  if (limit.limit < 1) {
    refuse(*limit_node, prefix_ + "limit " + std::to_string(limit.limit) + " is below 1; write " +
                            "a limit of at least 1");
  }
  if (limit.limit > most) {
    std::string message = prefix_ + "limit " + std::to_string(limit.limit) + " is above " +
                           std::to_string(most) + ", the most a " + alg + " rule can hold; " +
                           "write a limit up to " + std::to_string(most);
    const std::string_view larger = algorithmTraits(algorithm).for_larger_limits;
    if (!larger.empty()) message += ", or use algorithm = \"" + std::string(larger) + "\"";
    refuse(*limit_node, std::move(message));
  }

  const toml::node* period_node = table.get("period");
  if (const toml::node* window_node = table.get("window")) {
    readWindow(*window_node, period_node, algorithm, &limit);
  } else if (period_node == nullptr && default_period_ns) {
    limit.period_ns = *default_period_ns;
  } else if (period_node == nullptr) {
    if (!algorithmTraits(algorithm).holds) {
      refuse(where, prefix_ + "limit " + std::to_string(limit.limit) + " has no period; write " +
                        "e.g. period = \"1m\" (" + std::string(kDurationHint.substr(6)) + ")");
    }
  } else {
    limit.period_ns = durationValue(*period_node, prefix_ + "period", "period = \"1m\"");
    bool none_allowed = algorithmTraits(algorithm).holds && limit.period_ns == 0;
    if (!none_allowed && (limit.period_ns < kMinPeriodNs || limit.period_ns > kMaxPeriodNs)) {
      std::string message = prefix_ + "period " + quote(*period_node->value<std::string>()) +
                            " is " + (limit.period_ns < kMinPeriodNs ? "below " : "above ") +
                            "the range; write a period from " +
                            quote(formatDuration(kMinPeriodNs)) + " to " +
                            quote(formatDuration(kMaxPeriodNs));
      if (algorithmTraits(algorithm).holds) message += ", or \"0\" for no longest hold";
      refuse(*period_node, std::move(message));
    }
  }

  limit.burst = limit.limit;
  if (const toml::node* burst_node = table.get("burst")) {
    std::optional<std::string> why = burstOnly(algorithm);
    if (why) refuse(*burst_node, prefix_ + *why);
    limit.burst = integerValue(*burst_node, prefix_ + "burst", "burst = 20");
    if (limit.burst < 1 || limit.burst > most) {
      refuse(*burst_node, prefix_ + "burst " + std::to_string(limit.burst) + " is out of " +
                              "range; write a burst from 1 to " + std::to_string(most));
    }
    // The lease scripts (lua/token_bucket.lua, lua/gcra.lua) refuse a state
    // spanning more than 2^50 us: burst * interval, interval = ceil(period_us
    // / limit) with the period in whole ms, as they compute it.
    constexpr int64_t kMaxSpanUs = int64_t{1} << 50;
    const int64_t period_us = (limit.period_ns + 999'999) / 1'000'000 * 1'000;
    const int64_t interval_us = (period_us + limit.limit - 1) / limit.limit;
    if (interval_us > 0 && limit.burst > kMaxSpanUs / interval_us) {
      refuse(*burst_node, prefix_ + "burst " + std::to_string(limit.burst) + " at " +
                              std::to_string(limit.limit) + " per " +
                              quote(formatDuration(limit.period_ns)) +
                              " takes longer than 2^50 us (about 35 years) to refill; write " +
                              "a burst up to " + std::to_string(kMaxSpanUs / interval_us) +
                              ", or a shorter period");
    }
  }
  return limit;
}

}  // namespace sluice::config_detail

// ConfigRules: the reader of one [[rule]] table (internal to config_rules.cpp,
// which holds the rule key table, and config_limits.cpp, which reads a
// rule's limits and overrides). See config_values.h for the error policy.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config_values.h"

namespace sluice::config_detail {

constexpr size_t kMaxRuleNameBytes = 128;
// Overrides per rule; those matched by prefix or glob are scanned when a
// key's entry is created, so they are fewer.
constexpr size_t kMaxOverridesPerRule = 100'000;
constexpr size_t kMaxScannedOverridesPerRule = 256;

// The keys of one limit (a rule's own, an element of limits, an override's)
// and of an override.
constexpr std::array<std::string_view, 4> kLimitKeys = {"limit", "period", "burst", "window"};
constexpr std::array<std::string_view, 8> kOverrideKeys = {
    "key", "prefix", "glob", "limit", "period", "burst", "window", "limits"};

// The names of the algorithms whose row passes `has`, joined as prose:
// "token_bucket and gcra", "a, b, c or d".
std::string algorithmsWhere(bool (*has)(const AlgorithmTraits&), std::string_view last_joiner);

// Why a limit of an `algorithm` rule may not have a burst, ending in the
// fix; nullopt when it may (its row in algorithm.h has one).
std::optional<std::string> burstOnly(Algorithm algorithm);

// Reads one [[rule]] table through the rule key table (config_rules.cpp).
// Messages name the rule by its name once that is known to be usable, and
// by its place in the file before.
class RuleReader {
 public:
  RuleReader(const toml::table& table, size_t index, bool have_redis);

  // The rule, every key read in the order of the table.
  Rule read();

  const toml::node* nameNode() const { return table_.get("name"); }

  // The readers of the rows of the table (config_rules.cpp; limits and
  // overrides: config_limits.cpp). `node` is nullptr when the key is absent.
  void readName(const toml::node* node, Rule* rule);
  void readAlgorithm(const toml::node* node, Rule* rule);
  void readLimits(const toml::node* node, Rule* rule);
  void readScope(const toml::node* node, Rule* rule);
  void readOnRedisDown(const toml::node* node, Rule* rule);
  void readShadow(const toml::node* node, Rule* rule);
  void readMaxWait(const toml::node* node, Rule* rule);
  void readPace(const toml::node* node, Rule* rule);
  void readOverrides(const toml::node* node, Rule* rule);
  void readPenalty(const toml::node* node, Rule* rule);
  void readTimeZone(const toml::node* node, Rule* rule);
  void readMaxDebt(const toml::node* node, Rule* rule);

 private:
  bool flagValue(const toml::node& node, std::string_view key);
  Override readMatch(const toml::table& entry, const toml::node& where,
                     const std::string& rule_prefix);
  std::vector<Limit> readOverrideLimits(const toml::table& entry, const toml::node& where,
                                        const Rule& rule);
  void readWindow(const toml::node& node, const toml::node* period_node, Algorithm algorithm,
                  Limit* limit);
  Limit readLimit(const toml::table& table, const toml::node& where, Algorithm algorithm,
                  std::optional<int64_t> default_period_ns = std::nullopt);

  const toml::table& table_;
  const bool have_redis_;
  std::string prefix_;
};

}  // namespace sluice::config_detail

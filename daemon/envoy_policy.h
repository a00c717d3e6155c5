// EnvoyPolicy: envoyproxy/ratelimit's YAML configuration, read unchanged,
// as sluice rules and the tree that finds a request descriptor's rule.
//
// A YAML file holds one `domain` and nested `descriptors`; each descriptor
// has a `key`, an optional `value` (exact, or a prefix ending in `*`), and
// optionally a `rate_limit` (`unit` second, minute, hour or day and
// `requests_per_unit`), `unlimited`, `shadow_mode`, `name`, `replaces`
// (names of limits this one stands in for) and nested `descriptors`.
// `detailed_metric` is accepted (sluice counts per rule already).
//
// Each descriptor with a rate_limit becomes one Rule, named
// "<domain>/<key>[=<value>]/..." along its path (the rule's per-rule
// metrics are its descriptor's). The key a request spends under it is the
// request descriptor's values, joined by kEnvoyKeySeparator. Every domain,
// key and value in a name or a key is written by appendEnvoyNamePart, so
// that a name or key reads back to one path: two descriptors, of one domain
// or of two, never share a rule, nor two request descriptors a key.
//
// Matching follows the reference server: at each entry of a request
// descriptor, a child with that key and that exact value wins, then one
// whose value is a prefix ending in `*`, then one with that key and no
// value; the limit is that of the node the last entry lands on. A request
// descriptor nothing matches is unknown: answered OK, nothing spent.
//
// Errors name the file, line and column, and the fix, like the TOML ones:
// "path:line:col: what is wrong; what to write".
//
// Pure values and functions; an EnvoyPolicy is immutable once read and is
// shared between threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rules.h"

namespace sluice {

// Between the values of a descriptor in the key it spends (a control
// character, which the YAML reader refuses in values).
constexpr char kEnvoyKeySeparator = '\x1f';

// Marks the rules of Envoy's limit overrides ("<domain>/=<n>/<unit>",
// envoy_rls.h): a part with no key, which no descriptor's rule has (a
// descriptor's key is never empty), and which the config refuses in a
// [[rule]] name when [envoy] is on.
constexpr std::string_view kEnvoyOverrideMark = "/=";

// Appends `text` to `out` with %, /, = and control characters written as
// %XX (percent-encoding), so that those characters in `out` are only ever
// the name's or key's own separators.
void appendEnvoyNamePart(std::string* out, std::string_view text);

// Envoy's RateLimitResponse.RateLimit.Unit numbers.
enum class EnvoyUnit : int { kUnknown = 0, kSecond = 1, kMinute = 2, kHour = 3, kDay = 4 };
int64_t envoyUnitNs(EnvoyUnit unit);

// What a configured descriptor does to the requests that land on it.
struct EnvoyLimit {
  std::string rule;  // the sluice rule's name; "" when unlimited
  std::string name;  // the YAML `name` (what `replaces` refers to); may be ""
  std::vector<std::string> replaces;
  bool unlimited = false;
  bool shadow = false;
  uint32_t requests_per_unit = 0;
  EnvoyUnit unit = EnvoyUnit::kUnknown;
};

// One node of a domain's descriptor tree.
struct EnvoyNode {
  std::string key;
  std::string value;     // "" with has_value false: any value
  bool has_value = false;
  bool wildcard = false;  // value is a prefix (written with a trailing `*`)
  int limit = -1;         // index into EnvoyPolicy::limits, -1 for none
  std::vector<EnvoyNode> children;
};

struct EnvoyDomain {
  std::string name;
  std::vector<EnvoyNode> descriptors;
};

// How the rules of the YAML files are built.
struct EnvoyRuleOptions {
  Scope scope = Scope::kGlobal;
  Algorithm algorithm = Algorithm::kFixedWindow;
  RedisDownPolicy on_redis_down = RedisDownPolicy::kLocal;  // global rules only
};

// One entry of a request descriptor.
struct EnvoyEntry {
  std::string_view key;
  std::string_view value;
};

class EnvoyPolicy {
 public:
  std::vector<EnvoyDomain> domains;
  std::vector<EnvoyLimit> limits;
  std::vector<Rule> rules;  // one per limited descriptor, ids not yet assigned

  // The limit a request descriptor lands on; nullptr when none (unknown,
  // or a node without rate_limit or unlimited).
  const EnvoyLimit* match(std::string_view domain, std::span<const EnvoyEntry> entries) const;
};

// The key a request descriptor spends: its values, each written by
// appendEnvoyNamePart, joined by kEnvoyKeySeparator.
std::string envoyKey(std::span<const EnvoyEntry> entries);

// Reads one YAML file's text into `policy` (several files add up; a domain
// may appear in one file only). `source_name` names it in errors. Returns
// "" or the error, "path:line:col: what; fix".
std::string readEnvoyYaml(std::string_view text, const std::string& source_name,
                          const EnvoyRuleOptions& options, EnvoyPolicy* policy);

// Reads every file matching `pattern` (a glob, e.g. "/etc/sluice/ratelimit/*.yaml")
// in name order. A pattern that matches nothing is an error (a typo would
// otherwise leave Envoy unlimited). Returns "" or the error.
std::string readEnvoyFiles(const std::string& pattern, const EnvoyRuleOptions& options,
                           EnvoyPolicy* policy);

using EnvoyPolicyPtr = std::shared_ptr<const EnvoyPolicy>;

}  // namespace sluice

// ConfigValues: what the config loader's files share (internal to config.*):
// the refusal that carries a problem to the top, the message helpers, and the
// readers of one TOML value each.
//
// The loader is split by what it reads: config.cpp (the file and its
// sections), config_options.cpp (the option table of [daemon], [limits],
// [keys], [access] and [redis]), config_redis.cpp (Redis urls, addresses and
// modes), config_rules.cpp (the [[rule]] key table), config_limits.cpp (a
// rule's limits and overrides) and config_values.cpp (these helpers).
//
// Error policy: the first problem found is thrown as a Refusal (position plus
// message) and caught by loadConfigString, which turns it into the
// "path:line:col: ..." error of config.h. Every reader here either returns a
// valid value or refuses with what to write instead.
//
// Units: durations as nanoseconds unless a name says otherwise.
// Pure functions; any thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <sys/un.h>

#include <toml++/toml.h>

#include "config.h"

namespace sluice::config_detail {

// --- errors and messages ----------------------------------------------------------

struct Refusal {
  toml::source_position at;  // line 0: the position is unknown
  std::string message;
};

[[noreturn]] void refuse(const toml::node& where, std::string message);
[[noreturn]] void refuse(const toml::key& where, std::string message);

// "path:line:col: " (or "path: " when the position is unknown).
std::string locate(const std::string& source_name, const toml::source_position& at);

// `text` in double quotes, as the operator would write it in TOML.
std::string quote(std::string_view text);

// "a string", "an integer", ...: what the operator wrote, for messages.
std::string_view describe(const toml::node& node);

// The known name closest to `unknown`, when one is close enough to be a typo
// (or the same word with a suffix, like `period_ms` for `period`).
std::optional<std::string_view> closest(std::string_view unknown,
                                        std::span<const std::string_view> known);

// `"a", "b", "c"` and `a, b, c`.
std::string joinQuoted(std::span<const std::string_view> names);
std::string joinPlain(std::span<const std::string_view> names);

// Refuses `key`, unknown in `where` ("[[rule]]", "penalty", ...), with the
// closest known key or the list of them; `subject` prefixes the message
// ("rule \"api\": ").
[[noreturn]] void refuseUnknownKey(const toml::key& key, const std::string& subject,
                                   std::string_view where, std::span<const std::string_view> known);

// --- durations, modes, numbers ---------------------------------------------------

inline constexpr std::string_view kDurationHint =
    "write a number with a unit: \"500ms\", \"10s\", \"1m\", \"1h\", \"1d\"";

// The shortest way to write `ns` (a whole number of milliseconds) in the file.
std::string formatDuration(int64_t ns);

// `mode` as four octal digits, e.g. "0660".
std::string formatMode(int64_t mode);

bool allDigits(std::string_view text);

// sun_path holds the path and its terminating NUL.
inline constexpr int64_t kMaxSocketPathBytes = sizeof(sockaddr_un::sun_path) - 1;

// --- readers of one value ---------------------------------------------------------
// `what` names the value in the message ("[daemon] workers", "rule \"api\":
// limit"); `example` shows a correct line.

const toml::table& asSection(const toml::node& node, std::string_view name);
int64_t integerValue(const toml::node& node, const std::string& what, std::string_view example);
const std::string& stringValue(const toml::node& node, const std::string& what,
                               std::string_view example);
// Nanoseconds of a duration value.
int64_t durationValue(const toml::node& node, const std::string& what, std::string_view example);
// Permission bits, "0660" or 0o660.
int64_t fileModeValue(const toml::node& node, const std::string& what, std::string_view example);

// --- sections and their cross-checks ----------------------------------------------

// Positions of the options the file gave, for checks that involve two.
using Given = std::map<std::string_view, const toml::node*>;

// The section an option key belongs to; nullopt for no option of the table.
std::optional<std::string_view> sectionOfOption(std::string_view key);

// Applies the options of one section; returns where each was given.
Given loadSection(const toml::table& table, std::string_view section, Config* config);

// A frame must have room for the longest key plus the rest of a request.
void checkFrameHoldsKey(const LimitsConfig& limits, const Given& given);

// A hint for a TOML syntax error on `line` (the line the error is on), when
// the line shows what was meant: `socket_mode = 0660` is an octal mode that
// TOML reads as a decimal with a leading zero. nullopt for no hint.
std::optional<std::string> tomlErrorHint(std::string_view line);

// Fills the address fields of `redis` from `url`; returns what is wrong with
// the url ("" when it is fine).
std::string parseRedisUrl(std::string_view url, RedisConfig* redis);

// `url` with its password replaced by "***", fit for a log line.
std::string redactPassword(std::string_view url);

inline constexpr std::string_view kRedisUrlHint =
    "write e.g. url = \"redis://127.0.0.1:6379\", \"redis://:password@host:6379/0\" or "
    "\"unix:///run/redis/redis.sock\"";

// [redis] names the Redis one way (standalone, Sentinel or Cluster); checks
// that the options given belong to that mode and fills in the parsed fields.
void checkRedisMode(const Given& given, RedisConfig* redis);

// The [[rule]] array: every rule read and checked (ids: assignRuleIds).
std::vector<Rule> loadRules(const toml::node& node, bool have_redis);
// Gives every rule of the file its id (rules.h), the same for the same
// definition across reloads.
void assignRuleIds(std::vector<Rule>* rules);

// The [envoy] section (config_envoy.cpp), its YAML files read.
EnvoyConfig loadEnvoy(const toml::table& table, bool have_redis);

}  // namespace sluice::config_detail

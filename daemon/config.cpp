// Config: parses the TOML file with toml++ and validates it against the option
// table below (the only place an option of [daemon], [limits], [keys] or
// [redis] is declared) and the [[rule]] schema.
//
// Error policy: a bad file is an expected failure, so the public functions
// return it as a value. Inside this file the first problem found is thrown as
// a Refusal (position plus message) and caught at the top, which keeps every
// check a single line instead of an error path through each caller.
#include "config.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <sstream>
#include <vector>

#include <arpa/inet.h>
#include <grp.h>
#include <pwd.h>
#include <sys/un.h>

#include <toml++/toml.h>

namespace sluice {
namespace {

// --- errors -------------------------------------------------------------------

struct Refusal {
  toml::source_position at;  // line 0: the position is unknown
  std::string message;
};

[[noreturn]] void refuse(const toml::node& where, std::string message) {
  throw Refusal{where.source().begin, std::move(message)};
}

[[noreturn]] void refuse(const toml::key& where, std::string message) {
  throw Refusal{where.source().begin, std::move(message)};
}

std::string locate(const std::string& source_name, const toml::source_position& at) {
  if (at.line == 0) return source_name + ": ";
  return source_name + ":" + std::to_string(at.line) + ":" + std::to_string(at.column) + ": ";
}

// `text` in double quotes, as the operator would write it in TOML.
std::string quote(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (byte < 0x20 || byte == 0x7f) {
      static constexpr char kHex[] = "0123456789ABCDEF";
      out += "\\u00";
      out += kHex[byte >> 4];
      out += kHex[byte & 0xf];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// "a string", "an integer", ...: what the operator wrote, for messages.
std::string_view describe(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a floating-point number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    case toml::node_type::none: break;
  }
  return "nothing";
}

// Edit distance, for "did you mean" on misspelled keys.
size_t editDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The known name closest to `unknown`, when one is close enough to be a typo
// (or the same word with a suffix, like `period_ms` for `period`).
std::optional<std::string_view> closest(std::string_view unknown,
                                        std::span<const std::string_view> known) {
  std::optional<std::string_view> best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (std::string_view candidate : known) {
    size_t distance = editDistance(unknown, candidate);
    bool prefix = candidate.size() >= 4 &&
                  (unknown.starts_with(candidate) || candidate.starts_with(unknown));
    bool typo = distance <= std::max<size_t>(2, candidate.size() / 4);
    if ((prefix || typo) && distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

std::string joinQuoted(std::span<const std::string_view> names) {
  std::string out;
  for (std::string_view name : names) {
    if (!out.empty()) out += ", ";
    out += quote(name);
  }
  return out;
}

std::string joinPlain(std::span<const std::string_view> names) {
  std::string out;
  for (std::string_view name : names) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

// --- durations ----------------------------------------------------------------

struct DurationUnit {
  std::string_view suffix;
  int64_t ns;
};
// Longest suffix first where one is a prefix of another ("ms" before "m").
constexpr std::array<DurationUnit, 5> kDurationUnits = {{
    {"ms", 1'000'000},
    {"s", 1'000'000'000},
    {"m", 60LL * 1'000'000'000},
    {"h", 3600LL * 1'000'000'000},
    {"d", 86400LL * 1'000'000'000},
}};

constexpr std::string_view kDurationHint =
    "write a number with a unit: \"500ms\", \"10s\", \"1m\", \"1h\", \"1d\"";

// The shortest way to write `ns` (a whole number of milliseconds) in the file.
std::string formatDuration(int64_t ns) {
  if (ns == 0) return "0";
  for (auto unit = kDurationUnits.rbegin(); unit != kDurationUnits.rend(); ++unit) {
    if (ns % unit->ns == 0) return std::to_string(ns / unit->ns) + std::string(unit->suffix);
  }
  return std::to_string(ns) + "ns";
}

// --- the option table -----------------------------------------------------------

enum class OptionType {
  kCount,       // integer, min..max
  kBytes,       // integer number of bytes, min..max
  kDuration,    // duration string; min..max and the field are milliseconds
  kFileMode,    // permission bits, "0660" or 0o660; min..max
  kSocketPath,  // absolute path of at most max bytes
  kChoice,      // one of `choices`
  kRedisUrl,    // redis://[user:password@]host[:port][/db] or unix:///path
  kText,        // printable string of min..max bytes
  kListenAddress,  // "" or a numeric "HOST:PORT" (parseListenAddress)
  kUsers,       // array of user names or uids
  kGroups,      // array of group names or gids
  kGroup,       // one group name or gid, or "" for none (stored as -1)
  kAddresses,   // array of "host:port" (parseRedisAddress), at most max of them
};

constexpr std::array<std::string_view, 7> kLogLevels = {"trace", "debug", "info", "warn",
                                                        "error", "critical", "off"};

struct Option {
  std::string_view section;
  std::string_view key;
  OptionType type;
  int64_t min = 0;
  int64_t max = 0;
  std::span<const std::string_view> choices = {};
  std::string_view doc;
  // Integer-valued options (kCount, kBytes, kDuration, kFileMode, kGroup) use
  // get_int and set_int; string-valued ones (kSocketPath, kChoice, kRedisUrl,
  // kText, kListenAddress) get_str and set_str; lists of ids (kUsers,
  // kGroups) get_ids and set_ids; lists of strings (kAddresses) get_list and
  // set_list. The default is read from a default-constructed Config (config.h).
  int64_t (*get_int)(const Config&) = nullptr;
  void (*set_int)(Config&, int64_t) = nullptr;
  const std::string& (*get_str)(const Config&) = nullptr;
  void (*set_str)(Config&, std::string) = nullptr;
  const std::vector<uint32_t>& (*get_ids)(const Config&) = nullptr;
  void (*set_ids)(Config&, std::vector<uint32_t>) = nullptr;
  const std::vector<std::string>& (*get_list)(const Config&) = nullptr;
  void (*set_list)(Config&, std::vector<std::string>) = nullptr;
};

#define SLUICE_INT_FIELD(field)                                                 \
  .get_int = [](const Config& c) -> int64_t { return static_cast<int64_t>(c.field); }, \
  .set_int = [](Config& c, int64_t v) { c.field = static_cast<decltype(c.field)>(v); }
#define SLUICE_STR_FIELD(field)                                          \
  .get_str = [](const Config& c) -> const std::string& { return c.field; }, \
  .set_str = [](Config& c, std::string v) { c.field = std::move(v); }
#define SLUICE_IDS_FIELD(field)                                                      \
  .get_ids = [](const Config& c) -> const std::vector<uint32_t>& { return c.field; }, \
  .set_ids = [](Config& c, std::vector<uint32_t> v) { c.field = std::move(v); }
#define SLUICE_LIST_FIELD(field)                                                        \
  .get_list = [](const Config& c) -> const std::vector<std::string>& { return c.field; }, \
  .set_list = [](Config& c, std::vector<std::string> v) { c.field = std::move(v); }

constexpr int64_t kMs = 1;
constexpr int64_t kSecond = 1000 * kMs;
constexpr int64_t kMinute = 60 * kSecond;
constexpr int64_t kHour = 60 * kMinute;
constexpr int64_t kDay = 24 * kHour;
// Room in a frame for everything of an acquire request but its key.
constexpr int64_t kFrameOverheadBytes = 256;
// sun_path holds the path and its terminating NUL.
constexpr int64_t kMaxSocketPathBytes = sizeof(sockaddr_un::sun_path) - 1;

// Sentinel mode: the longest master name and the most sentinels.
constexpr int64_t kMaxSentinelMasterBytes = 128;
constexpr int64_t kMaxSentinels = 16;
// Cluster mode: the most seed nodes.
constexpr int64_t kMaxClusterNodes = 64;

const std::array<Option, 38> kOptions = {{
    {.section = "daemon", .key = "socket", .type = OptionType::kSocketPath,
     .max = kMaxSocketPathBytes, .doc = "path of the Unix socket clients connect to",
     SLUICE_STR_FIELD(daemon.socket_path)},
    {.section = "daemon", .key = "socket_mode", .type = OptionType::kFileMode, .min = 0,
     .max = 0777, .doc = "permission bits of the socket, in octal",
     SLUICE_INT_FIELD(daemon.socket_mode)},
    {.section = "daemon", .key = "workers", .type = OptionType::kCount, .min = 0, .max = 1024,
     .doc = "worker threads (event loops); 0: one per CPU core",
     SLUICE_INT_FIELD(daemon.workers)},
    {.section = "daemon", .key = "log_level", .type = OptionType::kChoice, .choices = kLogLevels,
     .doc = "least severe level logged to stderr", SLUICE_STR_FIELD(daemon.log_level)},
    {.section = "daemon", .key = "metrics", .type = OptionType::kListenAddress,
     .doc = "address of the Prometheus endpoint (GET /metrics); \"\" serves none",
     SLUICE_STR_FIELD(daemon.metrics)},

    {.section = "limits", .key = "max_connections", .type = OptionType::kCount, .min = 1,
     .max = 1'000'000, .doc = "client connections open at once; more are refused",
     SLUICE_INT_FIELD(limits.max_connections)},
    {.section = "limits", .key = "max_frame_bytes", .type = OptionType::kBytes, .min = 1024,
     .max = 64LL << 20, .doc = "largest request frame; a larger one closes the connection",
     SLUICE_INT_FIELD(limits.max_frame_bytes)},
    {.section = "limits", .key = "max_key_bytes", .type = OptionType::kBytes, .min = 1,
     .max = 1LL << 20, .doc = "longest key of a request", SLUICE_INT_FIELD(limits.max_key_bytes)},
    {.section = "limits", .key = "max_depth", .type = OptionType::kCount, .min = 4, .max = 128,
     .doc = "deepest nesting of arrays and maps in a frame", SLUICE_INT_FIELD(limits.max_depth)},
    {.section = "limits", .key = "max_items", .type = OptionType::kCount, .min = 16,
     .max = 1'000'000,
     .doc = "elements of one array or entries of one map in a frame; also the most items of one acquire_all",
     SLUICE_INT_FIELD(limits.max_items)},
    {.section = "limits", .key = "max_output_bytes", .type = OptionType::kBytes, .min = 4096,
     .max = 1LL << 30, .doc = "unsent output of one connection before the client is disconnected",
     SLUICE_INT_FIELD(limits.max_output_bytes)},
    {.section = "limits", .key = "idle_timeout", .type = OptionType::kDuration, .min = 0,
     .max = kDay, .doc = "a connection silent this long is closed; 0: never",
     SLUICE_INT_FIELD(limits.idle_timeout_ms)},
    {.section = "limits", .key = "partial_frame_timeout", .type = OptionType::kDuration,
     .min = 100 * kMs, .max = 10 * kMinute,
     .doc = "a frame not complete this long after its first byte closes the connection",
     SLUICE_INT_FIELD(limits.partial_frame_timeout_ms)},

    {.section = "keys", .key = "max_keys", .type = OptionType::kCount, .min = 1,
     .max = 1'000'000'000,
     .doc = "(rule, key) entries held at once; a new key beyond evicts a least recently used one",
     SLUICE_INT_FIELD(keys.max_keys)},
    {.section = "keys", .key = "max_memory", .type = OptionType::kBytes, .min = 1 << 20,
     .max = 1LL << 40,
     .doc = "bytes of entries (keys and state) held at once; long keys reach it before max_keys",
     SLUICE_INT_FIELD(keys.max_memory)},
    {.section = "keys", .key = "sweep_interval", .type = OptionType::kDuration, .min = 100 * kMs,
     .max = kHour, .doc = "how often keys whose state is back to fresh are dropped",
     SLUICE_INT_FIELD(keys.sweep_interval_ms)},

    {.section = "access", .key = "users", .type = OptionType::kUsers,
     .doc = "users (names or uids) who may use the daemon besides root and its own user; "
            "with groups also empty, anyone the socket's mode lets in",
     SLUICE_IDS_FIELD(access.users)},
    {.section = "access", .key = "groups", .type = OptionType::kGroups,
     .doc = "groups (names or gids) whose members may use the daemon",
     SLUICE_IDS_FIELD(access.groups)},
    {.section = "access", .key = "admin_group", .type = OptionType::kGroup,
     .doc = "group (name or gid) whose members may call admin methods (reload, reset) besides root "
            "and the daemon's user; \"\": none",
     SLUICE_INT_FIELD(access.admin_group)},
    {.section = "access", .key = "max_connections_per_user", .type = OptionType::kCount, .min = 0,
     .max = 1'000'000, .doc = "client connections one uid holds open at once; more are refused; 0: no cap",
     SLUICE_INT_FIELD(access.max_connections_per_user)},

    {.section = "redis", .key = "url", .type = OptionType::kRedisUrl,
     .doc = "where Redis is: redis://[user:password@]host[:port][/db] or unix:///path",
     SLUICE_STR_FIELD(redis->url)},
    {.section = "redis", .key = "sentinel_master", .type = OptionType::kText, .min = 0,
     .max = kMaxSentinelMasterBytes,
     .doc = "Sentinel mode: the master's name as the sentinels know it; \"\": standalone (url)",
     SLUICE_STR_FIELD(redis->sentinel_master)},
    {.section = "redis", .key = "sentinels", .type = OptionType::kAddresses,
     .max = kMaxSentinels, .doc = "Sentinel mode: the sentinels to ask, \"host:port\" each",
     SLUICE_LIST_FIELD(redis->sentinels)},
    {.section = "redis", .key = "sentinel_username", .type = OptionType::kText, .min = 0,
     .max = 256, .doc = "Sentinel mode: the ACL user the sentinels are authenticated as",
     SLUICE_STR_FIELD(redis->sentinel_username)},
    {.section = "redis", .key = "sentinel_password", .type = OptionType::kText, .min = 0,
     .max = 512, .doc = "Sentinel mode: the sentinels' password; \"\": no AUTH",
     SLUICE_STR_FIELD(redis->sentinel_password)},
    {.section = "redis", .key = "cluster_nodes", .type = OptionType::kAddresses,
     .max = kMaxClusterNodes,
     .doc = "Cluster mode: nodes to load the slot map from, \"host:port\" each",
     SLUICE_LIST_FIELD(redis->cluster_nodes)},
    {.section = "redis", .key = "username", .type = OptionType::kText, .min = 0, .max = 256,
     .doc = "Sentinel and Cluster mode: the ACL user the masters are authenticated as (with "
            "url: in the url)",
     SLUICE_STR_FIELD(redis->username)},
    {.section = "redis", .key = "password", .type = OptionType::kText, .min = 0, .max = 512,
     .doc = "Sentinel and Cluster mode: the masters' password (with url: in the url)",
     SLUICE_STR_FIELD(redis->password)},
    {.section = "redis", .key = "db", .type = OptionType::kCount, .min = 0, .max = 999'999'999,
     .doc = "Sentinel mode: the master's database (with url: after the /)",
     SLUICE_INT_FIELD(redis->db)},
    {.section = "redis", .key = "key_prefix", .type = OptionType::kText, .min = 0, .max = 64,
     .doc = "prefix of every Redis key sluice writes", SLUICE_STR_FIELD(redis->key_prefix)},
    {.section = "redis", .key = "node_id", .type = OptionType::kText, .min = 0, .max = 256,
     .doc = "this daemon's name in the members set; \"\": <hostname>:<pid>",
     SLUICE_STR_FIELD(redis->node_id)},
    {.section = "redis", .key = "expected_nodes", .type = OptionType::kCount, .min = 1,
     .max = 100'000, .doc = "nodes assumed to share global limits until heartbeats say otherwise",
     SLUICE_INT_FIELD(redis->expected_nodes)},
    {.section = "redis", .key = "lease_timeout", .type = OptionType::kDuration, .min = 1 * kMs,
     .max = 10 * kSecond,
     .doc = "longest wait for Redis to answer a lease; a cold key waits at most this long",
     SLUICE_INT_FIELD(redis->lease_timeout_ms)},
    {.section = "redis", .key = "lease_interval", .type = OptionType::kDuration, .min = 1 * kMs,
     .max = 60 * kSecond,
     .doc = "a lease covers about this much of a key's demand: longer means fewer Redis calls, "
            "more units held per node",
     SLUICE_INT_FIELD(redis->lease_interval_ms)},
    {.section = "redis", .key = "lease_ttl", .type = OptionType::kDuration, .min = 300 * kMs,
     .max = kHour,
     .doc = "a node's units of a global concurrency rule live this long in Redis unless renewed "
            "(every third of it): a crashed node's units come free after it",
     SLUICE_INT_FIELD(redis->lease_ttl_ms)},
    {.section = "redis", .key = "health_interval", .type = OptionType::kDuration,
     .min = 10 * kMs, .max = 10 * kSecond, .doc = "how often Redis is sent a PING",
     SLUICE_INT_FIELD(redis->health_interval_ms)},
    {.section = "redis", .key = "health_timeout", .type = OptionType::kDuration, .min = 10 * kMs,
     .max = 10 * kSecond,
     .doc = "a PING or heartbeat unanswered this long marks Redis down",
     SLUICE_INT_FIELD(redis->health_timeout_ms)},
    {.section = "redis", .key = "heartbeat_interval", .type = OptionType::kDuration,
     .min = 100 * kMs, .max = kMinute,
     .doc = "how often this node renews its membership; it expires after 3 intervals",
     SLUICE_INT_FIELD(redis->heartbeat_interval_ms)},
}};

#undef SLUICE_INT_FIELD
#undef SLUICE_STR_FIELD
#undef SLUICE_IDS_FIELD
#undef SLUICE_LIST_FIELD

constexpr std::array<std::string_view, 6> kSections = {"daemon", "limits", "keys",
                                                       "access", "redis", "rule"};

// A Config holding every default, including those of the optional [redis].
const Config& defaults() {
  static const Config config = [] {
    Config c;
    c.redis.emplace();
    return c;
  }();
  return config;
}

std::vector<std::string_view> keysOf(std::string_view section) {
  std::vector<std::string_view> keys;
  for (const Option& option : kOptions) {
    if (option.section == section) keys.push_back(option.key);
  }
  return keys;
}

std::string formatMode(int64_t mode) {
  std::ostringstream out;
  out << std::setfill('0') << std::setw(4) << std::oct << mode;
  return out.str();
}

// The default as the operator would write it, e.g. `"5m"`, `4096`, `"0660"`.
std::string defaultText(const Option& option) {
  const Config& c = defaults();
  switch (option.type) {
    case OptionType::kCount:
    case OptionType::kBytes: return std::to_string(option.get_int(c));
    case OptionType::kDuration: return quote(formatDuration(option.get_int(c) * 1'000'000));
    case OptionType::kFileMode: return quote(formatMode(option.get_int(c)));
    case OptionType::kSocketPath:
    case OptionType::kChoice:
    case OptionType::kRedisUrl:
    case OptionType::kText:
    case OptionType::kListenAddress: return quote(option.get_str(c));
    case OptionType::kUsers:
    case OptionType::kGroups: {
      std::string text = "[";
      for (uint32_t id : option.get_ids(c)) text += (text.size() > 1 ? ", " : "") + std::to_string(id);
      return text + "]";
    }
    case OptionType::kGroup: {
      int64_t gid = option.get_int(c);
      return gid < 0 ? quote("") : std::to_string(gid);
    }
    case OptionType::kAddresses: {
      std::string text = "[";
      for (const std::string& item : option.get_list(c)) text += (text.size() > 1 ? ", " : "") + quote(item);
      return text + "]";
    }
  }
  return "";
}

// --- redis urls -----------------------------------------------------------------

constexpr std::string_view kRedisUrlHint =
    "write e.g. url = \"redis://127.0.0.1:6379\", \"redis://:password@host:6379/0\" or "
    "\"unix:///run/redis/redis.sock\"";

// Percent-decodes `text`; nullopt on a malformed escape.
std::optional<std::string> percentDecode(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    if (i + 2 >= text.size()) return std::nullopt;
    auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    int high = hex(text[i + 1]);
    int low = hex(text[i + 2]);
    if (high < 0 || low < 0) return std::nullopt;
    out += static_cast<char>(high * 16 + low);
    i += 2;
  }
  return out;
}

// `url` with its password replaced by "***", fit for a log line.
std::string redactPassword(std::string_view url) {
  size_t scheme_end = url.find("://");
  size_t at = url.rfind('@');
  if (scheme_end == std::string_view::npos || at == std::string_view::npos || at < scheme_end) {
    return std::string(url);
  }
  size_t colon = url.find(':', scheme_end + 3);
  if (colon == std::string_view::npos || colon > at) return std::string(url);
  return std::string(url.substr(0, colon + 1)) + "***" + std::string(url.substr(at));
}

bool allDigits(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(),
                                      [](char c) { return c >= '0' && c <= '9'; });
}

// Fills the address fields of `redis` from `url`; returns what is wrong with
// the url ("" when it is fine).
std::string parseRedisUrl(std::string_view url, RedisConfig* redis) {
  redis->host.clear();
  redis->unix_path.clear();
  redis->username.clear();
  redis->password.clear();
  redis->port = 0;
  redis->db = 0;
  if (url.starts_with("unix://")) {
    std::string_view path = url.substr(7);
    if (!path.starts_with("/")) return "the path after unix:// must be absolute (three slashes)";
    if (path.find_first_of("?#") != std::string_view::npos) {
      return "unix:// urls take no options after the path";
    }
    if (path.size() > static_cast<size_t>(kMaxSocketPathBytes)) {
      return "the socket path is longer than " + std::to_string(kMaxSocketPathBytes) + " bytes";
    }
    redis->unix_path = std::string(path);
    return "";
  }
  if (url.starts_with("rediss://")) return "TLS (rediss://) is not supported yet";
  if (!url.starts_with("redis://")) return "it must start with redis:// or unix://";
  std::string_view rest = url.substr(8);
  if (rest.find_first_of("?#") != std::string_view::npos) return "query options are not supported";

  size_t at = rest.rfind('@');
  if (at != std::string_view::npos) {
    std::string_view userinfo = rest.substr(0, at);
    rest = rest.substr(at + 1);
    size_t colon = userinfo.find(':');
    if (colon == std::string_view::npos) {
      return "a password goes after a colon: redis://:password@host or "
             "redis://user:password@host";
    }
    auto username = percentDecode(userinfo.substr(0, colon));
    auto password = percentDecode(userinfo.substr(colon + 1));
    if (!username || !password) return "a % in the user or password must start an escape like %40";
    if (password->empty()) return "the password after the colon is empty";
    redis->username = std::move(*username);
    redis->password = std::move(*password);
  }

  std::string_view path;
  if (size_t slash = rest.find('/'); slash != std::string_view::npos) {
    path = rest.substr(slash + 1);
    rest = rest.substr(0, slash);
  }
  std::string_view port;
  if (rest.starts_with("[")) {
    size_t close = rest.find(']');
    if (close == std::string_view::npos) return "an IPv6 address needs its closing ]";
    redis->host = std::string(rest.substr(1, close - 1));
    rest = rest.substr(close + 1);
    if (!rest.empty() && !rest.starts_with(":")) return "a port after ] starts with a colon";
    if (!rest.empty()) port = rest.substr(1);
    if (redis->host.empty() || redis->host.find_first_not_of("0123456789abcdefABCDEF:.") !=
                                   std::string::npos) {
      return "the address in [ ] is not an IPv6 address";
    }
  } else {
    size_t colon = rest.find(':');
    redis->host = std::string(rest.substr(0, colon));
    if (colon != std::string_view::npos) port = rest.substr(colon + 1);
    if (redis->host.empty()) return "the host is missing";
    if (redis->host.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                      "0123456789.-_") != std::string::npos) {
      return "the host " + quote(redis->host) + " is not a host name or address";
    }
  }
  if (port.empty() && rest.find(':') != std::string_view::npos) return "the port is missing";
  redis->port = 6379;
  if (!port.empty()) {
    if (!allDigits(port) || port.size() > 5 || std::stoi(std::string(port)) < 1 ||
        std::stoi(std::string(port)) > 65535) {
      return "the port " + quote(port) + " is not a number from 1 to 65535";
    }
    redis->port = static_cast<uint16_t>(std::stoi(std::string(port)));
  }
  if (!path.empty()) {
    if (!allDigits(path) || path.size() > 9) {
      return "the database " + quote(path) + " after the / is not a number";
    }
    redis->db = static_cast<uint32_t>(std::stoul(std::string(path)));
  }
  return "";
}

// --- sections -------------------------------------------------------------------

const toml::table& asSection(const toml::node& node, std::string_view name) {
  if (const toml::table* table = node.as_table()) return *table;
  refuse(node, std::string(name) + " is " + std::string(describe(node)) +
                   "; it must be a section: write [" + std::string(name) +
                   "] on a line of its own and its options below");
}

// `subject` prefixes the message ("rule \"api\": "); `where` names the table.
void refuseUnknownKey(const toml::key& key, const std::string& subject, std::string_view where,
                      std::span<const std::string_view> known) {
  std::string message = subject + "unknown key " + quote(key.str()) + " in " + std::string(where);
  if (auto suggestion = closest(key.str(), known)) {
    message += "; did you mean " + quote(*suggestion) + "?";
  } else {
    message += "; remove it (the keys of " + std::string(where) + " are " + joinPlain(known) + ")";
  }
  refuse(key, std::move(message));
}

int64_t integerValue(const toml::node& node, const std::string& what, std::string_view example) {
  if (const auto* value = node.as_integer()) return value->get();
  std::string fix = "write a whole number";
  if (node.is_string() || node.is_floating_point()) fix += " without quotes or decimals";
  refuse(node, what + " is " + std::string(describe(node)) + "; " + fix + ", e.g. " +
                   std::string(example));
}

const std::string& stringValue(const toml::node& node, const std::string& what,
                               std::string_view example) {
  if (const auto* value = node.as_string()) return value->get();
  refuse(node, what + " is " + std::string(describe(node)) + "; write a string in double " +
                   "quotes, e.g. " + std::string(example));
}

// Nanoseconds of a duration value; refuses anything else.
int64_t durationValue(const toml::node& node, const std::string& what, std::string_view example) {
  const auto* value = node.as_string();
  if (value == nullptr) {
    refuse(node, what + " is " + std::string(describe(node)) +
                     "; write a duration in quotes with a unit, e.g. " + std::string(example));
  }
  auto ns = parseDurationNs(value->get());
  if (!ns) refuse(node, what + " " + quote(value->get()) + " is not a duration; " +
                            std::string(kDurationHint));
  return *ns;
}

int64_t fileModeValue(const toml::node& node, const std::string& what, std::string_view example) {
  if (const auto* value = node.as_integer()) {
    if (!!(value->flags() & toml::value_flags::format_as_octal)) return value->get();
    refuse(node, what + " is the decimal number " + std::to_string(value->get()) +
                     "; write permission bits in octal, in quotes: " + std::string(example));
  }
  if (const auto* value = node.as_string()) {
    const std::string& text = value->get();
    bool octal = text.find_first_not_of("01234567") == std::string::npos;
    if (!text.empty() && text.size() <= 4 && octal) {
      return std::stoll(text, nullptr, 8);
    }
    refuse(node, what + " " + quote(text) + " is not an octal mode; write up to four octal " +
                     "digits, e.g. " + std::string(example));
  }
  refuse(node, what + " is " + std::string(describe(node)) +
                   "; write permission bits in octal, in quotes: " + std::string(example));
}

// --- users and groups -----------------------------------------------------------

// Largest uid or gid; (uid_t)-1 means "none" to the kernel.
constexpr int64_t kMaxId = 0xfffffffeLL;

// The uid of user `name`, or the gid of group `name`, from the system's
// databases (NSS); nullopt when there is no such name.
std::optional<uint32_t> lookupId(const std::string& name, bool group) {
  std::vector<char> buffer(16 * 1024);
  for (;;) {
    int rc = 0;
    std::optional<uint32_t> id;
    if (group) {
      struct group entry{};
      struct group* found = nullptr;
      rc = getgrnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found);
      if (rc == 0 && found != nullptr) id = found->gr_gid;
    } else {
      passwd entry{};
      passwd* found = nullptr;
      rc = getpwnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found);
      if (rc == 0 && found != nullptr) id = found->pw_uid;
    }
    if (rc != ERANGE || buffer.size() >= (1u << 24)) return id;
    buffer.resize(buffer.size() * 2);
  }
}

// One user or group as written: a name known to this machine or a number.
uint32_t idValue(const toml::node& node, const std::string& what, bool group) {
  const char* kind = group ? "group" : "user";
  const char* database = group ? "/etc/group" : "/etc/passwd";
  if (const auto* number = node.as_integer()) {
    if (number->get() < 0 || number->get() > kMaxId) {
      refuse(node, what + " has " + std::to_string(number->get()) + ", which is not a " +
                       (group ? "gid" : "uid") + "; write a number from 0 to " +
                       std::to_string(kMaxId) + " or a " + kind + " name");
    }
    return static_cast<uint32_t>(number->get());
  }
  if (const auto* name = node.as_string()) {
    if (auto id = lookupId(name->get(), group)) return *id;
    refuse(node, what + ": there is no " + kind + " " + quote(name->get()) + " on this machine; " +
                     "write a name from " + database + " (getent " +
                     (group ? "group" : "passwd") + ") or a number without quotes");
  }
  refuse(node, what + " has " + std::string(describe(node)) + "; write a " + kind +
                   " name in quotes or a number, e.g. " + (group ? "\"sluice\"" : "\"www-data\""));
}

// Positions of the options the file gave, for checks that involve two.
using Given = std::map<std::string_view, const toml::node*>;

void applyOption(const Option& option, const toml::node& node, Config* config) {
  const std::string what = "[" + std::string(option.section) + "] " + std::string(option.key);
  const std::string example = std::string(option.key) + " = " + defaultText(option);
  auto checkBounds = [&](int64_t value, const std::string& written, auto format) {
    if (value >= option.min && value <= option.max) return;
    refuse(node, what + " = " + written + " is " +
                     (value < option.min ? "below the minimum " + format(option.min)
                                         : "above the maximum " + format(option.max)) +
                     "; write a value from " + format(option.min) + " to " + format(option.max));
  };
  auto number = [](int64_t v) { return std::to_string(v); };
  switch (option.type) {
    case OptionType::kCount:
    case OptionType::kBytes: {
      int64_t value = integerValue(node, what, example);
      checkBounds(value, std::to_string(value), number);
      option.set_int(*config, value);
      return;
    }
    case OptionType::kDuration: {
      int64_t ns = durationValue(node, what, example);
      auto duration = [](int64_t ms) { return quote(formatDuration(ms * 1'000'000)); };
      int64_t ms = ns / 1'000'000;
      checkBounds(ms, quote(*node.value<std::string>()), duration);
      option.set_int(*config, ms);
      return;
    }
    case OptionType::kFileMode: {
      int64_t mode = fileModeValue(node, what, example);
      checkBounds(mode, quote(formatMode(mode)), [](int64_t m) { return quote(formatMode(m)); });
      option.set_int(*config, mode);
      return;
    }
    case OptionType::kSocketPath: {
      const std::string& path = stringValue(node, what, example);
      if (!path.starts_with("/")) {
        refuse(node, what + " " + quote(path) + " is not an absolute path; write one starting " +
                         "with /, e.g. " + example);
      }
      if (static_cast<int64_t>(path.size()) > option.max) {
        refuse(node, what + " is " + std::to_string(path.size()) + " bytes long; a Unix socket " +
                         "path holds at most " + std::to_string(option.max) +
                         " bytes: choose a shorter path");
      }
      option.set_str(*config, path);
      return;
    }
    case OptionType::kChoice: {
      const std::string& value = stringValue(node, what, example);
      if (std::find(option.choices.begin(), option.choices.end(), value) == option.choices.end()) {
        refuse(node, what + " " + quote(value) + " is not one of " + joinQuoted(option.choices) +
                         "; write e.g. " + example);
      }
      option.set_str(*config, value);
      return;
    }
    case OptionType::kRedisUrl: {
      const std::string& url = stringValue(node, what, example);
      RedisConfig scratch;
      std::string problem = parseRedisUrl(url, &scratch);
      if (!problem.empty()) {
        refuse(node, what + " " + quote(redactPassword(url)) + " is not a Redis url: " + problem +
                         "; " + std::string(kRedisUrlHint));
      }
      option.set_str(*config, url);
      return;
    }
    case OptionType::kText: {
      const std::string& text = stringValue(node, what, example);
      if (static_cast<int64_t>(text.size()) > option.max) {
        refuse(node, what + " is " + std::to_string(text.size()) + " bytes long; write at most " +
                         std::to_string(option.max) + " bytes");
      }
      if (std::any_of(text.begin(), text.end(),
                      [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; })) {
        refuse(node, what + " has a control character; write printable text, e.g. " + example);
      }
      option.set_str(*config, text);
      return;
    }
    case OptionType::kUsers:
    case OptionType::kGroups: {
      bool group = option.type == OptionType::kGroups;
      const toml::array* list = node.as_array();
      if (list == nullptr) {
        refuse(node, what + " is " + std::string(describe(node)) + "; write a list in brackets, " +
                         "e.g. " + std::string(option.key) +
                         (group ? " = [\"sluice\", 1001]" : " = [\"www-data\", 1001]"));
      }
      std::vector<uint32_t> ids;
      for (const toml::node& item : *list) ids.push_back(idValue(item, what, group));
      option.set_ids(*config, std::move(ids));
      return;
    }
    case OptionType::kGroup: {
      const auto* text = node.as_string();
      bool none = text != nullptr && text->get().empty();
      option.set_int(*config, none ? int64_t{-1} : int64_t{idValue(node, what, true)});
      return;
    }
    case OptionType::kAddresses: {
      bool cluster = option.key == "cluster_nodes";
      const std::string list_example =
          std::string(option.key) +
          (cluster ? " = [\"10.0.0.1:6379\", \"10.0.0.2:6379\", \"10.0.0.3:6379\"]"
                   : " = [\"10.0.0.1:26379\", \"10.0.0.2:26379\", \"10.0.0.3:26379\"]");
      const std::string what_one = cluster ? "node" : "sentinel";
      const std::string item_example = cluster ? "\"10.0.0.1:6379\"" : "\"10.0.0.1:26379\"";
      const toml::array* list = node.as_array();
      if (list == nullptr) {
        refuse(node, what + " is " + std::string(describe(node)) + "; write a list in brackets, " +
                         "e.g. " + list_example);
      }
      if (list->empty()) refuse(node, what + " is empty; write at least one, e.g. " + list_example);
      if (static_cast<int64_t>(list->size()) > option.max) {
        refuse(node, what + " has " + std::to_string(list->size()) + " addresses; write at most " +
                         std::to_string(option.max));
      }
      std::vector<std::string> items;
      for (const toml::node& item : *list) {
        const std::string& text = stringValue(item, what + " item", item_example);
        RedisAddress address;
        std::string problem;
        if (!parseRedisAddress(text, &address, &problem)) {
          refuse(item, what + " has " + quote(text) + ", which is not an address: " + problem +
                           "; write \"host:port\" or \"[v6 address]:port\", e.g. " + item_example);
        }
        if (std::find(items.begin(), items.end(), text) != items.end()) {
          refuse(item, what + " has " + quote(text) + " twice; write each " + what_one + " once");
        }
        items.push_back(text);
      }
      option.set_list(*config, std::move(items));
      return;
    }
    case OptionType::kListenAddress: {
      const std::string& text = stringValue(node, what, example);
      std::string host;
      uint16_t port = 0;
      std::string problem;
      if (!text.empty() && !parseListenAddress(text, &host, &port, &problem)) {
        refuse(node, what + " " + quote(text) + " is not an address: " + problem +
                         "; write e.g. \"127.0.0.1:9464\", or \"\" for none");
      }
      option.set_str(*config, text);
      return;
    }
  }
}

// Applies the options of one section; returns where each was given.
Given loadSection(const toml::table& table, std::string_view section, Config* config) {
  const std::vector<std::string_view> known = keysOf(section);
  Given given;
  for (auto&& [key, node] : table) {
    const Option* option = nullptr;
    for (const Option& candidate : kOptions) {
      if (candidate.section == section && candidate.key == key.str()) option = &candidate;
    }
    if (option == nullptr) refuseUnknownKey(key, "", "[" + std::string(section) + "]", known);
    applyOption(*option, node, config);
    given.emplace(option->key, &node);
  }
  return given;
}

// Cluster mode: `cluster_nodes`, with the masters' AUTH (username,
// password); url, the Sentinel options and db (a cluster has only db 0) are
// refused.
void checkClusterMode(const Given& given, const toml::node& nodes, RedisConfig* redis) {
  std::string line = std::to_string(nodes.source().begin.line);
  for (std::string_view key : {"url", "sentinel_master", "sentinels", "sentinel_username",
                               "sentinel_password"}) {
    auto it = given.find(key);
    if (it == given.end()) continue;
    refuse(*it->second,
           "[redis] " + std::string(key) + " belongs to " +
               (key == "url" ? "standalone mode" : "Sentinel mode") +
               ", and this section also has cluster_nodes (line " + line + "), which name a " +
               "Redis Cluster; write either cluster_nodes or " +
               (key == "url" ? "url" : "sentinel_master and sentinels") + ", not both");
  }
  if (auto db = given.find("db"); db != given.end()) {
    refuse(*db->second, "[redis] db does not apply to a Redis Cluster, which has only database "
                        "0; remove db");
  }
  if (auto user = given.find("username"); user != given.end() && redis->password.empty()) {
    refuse(*user->second, "[redis] username needs password: add password = \"...\", the ACL "
                          "user's password on the cluster's nodes");
  }
  redis->url.clear();
  redis->host.clear();
  redis->port = 0;
  redis->unix_path.clear();
  redis->cluster_addresses.clear();
  for (const std::string& text : redis->cluster_nodes) {
    RedisAddress address;
    std::string problem;
    parseRedisAddress(text, &address, &problem);  // checked when given
    redis->cluster_addresses.push_back(std::move(address));
  }
}

// [redis] names the Redis one way: `url` (standalone), `sentinel_master`
// with `sentinels` (Sentinel) or `cluster_nodes` (Cluster). Each mode's own
// options are refused in the others, so that nothing the operator wrote is
// silently ignored.
void checkRedisMode(const Given& given, RedisConfig* redis) {
  auto at = [&](std::string_view key) -> const toml::node* {
    auto it = given.find(key);
    return it != given.end() ? it->second : nullptr;
  };
  // Redis Cluster hashes a key name's first {...}: a brace in the prefix
  // would come before each key's own hash tag (redis_keys.h) and could put
  // a (rule, key)'s two keys in different slots, or every key in one.
  if (const toml::node* prefix = at("key_prefix");
      prefix && redis->key_prefix.find_first_of("{}") != std::string::npos) {
    refuse(*prefix, "[redis] key_prefix " + quote(redis->key_prefix) + " has a brace, which " +
                        "Redis Cluster reads as a hash tag; write a prefix without { and }, " +
                        "e.g. key_prefix = \"sluice:\"");
  }
  if (const toml::node* nodes = at("cluster_nodes")) {
    checkClusterMode(given, *nodes, redis);
    return;
  }
  constexpr std::string_view kSentinelExample =
      "sentinel_master = \"mymaster\" and sentinels = [\"10.0.0.1:26379\", \"10.0.0.2:26379\"]";
  const char* sentinel_keys[] = {"sentinel_master", "sentinels", "sentinel_username",
                                 "sentinel_password", "username", "password", "db"};
  if (const toml::node* url = at("url")) {
    for (std::string_view key : sentinel_keys) {
      if (const toml::node* node = at(key)) {
        bool credentials = !key.starts_with("sentinel");
        refuse(*node, "[redis] " + std::string(key) + " belongs to Sentinel mode, and this " +
                          "section also has url (line " + std::to_string(url->source().begin.line) +
                          "), which names one Redis; " +
                          (credentials ? "write the master's user, password and db in the url "
                                         "instead, e.g. url = \"redis://user:password@host:6379/0\""
                                       : "write either url (one Redis) or " +
                                             std::string(kSentinelExample) + ", not both"));
      }
    }
  }
  const toml::node* master = at("sentinel_master");
  const toml::node* sentinels = at("sentinels");
  if (master == nullptr) {
    for (std::string_view key : sentinel_keys) {
      if (const toml::node* node = at(key)) {
        refuse(*node, "[redis] " + std::string(key) + " applies in Sentinel mode only, which " +
                          "needs sentinel_master, the master's name as the sentinels know it; " +
                          "add e.g. " + std::string(kSentinelExample) + ", or remove " +
                          std::string(key) + " and write url = \"redis://host:6379\"");
      }
    }
    // Standalone. The url was checked when given, and the default is valid,
    // so this only fills in the address fields.
    parseRedisUrl(redis->url, redis);
    return;
  }
  if (redis->sentinel_master.empty()) {
    refuse(*master, "[redis] sentinel_master is empty; write the master's name as in the "
                    "sentinels' config (sentinel monitor <name> ...), e.g. sentinel_master = "
                    "\"mymaster\", or remove it and write url = \"redis://host:6379\"");
  }
  if (redis->sentinel_master.find(' ') != std::string::npos) {
    refuse(*master, "[redis] sentinel_master " + quote(redis->sentinel_master) + " has a space, " +
                        "which no Sentinel master name has; write the name as in the " +
                        "sentinels' config (sentinel monitor <name> ...), e.g. \"mymaster\"");
  }
  if (sentinels == nullptr) {
    refuse(*master, "[redis] sentinel_master needs sentinels, the addresses to ask where the "
                    "master is; add e.g. sentinels = [\"10.0.0.1:26379\", \"10.0.0.2:26379\", "
                    "\"10.0.0.3:26379\"]");
  }
  if (const toml::node* user = at("sentinel_username"); user && redis->sentinel_password.empty()) {
    refuse(*user, "[redis] sentinel_username needs sentinel_password: add sentinel_password = "
                  "\"...\", the ACL user's password on the sentinels");
  }
  if (const toml::node* user = at("username"); user && redis->password.empty()) {
    refuse(*user, "[redis] username needs password: add password = \"...\", the ACL user's "
                  "password on the master");
  }
  redis->url.clear();
  redis->host.clear();
  redis->port = 0;
  redis->unix_path.clear();
  redis->sentinel_addresses.clear();
  for (const std::string& text : redis->sentinels) {
    RedisAddress address;
    std::string problem;
    parseRedisAddress(text, &address, &problem);  // checked when given
    redis->sentinel_addresses.push_back(std::move(address));
  }
}

// A frame must have room for the longest key plus the rest of a request.
void checkFrameHoldsKey(const LimitsConfig& limits, const Given& given) {
  if (static_cast<int64_t>(limits.max_frame_bytes) >=
      static_cast<int64_t>(limits.max_key_bytes) + kFrameOverheadBytes) {
    return;
  }
  // The defaults fit, so at least one of the two was given.
  auto key = given.find("max_key_bytes");
  const toml::node& where = *(key != given.end() ? key->second : given.at("max_frame_bytes"));
  refuse(where, "[limits] max_frame_bytes = " + std::to_string(limits.max_frame_bytes) +
                    " leaves no room for a key of max_key_bytes = " +
                    std::to_string(limits.max_key_bytes) + "; write max_frame_bytes of at " +
                    "least max_key_bytes + " + std::to_string(kFrameOverheadBytes));
}

// --- rules ----------------------------------------------------------------------

constexpr size_t kMaxRuleNameBytes = 128;

constexpr std::array<std::string_view, 13> kRuleKeys = {
    "name",   "algorithm", "limit",    "period", "burst",     "limits",  "scope",
    "on_redis_down", "shadow", "max_wait", "pace", "overrides", "penalty"};
constexpr std::array<std::string_view, 3> kPenaltyKeys = {"denials", "window", "block"};
constexpr int64_t kMaxPenaltyDenials = 1'000'000;
constexpr std::array<std::string_view, 7> kOverrideKeys = {"key",   "prefix", "glob",  "limit",
                                                           "period", "burst",  "limits"};
// Overrides per rule; those matched by prefix or glob are scanned when a
// key's entry is created, so they are fewer.
constexpr size_t kMaxOverridesPerRule = 100'000;
constexpr size_t kMaxScannedOverridesPerRule = 256;
constexpr std::array<std::string_view, 3> kLimitKeys = {"limit", "period", "burst"};

constexpr std::array<Algorithm, kAlgorithmCount> kAlgorithms = [] {
  std::array<Algorithm, kAlgorithmCount> all{};
  for (size_t i = 0; i < kAlgorithmCount; ++i) all[i] = kAlgorithmTraits[i].algorithm;
  return all;
}();
constexpr std::array<Scope, 2> kScopes = {Scope::kLocal, Scope::kGlobal};
constexpr std::array<RedisDownPolicy, 3> kRedisDownPolicies = {
    RedisDownPolicy::kLocal, RedisDownPolicy::kOpen, RedisDownPolicy::kClosed};

// Reads an enum-valued rule key: the value whose name (per `name`) is written.
template <typename Enum, size_t N, typename NameOf>
Enum enumValue(const toml::node& node, const std::string& what, const std::array<Enum, N>& values,
               NameOf name) {
  std::vector<std::string_view> names;
  for (Enum value : values) names.push_back(name(value));
  const std::string& text = stringValue(node, what, std::string(names.front()));
  for (Enum value : values) {
    if (name(value) == text) return value;
  }
  std::string message = what + " " + quote(text) + " is not one of " + joinQuoted(names);
  if (auto suggestion = closest(text, names)) {
    message += "; did you mean " + quote(*suggestion) + "?";
  } else {
    message += "; write one of those";
  }
  refuse(node, std::move(message));
}

class RuleReader {
 public:
  // Messages name the rule by its name once that is known to be usable, and
  // by its place in the file before.
  RuleReader(const toml::table& table, size_t index) : table_(table) {
    std::optional<std::string> name = table["name"].value<std::string>();
    if (name && !name->empty() && name->size() <= kMaxRuleNameBytes) {
      prefix_ = "rule " + quote(*name) + ": ";
    } else {
      prefix_ = "rule #" + std::to_string(index + 1) + ": ";
    }
  }

  Rule read(bool have_redis) {
    for (auto&& [key, node] : table_) {
      if (std::find(kRuleKeys.begin(), kRuleKeys.end(), key.str()) == kRuleKeys.end()) {
        refuseUnknownKey(key, prefix_, "[[rule]]", kRuleKeys);
      }
    }
    Rule rule;
    rule.name = readName();
    if (const toml::node* node = table_.get("algorithm")) {
      rule.algorithm = enumValue(*node, prefix_ + "algorithm", kAlgorithms, algorithmName);
    }
    readLimits(&rule);
    if (const toml::node* node = table_.get("scope")) {
      rule.scope = enumValue(*node, prefix_ + "scope", kScopes, scopeName);
      if (rule.scope == Scope::kGlobal && !have_redis) {
        refuse(*node, prefix_ + "scope = \"global\" needs Redis, and this file has no [redis] " +
                          "section; add [redis] with url = \"redis://host:6379\", or set " +
                          "scope = \"local\"");
      }
    }
    if (const toml::node* node = table_.get("on_redis_down")) {
      rule.on_redis_down =
          enumValue(*node, prefix_ + "on_redis_down", kRedisDownPolicies, redisDownPolicyName);
      if (rule.scope != Scope::kGlobal) {
        refuse(*node, prefix_ + "on_redis_down applies only to global rules; remove it, or set " +
                          "scope = \"global\"");
      }
    }
    if (const toml::node* node = table_.get("shadow")) {
      const auto* value = node->as_boolean();
      if (value == nullptr) {
        refuse(*node, prefix_ + "shadow is " + std::string(describe(*node)) +
                          "; write shadow = true or shadow = false, without quotes");
      }
      rule.shadow = value->get();
    }
    readShaping(&rule);
    readOverrides(&rule);
    readPenalty(&rule);
    return rule;
  }

  const toml::node* nameNode() const { return table_.get("name"); }

 private:
  std::string readName() {
    const toml::node* node = table_.get("name");
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
    return name;
  }

  // max_wait and pace: bounded waiting, which token bucket and GCRA offer,
  // on local rules and on global rules that lease (one limit).
  void readShaping(Rule* rule) {
    const toml::node* max_wait = table_.get("max_wait");
    const toml::node* pace = table_.get("pace");
    for (const toml::node* node : {max_wait, pace}) {
      if (node == nullptr) continue;
      const char* key = node == max_wait ? "max_wait" : "pace";
      if (!algorithmTraits(rule->algorithm).waits) {
        refuse(*node, prefix_ + key + " applies only to token_bucket and gcra (a window cannot " +
                          "be reserved ahead), and this rule is " +
                          std::string(algorithmName(rule->algorithm)) + "; remove " + key +
                          ", or set algorithm = \"gcra\"");
      }
      if (rule->scope == Scope::kGlobal && rule->limits.size() != 1) {
        refuse(*node, prefix_ + key + " on a global rule needs one limit (a waiter asks Redis " +
                          "again when its units are due, and a rule of several limits leases " +
                          "each on its own); remove " + key + ", or keep one limit");
      }
    }
    if (max_wait != nullptr) {
      rule->max_wait_ns = durationValue(*max_wait, prefix_ + "max_wait", "max_wait = \"200ms\"");
      if (rule->max_wait_ns > kMaxWaitNs) {
        refuse(*max_wait, prefix_ + "max_wait " + quote(*max_wait->value<std::string>()) +
                              " is above the maximum; write a wait from \"0\" to " +
                              quote(formatDuration(kMaxWaitNs)));
      }
    }
    if (pace != nullptr) {
      const auto* value = pace->as_boolean();
      if (value == nullptr) {
        refuse(*pace, prefix_ + "pace is " + std::string(describe(*pace)) +
                          "; write pace = true or pace = false, without quotes");
      }
      rule->pace = value->get();
      if (rule->pace) {
        bool has_burst = table_.get("burst") != nullptr;
        if (const toml::node* limits = table_.get("limits")) {
          for (const toml::node& element : *limits->as_array()) {
            has_burst = has_burst || element.as_table()->get("burst") != nullptr;
          }
        }
        if (has_burst) {
          refuse(*pace, prefix_ + "pace = true lets one unit through per interval, with no " +
                            "burst; remove burst, or set pace = false");
        }
        for (Limit& limit : rule->limits) limit.burst = 1;
      }
    }
  }

  // penalty = { denials = 5, window = "1m", block = "10m" }
  void readPenalty(Rule* rule) {
    const toml::node* node = table_.get("penalty");
    if (node == nullptr) return;
    const std::string example = "penalty = { denials = 5, window = \"1m\", block = \"10m\" }";
    const toml::table* table = node->as_table();
    if (table == nullptr) {
      refuse(*node, prefix_ + "penalty is " + std::string(describe(*node)) + "; write " + example);
    }
    // A global rule shares its blocks through its lease script (lease.h).
    bool leases = rule->limits.size() == 1 && hasRateLeaseScript(rule->algorithm);
    if (rule->scope == Scope::kGlobal && !leases) {
      refuse(*node, prefix_ + "penalty on a global rule needs one of one limit that leases " +
                        "from Redis (token_bucket, gcra, fixed_window or sliding_window: a rule " +
                        "of several limits leases each limit on its own, with no one block to " +
                        "share, and a global concurrency rule leases units that are held, not " +
                        "spent, and counts no denials across the fleet); remove it, or set " +
                        "scope = \"local\"");
    }
    for (auto&& [key, value] : *table) {
      if (std::find(kPenaltyKeys.begin(), kPenaltyKeys.end(), key.str()) == kPenaltyKeys.end()) {
        refuseUnknownKey(key, prefix_, "penalty", kPenaltyKeys);
      }
    }
    for (std::string_view key : kPenaltyKeys) {
      if (!table->contains(key)) {
        refuse(*node, prefix_ + "penalty needs " + std::string(key) + "; write " + example);
      }
    }
    Penalty penalty;
    const toml::node& denials = *table->get("denials");
    penalty.denials = integerValue(denials, prefix_ + "penalty denials", "denials = 5");
    if (penalty.denials < 1 || penalty.denials > kMaxPenaltyDenials) {
      refuse(denials, prefix_ + "penalty denials " + std::to_string(penalty.denials) +
                          " is out of range; write a count from 1 to " +
                          std::to_string(kMaxPenaltyDenials));
    }
    auto duration = [&](std::string_view key, int64_t most_ns) {
      const toml::node& value = *table->get(key);
      const std::string what = prefix_ + "penalty " + std::string(key);
      int64_t ns = durationValue(value, what, std::string(key) + " = \"1m\"");
      if (ns < kMinPeriodNs || ns > most_ns) {
        refuse(value, what + " " + quote(*value.value<std::string>()) + " is out of range; " +
                          "write a duration from " + quote(formatDuration(kMinPeriodNs)) +
                          " to " + quote(formatDuration(most_ns)));
      }
      return ns;
    };
    constexpr int64_t kDayNs = 24LL * 3600 * 1'000'000'000;
    penalty.window_ns = duration("window", kDayNs);
    penalty.block_ns = duration("block", 366 * kDayNs);
    rule->penalty = penalty;
  }

  // overrides = [{ prefix = "pro:", limit = 1000 }, { key = "acme", ... }]
  void readOverrides(Rule* rule) {
    const toml::node* node = table_.get("overrides");
    if (node == nullptr) return;
    const std::string example = "overrides = [{ prefix = \"pro:\", limit = 1000 }]";
    const toml::array* array = node->as_array();
    if (array == nullptr) {
      refuse(*node, prefix_ + "overrides is " + std::string(describe(*node)) +
                        "; write an array of tables, e.g. " + example);
    }
    bool one_word = algorithmTraits(rule->algorithm).state == StateShape::kOneWord;
    if (!one_word) {
      refuse(*node, prefix_ + "overrides apply to token_bucket, gcra, fixed_window and " +
                        "sliding_window rules, and this rule is " +
                        std::string(algorithmName(rule->algorithm)) + "; remove overrides, or " +
                        "give the keys their own rule");
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
  Override readMatch(const toml::table& entry, const toml::node& where,
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
  std::vector<Limit> readOverrideLimits(const toml::table& entry, const toml::node& where,
                                        const Rule& rule) {
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

  void readLimits(Rule* rule) {
    const toml::node* limits = table_.get("limits");
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
          if (earlier.period_ns == limit.period_ns) {
            refuse(element, prefix_ + "two limits have the period " +
                                quote(formatDuration(limit.period_ns)) + "; keep the stricter " +
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

  // One limit from `table` (the rule itself, an element of limits, or an
  // override); errors about a missing key point at `where`. A missing period
  // is `default_period_ns` when one is given (an override's, the rule's).
  Limit readLimit(const toml::table& table, const toml::node& where, Algorithm algorithm,
                  std::optional<int64_t> default_period_ns = std::nullopt) {
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
      if (algorithm == Algorithm::kSlidingLog) message += ", or use algorithm = \"sliding_window\"";
      refuse(*limit_node, std::move(message));
    }

    const toml::node* period_node = table.get("period");
    if (period_node == nullptr && default_period_ns) {
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
      if (!algorithmTraits(algorithm).burst) {
        refuse(*burst_node, prefix_ + "burst applies only to token_bucket and gcra, and this " +
                                "rule is " + alg + "; remove burst, or set algorithm = " +
                                "\"token_bucket\"");
      }
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

  const toml::table& table_;
  std::string prefix_;
};

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

std::vector<Rule> loadRules(const toml::node& node, bool have_redis) {
  const toml::array* array = node.as_array();
  if (array == nullptr || !array->is_array_of_tables()) {
    refuse(node, "rule is " + std::string(describe(node)) + "; write each rule as a [[rule]] " +
                     "section (two brackets) followed by its keys");
  }
  std::vector<Rule> rules;
  std::map<std::string, uint32_t> first_line;
  for (size_t i = 0; i < array->size(); ++i) {
    RuleReader reader(*array->get(i)->as_table(), i);
    Rule rule = reader.read(have_redis);
    const toml::node& name_node = *reader.nameNode();
    auto [it, inserted] = first_line.emplace(rule.name, name_node.source().begin.line);
    if (!inserted) {
      refuse(name_node, "rule " + quote(rule.name) + " is defined twice (first on line " +
                            std::to_string(it->second) + "); give each rule its own name");
    }
    rules.push_back(std::move(rule));
  }
  assignIds(&rules);
  return rules;
}

// --- the file -------------------------------------------------------------------

Config build(const toml::table& root, const std::string& source_name) {
  Config config;
  config.path = source_name;
  for (auto&& [key, node] : root) {
    if (std::find(kSections.begin(), kSections.end(), key.str()) != kSections.end()) continue;
    for (const Option& option : kOptions) {
      if (option.key == key.str()) {
        refuse(key, quote(key.str()) + " is outside any section; move it under [" +
                        std::string(option.section) + "]");
      }
    }
    std::string message = "unknown section [" + std::string(key.str()) + "]";
    if (auto suggestion = closest(key.str(), kSections)) {
      message += "; did you mean [" + std::string(*suggestion) + "]?";
    } else {
      message += "; the sections are " + joinPlain(kSections);
    }
    refuse(key, std::move(message));
  }

  // Sections may come in any order, and [redis] only when present.
  if (root.contains("redis")) config.redis.emplace();
  std::map<std::string_view, Given> given;
  for (std::string_view section : {"daemon", "limits", "keys", "access", "redis"}) {
    if (const toml::node* node = root.get(section)) {
      given[section] = loadSection(asSection(*node, section), section, &config);
    }
  }
  if (config.redis) checkRedisMode(given["redis"], &*config.redis);
  checkFrameHoldsKey(config.limits, given["limits"]);

  std::vector<Rule> rules;
  if (const toml::node* node = root.get("rule")) rules = loadRules(*node, config.redis.has_value());
  uint32_t nodes = config.redis ? config.redis->expected_nodes : 1;
  config.rules = std::make_shared<const RuleSet>(std::move(rules), nodes);
  return config;
}

}  // namespace

std::string RedisAddress::text() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

bool parseRedisAddress(std::string_view text, RedisAddress* address, std::string* problem) {
  size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) {
    *problem = "no port";
    return false;
  }
  std::string_view host = text.substr(0, colon);
  std::string_view port = text.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
    in6_addr scratch{};
    if (inet_pton(AF_INET6, std::string(host).c_str(), &scratch) != 1) {
      *problem = "the address in [ ] is not an IPv6 address";
      return false;
    }
  } else if (host.empty() || host.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQ"
                                                    "RSTUVWXYZ0123456789.-_") != std::string::npos) {
    *problem = host.find(':') != std::string_view::npos
                   ? "an IPv6 address goes in brackets"
                   : "the host " + quote(host) + " is not a host name or address";
    return false;
  }
  if (!allDigits(port) || port.size() > 5 || std::stoi(std::string(port)) < 1 ||
      std::stoi(std::string(port)) > 65535) {
    *problem = "the port " + quote(port) + " is not a number from 1 to 65535";
    return false;
  }
  address->host = std::string(host);
  address->port = static_cast<uint16_t>(std::stoi(std::string(port)));
  return true;
}

bool parseListenAddress(std::string_view text, std::string* host, uint16_t* port,
                        std::string* problem) {
  size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) {
    *problem = "no port";
    return false;
  }
  std::string_view name = text.substr(0, colon);
  std::string_view digits = text.substr(colon + 1);
  bool bracketed = name.size() >= 2 && name.front() == '[' && name.back() == ']';
  if (bracketed) name = name.substr(1, name.size() - 2);
  in6_addr scratch6{};
  in_addr scratch4{};
  std::string name_text(name);
  bool ipv6 = bracketed && inet_pton(AF_INET6, name_text.c_str(), &scratch6) == 1;
  bool ipv4 = !bracketed && inet_pton(AF_INET, name_text.c_str(), &scratch4) == 1;
  if (!ipv4 && !ipv6) {
    *problem = "the host must be a numeric IPv4 address or a bracketed IPv6 one";
    return false;
  }
  int value = 0;
  if (digits.empty() || digits.size() > 5 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      (value = std::stoi(std::string(digits))) < 1 || value > 65535) {
    *problem = "the port must be a number from 1 to 65535";
    return false;
  }
  *host = name_text;
  *port = static_cast<uint16_t>(value);
  return true;
}

std::optional<int64_t> parseDurationNs(std::string_view text) {
  if (text == "0") return 0;
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0) return std::nullopt;
  std::string_view suffix = text.substr(digits);
  for (const DurationUnit& unit : kDurationUnits) {
    if (suffix != unit.suffix) continue;
    const int64_t most = std::numeric_limits<int64_t>::max();
    int64_t count = 0;
    for (char c : text.substr(0, digits)) {
      if (count > (most - (c - '0')) / 10) return most;
      count = count * 10 + (c - '0');
    }
    return count > most / unit.ns ? most : count * unit.ns;
  }
  return std::nullopt;
}

ConfigResult loadConfigString(std::string_view text, const std::string& source_name) {
  ConfigResult result;
  toml::table root;
  try {
    root = toml::parse(text, source_name);
  } catch (const toml::parse_error& error) {
    result.error = locate(source_name, error.source().begin) + "invalid TOML: " +
                   std::string(error.description());
    return result;
  }
  try {
    result.config = build(root, source_name);
  } catch (const Refusal& refusal) {
    result.error = locate(source_name, refusal.at) + refusal.message;
  }
  return result;
}

ConfigResult loadConfigFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    ConfigResult result;
    result.error = path + ": cannot read the config file: " + std::strerror(errno);
    return result;
  }
  std::ostringstream text;
  text << file.rdbuf();
  return loadConfigString(text.str(), path);
}

std::vector<ConfigOptionInfo> configOptions() {
  std::vector<ConfigOptionInfo> out;
  for (const Option& option : kOptions) {
    out.push_back({option.section, option.key, defaultText(option), option.doc});
  }
  return out;
}

}  // namespace sluice

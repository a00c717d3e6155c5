// ConfigOptions: the option table of [daemon], [limits], [keys], [access]
// and [redis], the only place one of their options is declared (see
// config.h), and how a value of each type is read.
#include "config_values.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <span>
#include <vector>

#include <grp.h>
#include <pwd.h>

namespace sluice {
namespace config_detail {
namespace {

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
  kFrontAddress,   // "", a numeric "HOST:PORT" or "unix:/path" (parseFrontAddress)
  kSecretFile,  // "" or the absolute path of a file holding a secret (readSecretFile)
  kUsers,       // array of user names or uids
  kGroups,      // array of group names or gids
  kGroup,       // one group name or gid, or "" for none (stored as -1)
  kAddresses,   // array of "host:port" (parseRedisAddress), at most max of them
};

constexpr std::array<std::string_view, 2> kScopes = {"local", "global"};
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
  // kText, kListenAddress, kSecretFile) get_str and set_str; lists of ids (kUsers,
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

// Sentinel mode: the longest master name and the most sentinels.
constexpr int64_t kMaxSentinelMasterBytes = 128;
constexpr int64_t kMaxSentinels = 16;
// The longest path of a file holding a secret.
constexpr int64_t kMaxSecretFileBytes = 4096;
// Cluster mode: the most seed nodes.
constexpr int64_t kMaxClusterNodes = 64;

const std::array<Option, 46> kOptions = {{
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
    {.section = "redis", .key = "sentinel_password_file", .type = OptionType::kSecretFile,
     .max = kMaxSecretFileBytes,
     .doc = "Sentinel mode: a file holding the sentinels' password (instead of "
            "sentinel_password), readable by its owner only; \"\": none",
     SLUICE_STR_FIELD(redis->sentinel_password_file)},
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
    {.section = "redis", .key = "password_file", .type = OptionType::kSecretFile,
     .max = kMaxSecretFileBytes,
     .doc = "a file holding the masters' password (instead of password, or of the one in the "
            "url), readable by its owner only; \"\": none",
     SLUICE_STR_FIELD(redis->password_file)},
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
    {.section = "redis", .key = "reconnect_max", .type = OptionType::kDuration,
     .min = 50 * kMs, .max = kMinute,
     .doc = "longest wait between two attempts to reconnect to Redis (doubling from 50 ms, "
            "+-20 % jitter): a node is back at most this long after Redis is",
     SLUICE_INT_FIELD(redis->reconnect_max_ms)},

    {.section = "http", .key = "listen", .type = OptionType::kFrontAddress,
     .doc = "address of the HTTP check endpoint, \"HOST:PORT\" or \"unix:/path\"; \"\" serves none",
     SLUICE_STR_FIELD(http.listen)},
    {.section = "http", .key = "deny_status", .type = OptionType::kCount, .min = 400, .max = 499,
     .doc = "HTTP status of a denial: 429, or 403 behind nginx's auth_request",
     SLUICE_INT_FIELD(http.deny_status)},

    {.section = "resp", .key = "listen", .type = OptionType::kFrontAddress,
     .doc = "address of the Redis protocol front, \"HOST:PORT\" or \"unix:/path\"; \"\" serves none",
     SLUICE_STR_FIELD(resp.listen)},
    {.section = "resp", .key = "scope", .type = OptionType::kChoice, .choices = kScopes,
     .doc = "scope of CL.THROTTLE's rules: local, or global (needs [redis]) for one fleet-wide limit",
     SLUICE_STR_FIELD(resp.scope)},
    {.section = "resp", .key = "max_parameter_sets", .type = OptionType::kCount, .min = 1,
     .max = 100'000,
     .doc = "distinct (max_burst, count, period) of CL.THROTTLE held at once; one more is refused",
     SLUICE_INT_FIELD(resp.max_parameter_sets)},
}};

#undef SLUICE_INT_FIELD
#undef SLUICE_STR_FIELD
#undef SLUICE_IDS_FIELD
#undef SLUICE_LIST_FIELD


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
    case OptionType::kListenAddress:
    case OptionType::kFrontAddress:
    case OptionType::kSecretFile: return quote(option.get_str(c));
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
    case OptionType::kSecretFile: {
      const std::string& path = stringValue(node, what, example);
      if (!path.empty() && !path.starts_with("/")) {
        refuse(node, what + " " + quote(path) + " is not an absolute path; write one starting " +
                         "with /, e.g. " + std::string(option.key) +
                         " = \"/etc/sluice/redis.password\"");
      }
      if (static_cast<int64_t>(path.size()) > option.max) {
        refuse(node, what + " is " + std::to_string(path.size()) + " bytes long; write at most " +
                         std::to_string(option.max) + " bytes");
      }
      option.set_str(*config, path);
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
    case OptionType::kFrontAddress: {
      const std::string& text = stringValue(node, what, example);
      std::string host;
      uint16_t port = 0;
      std::string unix_path;
      std::string problem;
      if (!text.empty() && !parseFrontAddress(text, &host, &port, &unix_path, &problem)) {
        refuse(node, what + " " + quote(text) + " is not an address: " + problem +
                         "; write e.g. \"127.0.0.1:9470\" or \"unix:/run/sluice/http.sock\", "
                         "or \"\" for none");
      }
      option.set_str(*config, text);
      return;
    }
  }
}

}  // namespace

std::optional<std::string_view> sectionOfOption(std::string_view key) {
  for (const Option& option : kOptions) {
    if (option.key == key) return option.section;
  }
  return std::nullopt;
}

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

std::optional<std::string> tomlErrorHint(std::string_view line) {
  const size_t equals = line.find('=');
  if (equals == std::string_view::npos) return std::nullopt;
  auto trim = [](std::string_view text) {
    while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
    while (!text.empty() && (text.back() == ' ' || text.back() == '\t' || text.back() == '\r')) {
      text.remove_suffix(1);
    }
    return text;
  };
  const std::string_view key = trim(line.substr(0, equals));
  std::string_view value = trim(line.substr(equals + 1));
  value = value.substr(0, value.find('#'));
  value = trim(value);
  for (const Option& option : kOptions) {
    if (option.type != OptionType::kFileMode || option.key != key) continue;
    if (value.size() < 2 || value.front() != '0' || !allDigits(value)) return std::nullopt;
    return "a mode with a leading zero is octal, which TOML reads only in quotes (or as 0o" +
           std::string(value.substr(1)) + "); write " + std::string(key) + " = \"" +
           std::string(value) + "\"";
  }
  return std::nullopt;
}

}  // namespace config_detail

std::vector<ConfigOptionInfo> configOptions() {
  using namespace config_detail;
  std::vector<ConfigOptionInfo> out;
  for (const Option& option : kOptions) {
    out.push_back({option.section, option.key, defaultText(option), option.doc});
  }
  return out;
}

}  // namespace sluice


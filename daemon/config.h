// Config: the daemon's TOML configuration file, parsed and validated.
//
// Every option of [daemon], [limits], [keys], [access] and [redis] is declared once, in
// the option table in config_options.cpp (key, type, bounds, one-line doc);
// the defaults are the member initializers below, and the table reads them
// from here, so a default is written in exactly one place. Every key of a
// [[rule]] is declared once, in the rule key table in config_rules.cpp (type,
// default, doc, which rules it applies to), and what each algorithm can do
// in algorithm.h. conf/sluice.toml is the manual: it explains every option
// and rule key and shows its default.
//
// A file is either accepted whole or refused with one message naming the
// file, line and column of the first problem and what to write instead, in
// the form `path:line:col: what is wrong; what to write`.
//
// Units: durations are written in the file as "500ms", "10s", "1m", "1h" or
// "1d" and stored in milliseconds (fields ending in _ms) or, for rule
// periods, nanoseconds (Limit::period_ns); sizes are bytes.
//
// Thread-safety: the load functions are pure (apart from reading the file
// and looking up the user and group names of [access]) and may be called from
// any thread; a Config is a plain value whose RuleSet
// is immutable and shared.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "envoy_policy.h"
#include "rules.h"

namespace sluice {

// [daemon]: the process and its socket.
struct DaemonConfig {
  std::string socket_path = "/run/sluice/sluice.sock";  // key `socket`
  uint32_t socket_mode = 0660;                           // permission bits
  uint32_t workers = 0;                                  // 0: one per core
  std::string log_level = "info";  // trace, debug, info, warn, error, critical, off
  std::string metrics;             // Prometheus endpoint "HOST:PORT"; "" serves none

  bool operator==(const DaemonConfig&) const = default;
};

// [limits]: what one client connection may ask of the daemon.
struct LimitsConfig {
  uint32_t max_connections = 4096;
  uint32_t max_frame_bytes = 64 * 1024;
  uint32_t max_key_bytes = 4096;
  uint32_t max_depth = 16;           // nesting of arrays and maps in a frame
  uint32_t max_items = 1024;         // elements of one array / entries of one map
  uint64_t max_output_bytes = 1024 * 1024;  // unsent output before a disconnect
  int64_t idle_timeout_ms = 5 * 60 * 1000;  // 0: idle connections stay open
  int64_t partial_frame_timeout_ms = 10 * 1000;  // a half-sent frame this old closes

  bool operator==(const LimitsConfig&) const = default;
};

// [keys]: the key table.
struct KeysConfig {
  uint64_t max_keys = 1'000'000;      // (rule, key) entries held at once
  uint64_t max_memory = 256u << 20;   // bytes of entries (keys and state) held at once
  int64_t sweep_interval_ms = 10 * 1000;  // how often idle keys are dropped

  bool operator==(const KeysConfig&) const = default;
};

// [access]: who may use the socket and its admin methods (access.h). Names
// in the file are looked up when it is loaded and kept as ids.
struct AccessConfig {
  std::vector<uint32_t> users;   // uids allowed besides root and the daemon's user
  std::vector<uint32_t> groups;  // gids whose members are allowed
  int64_t admin_group = -1;      // gid whose members may call admin methods; -1: none
  uint32_t max_connections_per_user = 0;  // open at once per uid; 0: no cap

  bool operator==(const AccessConfig&) const = default;
};

// A TCP address of a Redis server or Sentinel.
struct RedisAddress {
  std::string host;  // a name or a numeric address; IPv6 without brackets
  uint16_t port = 0;

  // "host:port", with brackets around an IPv6 host.
  std::string text() const;
  bool operator==(const RedisAddress&) const = default;
};

// Parses "host:port" or "[v6]:port" (port 1..65535; host a name, IPv4 or
// IPv6 address); false with `problem` saying what is wrong.
bool parseRedisAddress(std::string_view text, RedisAddress* address, std::string* problem);

// [redis] reconnect_max's default, and so the reconnect backoff's cap of a
// link whose owner sets none (RedisLinkOptions).
inline constexpr int64_t kDefaultReconnectMaxMs = 1000;

// [redis]: present only when the file has a [redis] section; without it the
// daemon is local-only and global rules are refused.
//
// Three modes: standalone (`url` names the one Redis), Sentinel
// (`sentinel_master` and `sentinels`: the daemon asks the sentinels where the
// master is and follows failovers; see sentinel.h) and Cluster
// (`cluster_nodes`: the daemon loads the slot map from them and talks to
// every master; see cluster.h). A file gives one of them, never two.
struct RedisConfig {
  std::string url = "redis://127.0.0.1:6379";  // as written; parsed below
  // Standalone: from `url`, either a TCP address (host, port) or a Unix
  // socket path. Sentinel: empty until the master is resolved. Cluster:
  // empty (each master's link has its own).
  std::string host;       // "" for unix:// urls; IPv6 without brackets
  uint16_t port = 0;
  std::string unix_path;  // "" for redis:// urls
  // The master's AUTH and database: from the url (standalone), or from the
  // options username, password and db (Sentinel; Cluster: every node's AUTH,
  // and db 0, the only database of a cluster).
  std::string username;   // "" when none (AUTH with password only)
  std::string password;   // "" when none; percent-decoded from a url
  // The file the password was read from when the config was loaded (option
  // password_file, any mode); "" when none.
  std::string password_file;
  uint32_t db = 0;
  // Sentinel mode: the master's name as the sentinels know it ("": standalone
  // mode), the sentinels to ask (as written, and parsed), and the sentinels'
  // own AUTH, which is separate from the master's.
  std::string sentinel_master;
  std::vector<std::string> sentinels;
  std::vector<RedisAddress> sentinel_addresses;
  std::string sentinel_username;  // "" when none
  std::string sentinel_password;  // "" when the sentinels need no AUTH
  std::string sentinel_password_file;  // where sentinel_password was read from; "" when none
  bool sentinel() const { return !sentinel_master.empty(); }
  // Cluster mode: the seed nodes to load the slot map from (as written, and
  // parsed); empty in the other modes.
  std::vector<std::string> cluster_nodes;
  std::vector<RedisAddress> cluster_addresses;
  bool cluster() const { return !cluster_nodes.empty(); }
  std::string key_prefix = "sluice:";  // every Redis key sluice writes starts with it
  // This daemon's name among the members; "" means "<hostname>:<pid>" (see
  // control.h), so two daemons on one host and a restarted daemon differ.
  std::string node_id;
  uint32_t expected_nodes = 1;    // live nodes assumed before heartbeats arrive
  int64_t lease_timeout_ms = 50;  // longest wait for one lease answer
  // A lease covers about this much of a key's local demand (slice.h).
  int64_t lease_interval_ms = 100;
  // A global concurrency rule's units held by a node live this long in
  // Redis unless renewed (holding.h): the units of a node that crashed, or
  // lost Redis this long, come free after it.
  int64_t lease_ttl_ms = 5000;
  // Health and membership (control.h): a PING every health_interval_ms; a
  // PING or heartbeat unanswered after health_timeout_ms means Redis is down,
  // so a stall is noticed within health_interval_ms + health_timeout_ms.
  int64_t health_interval_ms = 100;
  int64_t health_timeout_ms = 250;
  int64_t heartbeat_interval_ms = 1000;  // membership heartbeat; TTL 3 intervals
  // A lost connection is tried again 50 ms later, then twice as long after
  // each failed attempt, up to this (RedisLinkOptions::backoff_max_ms): a
  // node is back at most this long (and its jitter) after Redis is.
  int64_t reconnect_max_ms = kDefaultReconnectMaxMs;

  bool operator==(const RedisConfig&) const = default;
};

// [http]: the HTTP check endpoint (http_front.h); off while `listen` is "".
struct HttpConfig {
  // "HOST:PORT" (numeric host) or "unix:/absolute/path"; "" serves none.
  std::string listen;
  // The status of a denial: 429, or 403 for nginx's auth_request, which
  // passes on only 2xx, 401 and 403.
  uint32_t deny_status = 429;

  bool operator==(const HttpConfig&) const = default;
};

// [resp]: the Redis protocol front (resp_front.h); off while `listen` is "".
// The prefix of the rules CL.THROTTLE makes, one per parameter set
// (resp::throttleRuleName); a [[rule]] may not use it while [resp] listens.
constexpr std::string_view kThrottleRulePrefix = "cl.throttle/";

struct RespConfig {
  // "HOST:PORT" (numeric host) or "unix:/absolute/path"; "" serves none.
  std::string listen;
  // The scope of CL.THROTTLE's parametric rules: "local", or "global"
  // (needs [redis]): one limit for the fleet.
  std::string scope = "local";
  // Distinct (max_burst, count, period) of CL.THROTTLE held at once; a
  // call naming one more is refused.
  uint32_t max_parameter_sets = 1000;

  bool operator==(const RespConfig&) const = default;
};

// [envoy] threads is 1 to this.
inline constexpr int kMaxEnvoyThreads = 64;
// [envoy] poll_spin_us is 0 to this (1 ms).
inline constexpr int64_t kMaxEnvoyPollSpinUs = 1'000;

// [envoy]: Envoy's rate limit service (envoy_front.h); present only when
// the file has an [envoy] section. Its YAML files are read with the TOML
// file, and their rules join the rule set, so a reload reloads them.
struct EnvoyConfig {
  std::string listen;  // "unix:/path" or "HOST:PORT", as gRPC takes it
  std::string config;  // path or glob of envoyproxy/ratelimit YAML files
  // The YAML limits' rules: global with [redis], local without (default).
  Scope scope = Scope::kGlobal;
  Algorithm algorithm = Algorithm::kFixedWindow;
  // What the global rules do while Redis is unreachable (rules.h).
  RedisDownPolicy on_redis_down = RedisDownPolicy::kLocal;
  // Several limited descriptors are decided all or nothing (acquire_all);
  // by default each is spent on its own and the results ORed, as the
  // reference server does.
  bool all_or_nothing = false;
  // gRPC polling threads that take ShouldRateLimit calls (envoy_front.h):
  // 1 costs the least per call; more carry more calls/s on more cores.
  int threads = 1;
  // After an event, a polling thread keeps polling without blocking for
  // this long before it sleeps (envoy_front.cpp, Pollers::run); 0: it
  // sleeps at once. Never spins while idle.
  int64_t poll_spin_us = 0;
  EnvoyPolicyPtr policy;  // never null in a loaded Config with [envoy]
};

struct Config {
  std::string path;  // the file (or source name) this was loaded from
  DaemonConfig daemon;
  LimitsConfig limits;
  KeysConfig keys;
  AccessConfig access;
  std::optional<RedisConfig> redis;
  HttpConfig http;
  RespConfig resp;
  std::optional<EnvoyConfig> envoy;
  RuleSetPtr rules;  // never null in a loaded Config; may hold no rules
};

// Either a config or the reason it was refused.
struct ConfigResult {
  std::optional<Config> config;  // set on success
  std::string error;             // set on failure: "path:line:col: ..."
  bool ok() const { return config.has_value(); }
};

// What loading checks besides the file itself.
enum class ConfigChecks {
  kFile,  // the file alone (tests, reloads: the socket is already bound)
  // Also what the daemon will need of this machine when it starts: that the
  // directory of the socket the file gives exists (--check-config, startup).
  kHost,
};

// Reads and validates the file at `path`.
ConfigResult loadConfigFile(const std::string& path, ConfigChecks checks = ConfigChecks::kFile);

// Validates `text`; `source_name` stands for the file name in messages and
// in Config::path.
ConfigResult loadConfigString(std::string_view text, const std::string& source_name,
                              ConfigChecks checks = ConfigChecks::kFile);

// Splits a metrics address, "127.0.0.1:9464" or "[::1]:9464" (numeric hosts
// only, port 1..65535), into host (IPv6 without brackets) and port; false
// with `problem` saying what is wrong.
bool parseListenAddress(std::string_view text, std::string* host, uint16_t* port,
                        std::string* problem);

// A front's listen address: "unix:/absolute/path" gives the path in
// `unix_path`, anything else is parsed as parseListenAddress does.
constexpr std::string_view kUnixListenPrefix = "unix:";
bool parseFrontAddress(std::string_view text, std::string* host, uint16_t* port,
                       std::string* unix_path, std::string* problem);

// Parses a duration as written in the file ("500ms", "10s", "1m", "1h", "1d")
// into nanoseconds; nullopt when it is not one. "0" (no unit) is zero. A
// duration too long for int64_t nanoseconds gives INT64_MAX, so that range
// checks report it as too long rather than as malformed.
std::optional<int64_t> parseDurationNs(std::string_view text);

// One option of the table, for documentation (e.g. a --help listing) and for
// the test that the shipped conf/sluice.toml shows every option.
struct ConfigOptionInfo {
  std::string_view section;  // "daemon", "limits", "keys", "access", "redis", "http"
  std::string_view key;
  std::string default_text;  // as written in the file: 4096, "5m", "0660", []
  std::string_view doc;      // one line
};
std::vector<ConfigOptionInfo> configOptions();

// One key of a [[rule]] table, from the rule key table, for documentation
// and for the test that conf/sluice.toml documents every rule key.
struct RuleKeyInfo {
  std::string_view key;           // "algorithm", "limit", ...
  std::string_view default_text;  // as the manual writes it; "" for none or required
  std::string_view doc;           // one line
};
std::vector<RuleKeyInfo> ruleKeys();

}  // namespace sluice

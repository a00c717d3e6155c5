// Tests for the config loader (daemon/config.h): the shipped file, defaults,
// durations, every kind of refusal with its position and fix, and rule ids.
#include "config.h"

#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <sys/stat.h>

#include "test_support.h"

namespace sluice {
namespace {

// The repository root: ctest sets SLUICE_SOURCE_DIR; run by hand, the test is
// started from the build tree, so fall back to the path of this file.
std::string sourceDir() {
  if (const char* dir = std::getenv("SLUICE_SOURCE_DIR")) return dir;
  std::string here = __FILE__;
  return here.substr(0, here.rfind("/tests/unit/"));
}

Config mustLoad(std::string_view text) {
  ConfigResult result = loadConfigString(text, "x.toml");
  EXPECT_TRUE(result.ok()) << result.error;
  return result.ok() ? std::move(*result.config) : Config{};
}

std::string errorOf(std::string_view text) {
  ConfigResult result = loadConfigString(text, "x.toml");
  EXPECT_FALSE(result.ok()) << "accepted:\n" << text;
  return result.error;
}

// --- the shipped file -------------------------------------------------------------

// Verifies that conf/sluice.toml, the default config, loads as a local-only
// daemon with its example rules.
TEST(ConfigTest, ShippedConfigLoadsAsLocalOnlyDaemon) {
  const std::string path = sourceDir() + "/conf/sluice.toml";
  ConfigResult result = loadConfigFile(path);
  ASSERT_TRUE(result.ok()) << result.error;
  const Config& config = *result.config;
  EXPECT_EQ(config.path, path);
  EXPECT_FALSE(config.redis.has_value());
  EXPECT_EQ(config.daemon.socket_path, "/run/sluice/sluice.sock");
  ASSERT_NE(config.rules, nullptr);

  const Rule* api = config.rules->find("api");
  ASSERT_NE(api, nullptr);
  EXPECT_EQ(api->algorithm, Algorithm::kTokenBucket);
  ASSERT_EQ(api->limits.size(), 1u);
  EXPECT_EQ(api->limits[0].limit, 100);
  EXPECT_EQ(api->limits[0].period_ns, 60'000'000'000);
  EXPECT_EQ(api->limits[0].burst, 20);

  const Rule* login = config.rules->find("login");
  ASSERT_NE(login, nullptr);
  EXPECT_EQ(login->limits.size(), 2u);

  const Rule* search = config.rules->find("search");
  ASSERT_NE(search, nullptr);
  EXPECT_EQ(search->algorithm, Algorithm::kSlidingWindow);

  const Rule* uploads = config.rules->find("uploads");
  ASSERT_NE(uploads, nullptr);
  EXPECT_EQ(uploads->algorithm, Algorithm::kConcurrency);
  EXPECT_EQ(uploads->limits[0].limit, 4);
  EXPECT_EQ(uploads->limits[0].period_ns, 600'000'000'000);

  bool has_shadow = false;
  for (const Rule& rule : config.rules->rules()) {
    EXPECT_EQ(rule.scope, Scope::kLocal) << rule.name;
    has_shadow = has_shadow || rule.shadow;
  }
  EXPECT_TRUE(has_shadow);
}

// Verifies that the shipped file, being the manual, shows every option of the
// table with its default value (commented out for the [redis] section).
TEST(ConfigTest, ShippedConfigShowsEveryOptionWithItsDefault) {
  const std::string text = test::readFile(sourceDir() + "/conf/sluice.toml");
  ASSERT_FALSE(text.empty());
  for (const ConfigOptionInfo& option : configOptions()) {
    std::string line = std::string(option.key) + " = " + option.default_text + "\n";
    EXPECT_NE(text.find(line), std::string::npos)
        << "conf/sluice.toml does not show [" << option.section << "] " << line;
  }
}

// The paragraph of the manual's RULES section that documents `key`: the line
// "#   <key>  ..." and the lines indented under it; "" when there is none.
std::string ruleKeyParagraph(const std::string& text, std::string_view key) {
  const size_t rules = text.find("#### RULES ####");
  if (rules == std::string::npos) return "";
  const std::string head = "\n#   " + std::string(key) + " ";
  size_t at = text.find(head, rules);
  if (at == std::string::npos) return "";
  std::string paragraph;
  size_t line = at + 1;
  do {
    size_t end = text.find('\n', line);
    paragraph += text.substr(line, end - line) + "\n";
    line = end + 1;
  } while (text.compare(line, 6, "#     ") == 0);
  return paragraph;
}

// Verifies that the shipped file, being the manual, documents every key of
// the rule key table in its RULES section with the key's default, every
// algorithm of the algorithm table, and each algorithm's largest limit.
TEST(ConfigTest, ShippedConfigDocumentsEveryRuleKey) {
  const std::string text = test::readFile(sourceDir() + "/conf/sluice.toml");
  ASSERT_FALSE(text.empty());
  const std::vector<RuleKeyInfo> keys = ruleKeys();
  ASSERT_GE(keys.size(), 13u);
  for (const RuleKeyInfo& key : keys) {
    const std::string paragraph = ruleKeyParagraph(text, key.key);
    EXPECT_FALSE(paragraph.empty()) << "conf/sluice.toml does not document [[rule]] " << key.key;
    EXPECT_FALSE(key.doc.empty()) << key.key;
    if (!key.default_text.empty()) {
      EXPECT_NE(paragraph.find(key.default_text), std::string::npos)
          << "conf/sluice.toml does not show the default " << key.default_text << " of "
          << key.key << ":\n" << paragraph;
      EXPECT_NE(paragraph.find("efault"), std::string::npos) << paragraph;
    }
  }
  const std::string limit = ruleKeyParagraph(text, "limit");
  for (const AlgorithmTraits& row : kAlgorithmTraits) {
    EXPECT_NE(text.find("\n#   " + std::string(row.name) + " "), std::string::npos)
        << "conf/sluice.toml does not describe the algorithm " << row.name;
    EXPECT_NE(limit.find(std::to_string(row.max_limit) + " for"), std::string::npos)
        << "the limit paragraph does not give " << row.name << "'s maximum " << row.max_limit;
  }
}

// Verifies that a missing file is refused with its path and the reason.
TEST(ConfigTest, MissingFileIsRefusedWithItsPath) {
  ConfigResult result = loadConfigFile("/nonexistent/sluice.toml");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error.rfind("/nonexistent/sluice.toml: cannot read", 0), 0u) << result.error;
}

// --- defaults -------------------------------------------------------------------

// Verifies that an empty file gives every default and no rules.
TEST(ConfigTest, EmptyFileGivesDefaults) {
  Config config = mustLoad("");
  EXPECT_EQ(config.daemon.socket_path, "/run/sluice/sluice.sock");
  EXPECT_EQ(config.daemon.socket_mode, 0660u);
  EXPECT_EQ(config.daemon.workers, 0u);
  EXPECT_EQ(config.daemon.log_level, "info");
  EXPECT_EQ(config.limits.max_key_bytes, 4096u);
  EXPECT_GE(config.limits.max_key_bytes, 1024u);
  EXPECT_EQ(config.limits.idle_timeout_ms, 300'000);
  EXPECT_EQ(config.keys.max_keys, 1'000'000u);
  EXPECT_FALSE(config.redis.has_value());
  ASSERT_NE(config.rules, nullptr);
  EXPECT_TRUE(config.rules->rules().empty());
}

// Verifies that the options of each section are stored, durations in ms.
TEST(ConfigTest, GivenOptionsAreStored) {
  Config config = mustLoad(R"(
[daemon]
socket = "/tmp/s.sock"
socket_mode = "0600"
workers = 3
log_level = "debug"
[limits]
max_connections = 10
max_frame_bytes = 2048
max_key_bytes = 1024
max_depth = 8
max_items = 64
max_output_bytes = 8192
idle_timeout = "0"
partial_frame_timeout = "500ms"
[keys]
max_keys = 5
sweep_interval = "1m"
)");
  EXPECT_EQ(config.daemon.socket_path, "/tmp/s.sock");
  EXPECT_EQ(config.daemon.socket_mode, 0600u);
  EXPECT_EQ(config.daemon.workers, 3u);
  EXPECT_EQ(config.daemon.log_level, "debug");
  EXPECT_EQ(config.limits.max_connections, 10u);
  EXPECT_EQ(config.limits.max_frame_bytes, 2048u);
  EXPECT_EQ(config.limits.max_key_bytes, 1024u);
  EXPECT_EQ(config.limits.max_depth, 8u);
  EXPECT_EQ(config.limits.max_items, 64u);
  EXPECT_EQ(config.limits.max_output_bytes, 8192u);
  EXPECT_EQ(config.limits.idle_timeout_ms, 0);
  EXPECT_EQ(config.limits.partial_frame_timeout_ms, 500);
  EXPECT_EQ(config.keys.max_keys, 5u);
  EXPECT_EQ(config.keys.sweep_interval_ms, 60'000);
}

// Verifies that a socket mode may be written as a TOML octal integer too.
TEST(ConfigTest, SocketModeAcceptsOctalInteger) {
  EXPECT_EQ(mustLoad("[daemon]\nsocket_mode = 0o640\n").daemon.socket_mode, 0640u);
}

// Verifies that a rule gets the documented defaults: token bucket, burst equal
// to the limit, local, on_redis_down local, not shadow.
TEST(ConfigTest, RuleDefaultsAreApplied) {
  Config config = mustLoad("[[rule]]\nname = \"a\"\nlimit = 7\nperiod = \"1s\"\n");
  const Rule* rule = config.rules->find("a");
  ASSERT_NE(rule, nullptr);
  EXPECT_EQ(rule->algorithm, Algorithm::kTokenBucket);
  ASSERT_EQ(rule->limits.size(), 1u);
  EXPECT_EQ(rule->limits[0].burst, 7);
  EXPECT_EQ(rule->scope, Scope::kLocal);
  EXPECT_EQ(rule->on_redis_down, RedisDownPolicy::kLocal);
  EXPECT_FALSE(rule->shadow);
  EXPECT_NE(rule->id, 0u);
}

// Verifies that a window algorithm's burst equals its limit and that a
// concurrency rule needs no period.
TEST(ConfigTest, WindowBurstEqualsLimitAndConcurrencyPeriodIsOptional) {
  Config config = mustLoad(R"(
[[rule]]
name = "w"
algorithm = "fixed_window"
limit = 9
period = "1s"
[[rule]]
name = "c"
algorithm = "concurrency"
limit = 3
)");
  EXPECT_EQ(config.rules->find("w")->limits[0].burst, 9);
  EXPECT_EQ(config.rules->find("c")->limits[0].period_ns, 0);
  EXPECT_EQ(config.rules->find("c")->limits[0].limit, 3);
}

// Verifies that calendar windows are read with their zone, which every
// limit and override of the rule follows, and that the zone is part of the
// rule's identity.
TEST(ConfigTest, CalendarWindowsAreStoredWithTheRulesTimeZone) {
  const std::string text = R"(
[[rule]]
name = "tokens"
algorithm = "fixed_window"
limits = [{ limit = 100000, window = "day" }, { limit = 2000000, window = "month" }]
time_zone = "Europe/Berlin"
[[rule]]
name = "weekly"
algorithm = "fixed_window"
limit = 50
window = "week"
overrides = [{ prefix = "pro:", limit = 500 }]
)";
  Config config = mustLoad(text);
  const Rule* tokens = config.rules->find("tokens");
  ASSERT_EQ(tokens->limits.size(), 2u);
  EXPECT_EQ(tokens->limits[0].window, calendar::Span::kDay);
  EXPECT_EQ(tokens->limits[1].window, calendar::Span::kMonth);
  EXPECT_EQ(tokens->limits[1].time_zone.name(), "Europe/Berlin");
  EXPECT_EQ(tokens->limits[1].period_ns, calendar::longestNs(calendar::Span::kMonth));
  const Rule* weekly = config.rules->find("weekly");
  EXPECT_EQ(weekly->limits[0].window, calendar::Span::kWeek);
  EXPECT_EQ(weekly->limits[0].time_zone.name(), "UTC");
  ASSERT_EQ(weekly->overrides.size(), 1u);
  EXPECT_EQ(weekly->overrides[0].limits[0].window, calendar::Span::kWeek);

  std::string elsewhere = text;
  elsewhere.replace(elsewhere.find("Europe/Berlin"), 13, "Asia/Tokyo");
  EXPECT_NE(mustLoad(elsewhere).rules->find("tokens")->id, tokens->id);
}

// Verifies that a multi-limit rule keeps its limits in order with their bursts.
TEST(ConfigTest, MultiLimitRuleKeepsEachLimit) {
  Config config = mustLoad(R"(
[[rule]]
name = "m"
limits = [{ limit = 100, period = "1m" }, { limit = 20, period = "10s", burst = 5 }]
)");
  const Rule* rule = config.rules->find("m");
  ASSERT_NE(rule, nullptr);
  ASSERT_EQ(rule->limits.size(), 2u);
  EXPECT_EQ(rule->limits[0].limit, 100);
  EXPECT_EQ(rule->limits[0].burst, 100);
  EXPECT_EQ(rule->limits[1].period_ns, 10'000'000'000);
  EXPECT_EQ(rule->limits[1].burst, 5);
}

// --- redis ------------------------------------------------------------------------

// Verifies that a [redis] section enables global rules and that its url is
// taken apart into address, credentials and database.
TEST(ConfigTest, RedisSectionEnablesGlobalRules) {
  Config config = mustLoad(R"(
[redis]
url = "redis://app:p%40ss@cache.local:6380/2"
expected_nodes = 12
lease_timeout = "20ms"
key_prefix = "rl:eu:"
node_id = "web-7"
health_interval = "50ms"
health_timeout = "300ms"
heartbeat_interval = "2s"
reconnect_max = "250ms"
[[rule]]
name = "g"
limit = 5
period = "1s"
scope = "global"
on_redis_down = "closed"
)");
  ASSERT_TRUE(config.redis.has_value());
  EXPECT_EQ(config.redis->host, "cache.local");
  EXPECT_EQ(config.redis->port, 6380);
  EXPECT_EQ(config.redis->username, "app");
  EXPECT_EQ(config.redis->password, "p@ss");
  EXPECT_EQ(config.redis->db, 2u);
  EXPECT_EQ(config.redis->expected_nodes, 12u);
  EXPECT_EQ(config.redis->lease_timeout_ms, 20);
  EXPECT_EQ(config.redis->key_prefix, "rl:eu:");
  EXPECT_EQ(config.redis->node_id, "web-7");
  EXPECT_EQ(config.redis->health_interval_ms, 50);
  EXPECT_EQ(config.redis->health_timeout_ms, 300);
  EXPECT_EQ(config.redis->heartbeat_interval_ms, 2000);
  EXPECT_EQ(config.redis->reconnect_max_ms, 250);
  const Rule* rule = config.rules->find("g");
  EXPECT_EQ(rule->scope, Scope::kGlobal);
  EXPECT_EQ(rule->on_redis_down, RedisDownPolicy::kClosed);
}

// Verifies the accepted url forms: default port, IPv6, password only, unix.
TEST(ConfigTest, RedisUrlFormsAreParsed) {
  Config plain = mustLoad("[redis]\nurl = \"redis://10.0.0.1\"\n");
  EXPECT_EQ(plain.redis->host, "10.0.0.1");
  EXPECT_EQ(plain.redis->port, 6379);
  EXPECT_EQ(plain.redis->db, 0u);

  Config v6 = mustLoad("[redis]\nurl = \"redis://:secret@[::1]:7000\"\n");
  EXPECT_EQ(v6.redis->host, "::1");
  EXPECT_EQ(v6.redis->port, 7000);
  EXPECT_EQ(v6.redis->username, "");
  EXPECT_EQ(v6.redis->password, "secret");

  Config unix = mustLoad("[redis]\nurl = \"unix:///run/redis/redis.sock\"\n");
  EXPECT_EQ(unix.redis->unix_path, "/run/redis/redis.sock");
  EXPECT_EQ(unix.redis->host, "");

  Config empty = mustLoad("[redis]\n");
  EXPECT_EQ(empty.redis->url, "redis://127.0.0.1:6379");
  EXPECT_EQ(empty.redis->host, "127.0.0.1");
  EXPECT_EQ(empty.redis->port, 6379);
}

// Verifies that Sentinel mode takes the master's name, the sentinels (names,
// IPv4 and bracketed IPv6), the sentinels' AUTH and, apart from it, the
// master's AUTH and db, and leaves the url's address empty.
TEST(ConfigTest, SentinelModeNamesTheMasterTheSentinelsAndBothAuths) {
  Config config = mustLoad(R"(
[redis]
sentinel_master = "cache-eu"
sentinels = ["10.0.0.1:26379", "sentinel-2.local:26380", "[::1]:26381"]
sentinel_username = "watcher"
sentinel_password = "s3cret"
username = "app"
password = "p@ss"
db = 3
)");
  ASSERT_TRUE(config.redis.has_value());
  const RedisConfig& redis = *config.redis;
  EXPECT_TRUE(redis.sentinel());
  EXPECT_EQ(redis.sentinel_master, "cache-eu");
  ASSERT_EQ(redis.sentinel_addresses.size(), 3u);
  EXPECT_EQ(redis.sentinel_addresses[0], (RedisAddress{"10.0.0.1", 26379}));
  EXPECT_EQ(redis.sentinel_addresses[1], (RedisAddress{"sentinel-2.local", 26380}));
  EXPECT_EQ(redis.sentinel_addresses[2], (RedisAddress{"::1", 26381}));
  EXPECT_EQ(redis.sentinel_addresses[2].text(), "[::1]:26381");
  EXPECT_EQ(redis.sentinel_username, "watcher");
  EXPECT_EQ(redis.sentinel_password, "s3cret");
  EXPECT_EQ(redis.username, "app");
  EXPECT_EQ(redis.password, "p@ss");
  EXPECT_EQ(redis.db, 3u);
  EXPECT_EQ(redis.url, "");
  EXPECT_EQ(redis.host, "");
  EXPECT_EQ(redis.port, 0);

  Config standalone = mustLoad("[redis]\nurl = \"redis://10.0.0.1\"\n");
  EXPECT_FALSE(standalone.redis->sentinel());
  EXPECT_TRUE(standalone.redis->sentinel_addresses.empty());
}

// Verifies that Cluster mode takes the seed nodes (IPv4, names, bracketed
// IPv6) and the masters' AUTH, and leaves the url's address empty.
TEST(ConfigTest, ClusterModeTakesSeedNodesAndTheMastersAuth) {
  Config config = mustLoad(R"(
[redis]
cluster_nodes = ["10.0.0.1:7000", "redis-2.local:7001", "[::1]:7002"]
username = "app"
password = "p@ss"
)");
  ASSERT_TRUE(config.redis.has_value());
  const RedisConfig& redis = *config.redis;
  EXPECT_TRUE(redis.cluster());
  EXPECT_FALSE(redis.sentinel());
  ASSERT_EQ(redis.cluster_addresses.size(), 3u);
  EXPECT_EQ(redis.cluster_addresses[0], (RedisAddress{"10.0.0.1", 7000}));
  EXPECT_EQ(redis.cluster_addresses[1], (RedisAddress{"redis-2.local", 7001}));
  EXPECT_EQ(redis.cluster_addresses[2], (RedisAddress{"::1", 7002}));
  EXPECT_EQ(redis.username, "app");
  EXPECT_EQ(redis.password, "p@ss");
  EXPECT_EQ(redis.db, 0u);
  EXPECT_EQ(redis.url, "");
  EXPECT_EQ(redis.host, "");
  EXPECT_EQ(redis.port, 0);

  Config standalone = mustLoad("[redis]\nurl = \"redis://10.0.0.1\"\n");
  EXPECT_FALSE(standalone.redis->cluster());
  EXPECT_TRUE(standalone.redis->cluster_addresses.empty());
}

// Verifies that a refused url is echoed without its password, since the
// message ends up in logs.
TEST(ConfigTest, RedisUrlErrorsDoNotRevealThePassword) {
  std::string error = errorOf("[redis]\nurl = \"redis://:hunter2@cache:http\"\n");
  EXPECT_EQ(error.find("hunter2"), std::string::npos) << error;
  EXPECT_NE(error.find("redis://:***@cache:http"), std::string::npos) << error;
}

// --- durations ----------------------------------------------------------------------

// Verifies that each unit is parsed, and "0" alone is zero.
TEST(ConfigTest, DurationsWithEachUnitAreParsed) {
  EXPECT_EQ(parseDurationNs("500ms"), 500'000'000);
  EXPECT_EQ(parseDurationNs("10s"), 10'000'000'000);
  EXPECT_EQ(parseDurationNs("1m"), 60'000'000'000);
  EXPECT_EQ(parseDurationNs("1h"), 3'600'000'000'000);
  EXPECT_EQ(parseDurationNs("1d"), 86'400'000'000'000);
  EXPECT_EQ(parseDurationNs("0"), 0);
  EXPECT_EQ(parseDurationNs("0s"), 0);
}

// Verifies that a duration too long to hold saturates, so that bounds checks
// call it too long instead of malformed.
TEST(ConfigTest, HugeDurationsSaturate) {
  constexpr int64_t kMost = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(parseDurationNs("99999999999999999d"), kMost);
  EXPECT_EQ(parseDurationNs("99999999999999999999999999ms"), kMost);
  EXPECT_EQ(parseDurationNs("9223372036854ms"), 9'223'372'036'854'000'000);
}

// Verifies that anything but digits and one known unit is not a duration.
TEST(ConfigTest, MalformedDurationsAreRejected) {
  for (const char* text : {"", "10", "s", "10 s", "10 sec", "1.5s", "-1s", "1m30s", "10S",
                           " 10s", "10s ", "1w", "+1s", "0x10s"}) {
    EXPECT_EQ(parseDurationNs(text), std::nullopt) << '"' << text << '"';
  }
}

// --- refusals -------------------------------------------------------------------------

struct Refusal {
  const char* what;
  const char* text;
  const char* position;  // "line:column" expected right after "x.toml:"
  const char* fix;       // a piece of the message that says what to write
};

class ConfigRefusalTest : public testing::TestWithParam<Refusal> {};

// Verifies that each bad file is refused with the file, the line and column
// of the offending spot, and a message that says what to write instead.
TEST_P(ConfigRefusalTest, NamesFileLineAndFix) {
  const Refusal& refusal = GetParam();
  std::string error = errorOf(refusal.text);
  EXPECT_EQ(error.rfind(std::string("x.toml:") + refusal.position + ": ", 0), 0u)
      << "wrong position in: " << error;
  EXPECT_NE(error.find(refusal.fix), std::string::npos) << "no fix in: " << error;
}

// A node id one byte over its limit (256), as a whole file.
const std::string kLongNodeIdFile = "[redis]\nnode_id = \"" + std::string(257, 'n') + "\"\n";

const Refusal kRefusals[] = {
    {"unknown_key_suggests", "[limits]\nmax_conections = 5\n", "2:1",
     "unknown key \"max_conections\" in [limits]; did you mean \"max_connections\"?"},
    {"unknown_key_lists_keys", "[keys]\nfoo = 1\n", "2:1",
     "remove it (the keys of [keys] are max_keys, max_memory, sweep_interval)"},
    {"unknown_access_key_suggests", "[access]\nuser = [0]\n", "2:1", "did you mean \"users\"?"},
    {"unknown_section_suggests", "[limit]\nmax_depth = 4\n", "1:2", "did you mean [limits]?"},
    {"option_outside_section", "workers = 2\n", "1:1", "move it under [daemon]"},
    {"unknown_rule_key_suggests",
     "[[rule]]\nname = \"r\"\nlimit = 1\nperiod = \"1s\"\nperoid = 1\n", "5:1",
     "did you mean \"period\"?"},
    {"section_is_not_a_table", "daemon = 1\n", "1:10", "write [daemon] on a line of its own"},
    {"rule_is_a_single_table", "[rule]\nname = \"r\"\n", "1:1", "[[rule]] section (two brackets)"},
    {"wrong_type_integer", "[limits]\nmax_connections = \"10\"\n", "2:19",
     "is a string; write a whole number without quotes or decimals, e.g. max_connections = 4096"},
    {"wrong_type_duration", "[limits]\nidle_timeout = 30\n", "2:16",
     "write a duration in quotes with a unit, e.g. idle_timeout = \"5m\""},
    {"wrong_type_string", "[daemon]\nlog_level = 3\n", "2:13", "e.g. log_level = \"info\""},
    {"bad_choice", "[daemon]\nlog_level = \"verbose\"\n", "2:13",
     "is not one of \"trace\", \"debug\", \"info\""},
    {"below_minimum", "[limits]\nmax_connections = 0\n", "2:19",
     "max_connections = 0 is below the minimum 1; write a value from 1 to 1000000"},
    {"above_maximum", "[daemon]\nworkers = 5000\n", "2:11",
     "above the maximum 1024; write a value from 0 to 1024"},
    {"duration_below_minimum", "[limits]\npartial_frame_timeout = \"10ms\"\n", "2:25",
     "is below the minimum \"100ms\"; write a value from \"100ms\" to \"10m\""},
    {"duration_above_maximum", "[keys]\nsweep_interval = \"2h\"\n", "2:18",
     "above the maximum \"1h\""},
    {"bad_duration", "[limits]\nidle_timeout = \"10 sec\"\n", "2:16",
     "\"10 sec\" is not a duration; write a number with a unit: \"500ms\", \"10s\", \"1m\", "
     "\"1h\", \"1d\""},
    {"frame_smaller_than_key", "[limits]\nmax_frame_bytes = 2048\nmax_key_bytes = 2000\n", "3:17",
     "write max_frame_bytes of at least max_key_bytes + 256"},
    {"socket_mode_decimal", "[daemon]\nsocket_mode = 660\n", "2:15",
     "decimal number 660; write permission bits in octal, in quotes: socket_mode = \"0660\""},
    {"socket_mode_not_octal", "[daemon]\nsocket_mode = \"0968\"\n", "2:15",
     "not an octal mode; write up to four octal digits"},
    {"socket_mode_too_large", "[daemon]\nsocket_mode = \"1777\"\n", "2:15",
     "above the maximum \"0777\""},
    {"socket_relative_path", "[daemon]\nsocket = \"sluice.sock\"\n", "2:10",
     "not an absolute path; write one starting with /"},
    {"socket_path_too_long",
     "[daemon]\nsocket = \"/tmp/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"\n",
     "2:10",
     "holds at most 107 bytes"},
    {"bad_toml_syntax", "[daemon]\nworkers = = 2\n", "2:11", "invalid TOML: "},
    {"bad_toml_unterminated", "[daemon]\nsocket = \"/run/x\n", "2:17", "invalid TOML: "},
    {"duplicate_rule_name",
     "[[rule]]\nname = \"api\"\nlimit = 1\nperiod = \"1s\"\n"
     "[[rule]]\nname = \"api\"\nlimit = 2\nperiod = \"1s\"\n",
     "6:8", "rule \"api\" is defined twice (first on line 2); give each rule its own name"},
    {"rule_without_name", "[[rule]]\nlimit = 1\nperiod = \"1s\"\n", "1:1",
     "rule #1: has no name; write name = \"api\""},
    {"rule_empty_name", "[[rule]]\nname = \"\"\n", "2:8", "name is empty"},
    {"rule_control_character_in_name", "[[rule]]\nname = \"a\\tb\"\n", "2:8",
     "write only printable characters"},
    {"rule_without_limit", "[[rule]]\nname = \"r\"\nperiod = \"1s\"\n", "1:1",
     "rule \"r\": has no limit; write limit = 100 and period = \"1m\""},
    {"rule_without_period", "[[rule]]\nname = \"r\"\nlimit = 5\n", "1:1",
     "limit 5 has no period; write e.g. period = \"1m\""},
    {"rule_bad_period", "[[rule]]\nname = \"api\"\nlimit = 5\nperiod = \"10 sec\"\n", "4:10",
     "rule \"api\": period \"10 sec\" is not a duration; write a number with a unit: \"500ms\", "
     "\"10s\", \"1m\", \"1h\", \"1d\""},
    {"rule_period_above_maximum", "[[rule]]\nname = \"r\"\nlimit = 5\nperiod = \"400d\"\n", "4:10",
     "write a period from \"1ms\" to \"366d\""},
    {"rule_period_zero", "[[rule]]\nname = \"r\"\nlimit = 5\nperiod = \"0\"\n", "4:10",
     "write a period from \"1ms\" to \"366d\""},
    {"rule_unknown_algorithm", "[[rule]]\nname = \"r\"\nalgorithm = \"gcr\"\n", "3:13",
     "did you mean \"gcra\"?"},
    {"rule_limit_zero", "[[rule]]\nname = \"r\"\nlimit = 0\nperiod = \"1s\"\n", "3:9",
     "write a limit of at least 1"},
    {"rule_limit_above_max_limit",
     "[[rule]]\nname = \"r\"\nalgorithm = \"sliding_log\"\nlimit = 5000\nperiod = \"1s\"\n", "4:9",
     "limit 5000 is above 1000, the most a sliding_log rule can hold; write a limit up to 1000, "
     "or use algorithm = \"sliding_window\""},
    {"rule_limit_is_float", "[[rule]]\nname = \"r\"\nlimit = 1.5\nperiod = \"1s\"\n", "3:9",
     "write a whole number"},
    {"rule_burst_on_window_algorithm",
     "[[rule]]\nname = \"r\"\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1s\"\n"
     "burst = 2\n",
     "6:9",
     "burst applies only to token_bucket and gcra, and this rule is fixed_window; remove burst"},
    {"rule_burst_zero", "[[rule]]\nname = \"r\"\nlimit = 5\nperiod = \"1s\"\nburst = 0\n", "5:9",
     "write a burst from 1 to 1000000000"},
    {"rule_burst_spans_beyond_2_to_50_us",
     "[[rule]]\nname = \"r\"\nlimit = 10\nperiod = \"1d\"\nburst = 1000000\n", "5:9",
     "rule \"r\": burst 1000000 at 10 per \"1d\" takes longer than 2^50 us (about 35 years) to "
     "refill; write a burst up to 130312, or a shorter period"},
    {"rule_both_limit_and_limits",
     "[[rule]]\nname = \"r\"\nlimit = 5\nlimits = [{ limit = 1, period = \"1s\" }]\n", "3:9",
     "limit and limits = [...] cannot both be given"},
    {"rule_limits_empty", "[[rule]]\nname = \"r\"\nlimits = []\n", "3:10", "limits is empty"},
    {"rule_limits_unknown_key",
     "[[rule]]\nname = \"r\"\nlimits = [{ limit = 1, period = \"1s\", brust = 1 }]\n", "3:39",
     "rule \"r\": unknown key \"brust\" in limits; did you mean \"burst\"?"},
    {"rule_limits_same_period",
     "[[rule]]\nname = \"r\"\nlimits = [{ limit = 1, period = \"1s\" }, { limit = 2, period = "
     "\"1000ms\" }]\n",
     "3:41", "two limits have the period \"1s\""},
    {"rule_concurrency_two_limits",
     "[[rule]]\nname = \"r\"\nalgorithm = \"concurrency\"\n"
     "limits = [{ limit = 1 }, { limit = 2 }]\n",
     "4:10", "a concurrency rule holds one limit"},
    {"global_without_redis",
     "[[rule]]\nname = \"r\"\nlimit = 5\nperiod = \"1s\"\nscope = \"global\"\n", "5:9",
     "add [redis] with url = \"redis://host:6379\", or set scope = \"local\""},
    {"on_redis_down_on_local_rule",
     "[[rule]]\nname = \"r\"\nlimit = 5\nperiod = \"1s\"\non_redis_down = \"open\"\n", "5:17",
     "on_redis_down applies only to global rules; remove it, or set scope = \"global\""},
    {"shadow_not_boolean", "[[rule]]\nname = \"r\"\nlimit = 5\nperiod = \"1s\"\nshadow = \"yes\"\n",
     "5:10", "write shadow = true or shadow = false"},
    {"redis_url_bad_scheme", "[redis]\nurl = \"http://cache:6379\"\n", "2:7",
     "must start with redis:// or unix://; write e.g. url = \"redis://127.0.0.1:6379\""},
    {"redis_url_bad_port", "[redis]\nurl = \"redis://cache:99999\"\n", "2:7",
     "the port \"99999\" is not a number from 1 to 65535"},
    {"redis_url_no_host", "[redis]\nurl = \"redis://:6379\"\n", "2:7", "the host is missing"},
    {"redis_url_bad_db", "[redis]\nurl = \"redis://cache:6379/zero\"\n", "2:7",
     "the database \"zero\" after the / is not a number"},
    {"redis_url_password_without_colon", "[redis]\nurl = \"redis://secret@cache\"\n", "2:7",
     "redis://:password@host"},
    {"redis_url_error_hides_password", "[redis]\nurl = \"redis://app:hunter2@cache:0\"\n", "2:7",
     "url \"redis://app:***@cache:0\" is not a Redis url"},
    {"rule_period_too_long_to_hold",
     "[[rule]]\nname = \"r\"\nlimit = 5\nperiod = \"99999999999999999999d\"\n", "4:10",
     "write a period from \"1ms\" to \"366d\""},
    {"redis_url_relative_unix_path", "[redis]\nurl = \"unix://run/redis.sock\"\n", "2:7",
     "must be absolute (three slashes)"},
    {"redis_unknown_key", "[redis]\nurl = \"redis://h\"\nexpected_node = 3\n", "3:1",
     "did you mean \"expected_nodes\"?"},
    {"redis_node_id_control_character", "[redis]\nnode_id = \"a\\tb\"\n", "2:11",
     "[redis] node_id has a control character; write printable text"},
    {"redis_node_id_too_long", kLongNodeIdFile.c_str(), "2:11",
     "[redis] node_id is 257 bytes long; write at most 256 bytes"},
    {"redis_health_timeout_too_short", "[redis]\nhealth_timeout = \"1ms\"\n", "2:18",
     "below the minimum \"10ms\""},
    {"redis_reconnect_max_too_short", "[redis]\nreconnect_max = \"10ms\"\n", "2:17",
     "below the minimum \"50ms\""},
    {"redis_key_prefix_with_brace", "[redis]\nkey_prefix = \"app{1}:\"\n", "2:14",
     "[redis] key_prefix \"app{1}:\" has a brace, which Redis Cluster reads as a hash tag; "
     "write a prefix without { and }"},
    {"cluster_with_url",
     "[redis]\nurl = \"redis://cache:6379\"\ncluster_nodes = [\"10.0.0.1:6379\"]\n", "2:7",
     "[redis] url belongs to standalone mode, and this section also has cluster_nodes (line 3), "
     "which name a Redis Cluster; write either cluster_nodes or url, not both"},
    {"cluster_with_sentinels",
     "[redis]\ncluster_nodes = [\"10.0.0.1:6379\"]\nsentinels = [\"10.0.0.1:26379\"]\n", "3:13",
     "[redis] sentinels belongs to Sentinel mode, and this section also has cluster_nodes (line "
     "2), which name a Redis Cluster; write either cluster_nodes or sentinel_master and "
     "sentinels, not both"},
    {"cluster_with_db", "[redis]\ncluster_nodes = [\"10.0.0.1:6379\"]\ndb = 1\n", "3:6",
     "[redis] db does not apply to a Redis Cluster, which has only database 0; remove db"},
    {"cluster_username_without_password",
     "[redis]\ncluster_nodes = [\"10.0.0.1:6379\"]\nusername = \"u\"\n", "3:12",
     "username needs password"},
    {"cluster_nodes_empty", "[redis]\ncluster_nodes = []\n", "2:17",
     "[redis] cluster_nodes is empty; write at least one, e.g. cluster_nodes = [\"10.0.0.1:6379\""},
    {"cluster_node_twice", "[redis]\ncluster_nodes = [\"a:1\", \"a:1\"]\n", "2:25",
     "has \"a:1\" twice; write each node once"},
    {"sentinel_with_url",
     "[redis]\nurl = \"redis://cache:6379\"\nsentinel_master = \"mymaster\"\n"
     "sentinels = [\"10.0.0.1:26379\"]\n",
     "3:19", "this section also has url (line 2), which names one Redis; write either url"},
    {"sentinel_master_password_with_url",
     "[redis]\nurl = \"redis://cache:6379\"\npassword = \"secret\"\n", "3:12",
     "write the master's user, password and db in the url instead"},
    {"sentinels_without_master", "[redis]\nsentinels = [\"10.0.0.1:26379\"]\n", "2:13",
     "needs sentinel_master, the master's name as the sentinels know it; add e.g. "
     "sentinel_master = \"mymaster\""},
    {"sentinel_password_without_master", "[redis]\nsentinel_password = \"s\"\n", "2:21",
     "applies in Sentinel mode only"},
    {"sentinel_master_without_sentinels", "[redis]\nsentinel_master = \"mymaster\"\n", "2:19",
     "needs sentinels, the addresses to ask where the master is; add e.g. sentinels = ["},
    {"sentinel_master_empty",
     "[redis]\nsentinel_master = \"\"\nsentinels = [\"10.0.0.1:26379\"]\n", "2:19",
     "sentinel_master is empty; write the master's name"},
    {"sentinel_master_with_space",
     "[redis]\nsentinel_master = \"my master\"\nsentinels = [\"10.0.0.1:26379\"]\n", "2:19",
     "has a space, which no Sentinel master name has"},
    {"sentinels_not_a_list",
     "[redis]\nsentinel_master = \"m\"\nsentinels = \"10.0.0.1:26379\"\n", "3:13",
     "[redis] sentinels is a string; write a list in brackets, e.g. sentinels = ["},
    {"sentinels_empty", "[redis]\nsentinel_master = \"m\"\nsentinels = []\n", "3:13",
     "[redis] sentinels is empty; write at least one"},
    {"sentinel_without_port",
     "[redis]\nsentinel_master = \"m\"\nsentinels = [\"10.0.0.1:26379\", \"10.0.0.2\"]\n",
     "3:32", "has \"10.0.0.2\", which is not an address: no port; write \"host:port\""},
    {"sentinel_bad_port",
     "[redis]\nsentinel_master = \"m\"\nsentinels = [\"10.0.0.1:0\"]\n", "3:14",
     "the port \"0\" is not a number from 1 to 65535"},
    {"sentinel_ipv6_without_brackets",
     "[redis]\nsentinel_master = \"m\"\nsentinels = [\"::1:26379\"]\n", "3:14",
     "an IPv6 address goes in brackets"},
    {"sentinel_twice",
     "[redis]\nsentinel_master = \"m\"\nsentinels = [\"a:1\", \"a:1\"]\n", "3:21",
     "has \"a:1\" twice; write each sentinel once"},
    {"sentinel_not_a_string",
     "[redis]\nsentinel_master = \"m\"\nsentinels = [26379]\n", "3:14",
     "[redis] sentinels item is an integer; write a string in double quotes"},
    {"sentinel_username_without_password",
     "[redis]\nsentinel_master = \"m\"\nsentinels = [\"a:1\"]\nsentinel_username = \"u\"\n",
     "4:21", "sentinel_username needs sentinel_password"},
    {"sentinel_master_username_without_password",
     "[redis]\nsentinel_master = \"m\"\nsentinels = [\"a:1\"]\nusername = \"u\"\n", "4:12",
     "username needs password"},
    {"max_wait_on_window_rule",
     "[[rule]]\nname = \"r\"\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1s\"\n"
     "max_wait = \"1s\"\n",
     "6:12", "max_wait applies only to token_bucket and gcra"},
    {"max_wait_above_maximum",
     "[[rule]]\nname = \"r\"\nlimit = 5\nperiod = \"1s\"\nmax_wait = \"2m\"\n", "5:12",
     "write a wait from \"0\" to \"1m\""},
    {"max_debt_on_concurrency_rule",
     "[[rule]]\nname = \"r\"\nalgorithm = \"concurrency\"\nlimit = 5\nperiod = \"1m\"\n"
     "max_debt = 10\n",
     "6:12", "max_debt bounds what a settle charges, which applies only to token_bucket"},
    {"max_debt_negative",
     "[[rule]]\nname = \"r\"\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1s\"\n"
     "max_debt = -1\n",
     "6:12", "max_debt -1 is out of range; write a count of units from 0"},
    {"pace_with_burst",
     "[[rule]]\nname = \"r\"\nlimit = 5\nperiod = \"1s\"\nburst = 3\npace = true\n", "6:8",
     "pace = true lets one unit through per interval, with no burst; remove burst"},
    {"pace_on_global_rule_of_two_limits",
     "[redis]\n[[rule]]\nname = \"r\"\nalgorithm = \"gcra\"\nscope = \"global\"\n"
     "limits = [{ limit = 5, period = \"1s\" }, { limit = 50, period = \"1m\" }]\npace = true\n",
     "7:8", "pace on a global rule needs one limit"},
    {"override_without_match",
     "[[rule]]\nname = \"r\"\nlimit = 5\nperiod = \"1s\"\noverrides = [{ limit = 9 }]\n", "5:14",
     "an override needs the keys it applies to: key = \"acme\""},
    {"override_two_matches",
     "[[rule]]\nname = \"r\"\nlimit = 5\nperiod = \"1s\"\n"
     "overrides = [{ key = \"a\", prefix = \"b\", limit = 9 }]\n",
     "5:36", "write only one of them"},
    {"override_unknown_key",
     "[[rule]]\nname = \"r\"\nlimit = 5\nperiod = \"1s\"\n"
     "overrides = [{ prefix = \"p\", limt = 9 }]\n",
     "5:30", "unknown key \"limt\" in overrides; did you mean \"limit\"?"},
    {"override_empty_prefix",
     "[[rule]]\nname = \"r\"\nlimit = 5\nperiod = \"1s\"\noverrides = [{ prefix = \"\", limit = 9 }]\n",
     "5:25", "an empty prefix matches every key"},
    {"override_given_twice",
     "[[rule]]\nname = \"r\"\nlimit = 5\nperiod = \"1s\"\n"
     "overrides = [{ prefix = \"p\", limit = 9 }, { prefix = \"p\", limit = 8 }]\n",
     "5:43", "rule \"r\": override \"p\": is given twice"},
    {"override_limits_count",
     "[[rule]]\nname = \"r\"\nlimits = [{ limit = 5, period = \"1s\" }, { limit = 50, period = \"1m\" }]\n"
     "overrides = [{ prefix = \"p\", limit = 9 }]\n",
     "4:14", "the rule has 2 limits; give the override as many"},
    {"override_bad_limit",
     "[[rule]]\nname = \"r\"\nlimit = 5\nperiod = \"1s\"\noverrides = [{ prefix = \"p\", limit = 0 }]\n",
     "5:38", "rule \"r\": override \"p\": limit 0 is below 1"},
    {"override_on_concurrency_rule",
     "[[rule]]\nname = \"r\"\nalgorithm = \"concurrency\"\nlimit = 5\n"
     "overrides = [{ prefix = \"p\", limit = 9 }]\n",
     "5:13", "overrides apply to token_bucket, gcra, fixed_window and sliding_window rules"},
    {"override_burst_on_paced_rule",
     "[[rule]]\nname = \"r\"\nalgorithm = \"gcra\"\nlimit = 5\nperiod = \"1s\"\npace = true\n"
     "overrides = [{ prefix = \"p\", limit = 9, burst = 3 }]\n",
     "7:14", "the rule has pace = true"},
    {"penalty_missing_block",
     "[[rule]]\nname = \"r\"\nlimit = 5\nperiod = \"1s\"\npenalty = { denials = 3, window = \"1m\" }\n",
     "5:11", "penalty needs block; write penalty = { denials = 5"},
    {"penalty_unknown_key",
     "[[rule]]\nname = \"r\"\nlimit = 5\nperiod = \"1s\"\n"
     "penalty = { denials = 3, window = \"1m\", blok = \"1m\" }\n",
     "5:41", "unknown key \"blok\" in penalty; did you mean \"block\"?"},
    {"penalty_zero_denials",
     "[[rule]]\nname = \"r\"\nlimit = 5\nperiod = \"1s\"\n"
     "penalty = { denials = 0, window = \"1m\", block = \"1m\" }\n",
     "5:23", "penalty denials 0 is out of range; write a count from 1 to 1000000"},
    {"penalty_window_too_long",
     "[[rule]]\nname = \"r\"\nlimit = 5\nperiod = \"1s\"\n"
     "penalty = { denials = 3, window = \"2d\", block = \"1m\" }\n",
     "5:35", "penalty window \"2d\" is out of range; write a duration from \"1ms\" to \"1d\""},
    {"penalty_on_global_rule_of_several_limits",
     "[redis]\n[[rule]]\nname = \"r\"\nlimits = [{ limit = 5, period = \"1s\" }, "
     "{ limit = 50, period = \"1m\" }]\nscope = \"global\"\n"
     "penalty = { denials = 3, window = \"1m\", block = \"1m\" }\n",
     "6:11", "a rule of several limits leases each limit on its own, with no one block"},
    {"penalty_on_global_concurrency_rule",
     "[redis]\n[[rule]]\nname = \"r\"\nalgorithm = \"concurrency\"\nlimit = 5\n"
     "scope = \"global\"\npenalty = { denials = 3, window = \"1m\", block = \"1m\" }\n",
     "7:11", "a global concurrency rule leases units that are held, not spent"},
    {"lease_ttl_too_short", "[redis]\nlease_ttl = \"100ms\"\n", "2:13",
     "lease_ttl = \"100ms\" is below the minimum \"300ms\"; write a value from \"300ms\" to \"1h\""},
    {"access_unknown_user", "[access]\nusers = [0, \"no-such-user-x\"]\n", "2:13",
     "there is no user \"no-such-user-x\" on this machine; write a name from /etc/passwd"},
    {"access_unknown_admin_group", "[access]\nadmin_group = \"no-such-group-x\"\n", "2:15",
     "there is no group \"no-such-group-x\" on this machine; write a name from /etc/group"},
    {"access_negative_gid", "[access]\ngroups = [-1]\n", "2:11",
     "-1, which is not a gid; write a number from 0 to 4294967294 or a group name"},
    {"access_users_not_a_list", "[access]\nusers = \"www-data\"\n", "2:9",
     "write a list in brackets, e.g. users = [\"www-data\", 1001]"},
    {"access_admin_group_boolean", "[access]\nadmin_group = true\n", "2:15",
     "write a group name in quotes or a number"},
    {"socket_mode_unquoted_octal", "[daemon]\nsocket_mode = 0660\n", "2:19",
     "leading zeroes are prohibited; a mode with a leading zero is octal, which TOML reads only "
     "in quotes (or as 0o660); write socket_mode = \"0660\""},
    {"rule_leaky_bucket_algorithm",
     "[[rule]]\nname = \"r\"\nalgorithm = \"leaky_bucket\"\nlimit = 5\nperiod = \"1s\"\n", "3:13",
     "algorithm \"leaky_bucket\" is not one of \"token_bucket\", \"gcra\", \"fixed_window\", "
     "\"sliding_window\", \"sliding_log\", \"concurrency\"; a leaky bucket is algorithm = "
     "\"gcra\" with pace = true"},
    {"redis_password_file_and_password",
     "[redis]\nsentinel_master = \"m\"\nsentinels = [\"10.0.0.1:26379\"]\n"
     "password = \"x\"\npassword_file = \"/etc/sluice/redis.password\"\n",
     "5:17", "[redis] password_file and password (line 4) both give the password; keep "
     "password_file"},
    {"redis_password_file_relative", "[redis]\npassword_file = \"redis.password\"\n", "2:17",
     "is not an absolute path; write one starting with /"},
    {"redis_sentinel_password_file_with_url",
     "[redis]\nurl = \"redis://h:6379\"\nsentinel_password_file = \"/etc/sluice/s\"\n", "3:26",
     "[redis] sentinel_password_file belongs to Sentinel mode, and this section also has url"},
    {"redis_password_file_missing",
     "[redis]\npassword_file = \"/nonexistent/sluice/redis.password\"\n", "2:17",
     "[redis] password_file \"/nonexistent/sluice/redis.password\" cannot be read: No such file "
     "or directory; write the path of a file the daemon's user can read"},
    {"calendar_window_unknown",
     "[[rule]]\nname = \"b\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"mnth\"\n",
     "5:10", "window \"mnth\" is not one of \"day\", \"week\", \"month\"; did you mean \"month\"?"},
    {"calendar_window_written_as_a_period",
     "[[rule]]\nname = \"b\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1d\"\n",
     "5:10", "or period = \"1d\" for a fixed length"},
    {"calendar_window_as_a_flag",
     "[[rule]]\nname = \"b\"\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1d\"\n"
     "calendar = true\n",
     "6:1", "a calendar window is written window = \"day\", \"week\" or \"month\" in place of "
     "period"},
    {"calendar_month_as_a_period",
     "[[rule]]\nname = \"b\"\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1mo\"\n",
     "5:10", "period \"1mo\" is not a duration; a rule's limit per calendar week or month is "
     "written window = \"week\" or \"month\" in place of period"},
    {"calendar_window_on_a_bucket",
     "[[rule]]\nname = \"b\"\nlimit = 5\nwindow = \"day\"\n", "4:10",
     "window applies only to fixed_window"},
    {"calendar_window_and_period",
     "[[rule]]\nname = \"b\"\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1d\"\n"
     "window = \"day\"\n",
     "6:10", "window and period cannot both be given"},
    {"calendar_time_zone_unknown",
     "[[rule]]\nname = \"b\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"day\"\n"
     "time_zone = \"Europe/Berln\"\n",
     "6:13", "time_zone \"Europe/Berln\" is not a zone of the system's time-zone database"},
    {"calendar_time_zone_without_window",
     "[[rule]]\nname = \"b\"\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1d\"\n"
     "time_zone = \"UTC\"\n",
     "6:13", "time_zone applies to limits with a calendar window"},
    {"calendar_two_limits_of_one_window",
     "[[rule]]\nname = \"b\"\nalgorithm = \"fixed_window\"\n"
     "limits = [{ limit = 5, window = \"day\" }, { limit = 9, window = \"day\" }]\n",
     "4:42", "two limits have the window \"day\""},
};

INSTANTIATE_TEST_SUITE_P(Refusals, ConfigRefusalTest, testing::ValuesIn(kRefusals),
                         [](const testing::TestParamInfo<Refusal>& info) {
                           return std::string(info.param.what);
                         });

// --- what the file names on this machine --------------------------------------------

// Verifies that a socket in a directory that does not exist is refused at its
// line with the fix when the host is checked (--check-config, startup), and
// taken when only the file is (tests, reloads).
TEST(ConfigTest, SocketInADirectoryThatDoesNotExistIsRefusedWhenTheHostIsChecked) {
  const std::string text = "[daemon]\nsocket = \"/nonexistent-sluice-dir/s.sock\"\n";
  ConfigResult host = loadConfigString(text, "x.toml", ConfigChecks::kHost);
  ASSERT_FALSE(host.ok());
  EXPECT_EQ(host.error,
            "x.toml:2:10: [daemon] socket \"/nonexistent-sluice-dir/s.sock\" is in "
            "\"/nonexistent-sluice-dir\", which does not exist; create it (mkdir -p "
            "/nonexistent-sluice-dir, or RuntimeDirectory= in the daemon's systemd unit), or "
            "write a socket path in a directory that exists");
  EXPECT_TRUE(loadConfigString(text, "x.toml", ConfigChecks::kFile).ok());

  test::TempDir dir;
  test::writeFile(dir.file("file"), "");
  ConfigResult under_file = loadConfigString(
      "[daemon]\nsocket = \"" + dir.file("file") + "/s.sock\"\n", "x.toml", ConfigChecks::kHost);
  ASSERT_FALSE(under_file.ok());
  EXPECT_NE(under_file.error.find("which is not a directory"), std::string::npos)
      << under_file.error;
  ConfigResult fine = loadConfigString("[daemon]\nsocket = \"" + dir.file("s.sock") + "\"\n",
                                       "x.toml", ConfigChecks::kHost);
  EXPECT_TRUE(fine.ok()) << fine.error;
}

// Verifies the shipped config passes the host's checks whether /run/sluice
// exists or not: its socket's directory is the systemd unit's
// RuntimeDirectory, made when the unit starts (a fresh install's
// --check-config runs before that).
TEST(ConfigTest, ASocketInTheRuntimeDirectoryIsTakenBeforeTheUnitMadeIt) {
  ConfigResult shipped =
      loadConfigFile(std::string(SLUICE_SOURCE_DIR) + "/conf/sluice.toml", ConfigChecks::kHost);
  EXPECT_TRUE(shipped.ok()) << shipped.error;
  ConfigResult named = loadConfigString("[daemon]\nsocket = \"/run/sluice/other.sock\"\n",
                                        "x.toml", ConfigChecks::kHost);
  EXPECT_TRUE(named.ok()) << named.error;
}

// A file holding `secret` with permission bits `mode`, in `dir`.
std::string secretFile(const test::TempDir& dir, const std::string& secret, mode_t mode) {
  const std::string path = dir.file("secret");
  test::writeFile(path, secret);
  EXPECT_EQ(chmod(path.c_str(), mode), 0);
  return path;
}

// Verifies that password_file's one line (without its newline) becomes the
// masters' password, with the url's host and an ACL user in username, and
// that sentinel_password_file's becomes the sentinels'.
TEST(ConfigTest, PasswordFilesAreReadIntoThePasswords) {
  test::TempDir dir;
  const std::string path = secretFile(dir, "s3cret\n", 0600);
  Config standalone = mustLoad("[redis]\nurl = \"redis://10.0.0.1:6380/2\"\nusername = \"lease\"\n"
                               "password_file = \"" + path + "\"\n");
  ASSERT_TRUE(standalone.redis.has_value());
  EXPECT_EQ(standalone.redis->password, "s3cret");
  EXPECT_EQ(standalone.redis->username, "lease");
  EXPECT_EQ(standalone.redis->host, "10.0.0.1");
  EXPECT_EQ(standalone.redis->port, 6380);
  EXPECT_EQ(standalone.redis->db, 2u);
  EXPECT_EQ(standalone.redis->password_file, path);

  Config sentinel = mustLoad("[redis]\nsentinel_master = \"m\"\nsentinels = [\"10.0.0.1:26379\"]\n"
                             "sentinel_password_file = \"" + path + "\"\npassword_file = \"" +
                             path + "\"\n");
  ASSERT_TRUE(sentinel.redis.has_value());
  EXPECT_EQ(sentinel.redis->sentinel_password, "s3cret");
  EXPECT_EQ(sentinel.redis->password, "s3cret");

  Config cluster = mustLoad("[redis]\ncluster_nodes = [\"10.0.0.1:6379\"]\nusername = \"u\"\n"
                            "password_file = \"" + path + "\"\n");
  ASSERT_TRUE(cluster.redis.has_value());
  EXPECT_EQ(cluster.redis->password, "s3cret");
}

// Verifies that a password file its group or others may read is refused at
// its line with the fix, as are an empty file, one of two lines, a FIFO and
// a url that has its own password.
TEST(ConfigTest, PasswordFileOpenToOthersOrNotOneLineIsRefusedAtItsLine) {
  test::TempDir dir;
  const std::string text_head = "[redis]\nurl = \"redis://h:6379\"\npassword_file = \"";
  std::string path = secretFile(dir, "s3cret\n", 0640);
  EXPECT_EQ(errorOf(text_head + path + "\"\n"),
            "x.toml:3:17: [redis] password_file \"" + path + "\" is open to its group or others "
            "(mode 0640); chmod 600 it, owned by the daemon's user, so that only the daemon "
            "reads the password");
  path = secretFile(dir, "s3cret\n", 0604);
  EXPECT_NE(errorOf(text_head + path + "\"\n").find("(mode 0604); chmod 600"), std::string::npos);
  path = secretFile(dir, "\n", 0600);
  EXPECT_NE(errorOf(text_head + path + "\"\n").find("is empty; write the password in it"),
            std::string::npos);
  path = secretFile(dir, "s3cret\nmore\n", 0600);
  EXPECT_NE(errorOf(text_head + path + "\"\n").find("holds more than one line"),
            std::string::npos);
  // A FIFO is refused without waiting for a writer.
  const std::string fifo = dir.file("fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(errorOf(text_head + fifo + "\"\n").find("is not a regular file"), std::string::npos);
  path = secretFile(dir, "s3cret", 0600);
  EXPECT_NE(errorOf("[redis]\nurl = \"redis://:pw@h:6379\"\npassword_file = \"" + path + "\"\n")
                .find("x.toml:3:17: [redis] password_file and the url both give the password"),
            std::string::npos);
}

// Verifies that [access] resolves user and group names to ids (root exists
// on every machine) and keeps numbers as they are.
TEST(ConfigTest, AccessNamesAreResolvedToIds) {
  Config config = mustLoad(R"(
[access]
users = ["root", 1001]
groups = ["root", 4242]
admin_group = "root"
max_connections_per_user = 3
)");
  EXPECT_EQ(config.access.users, (std::vector<uint32_t>{0, 1001}));
  EXPECT_EQ(config.access.groups, (std::vector<uint32_t>{0, 4242}));
  EXPECT_EQ(config.access.admin_group, 0);
  EXPECT_EQ(config.access.max_connections_per_user, 3u);
  EXPECT_EQ(mustLoad("[access]\nadmin_group = 50\n").access.admin_group, 50);
  Config defaults = mustLoad("[access]\nadmin_group = \"\"\n");
  EXPECT_EQ(defaults.access.admin_group, -1);
  EXPECT_TRUE(defaults.access.users.empty());
  EXPECT_EQ(defaults.access.max_connections_per_user, 0u);
}

// Verifies bounded waiting's rule options: max_wait is stored, pace sets
// every limit's burst to 1.
TEST(ConfigTest, MaxWaitAndPaceAreStored) {
  Config config = mustLoad(R"(
[[rule]]
name = "payments"
algorithm = "gcra"
limits = [{ limit = 10, period = "1s" }, { limit = 300, period = "1m" }]
pace = true
max_wait = "2s"
)");
  const Rule* rule = config.rules->find("payments");
  ASSERT_NE(rule, nullptr);
  EXPECT_TRUE(rule->pace);
  EXPECT_EQ(rule->max_wait_ns, 2'000'000'000);
  for (const Limit& limit : rule->limits) EXPECT_EQ(limit.burst, 1);
  EXPECT_EQ(mustLoad("[[rule]]\nname = \"r\"\nlimit = 5\nperiod = \"1s\"\n").rules->find("r")->max_wait_ns,
            0);
}

// Verifies a rule's debt bound: max_debt when written, else each limit's
// own limit.
TEST(ConfigTest, MaxDebtBoundsEachLimitAndDefaultsToTheLimit) {
  Config config = mustLoad(R"(
[[rule]]
name = "capped"
algorithm = "fixed_window"
limits = [{ limit = 100, period = "1m" }, { limit = 5000, period = "1d" }]
max_debt = 0

[[rule]]
name = "plain"
algorithm = "token_bucket"
limit = 30
period = "1s"
)");
  const Rule* capped = config.rules->find("capped");
  ASSERT_NE(capped, nullptr);
  EXPECT_EQ(capped->max_debt, std::optional<int64_t>(0));
  EXPECT_EQ(debtBound(*capped, capped->limits[1]), 0);
  const Rule* plain = config.rules->find("plain");
  ASSERT_NE(plain, nullptr);
  EXPECT_FALSE(plain->max_debt.has_value());
  EXPECT_EQ(debtBound(*plain, plain->limits[0]), 30);
}

// Verifies overrides are stored with their match and limits, a single
// limit's period defaults to the rule's, and the [[rule.overrides]] form
// reads the same as the inline one.
TEST(ConfigTest, OverridesAreStored) {
  Config config = mustLoad(R"(
[[rule]]
name = "api"
limit = 100
period = "1m"
burst = 20
overrides = [
  { prefix = "pro:", limit = 1000, burst = 200 },
  { key = "acme", limit = 5000, period = "1s" },
  { glob = "*-eu", limit = 50 },
]

[[rule]]
name = "two"
algorithm = "fixed_window"
limits = [{ limit = 10, period = "1s" }, { limit = 100, period = "1m" }]
[[rule.overrides]]
prefix = "pro:"
limits = [{ limit = 20, period = "1s" }, { limit = 500, period = "1m" }]
)");
  const Rule* api = config.rules->find("api");
  ASSERT_NE(api, nullptr);
  ASSERT_EQ(api->overrides.size(), 3u);
  EXPECT_EQ(api->overrides[0].match, Override::Match::kPrefix);
  EXPECT_EQ(api->overrides[0].pattern, "pro:");
  EXPECT_EQ(api->overrides[0].limits[0].limit, 1000);
  EXPECT_EQ(api->overrides[0].limits[0].burst, 200);
  EXPECT_EQ(api->overrides[0].limits[0].period_ns, 60'000'000'000);
  EXPECT_EQ(api->overrides[1].match, Override::Match::kKey);
  EXPECT_EQ(api->overrides[1].limits[0].period_ns, 1'000'000'000);
  EXPECT_EQ(api->overrides[2].match, Override::Match::kGlob);
  EXPECT_EQ(api->overrides[2].limits[0].burst, 50);
  const Rule* two = config.rules->find("two");
  ASSERT_NE(two, nullptr);
  ASSERT_EQ(two->overrides.size(), 1u);
  EXPECT_EQ(two->overrides[0].limits[1].limit, 500);
}

// Verifies that changing an override changes the rule's id (its keys start
// afresh), and an unchanged rule keeps it.
TEST(ConfigTest, OverridesArePartOfTheRulesIdentity) {
  auto idOf = [](const char* overrides) {
    std::string text = std::string("[[rule]]\nname = \"api\"\nlimit = 10\nperiod = \"1m\"\n") +
                       overrides;
    return mustLoad(text).rules->find("api")->id;
  };
  uint32_t with = idOf("overrides = [{ prefix = \"pro:\", limit = 100 }]\n");
  EXPECT_EQ(with, idOf("overrides = [{ prefix = \"pro:\", limit = 100 }]\n"));
  EXPECT_NE(with, idOf("overrides = [{ prefix = \"pro:\", limit = 200 }]\n"));
  EXPECT_NE(with, idOf(""));
}

// Verifies a penalty is stored in its units.
TEST(ConfigTest, PenaltyIsStored) {
  Config config = mustLoad(R"(
[[rule]]
name = "login"
limit = 5
period = "1m"
penalty = { denials = 10, window = "1m", block = "15m" }
)");
  const Rule* rule = config.rules->find("login");
  ASSERT_NE(rule, nullptr);
  ASSERT_TRUE(rule->penalty.has_value());
  EXPECT_EQ(rule->penalty->denials, 10);
  EXPECT_EQ(rule->penalty->window_ns, 60'000'000'000);
  EXPECT_EQ(rule->penalty->block_ns, 900'000'000'000);
}

// Verifies that a file given by path names that path in its errors.
TEST(ConfigTest, FileErrorsNameThePath) {
  test::TempDir dir;
  const std::string path = dir.file("bad.toml");
  test::writeFile(path, "[daemon]\n\nworkers = -1\n");
  ConfigResult result = loadConfigFile(path);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error.rfind(path + ":3:11: ", 0), 0u) << result.error;
}

// --- rule ids ---------------------------------------------------------------------------

uint32_t idOf(const Config& config, std::string_view name) {
  const Rule* rule = config.rules->find(name);
  EXPECT_NE(rule, nullptr) << name;
  return rule == nullptr ? 0 : rule->id;
}

// Verifies that reloading keeps the ids of unchanged rules, even when other
// rules are added, removed or reordered, and that ids are unique.
TEST(ConfigTest, RuleIdsAreStableAcrossReloadsForUnchangedRules) {
  const std::string a = "[[rule]]\nname = \"a\"\nlimit = 5\nperiod = \"1s\"\n";
  const std::string b = "[[rule]]\nname = \"b\"\nlimit = 5\nperiod = \"1s\"\n";
  const std::string c = "[[rule]]\nname = \"c\"\nalgorithm = \"concurrency\"\nlimit = 2\n";
  Config first = mustLoad(a + b);
  Config again = mustLoad(a + b);
  Config reordered = mustLoad(c + b + a);
  EXPECT_EQ(idOf(first, "a"), idOf(again, "a"));
  EXPECT_EQ(idOf(first, "b"), idOf(again, "b"));
  EXPECT_EQ(idOf(first, "a"), idOf(reordered, "a"));
  EXPECT_EQ(idOf(first, "b"), idOf(reordered, "b"));
  EXPECT_NE(idOf(first, "a"), idOf(first, "b"));
  EXPECT_NE(idOf(reordered, "c"), idOf(reordered, "a"));
}

// Verifies that changing any part of a rule's definition changes its id.
TEST(ConfigTest, RuleIdsChangeWhenTheDefinitionChanges) {
  const std::string redis = "[redis]\nurl = \"redis://h\"\n";
  auto id = [&](const std::string& body) {
    return idOf(mustLoad(redis + "[[rule]]\nname = \"r\"\n" + body), "r");
  };
  const uint32_t base = id("limit = 5\nperiod = \"1s\"\n");
  const std::vector<std::string> changed = {
      "limit = 6\nperiod = \"1s\"\n",
      "limit = 5\nperiod = \"2s\"\n",
      "limit = 5\nperiod = \"1s\"\nburst = 2\n",
      "algorithm = \"gcra\"\nlimit = 5\nperiod = \"1s\"\n",
      "limit = 5\nperiod = \"1s\"\nscope = \"global\"\n",
      "limit = 5\nperiod = \"1s\"\nscope = \"global\"\non_redis_down = \"open\"\n",
      "limit = 5\nperiod = \"1s\"\nshadow = true\n",
      "limits = [{ limit = 5, period = \"1s\" }, { limit = 50, period = \"1m\" }]\n",
  };
  for (const std::string& body : changed) EXPECT_NE(id(body), base) << body;
  // The same definition written differently is the same rule.
  EXPECT_EQ(id("limits = [{ limit = 5, period = \"1000ms\", burst = 5 }]\n"), base);
  EXPECT_NE(idOf(mustLoad(redis + "[[rule]]\nname = \"s\"\nlimit = 5\nperiod = \"1s\"\n"), "s"),
            base);
}

// Verifies a global rule of several limits loads with one part per limit
// (rules.h), whose ids, like the rule's, stay across a reload that changes
// other rules and change with the rule; configured ids leave room for them.
TEST(ConfigTest, PartsOfAGlobalRuleOfSeveralLimitsKeepTheirIdsAcrossReloads) {
  const std::string redis = "[redis]\nurl = \"redis://h\"\n";
  const std::string m =
      "[[rule]]\nname = \"m\"\nscope = \"global\"\n"
      "limits = [{ limit = 100, period = \"1m\" }, { limit = 20, period = \"10s\" }]\n";
  const std::string other = "[[rule]]\nname = \"o\"\nlimit = 5\nperiod = \"1s\"\n";
  Config first = mustLoad(redis + m);
  Config again = mustLoad(redis + other + m);
  Config changed = mustLoad(redis + other +
                            "[[rule]]\nname = \"m\"\nscope = \"global\"\n"
                            "limits = [{ limit = 100, period = \"1m\" }, "
                            "{ limit = 30, period = \"10s\" }]\n");
  auto parts = [](const Config& config) {
    std::vector<uint32_t> ids;
    for (const Rule& part : config.rules->parts(*config.rules->find("m"))) ids.push_back(part.id);
    return ids;
  };
  ASSERT_EQ(parts(first).size(), 2u);
  EXPECT_EQ(first.rules->parts(*first.rules->find("m"))[1].limits.front().limit, 20);
  EXPECT_EQ(parts(first), parts(again));
  EXPECT_NE(parts(first), parts(changed));
  for (const Config* config : {&first, &again, &changed}) {
    for (const Rule& rule : config->rules->rules()) EXPECT_EQ(rule.id & ~kRuleIdMask, 0u);
  }
}

// --- [http] -----------------------------------------------------------------------

// Verifies that [http] is off unless it names an address, and that a TCP
// address, a Unix socket and another deny status are read as written.
TEST(ConfigTest, HttpListensOnlyWhereTheFileSays) {
  EXPECT_EQ(mustLoad("").http.listen, "");
  EXPECT_EQ(mustLoad("").http.deny_status, 429u);
  Config tcp = mustLoad("[http]\nlisten = \"127.0.0.1:9470\"\ndeny_status = 403\n");
  EXPECT_EQ(tcp.http.listen, "127.0.0.1:9470");
  EXPECT_EQ(tcp.http.deny_status, 403u);
  EXPECT_EQ(mustLoad("[http]\nlisten = \"unix:/run/sluice/http.sock\"\n").http.listen,
            "unix:/run/sluice/http.sock");
}

// Verifies that a bad [http] address or status is refused with its line and
// what to write instead.
TEST(ConfigTest, HttpRefusesABadAddressNamingTheLineAndTheFix) {
  std::string relative = errorOf("[http]\nlisten = \"unix:run/http.sock\"\n");
  EXPECT_NE(relative.find("x.toml:2:"), std::string::npos) << relative;
  EXPECT_NE(relative.find("must be absolute"), std::string::npos) << relative;
  EXPECT_NE(relative.find("unix:/run/sluice/http.sock"), std::string::npos) << relative;
  std::string named = errorOf("[http]\nlisten = \"localhost:9470\"\n");
  EXPECT_NE(named.find("numeric"), std::string::npos) << named;
  std::string status = errorOf("[http]\ndeny_status = 200\n");
  EXPECT_NE(status.find("x.toml:2:"), std::string::npos) << status;
  std::string section = errorOf("[htp]\nlisten = \"\"\n");
  EXPECT_NE(section.find("did you mean [http]"), std::string::npos) << section;
}

// Verifies that [resp] scope = "global" without [redis] is refused at its
// line, saying what to add or write instead.
TEST(ConfigTest, RespGlobalScopeNeedsRedis) {
  std::string error = errorOf("[resp]\nlisten = \"127.0.0.1:6390\"\nscope = \"global\"\n");
  EXPECT_NE(error.find("x.toml:3:"), std::string::npos) << error;
  EXPECT_NE(error.find("needs a [redis] section"), std::string::npos) << error;
  Config local = mustLoad("[resp]\nlisten = \"unix:/run/sluice/resp.sock\"\n");
  EXPECT_EQ(local.resp.scope, "local");
  EXPECT_EQ(local.resp.max_parameter_sets, 1000u);
}

// Verifies that while [resp] listens, a [[rule]] may not take a name of the
// rules CL.THROTTLE makes (the front would decide on it instead of its own
// parameters); without [resp] the name is free.
TEST(ConfigTest, RespRefusesARuleNamedLikeAThrottleRule) {
  const std::string rule =
      "[[rule]]\nname = \"cl.throttle/10/100/60\"\nlimit = 5\nperiod = \"1s\"\n";
  std::string error = errorOf("[resp]\nlisten = \"127.0.0.1:6390\"\n" + rule);
  EXPECT_NE(error.find("x.toml:2:"), std::string::npos) << error;
  EXPECT_NE(error.find("names the rules CL.THROTTLE makes; rename the [[rule]]"),
            std::string::npos)
      << error;
  Config without = mustLoad(rule);
  EXPECT_NE(without.rules->find("cl.throttle/10/100/60"), nullptr);
}

}  // namespace
}  // namespace sluice

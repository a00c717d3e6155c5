// Config: parses the TOML file with toml++ and checks it section by section:
// the options of [daemon], [limits], [keys], [access] and [redis] against
// their table (config_options.cpp), [redis]'s mode (config_redis.cpp) and
// each [[rule]] against the rule key table (config_rules.cpp).
//
// Error policy: a bad file is an expected failure, so the public functions
// return it as a value. Inside the loader the first problem found is thrown
// as a Refusal (config_values.h) and caught here, which keeps every check a
// single line instead of an error path through each caller.
#include "config.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include <arpa/inet.h>
#include <sys/stat.h>

#include <toml++/toml.h>

#include "config_values.h"

namespace sluice {
namespace {

using namespace config_detail;

constexpr std::array<std::string_view, 9> kSections = {"daemon", "limits", "keys", "access", "redis",
                                                       "http",   "resp",   "envoy", "rule"};

// --- the file -------------------------------------------------------------------

// The directory of `path`, a socket path.
std::string directoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
}

// The directory of the socket the file gives exists on this machine (a
// missing one fails only at bind, after the file was called valid).
void checkSocketDirectory(const DaemonConfig& daemon, const Given& given) {
  // The default's directory (/run/sluice) is the systemd unit's
  // RuntimeDirectory, which exists by the time the unit runs
  // --check-config, and not before the unit first ran: a file that names
  // a socket there is not refused for it.
  auto socket = given.find("socket");
  if (socket == given.end()) return;
  const std::string& path = daemon.socket_path;
  const std::string directory = directoryOf(path);
  if (directory == directoryOf(DaemonConfig{}.socket_path)) return;
  struct stat info{};
  const bool exists = stat(directory.c_str(), &info) == 0;
  if (exists && S_ISDIR(info.st_mode)) return;
  const std::string problem = quote(directory) + (exists ? ", which is not a directory"
                                                         : ", which does not exist");
  const std::string fix = "create it (mkdir -p " + directory + ", or RuntimeDirectory= in the " +
                          "daemon's systemd unit), or write a socket path in a directory that " +
                          "exists";
  refuse(*socket->second, "[daemon] socket " + quote(path) + " is in " + problem + "; " + fix);
}

Config build(const toml::table& root, const std::string& source_name, ConfigChecks checks) {
  Config config;
  config.path = source_name;
  for (auto&& [key, node] : root) {
    if (std::find(kSections.begin(), kSections.end(), key.str()) != kSections.end()) continue;
    if (std::optional<std::string_view> section = sectionOfOption(key.str())) {
      refuse(key, quote(key.str()) + " is outside any section; move it under [" +
                      std::string(*section) + "]");
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
  for (std::string_view section :
       {"daemon", "limits", "keys", "access", "redis", "http", "resp"}) {
    if (const toml::node* node = root.get(section)) {
      given[section] = loadSection(asSection(*node, section), section, &config);
    }
  }
  if (config.redis) checkRedisMode(given["redis"], &*config.redis);
  checkFrameHoldsKey(config.limits, given["limits"]);
  if (config.resp.scope == "global" && !config.redis) {
    refuse(*given["resp"]["scope"], "[resp] scope = \"global\" needs a [redis] section to share "
                                    "CL.THROTTLE's limits through; add [redis], or write scope = "
                                    "\"local\"");
  }
  if (checks == ConfigChecks::kHost) checkSocketDirectory(config.daemon, given["daemon"]);

  std::vector<Rule> rules;
  if (const toml::node* node = root.get("rule")) rules = loadRules(*node, config.redis.has_value());
  if (!config.resp.listen.empty()) {
    for (const Rule& rule : rules) {
      if (rule.name.starts_with(kThrottleRulePrefix)) {
        refuse(*given["resp"]["listen"],
               "rule " + quote(rule.name) + " starts with \"" + std::string(kThrottleRulePrefix) +
                   "\", which names the rules CL.THROTTLE makes; rename the [[rule]]");
      }
    }
  }
  if (const toml::node* node = root.get("envoy")) {
    config.envoy = loadEnvoy(asSection(*node, "envoy"), config.redis.has_value());
    for (const Rule& rule : rules) {
      if (rule.name.find(kEnvoyOverrideMark) != std::string::npos) {
        refuse(*node, "rule " + quote(rule.name) + " has \"" + std::string(kEnvoyOverrideMark) +
                          "\", which marks the rules of Envoy's limit overrides; rename the "
                          "[[rule]]");
      }
    }
    for (const Rule& rule : config.envoy->policy->rules) {
      for (const Rule& other : rules) {
        if (other.name == rule.name) {
          refuse(*node, "rule " + quote(rule.name) + " is both a [[rule]] and a descriptor of " +
                            "[envoy] config; rename the [[rule]]");
        }
      }
    }
    rules.insert(rules.end(), config.envoy->policy->rules.begin(),
                 config.envoy->policy->rules.end());
  }
  assignRuleIds(&rules);
  uint32_t nodes = config.redis ? config.redis->expected_nodes : 1;
  config.rules = std::make_shared<const RuleSet>(std::move(rules), nodes);
  return config;
}

}  // namespace


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

bool parseFrontAddress(std::string_view text, std::string* host, uint16_t* port,
                       std::string* unix_path, std::string* problem) {
  if (text.starts_with(kUnixListenPrefix)) {
    std::string_view path = text.substr(kUnixListenPrefix.size());
    if (!path.starts_with("/")) {
      *problem = "the socket path must be absolute";
      return false;
    }
    if (static_cast<int64_t>(path.size()) > kMaxSocketPathBytes) {
      *problem = "the socket path is longer than " + std::to_string(kMaxSocketPathBytes) +
                 " bytes";
      return false;
    }
    *unix_path = std::string(path);
    host->clear();
    *port = 0;
    return true;
  }
  unix_path->clear();
  return parseListenAddress(text, host, port, problem);
}

ConfigResult loadConfigString(std::string_view text, const std::string& source_name,
                              ConfigChecks checks) {
  ConfigResult result;
  toml::table root;
  try {
    root = toml::parse(text, source_name);
  } catch (const toml::parse_error& error) {
    const toml::source_position at = error.source().begin;
    result.error = locate(source_name, at) + "invalid TOML: " + std::string(error.description());
    // What the operator meant, when the line says it (an octal mode unquoted).
    std::string_view line = text;
    for (uint32_t n = 1; n < at.line && !line.empty(); ++n) {
      size_t end = line.find('\n');
      line = end == std::string_view::npos ? std::string_view() : line.substr(end + 1);
    }
    line = line.substr(0, line.find('\n'));
    if (std::optional<std::string> hint = tomlErrorHint(line)) result.error += "; " + *hint;
    return result;
  }
  try {
    result.config = build(root, source_name, checks);
  } catch (const Refusal& refusal) {
    result.error = locate(source_name, refusal.at) + refusal.message;
  }
  return result;
}

ConfigResult loadConfigFile(const std::string& path, ConfigChecks checks) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    ConfigResult result;
    result.error = path + ": cannot read the config file: " + std::strerror(errno);
    return result;
  }
  std::ostringstream text;
  text << file.rdbuf();
  return loadConfigString(text.str(), path, checks);
}

}  // namespace sluice

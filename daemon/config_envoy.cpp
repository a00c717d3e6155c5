// The [envoy] section: where Envoy's rate limit service listens, which
// envoyproxy/ratelimit YAML files hold its limits, and how they become rules.
#include <algorithm>
#include <array>

#include "config_values.h"

namespace sluice::config_detail {
namespace {

constexpr std::array<std::string_view, 8> kEnvoyKeys = {
    "listen", "config", "scope", "algorithm", "on_redis_down", "all_or_nothing", "threads", "poll_spin_us"};
constexpr std::array<std::string_view, 3> kRedisDownNames = {"local", "open", "closed"};
constexpr std::array<RedisDownPolicy, 3> kRedisDownValues = {
    RedisDownPolicy::kLocal, RedisDownPolicy::kOpen, RedisDownPolicy::kClosed};
constexpr std::array<std::string_view, 3> kEnvoyAlgorithms = {"fixed_window", "token_bucket",
                                                              "gcra"};

}  // namespace

EnvoyConfig loadEnvoy(const toml::table& table, bool have_redis) {
  EnvoyConfig envoy;
  envoy.scope = have_redis ? Scope::kGlobal : Scope::kLocal;
  for (auto&& [key, node] : table) {
    if (std::find(kEnvoyKeys.begin(), kEnvoyKeys.end(), key.str()) != kEnvoyKeys.end()) continue;
    std::string message = "unknown option " + quote(key.str()) + " in [envoy]";
    if (auto suggestion = closest(key.str(), kEnvoyKeys)) {
      message += "; did you mean " + quote(*suggestion) + "?";
    } else {
      message += "; the options are " + joinPlain(kEnvoyKeys);
    }
    refuse(key, std::move(message));
  }
  const toml::node* listen = table.get("listen");
  if (listen == nullptr) {
    refuse(table, "[envoy] has no listen; add e.g. listen = \"unix:/run/sluice/rls.sock\" or "
                  "listen = \"127.0.0.1:8081\"");
  }
  envoy.listen = stringValue(*listen, "[envoy] listen", "listen = \"unix:/run/sluice/rls.sock\"");
  const bool unix_socket = envoy.listen.starts_with("unix:");
  if (unix_socket ? envoy.listen.size() <= 5 || envoy.listen.size() - 5 > kMaxSocketPathBytes
                  : envoy.listen.find(':') == std::string::npos) {
    refuse(*listen, "[envoy] listen " + quote(envoy.listen) + " is not an address; write " +
                        "\"unix:/run/sluice/rls.sock\" or \"127.0.0.1:8081\"");
  }
  const toml::node* config = table.get("config");
  if (config == nullptr) {
    refuse(table, "[envoy] has no config; add e.g. config = \"/etc/sluice/ratelimit/*.yaml\"");
  }
  envoy.config = stringValue(*config, "[envoy] config", "config = \"/etc/sluice/ratelimit/*.yaml\"");
  if (const toml::node* scope = table.get("scope")) {
    const std::string& name = stringValue(*scope, "[envoy] scope", "scope = \"global\"");
    if (name == "global") {
      if (!have_redis) {
        refuse(*scope, "[envoy] scope = \"global\" needs Redis; add a [redis] section or write "
                       "scope = \"local\"");
      }
      envoy.scope = Scope::kGlobal;
    } else if (name == "local") {
      envoy.scope = Scope::kLocal;
    } else {
      refuse(*scope, "[envoy] scope is " + quote(name) + "; write \"global\" or \"local\"");
    }
  }
  if (const toml::node* algorithm = table.get("algorithm")) {
    const std::string& name =
        stringValue(*algorithm, "[envoy] algorithm", "algorithm = \"fixed_window\"");
    auto it = std::find(kEnvoyAlgorithms.begin(), kEnvoyAlgorithms.end(), name);
    if (it == kEnvoyAlgorithms.end()) {
      refuse(*algorithm, "[envoy] algorithm is " + quote(name) + "; write " +
                             joinQuoted(kEnvoyAlgorithms));
    }
    envoy.algorithm = it == kEnvoyAlgorithms.begin()     ? Algorithm::kFixedWindow
                      : it == kEnvoyAlgorithms.begin() + 1 ? Algorithm::kTokenBucket
                                                           : Algorithm::kGcra;
  }
  if (const toml::node* down = table.get("on_redis_down")) {
    const std::string& name =
        stringValue(*down, "[envoy] on_redis_down", "on_redis_down = \"local\"");
    auto it = std::find(kRedisDownNames.begin(), kRedisDownNames.end(), name);
    if (it == kRedisDownNames.end()) {
      refuse(*down, "[envoy] on_redis_down is " + quote(name) + "; write " +
                        joinQuoted(kRedisDownNames));
    }
    envoy.on_redis_down = kRedisDownValues[static_cast<size_t>(it - kRedisDownNames.begin())];
  }
  if (const toml::node* all = table.get("all_or_nothing")) {
    const std::optional<bool> value = all->value<bool>();
    if (!value) {
      refuse(*all, "[envoy] all_or_nothing is " + std::string(describe(*all)) +
                       "; write all_or_nothing = true or false");
    }
    envoy.all_or_nothing = *value;
  }
  if (const toml::node* threads = table.get("threads")) {
    const int64_t value = integerValue(*threads, "[envoy] threads", "threads = 1");
    if (value < 1 || value > kMaxEnvoyThreads) {
      refuse(*threads, "[envoy] threads is " + std::to_string(value) + "; write 1 to " +
                           std::to_string(kMaxEnvoyThreads) + " (1, the default, costs the "
                           "least per call)");
    }
    envoy.threads = static_cast<int>(value);
  }
  if (const toml::node* spin = table.get("poll_spin_us")) {
    const int64_t value = integerValue(*spin, "[envoy] poll_spin_us", "poll_spin_us = 0");
    if (value < 0 || value > kMaxEnvoyPollSpinUs) {
      refuse(*spin, "[envoy] poll_spin_us is " + std::to_string(value) + "; write 0 to " +
                        std::to_string(kMaxEnvoyPollSpinUs) + " (0, the default, sleeps at once)");
    }
    envoy.poll_spin_us = value;
  }
  auto policy = std::make_shared<EnvoyPolicy>();
  const std::string error =
      readEnvoyFiles(envoy.config,
                     {.scope = envoy.scope, .algorithm = envoy.algorithm,
                      .on_redis_down = envoy.on_redis_down},
                     policy.get());
  if (!error.empty()) refuse(*config, "[envoy] config: " + error);
  envoy.policy = std::move(policy);
  return envoy;
}

}  // namespace sluice::config_detail

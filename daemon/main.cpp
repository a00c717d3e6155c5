// sluiced: command line, config loading and logging set-up; the daemon itself
// is Server (server.h).
#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstring>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "config.h"
#include "server.h"

namespace {

constexpr const char* kUsage =
    "usage: sluiced [--config FILE] [--socket PATH] [--workers N] [--log-level LEVEL]\n"
    "       sluiced --check-config FILE\n"
    "       sluiced --version | --help\n"
    "\n"
    "Serves rate-limit decisions over a Unix socket in MessagePack-RPC.\n"
    "\n"
    "  --config FILE        the TOML config (default /etc/sluice/sluice.toml)\n"
    "  --check-config FILE  validate FILE, print what is wrong, exit 0 (valid) or 1\n"
    "  --socket PATH        serve on PATH instead of the config's [daemon] socket\n"
    "  --workers N          worker threads instead of the config's [daemon] workers\n"
    "  --log-level LEVEL    trace, debug, info, warn, error, critical or off\n"
    "  --version            print the version and exit\n"
    "\n"
    "Signals: SIGTERM and SIGINT stop gracefully; SIGHUP reloads the rules.\n";

constexpr const char* kDefaultConfig = "/etc/sluice/sluice.toml";

int usageError(const std::string& message) {
  std::fprintf(stderr, "sluiced: %s\n%s", message.c_str(), kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path = kDefaultConfig;
  std::string check_path;
  std::string socket_override;
  std::string workers_override;
  std::string level_override;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) {
        return false;
      }
      *out = argv[++i];
      return true;
    };
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg == "--version") {
      std::printf("sluiced %s\n", SLUICE_VERSION);
      return 0;
    }
    bool ok = false;
    if (arg == "--config") {
      ok = value(&config_path);
    } else if (arg == "--check-config") {
      ok = value(&check_path);
    } else if (arg == "--socket") {
      ok = value(&socket_override);
    } else if (arg == "--workers") {
      ok = value(&workers_override);
    } else if (arg == "--log-level") {
      ok = value(&level_override);
    } else {
      return usageError("unknown argument " + arg);
    }
    if (!ok) {
      return usageError(arg + " needs a value");
    }
  }

  if (!check_path.empty()) {
    sluice::ConfigResult result =
        sluice::loadConfigFile(check_path, sluice::ConfigChecks::kHost);
    if (!result.ok()) {
      std::fprintf(stderr, "%s\n", result.error.c_str());
      return 1;
    }
    size_t rules = result.config->rules->rules().size();
    std::printf("%s: ok, %zu rule%s\n", check_path.c_str(), rules, rules == 1 ? "" : "s");
    return 0;
  }

  // With --socket, the file's socket is not the one bound.
  const sluice::ConfigChecks checks =
      socket_override.empty() ? sluice::ConfigChecks::kHost : sluice::ConfigChecks::kFile;
  sluice::ConfigResult result = sluice::loadConfigFile(config_path, checks);
  if (!result.ok()) {
    std::fprintf(stderr, "sluiced: %s\n", result.error.c_str());
    return 1;
  }
  sluice::Config config = std::move(*result.config);
  if (!socket_override.empty()) {
    config.daemon.socket_path = socket_override;
  }
  if (!workers_override.empty()) {
    char* end = nullptr;
    long workers = std::strtol(workers_override.c_str(), &end, 10);
    if (*end != '\0' || workers < 0 || workers > 256) {
      return usageError("--workers takes a number from 0 (one per core) to 256");
    }
    config.daemon.workers = static_cast<uint32_t>(workers);
  }
  std::string level_name = level_override.empty() ? config.daemon.log_level : level_override;
  auto level = spdlog::level::from_str(level_name);
  if (level == spdlog::level::off && level_name != "off") {
    return usageError("--log-level takes trace, debug, info, warn, error, critical or off");
  }

  // Logs go to stderr, where journald picks them up under systemd.
  auto logger = spdlog::stderr_color_mt("sluiced");
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  logger->set_level(level);
  spdlog::set_default_logger(logger);

  // A client that disconnects while we write must not kill the daemon.
  signal(SIGPIPE, SIG_IGN);

  // Every connection is a descriptor: take all the kernel allows this process
  // (the soft limit is often 1024), and say so when it is still too few.
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
    getrlimit(RLIMIT_NOFILE, &files);
    constexpr rlim_t kSpareFiles = 64;  // listener, loops, logs, Redis
    if (files.rlim_cur < config.limits.max_connections + kSpareFiles) {
      spdlog::warn("open files limit {} is below [limits] max_connections {} + {}; "
                   "raise LimitNOFILE or lower max_connections",
                   files.rlim_cur, config.limits.max_connections, kSpareFiles);
    }
  }

  sluice::Server server(std::move(config));
  return server.run();
}

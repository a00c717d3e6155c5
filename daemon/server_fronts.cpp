// Server: the fronts beside the Unix socket ([http], [resp], [envoy]) and
// the rules they add while running; see server.h.
#include "server.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

namespace sluice {

std::vector<Rule> Server::withAddedRules(std::vector<Rule> rules, const std::vector<Rule>& added) {
  std::set<uint32_t> ids;
  std::set<std::string_view> names;
  for (const Rule& rule : rules) {
    ids.insert(rule.id);
    names.insert(rule.name);
  }
  for (const Rule& rule : added) {
    if (names.contains(rule.name)) continue;
    Rule copy = rule;
    while (copy.id == 0 || ids.contains(copy.id)) copy.id = (copy.id + 1) & kRuleIdMask;
    ids.insert(copy.id);
    rules.push_back(std::move(copy));
  }
  return rules;
}

namespace {

// A listening socket on `listen` ("HOST:PORT" or "unix:/path"), non-blocking;
// -1 with `error`. A Unix one's path goes in `unix_path` (a socket file left
// there is replaced), with `mode`, as [daemon] socket_mode gives the main
// socket: [access] then decides among those the mode lets connect.
int bindListener(const std::string& listen, mode_t mode, std::string* unix_path,
                 std::string* error) {
  std::string host;
  uint16_t port = 0;
  std::string path;
  std::string problem;
  if (!parseFrontAddress(listen, &host, &port, &path, &problem)) {
    *error = problem;
    return -1;
  }
  sockaddr_storage address{};
  socklen_t size = 0;
  if (!path.empty()) {
    sockaddr_un local{};
    if (path.size() >= sizeof(local.sun_path)) {
      *error = "the path is longer than " + std::to_string(sizeof(local.sun_path) - 1) + " bytes";
      return -1;
    }
    local.sun_family = AF_UNIX;
    std::memcpy(local.sun_path, path.c_str(), path.size() + 1);
    std::memcpy(&address, &local, sizeof(local));
    size = sizeof(local);
    struct stat info{};
    if (lstat(path.c_str(), &info) == 0 && S_ISSOCK(info.st_mode)) unlink(path.c_str());
  } else if (host.find(':') != std::string::npos) {
    uv_ip6_addr(host.c_str(), port, reinterpret_cast<sockaddr_in6*>(&address));
    size = sizeof(sockaddr_in6);
  } else {
    uv_ip4_addr(host.c_str(), port, reinterpret_cast<sockaddr_in*>(&address));
    size = sizeof(sockaddr_in);
  }
  int fd = socket(address.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *error = std::strerror(errno);
    return -1;
  }
  int on = 1;
  if (path.empty()) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  // A socket file is made with no permissions for others, then opened up
  // to `mode`: no window in which anyone may connect.
  mode_t old_umask = umask(0177);
  int rc = bind(fd, reinterpret_cast<sockaddr*>(&address), size);
  umask(old_umask);
  if (rc != 0 || (!path.empty() && chmod(path.c_str(), mode) != 0) ||
      ::listen(fd, SOMAXCONN) != 0) {
    *error = std::strerror(errno);
    ::close(fd);
    return -1;
  }
  *unix_path = path;
  return fd;
}

}  // namespace

bool Server::startHttp(std::string* error) {
  std::string problem;
  http_fd_ = bindListener(config_.http.listen, config_.daemon.socket_mode, &http_unix_path_,
                          &problem);
  if (http_fd_ < 0) {
    *error = "cannot serve HTTP checks on " + config_.http.listen + ": " + problem +
             "; choose another [http] listen";
    return false;
  }
  uv_poll_init(&loop_, &http_listener_, http_fd_);
  http_listener_.data = this;
  spdlog::info("serving HTTP checks on {}", config_.http.listen);
  return true;
}

bool Server::startResp(std::string* error) {
  std::string problem;
  resp_fd_ = bindListener(config_.resp.listen, config_.daemon.socket_mode, &resp_unix_path_,
                          &problem);
  if (resp_fd_ < 0) {
    *error = "cannot serve the Redis protocol on " + config_.resp.listen + ": " + problem +
             "; choose another [resp] listen";
    return false;
  }
  uv_poll_init(&loop_, &resp_listener_, resp_fd_);
  resp_listener_.data = this;
  spdlog::info("serving the Redis protocol on {}", config_.resp.listen);
  return true;
}

RuleSetPtr Server::ensureThrottleRule(const resp::Throttle& throttle, std::string* error) {
  std::lock_guard<std::mutex> lock(reload_mutex_);
  const std::string name = resp::throttleRuleName(throttle);
  if (config_.rules->find(name) != nullptr) return config_.rules;
  if (stopping_) {
    *error = "the daemon is stopping";
    return nullptr;
  }
  if (throttle_sets_ >= config_.resp.max_parameter_sets) {
    *error = "CL.THROTTLE has " + std::to_string(throttle_sets_) +
             " parameter sets already, [resp] max_parameter_sets; use fewer distinct "
             "(max_burst, count, period), or raise it";
    return nullptr;
  }
  Rule rule;
  rule.name = name;
  rule.algorithm = Algorithm::kGcra;
  rule.limits = {Limit{.limit = throttle.count,
                       .period_ns = throttle.period_s * 1'000'000'000,
                       .burst = throttle.max_burst + 1}};
  rule.scope = config_.resp.scope == "global" ? Scope::kGlobal : Scope::kLocal;
  ++throttle_sets_;
  addRuleLocked(rule);
  return config_.rules;
}

bool Server::startEnvoy(std::string* error) {
  envoy_ = makeEnvoyFront();
  if (envoy_ == nullptr) {
    *error = config_.path + ": [envoy] needs sluiced built with gRPC (cmake -DSLUICE_GRPC=ON); "
             "remove [envoy] or rebuild";
    return false;
  }
  std::vector<Worker*> workers;
  for (auto& worker : workers_) workers.push_back(worker.get());
  if (!envoy_->start(*config_.envoy, config_.daemon.socket_mode, std::move(workers),
                     [this](const Rule& rule) { return addRule(rule); },
                     EnvoyCounters{.overrides_refused = &metrics_.envoyOverridesRefused(),
                                   .deadline_exceeded = &metrics_.envoyDeadlineExceeded()},
                     error)) {
    envoy_.reset();
    return false;
  }
  return true;
}

bool Server::addRule(const Rule& rule) {
  std::lock_guard<std::mutex> lock(reload_mutex_);
  if (stopping_) return false;
  if (config_.rules->find(rule.name) != nullptr) return true;
  addRuleLocked(rule);
  return true;
}

void Server::addRuleLocked(const Rule& rule) {
  Rule added = rule;
  // FNV-1a of the name, as stable as a configured rule's id.
  uint32_t hash = 2166136261u;
  for (char c : rule.name) hash = (hash ^ static_cast<unsigned char>(c)) * 16777619u;
  added.id = hash & kRuleIdMask;
  std::vector<Rule> rules = withAddedRules(std::vector<Rule>(config_.rules->rules()), {added});
  added_rules_.push_back(rules.back());  // with the id it got, kept across reloads
  installRules(std::make_shared<const RuleSet>(std::move(rules), config_.rules->fallbackNodes()));
  spdlog::info("added rule {}", rule.name);
}

}  // namespace sluice

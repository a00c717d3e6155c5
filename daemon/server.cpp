// Server: the socket, the workers, signals, reloads and key sweeping;
// accepting is in server_accept.cpp, its reports in server_report.cpp,
// the other fronts in server_fronts.cpp; see server.h.
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include <spdlog/spdlog.h>

#include "calendar.h"
#include "entry.h"
#include "holding.h"
#include "limiter.h"
#include "penalty.h"
#include "slice.h"
#include "systemd.h"
#include "uv_handles.h"

namespace sluice {

namespace {

constexpr int kListenBacklog = 1024;
// How often the status line is refreshed when no watchdog asks for more.
constexpr uint64_t kStatusIntervalMs = 1000;

std::string errnoText(int err) { return std::strerror(err); }

WorkerOptions workerOptions(const Config& config) {
  WorkerOptions options;
  options.protocol.max_frame_bytes = config.limits.max_frame_bytes;
  options.protocol.max_key_bytes = config.limits.max_key_bytes;
  options.protocol.max_depth = config.limits.max_depth;
  options.protocol.max_items = config.limits.max_items;
  options.max_output_bytes = config.limits.max_output_bytes;
  options.resp.max_command_bytes = config.limits.max_frame_bytes;
  options.resp.max_arguments = config.limits.max_items;
  options.resp.max_key_bytes = config.limits.max_key_bytes;
  options.http.deny_status = config.http.deny_status;
  options.http.max_key_bytes = config.limits.max_key_bytes;
  options.http.limits.max_request_bytes = config.limits.max_frame_bytes;
  options.http.limits.max_headers = config.limits.max_items;
  if (config.redis) options.lease_timeout_ms = config.redis->lease_timeout_ms;
  // 0 turns the timeouts off; a day is as good as never for a sweep timer.
  constexpr int64_t kNever = 24LL * 3600 * 1000;
  options.idle_timeout_ms = config.limits.idle_timeout_ms > 0 ? config.limits.idle_timeout_ms : kNever;
  options.partial_frame_timeout_ms = config.limits.partial_frame_timeout_ms > 0
                                         ? config.limits.partial_frame_timeout_ms
                                         : kNever;
  return options;
}

// Removes a socket file left by a daemon that is gone. Refuses when another
// daemon still answers on it, or when the path is not a socket.
bool removeStaleSocket(const std::string& path, std::string* error) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    return true;  // nothing there
  }
  if (!S_ISSOCK(st.st_mode)) {
    *error = path + " exists and is not a socket; remove it or choose another [daemon] socket";
    return false;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  bool alive = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  if (alive) {
    *error = "another process is serving " + path + "; stop it or choose another [daemon] socket";
    return false;
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    *error = "cannot remove the stale socket " + path + ": " + errnoText(errno);
    return false;
  }
  spdlog::info("removed stale socket {}", path);
  return true;
}

}  // namespace

size_t workerCount(uint32_t configured) {
  if (configured > 0) {
    return configured;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

Server::Server(Config config, MonotonicClock clock)
    : config_(std::move(config)),
      access_(config_.access, geteuid()),
      user_connections_(config_.access.max_connections_per_user),
      metrics_(workerCount(config_.daemon.workers) * (config_.envoy ? 2 : 1)),
      clock_ns_(std::move(clock)) {
  rules_.store(config_.rules, std::memory_order_release);
  KeyTableOptions key_options;
  key_options.max_keys = config_.keys.max_keys;
  key_options.max_bytes = config_.keys.max_memory;
  // One reader per worker, one per worker's lane (with [envoy]: Worker's
  // thread model), and the control thread's.
  key_options.max_readers = workerCount(config_.daemon.workers) * (config_.envoy ? 2 : 1) + 1;
  // A global rule's slice evicted from a full table gives its units back,
  // as one that goes idle does (sweepKeys).
  key_options.on_forced_eviction = [this](uint32_t rule_id, std::string_view key,
                                          std::span<std::atomic<uint64_t>> words) {
    onForcedEviction(rule_id, key, words);
  };
  keys_ = std::make_unique<KeyTable>(key_options);
#if defined(__GLIBC__)
  // One malloc arena for every thread, set before any thread starts. glibc
  // gives a thread that meets contention an arena of its own, and
  // malloc_trim (releaseFreeMemory) hands back the free pages inside every
  // arena but shrinks only the main arena's top: what a worker's arena
  // freed at its top (keys it inserted, then swept) stayed resident at the
  // highest the keys ever reached: 0.7 MiB with no key left after a peak of
  // 12,000, 0.1 MiB after one of 3,000 (a step in bench/soak's RSS whenever
  // the load set a new peak). Workers allocate nothing for a warm key and
  // take small blocks from their thread's cache (tcache) without the arena's
  // lock, so sharing it costs little.
  mallopt(M_ARENA_MAX, 1);
#endif
  if (config_.redis) {
    // A unit released on another node stays in its pool until a renewal
    // pass finds it unused through a whole interval (up to two intervals),
    // then this node asks again within a lease interval.
    int64_t renewal_ns = config_.redis->lease_ttl_ms * 1'000'000 / kRenewalsPerTtl;
    int64_t lease_interval_ns = config_.redis->lease_interval_ms * 1'000'000;
    broker_ = std::make_unique<LeaseBroker>(lease_interval_ns, 2 * renewal_ns + lease_interval_ns);
    broker_->onReplies([this] {
      for (auto& worker : workers_) worker->notifyLeases();
    });
    RedisLinkOptions link_options;
    link_options.backoff_max_ms = config_.redis->reconnect_max_ms;
    control_ = std::make_unique<Control>(*config_.redis, link_options, clock_ns_);
    control_->onNodesChanged([this](uint32_t nodes) { onNodesChanged(nodes); });
    LeaseContext context;
    context.keys = keys_.get();
    context.broker = broker_.get();
    context.rules = [this] { return rules_.load(std::memory_order_acquire); };
    context.now_ns = clock_ns_;
    control_->attachLeases(std::move(context));
  }
}

Server::~Server() {
  if (listen_fd_ >= 0) {
    ::close(listen_fd_);
  }
}

bool Server::listen(std::string* error) {
  const std::string& path = config_.daemon.socket_path;
  int passed = -1;
  std::string passed_path;
  if (!systemd::takeListenSocket(&passed, &passed_path, error)) {
    return false;
  }
  if (passed >= 0) {
    listen_fd_ = passed;
    socket_inherited_ = true;
    serving_path_ = passed_path;
    if (passed_path != path) {
      spdlog::warn("serving the socket systemd passed, {}, not the config's {}; "
                   "make ListenStream= and [daemon] socket the same path",
                   passed_path, path);
    }
    return true;
  }
  serving_path_ = path;
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    *error = "socket path " + path + " is longer than " +
             std::to_string(sizeof(addr.sun_path) - 1) + " bytes; choose a shorter [daemon] socket";
    return false;
  }
  if (!removeStaleSocket(path, error)) {
    return false;
  }
  listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) {
    *error = "socket: " + errnoText(errno);
    return false;
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  // Create the socket file with no permissions for others, then open it up
  // to the configured mode: no window in which anyone may connect.
  mode_t old_umask = umask(0177);
  int rc = bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  int bind_errno = errno;
  umask(old_umask);
  if (rc != 0) {
    *error = "cannot bind " + path + ": " + errnoText(bind_errno);
    return false;
  }
  if (chmod(path.c_str(), config_.daemon.socket_mode) != 0) {
    *error = "cannot chmod " + path + ": " + errnoText(errno);
    return false;
  }
  if (::listen(listen_fd_, kListenBacklog) != 0) {
    *error = "cannot listen on " + path + ": " + errnoText(errno);
    return false;
  }
  return true;
}

int Server::run() {
  started_ms_ = clock_ns_() / 1'000'000;
  uv_loop_init(&loop_);
  // Signals first: a SIGHUP or SIGTERM that arrives once clients can connect
  // must reach our handlers, not the default action.
  auto on_signal = [](uv_signal_t* handle, int signum) {
    static_cast<Server*>(handle->data)->onSignal(signum);
  };
  for (auto [handle, signum] : {std::pair{&sigterm_, SIGTERM}, {&sigint_, SIGINT},
                                {&sighup_, SIGHUP}}) {
    uv_signal_init(&loop_, handle);
    handle->data = this;
    uv_signal_start(handle, on_signal, signum);
  }

  std::string error;
  if (!listen(&error)) {
    spdlog::critical("{}", error);
    for (uv_signal_t* handle : {&sigterm_, &sigint_, &sighup_}) {
      uv_close(reinterpret_cast<uv_handle_t*>(handle), nullptr);
    }
    uv_run(&loop_, UV_RUN_DEFAULT);
    uv_loop_close(&loop_);
    return 1;
  }

  if (!config_.daemon.metrics.empty() &&
      !metrics_endpoint_.start(config_.daemon.metrics, [this] { return renderPrometheus(metricsView()); },
                               &error)) {
    spdlog::critical("{}", error);
    ::close(listen_fd_);
    listen_fd_ = -1;
    if (!socket_inherited_) unlink(config_.daemon.socket_path.c_str());
    for (uv_signal_t* handle : {&sigterm_, &sigint_, &sighup_}) {
      uv_close(reinterpret_cast<uv_handle_t*>(handle), nullptr);
    }
    uv_run(&loop_, UV_RUN_DEFAULT);
    uv_loop_close(&loop_);
    return 1;
  }

  WorkerOptions options = workerOptions(config_);
  size_t count = workerCount(config_.daemon.workers);
  RespFront::EnsureRule throttle_rules;
  if (!config_.resp.listen.empty()) {
    throttle_rules = [this](const resp::Throttle& throttle, std::string* refusal) {
      return ensureThrottleRule(throttle, refusal);
    };
  }
  for (size_t i = 0; i < count; ++i) {
    // With [envoy], a lane each, on the shards after the workers'.
    MetricsShard* lane_metrics = config_.envoy ? &metrics_.shard(count + i) : nullptr;
    workers_.push_back(std::make_unique<Worker>(i, options, *keys_, metrics_.shard(i), *this,
                                                config_.rules, broker_.get(), throttle_rules,
                                                lane_metrics));
  }
  std::vector<Worker*> siblings;
  for (auto& worker : workers_) siblings.push_back(worker.get());
  for (auto& worker : workers_) worker->setSiblings(siblings);
  for (auto& worker : workers_) {
    worker->start();
  }
  // Read before the fronts start: from then on CL.THROTTLE may replace
  // config_.rules (under reload_mutex_).
  const size_t rule_count = config_.rules->rules().size();
  if ((!config_.http.listen.empty() && !startHttp(&error)) ||
      (!config_.resp.listen.empty() && !startResp(&error))) {
    spdlog::critical("{}", error);
    for (auto& worker : workers_) worker->stop();
    for (auto& worker : workers_) worker->join();
    workers_.clear();
    if (http_fd_ >= 0) {
      uv_close(reinterpret_cast<uv_handle_t*>(&http_listener_), nullptr);
      ::close(http_fd_);
      http_fd_ = -1;
      if (!http_unix_path_.empty()) unlink(http_unix_path_.c_str());
    }
    ::close(listen_fd_);
    listen_fd_ = -1;
    if (!socket_inherited_) unlink(config_.daemon.socket_path.c_str());
    metrics_endpoint_.stop();
    for (uv_signal_t* handle : {&sigterm_, &sigint_, &sighup_}) {
      uv_close(reinterpret_cast<uv_handle_t*>(handle), nullptr);
    }
    uv_run(&loop_, UV_RUN_DEFAULT);
    uv_loop_close(&loop_);
    return 1;
  }

  uv_poll_init(&loop_, &listener_, listen_fd_);
  listener_.data = this;
  uv_timer_init(&loop_, &accept_pause_);
  accept_pause_.data = this;
  startAccepting();
  uv_timer_init(&loop_, &key_sweep_);
  key_sweep_.data = this;
  auto sweep_ms = static_cast<uint64_t>(config_.keys.sweep_interval_ms);
  uv_timer_start(
      &key_sweep_, [](uv_timer_t* t) { static_cast<Server*>(t->data)->sweepKeys(); }, sweep_ms,
      sweep_ms);

  spdlog::info("sluiced {} serving {}{} with {} workers, {} rules", SLUICE_VERSION, serving_path_,
               socket_inherited_ ? " (passed by systemd)" : "", count, rule_count);
  // Last: from here on the control thread may replace config_.rules (under
  // reload_mutex_), as a reload from a worker may.
  if (control_) {
    spdlog::info("node id {}; {} nodes assumed until heartbeats count them", control_->nodeId(),
                 config_.redis->expected_nodes);
    control_->start();
  }
  watchdog_us_ = systemd::watchdogIntervalUs();
  uint64_t status_ms = kStatusIntervalMs;
  if (watchdog_us_ > 0) {
    status_ms = std::clamp<uint64_t>(watchdog_us_ / 2000, 1, kStatusIntervalMs);
    spdlog::info("systemd watchdog every {} ms; pinging every {} ms", watchdog_us_ / 1000, status_ms);
  }
  uv_timer_init(&loop_, &status_timer_);
  status_timer_.data = this;
  uv_timer_start(
      &status_timer_, [](uv_timer_t* t) { static_cast<Server*>(t->data)->onStatusTimer(); },
      status_ms, status_ms);
  last_status_ = statusLine();
  handle_count_.store(openHandles(&loop_), std::memory_order_relaxed);
  // Last of the listeners, so that a failure stops what has started.
  const bool envoy_failed = config_.envoy && !startEnvoy(&error);
  if (envoy_failed) {
    spdlog::critical("{}", error);
    beginStop();
  } else {
    systemd::notifyReady(last_status_);
  }
  uv_run(&loop_, UV_RUN_DEFAULT);

  for (auto& worker : workers_) {
    worker->join();
  }
  // After the workers: nothing spends from slices any more, so the control
  // thread returns what they hold, then leaves the members set.
  if (control_) {
    control_->stop();
    control_->join();
  }
  int rc = uv_loop_close(&loop_);
  if (rc != 0) {
    spdlog::error("main loop closed with handles still open ({})", uv_strerror(rc));
  }
  spdlog::info("stopped");
  return envoy_failed ? 1 : 0;
}

void Server::onSignal(int signum) {
  if (signum == SIGHUP) {
    std::string error;
    if (!reload(&error)) {
      spdlog::error("reload refused, keeping the old config: {}", error);
    }
    return;
  }
  spdlog::info("{} received, stopping", signum == SIGTERM ? "SIGTERM" : "SIGINT");
  beginStop();
}

bool Server::reload(std::string* error) {
  systemd::notifyReloading();
  bool ok = reloadLocked(error);
  systemd::notifyReady(ok ? "reloaded; " + statusLine() : "reload refused; " + statusLine());
  return ok;
}

bool Server::reloadLocked(std::string* error) {
  // Read and checked before the lock is taken (config_.path never changes),
  // so the lock is held for moments only.
  ConfigResult result = loadConfigFile(config_.path);
  std::lock_guard<std::mutex> lock(reload_mutex_);
  // Once stopping, workers close their queues: nothing may be posted to them.
  if (stopping_) {
    *error = "the daemon is stopping";
    return false;
  }
  if (!result.ok()) {
    *error = result.error;
    return false;
  }
  Config& fresh = *result.config;
  // Rules change live; the rest needs a restart, so say so instead of
  // silently ignoring it. The socket may have come from --socket.
  fresh.daemon.socket_path = config_.daemon.socket_path;
  for (auto [section, changed] :
       {std::pair{"[daemon]", !(fresh.daemon == config_.daemon)},
        {"[limits]", !(fresh.limits == config_.limits)},
        {"[keys]", !(fresh.keys == config_.keys)},
        {"[access]", !(fresh.access == config_.access)},
        {"[redis]", fresh.redis != config_.redis},
        {"[http]", !(fresh.http == config_.http)},
        {"[resp]", !(fresh.resp == config_.resp)}}) {
    if (changed) {
      spdlog::warn("reload: {} changed; only rules change on reload, the rest at the next restart",
                   section);
    }
  }
  RuleSetPtr rules = fresh.rules;
  // The fresh file's shares divide by expected_nodes; once heartbeats have
  // counted the nodes, N decides.
  uint32_t nodes = control_ ? control_->snapshot().nodes : rules->fallbackNodes();
  if (!added_rules_.empty()) {
    rules = std::make_shared<const RuleSet>(withAddedRules(rules->rules(), added_rules_), nodes);
  } else if (nodes != rules->fallbackNodes()) {
    rules = std::make_shared<const RuleSet>(std::vector<Rule>(rules->rules()), nodes);
  }
  installRules(rules);
  if (envoy_ && fresh.envoy) {
    envoy_->setConfig(*fresh.envoy);
  } else if (envoy_ || fresh.envoy) {
    spdlog::warn("reload: [envoy] was added or removed; that takes a restart");
  }
  spdlog::info("reloaded {}: {} rules", config_.path, rules->rules().size());
  return true;
}

void Server::installRules(RuleSetPtr rules) {
  config_.rules = rules;
  rules_.store(rules, std::memory_order_release);
  for (auto& worker : workers_) {
    worker->setRules(rules);
  }
}

void Server::onNodesChanged(uint32_t nodes) {
  std::lock_guard<std::mutex> lock(reload_mutex_);
  // Once stopping, workers close their queues: nothing may be posted to them.
  if (stopping_ || nodes == config_.rules->fallbackNodes()) {
    return;
  }
  // Same rules, so the same ids: keys keep their state under the new share.
  installRules(std::make_shared<const RuleSet>(std::vector<Rule>(config_.rules->rules()), nodes));
  spdlog::info("global rules' fallback shares are now 1/{} of their limits", nodes);
}

void Server::returnSlice(const Rule& rule, std::string_view key,
                         std::span<std::atomic<uint64_t>> words, int64_t now_ns) {
  slice::Taken taken = slice::takeBack(words, now_ns);
  if (taken.units <= 0 || !broker_) return;
  LeaseRequest back;
  back.kind = LeaseRequest::Kind::kReturn;
  back.rule_id = rule.id;
  back.variant = storedOverride(rule, words);
  back.key = std::string(key);
  back.n = taken.units;
  back.lease_now_ms = taken.lease_now_ms;
  broker_->submit(std::move(back));
}

void Server::onForcedEviction(uint32_t rule_id, std::string_view key,
                              std::span<std::atomic<uint64_t>> words) {
  // Only a global rule's slice holds units.
  if (!broker_ || (rule_id & kFallbackIdBit) != 0 || words.size() < slice::kWords ||
      !slice::holdsUnits(words)) {
    return;
  }
  RuleSetPtr rules = rules_.load(std::memory_order_acquire);
  const Rule* rule = rules->findById(rule_id);
  // A holding's units that callers hold go back with the next renewal pass
  // (lease_manager.h), which finds the key gone.
  if (rule != nullptr && (leasable(*rule) || leasesHolding(*rule)) &&
      words.size() == entryWords(*rule)) {
    returnSlice(*rule, key, words, clock_ns_());
  }
}

void Server::sweepKeys() {
  // Calendar windows follow a step of the wall clock from the next sweep on.
  calendar::refreshWallOffset();
  RuleSetPtr rules = rules_.load(std::memory_order_acquire);
  int64_t now_ns = clock_ns_();
  // A key is dropped when its rule is gone or its state is a fresh key's:
  // dropping it then changes no future decision. A global rule's idle slice
  // gives its unused units back to Redis as it goes; a share entry stays
  // while it holds units admitted in fallback that Redis has not been told of.
  size_t evicted = keys_->sweep(now_ns, [&](KeyTable::Entry& entry) {
    const Rule* rule = rules->findById(entry.ruleId());
    if (rule == nullptr || entry.state().size() != entryWords(*rule)) return true;
    auto words = entry.state();
    // A key blocked, or counting denials toward a block, is not fresh.
    if (rule->penalty && !penalty::isIdle(*rule->penalty, penaltyState(*rule, words), now_ns)) {
      return false;
    }
    if ((rule->id & kFallbackIdBit) == 0 && leasesHolding(*rule)) {
      // A holding is idle when no caller holds a unit here (expired ones
      // come back first) and no lease is on the way; its pool goes back.
      if (slice::inFlight(words)) return false;
      if (int64_t reclaimed = holding::reclaim(words, now_ns); reclaimed > 0 && broker_) {
        broker_->counters().released_units.fetch_add(static_cast<uint64_t>(reclaimed),
                                                     std::memory_order_relaxed);
      }
      if (holding::live(words, now_ns) > 0 || holding::pool(words) < 0) return false;
      returnSlice(*rule, entry.key(), words, now_ns);
      return true;
    }
    if ((rule->id & kFallbackIdBit) == 0 && leasable(*rule)) {
      if (!slice::idle(words, now_ns)) return false;
      // Requests wait in line for its units (the mark goes with the line).
      if (slice::lineMarked(words) &&
          broker_->lines().standing(rule->id, entry.key(), slice::of(words))) {
        return false;
      }
      returnSlice(*rule, entry.key(), words, now_ns);
      return true;
    }
    if ((rule->id & kFallbackIdBit) != 0 && undebited(*rule, words) > 0) {
      return false;
    }
    const Rule& deciding = decidingRule(*rules, *rule, entry.key(), words);
    return isIdle(deciding, words.first(stateWords(deciding)), now_ns);
  });
  if (evicted > 0) {
    spdlog::debug("swept {} idle keys", evicted);
  }
  releaseFreeMemory();
}

void Server::releaseFreeMemory() {
#if defined(__GLIBC__)
  // glibc gives memory back to the system only from the top of an arena,
  // and only past a threshold that rises with the largest block freed. Each
  // sweep frees thousands of keys (allocated by the workers) and starts a
  // burst of returns on the control thread; the pages they left free inside
  // the arena stayed resident, and RSS rose in steps for as long as a new
  // peak could come (bench/soak). malloc_trim hands every whole free page
  // back (madvise) and shrinks the (one, see the constructor) arena's top;
  // it takes 0.1 to 1.5 ms here, once per sweep.
  malloc_trim(0);
#endif
}

void Server::beginStop() {
  {
    std::lock_guard<std::mutex> lock(reload_mutex_);
    if (stopping_) {
      return;
    }
    stopping_ = true;
  }
  uv_close(reinterpret_cast<uv_handle_t*>(&listener_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&accept_pause_), nullptr);
  ::close(listen_fd_);
  listen_fd_ = -1;
  if (!socket_inherited_) {
    unlink(config_.daemon.socket_path.c_str());
  }
  if (resp_fd_ >= 0) {
    uv_close(reinterpret_cast<uv_handle_t*>(&resp_listener_), nullptr);
    ::close(resp_fd_);
    resp_fd_ = -1;
    if (!resp_unix_path_.empty()) unlink(resp_unix_path_.c_str());
  }
  if (http_fd_ >= 0) {
    uv_close(reinterpret_cast<uv_handle_t*>(&http_listener_), nullptr);
    ::close(http_fd_);
    http_fd_ = -1;
    if (!http_unix_path_.empty()) unlink(http_unix_path_.c_str());
  }
  systemd::notifyStopping();
  uv_close(reinterpret_cast<uv_handle_t*>(&status_timer_), nullptr);
  metrics_endpoint_.stop();
  for (uv_signal_t* handle : {&sigterm_, &sigint_, &sighup_}) {
    uv_close(reinterpret_cast<uv_handle_t*>(handle), nullptr);
  }
  uv_close(reinterpret_cast<uv_handle_t*>(&key_sweep_), nullptr);
  // Before the workers: its calls in flight are answered by them.
  if (envoy_) envoy_->stop();
  for (auto& worker : workers_) {
    worker->stop();
  }
}

void Server::onStatusTimer() {
  handle_count_.store(openHandles(&loop_), std::memory_order_relaxed);
  if (watchdog_us_ > 0) {
    // A worker that has not answered the last ping is stuck (or very
    // late): withhold WATCHDOG=1, so systemd restarts a daemon that stays so.
    auto stuck = std::find_if(workers_.begin(), workers_.end(),
                              [&](const auto& worker) { return worker->pong() != ping_seq_; });
    if (stuck == workers_.end()) {
      systemd::notifyWatchdog();
      if (worker_stuck_) spdlog::info("every worker answers again; the watchdog is fed");
      worker_stuck_ = false;
    } else if (!worker_stuck_) {
      worker_stuck_ = true;
      spdlog::warn("worker {} has not answered the watchdog ping; withholding the watchdog",
                   stuck - workers_.begin());
    }
    ++ping_seq_;
    for (auto& worker : workers_) {
      worker->ping(ping_seq_);
    }
  }
  std::string status = statusLine();
  if (status != last_status_) {
    systemd::notifyStatus(status);
    last_status_ = std::move(status);
  }
}

}  // namespace sluice

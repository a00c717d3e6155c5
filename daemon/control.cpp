// Control: the control thread's health checks, heartbeats and clock offset;
// see control.h.
#include "control.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <spdlog/spdlog.h>

#include "redis_keys.h"
#include "scripts.h"
#include "uv_handles.h"

namespace sluice {

std::string defaultNodeId() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') {
    std::snprintf(host, sizeof(host), "unknown");
  }
  return std::string(host) + ":" + std::to_string(getpid());
}

namespace {

// The state version this node writes: kRedisStateVersion, or the tests'
// seam `env` (SLUICE_TEST_STATE_VERSION), which lets a test run a mixed
// fleet on one Redis. A value that is not a version >= 1 is ignored.
int64_t stateVersionOf(const char* env) {
  if (env == nullptr) return kRedisStateVersion;
  char* end = nullptr;
  long long version = std::strtoll(env, &end, 10);
  if (end == env || *end != '\0' || version < 1 || version > (1LL << 31)) return kRedisStateVersion;
  return version;
}

}  // namespace

Control::Control(RedisConfig config, RedisLinkOptions link_options, MonotonicClock clock)
    : config_(std::move(config)),
      link_options_(link_options),
      clock_ns_(std::move(clock)),
      node_id_(config_.node_id.empty() ? defaultNodeId() : config_.node_id),
      members_key_(redisMembersKey(config_.key_prefix)),
      state_version_(stateVersionOf(std::getenv("SLUICE_TEST_STATE_VERSION"))),
      nodes_(std::max<uint32_t>(config_.expected_nodes, 1)) {}

Control::~Control() {
  stop();
  join();
}

void Control::start() {
  uv_loop_init(&loop_);
  uv_async_init(&loop_, &wakeup_, [](uv_async_t* handle) {
    static_cast<Control*>(handle->data)->onWakeup();
  });
  wakeup_.data = this;
  uv_timer_init(&loop_, &health_timer_);
  health_timer_.data = this;
  uv_timer_init(&loop_, &heartbeat_timer_);
  heartbeat_timer_.data = this;
  uv_timer_init(&loop_, &renew_timer_);
  renew_timer_.data = this;
  uv_timer_init(&loop_, &sweep_timer_);
  sweep_timer_.data = this;

  if (config_.cluster()) {
    // A CLUSTER SLOTS answer is bounded like any command of ours; keyless
    // commands (PING, INFO) go to the master of the members set.
    cluster_ = std::make_unique<RedisCluster>(&loop_, config_, link_options_,
                                              config_.health_timeout_ms, members_key_);
    redis_ = cluster_.get();
    cluster_->onMastersChanged([this] {
      std::string masters = cluster_->address();
      if (!connected_to_.empty()) publishAddress(masters);
      // A master left the map and one it never had took slots over: a
      // replica promoted in a failover, without the writes it had not
      // replicated. Learning mode holds every node to its share for a
      // while, as after a run_id change. (Masters only appearing, as while
      // the map first loads or a node is added, are no failover.)
      std::set<std::string> now;
      for (size_t from = 0; from < masters.size();) {
        size_t comma = std::min(masters.find(',', from), masters.size());
        now.insert(masters.substr(from, comma - from));
        from = comma + 1;
      }
      for (const std::string& master : current_masters_) {
        if (!now.contains(master)) lost_masters_.insert(master);
      }
      for (const std::string& master : now) {
        if (!known_masters_.contains(master) && !lost_masters_.empty() && leases_) {
          leases_->newMaster(master);
          lost_masters_.clear();
        }
        known_masters_.insert(master);
      }
      current_masters_ = std::move(now);
    });
  } else {
    RedisLinkOptions options = link_options_;
    options.require_master = config_.sentinel();
    link_ = std::make_unique<RedisLink>(&loop_, config_, options);
    redis_ = link_.get();
  }
  if (config_.sentinel()) {
    // A sentinel's answer is bounded like any command of ours.
    sentinel_ = std::make_unique<Sentinel>(&loop_, config_, link_options_,
                                           config_.health_timeout_ms);
    link_->resolveWith(
        [this](RedisLink::AddressCallback done) { sentinel_->resolve(std::move(done)); });
    sentinel_->onSwitch([this](const RedisAddress& master) {
      if (stopping_ || (link_->connected() && link_->address() == master.text())) return;
      link_->reconnect("sentinel: " + config_.sentinel_master + " moved to " + master.text());
      if (renew_watch_) renew_watch_->reconnect("sentinel: the master moved");
    });
  }
  const scripts::ScriptSource& heartbeat = scripts::get(scripts::Script::kHeartbeat);
  heartbeat_script_ =
      redis_->registerScript(std::string(heartbeat.name), std::string(heartbeat.source));
  if (lease_context_.keys != nullptr) {
    lease_context_.node_id = node_id_;
    lease_context_.fleet_ttl_ms = kHeartbeatTtlIntervals * config_.heartbeat_interval_ms;
    lease_context_.state_version = state_version_;
    lease_context_.redis_now_us = [this]() -> std::optional<int64_t> {
      int64_t offset_us = clock_offset_us_.load(std::memory_order_acquire);
      if (offset_us == kNoOffset) return std::nullopt;
      return nowUs() + offset_us;
    };
    leases_ = std::make_unique<LeaseManager>(*redis_, config_, lease_context_);
    lease_context_.broker->setWakeup(&wakeup_);
    startRenewWatch();
  }
  redis_->onConnected([this] { onConnected(); });
  redis_->onDisconnected([this](std::string_view reason) { setUp(false, reason); });

  // The thread is created after everything above, so it sees it all; a
  // stop() that came first has set the flag, and the wakeup's first run
  // finds it.
  thread_ = std::thread([this] { run(); });
  uv_async_send(&wakeup_);
}

void Control::startRenewWatch() {
  RedisLinkOptions options = link_options_;
  options.require_master = false;  // a replica gets the master's messages too
  options.log_name = "redis-renew";
  options.probe_interval_ms = kWatchProbeIntervalMs;
  options.probe_timeout_ms = config_.health_timeout_ms;
  renew_watch_ = std::make_unique<RedisLink>(&loop_, config_, options);
  if (config_.sentinel() || config_.cluster()) {
    // Where the main link (or the cluster's first master) is connected.
    renew_watch_->resolveWith([this](const RedisLink::AddressCallback& done) {
      std::string at = redis_->connected() ? redis_->address() : "";
      at = at.substr(0, at.find(','));
      RedisAddress address;
      std::string problem;
      if (at.empty() || !parseRedisAddress(at, &address, &problem)) {
        done(std::nullopt, "the main link is not connected");
        return;
      }
      done(address, "");
    });
  }
  renew_watch_->subscribe(redisRenewChannel(config_.key_prefix, state_version_),
                          [this](std::string_view state_key) {
                            if (leases_ && !stopping_) leases_->renewHeard(state_key);
                          });
}

void Control::stop() {
  if (stop_requested_.exchange(true, std::memory_order_acq_rel)) return;
  if (thread_.joinable()) uv_async_send(&wakeup_);
}

bool Control::join() {
  if (thread_.joinable()) thread_.join();
  return loop_close_rc_ == 0;
}

ControlSnapshot Control::snapshot() const {
  ControlSnapshot snapshot;
  snapshot.redis_up = up_.load(std::memory_order_acquire);
  snapshot.nodes = nodes_.load(std::memory_order_acquire);
  {
    std::lock_guard<std::mutex> lock(address_mutex_);
    snapshot.address = address_;
  }
  int64_t offset_us = clock_offset_us_.load(std::memory_order_acquire);
  if (offset_us != kNoOffset) snapshot.clock_offset_us = offset_us;
  snapshot.try_agains = try_agains_.load(std::memory_order_relaxed);
  return snapshot;
}

void Control::run() {
  pthread_setname_np(pthread_self(), "sluice-control");
  if (sentinel_) sentinel_->start();
  redis_->start();
  if (renew_watch_) renew_watch_->start();
  auto every = [](int64_t ms) { return static_cast<uint64_t>(ms); };
  uv_timer_start(
      &health_timer_, [](uv_timer_t* timer) { static_cast<Control*>(timer->data)->ping(); },
      every(config_.health_interval_ms), every(config_.health_interval_ms));
  uv_timer_start(
      &heartbeat_timer_, [](uv_timer_t* timer) { static_cast<Control*>(timer->data)->beat(); },
      every(config_.heartbeat_interval_ms), every(config_.heartbeat_interval_ms));
  if (leases_) {
    auto renew_ms =
        static_cast<uint64_t>(std::max<int64_t>(config_.lease_ttl_ms / kRenewalsPerTtl, 1));
    uv_timer_start(
        &renew_timer_,
        [](uv_timer_t* timer) { static_cast<Control*>(timer->data)->leases_->renewHoldings(); },
        renew_ms, renew_ms);
    auto sweep_ms = static_cast<uint64_t>(LeaseManager::sweepIntervalMs(config_.lease_interval_ms));
    uv_timer_start(
        &sweep_timer_,
        [](uv_timer_t* timer) { static_cast<Control*>(timer->data)->leases_->sweepIdleRates(); },
        sweep_ms, sweep_ms);
  }
  handle_count_.store(openHandles(&loop_), std::memory_order_relaxed);
  uv_run(&loop_, UV_RUN_DEFAULT);
  // Every handle is closed by now (beginStop), so the loop closes.
  leases_.reset();
  renew_watch_.reset();
  link_.reset();
  cluster_.reset();
  sentinel_.reset();
  loop_close_rc_ = uv_loop_close(&loop_);
  if (loop_close_rc_ != 0) {
    spdlog::error("control: loop closed with handles still open ({})",
                  uv_strerror(loop_close_rc_));
  }
}

void Control::onWakeup() {
  if (stop_requested_.load(std::memory_order_acquire)) {
    beginStop();
  } else if (leases_) {
    leases_->onWakeup();
  }
}

void Control::onConnected() {
  if (stopping_) return;
  reconnected_ = connected_at_us_ != 0;
  connected_at_us_ = nowUs();
  std::string address = redis_->address();
  if (!connected_to_.empty() && address != connected_to_) {
    spdlog::warn("control: redis is now {} (was {})", address, connected_to_);
  }
  publishAddress(std::move(address));
  setUp(true, "");
  // Count ourselves in at once, then every interval from now.
  uv_timer_start(
      &heartbeat_timer_, [](uv_timer_t* timer) { static_cast<Control*>(timer->data)->beat(); }, 0,
      static_cast<uint64_t>(config_.heartbeat_interval_ms));
}

void Control::publishAddress(std::string address) {
  connected_to_ = address;
  std::lock_guard<std::mutex> lock(address_mutex_);
  address_ = std::move(address);
}

void Control::setUp(bool up, std::string_view reason) {
  if (up_.load(std::memory_order_relaxed) == up) return;
  up_.store(up, std::memory_order_release);
  if (up) {
    spdlog::info("control: redis is up");
  } else {
    spdlog::warn("control: redis is down ({}); global rules follow their on_redis_down policy",
                 reason);
  }
  if (leases_ && !stopping_) {
    if (up) {
      leases_->onUp();
    } else {
      leases_->onDown();
    }
  }
}

void Control::ping() {
  handle_count_.store(openHandles(&loop_), std::memory_order_relaxed);
  if (cluster_) try_agains_.store(cluster_->tryAgains(), std::memory_order_relaxed);
  if (stopping_ || !redis_->connected()) return;
  if (leases_) leases_->retryDebits();
  if (ping_in_flight_) return;
  ping_in_flight_ = redis_->command(
      {"PING"},
      [this](const RedisResult& result) {
        ping_in_flight_ = false;
        // A timeout or a lost connection reaches setUp through the link's
        // onDisconnected; here only what a live connection answered counts.
        if (result.status == RedisStatus::kOk) {
          setUp(true, "");
        } else if (result.status == RedisStatus::kRedisError) {
          setUp(false, "PING answered " + std::string(result.error));
        }
      },
      config_.health_timeout_ms);
}

void Control::beat() {
  if (stopping_ || !redis_->connected()) return;
  if (leases_) leases_->checkFleet();
  if (beat_in_flight_) return;
  std::vector<std::string> argv = scripts::heartbeatArgv(
      scripts::HeartbeatOp::kBeat, node_id_, kHeartbeatTtlIntervals * config_.heartbeat_interval_ms);
  std::vector<std::string_view> args(argv.begin(), argv.end());
  std::string_view keys[] = {members_key_};
  int64_t sent_us = nowUs();
  beat_in_flight_ = redis_->evalsha(
      heartbeat_script_, keys, args,
      [this, sent_us](const RedisResult& result) { onHeartbeat(result, sent_us); },
      config_.health_timeout_ms);
}

void Control::onHeartbeat(const RedisResult& result, int64_t sent_us) {
  int64_t received_us = nowUs();
  beat_in_flight_ = false;
  if (result.status != RedisStatus::kOk) {
    // Timeouts and disconnects are the link's to report (and mark Redis down);
    // an error reply means Redis is there but refuses the script.
    if (result.status == RedisStatus::kRedisError && result.error != last_heartbeat_error_) {
      last_heartbeat_error_ = std::string(result.error);
      spdlog::error("control: heartbeat failed: {}", result.error);
    }
    return;
  }
  std::optional<std::vector<int64_t>> values = result.reply->integers();
  std::optional<scripts::HeartbeatReply> beat;
  if (values) beat = scripts::parseHeartbeatReply(*values);
  if (!beat || beat->live < 1) {
    std::string error = "heartbeat.lua answered something else than {live, now_ms}";
    if (error != last_heartbeat_error_) {
      last_heartbeat_error_ = error;
      spdlog::error("control: {}", error);
    }
    return;
  }
  last_heartbeat_error_.clear();

  clock_.addSample(sent_us, received_us, beat->now_ms);
  clock_offset_us_.store(*clock_.offsetUs(), std::memory_order_release);

  auto live = static_cast<uint32_t>(std::min<int64_t>(beat->live, UINT32_MAX));
  uint32_t was = nodes_.load(std::memory_order_relaxed);
  if (live == was) return;
  // After an outage longer than a heartbeat's TTL the members set is empty
  // and refills as the nodes reconnect, each on its own backoff: a smaller
  // count then means "not back yet", not "gone". Until every node has had a
  // TTL to beat again, N only grows; after a reconnect, also until every
  // node can have reconnected (the backoff's cap, with its jitter): a node
  // that came back first and believed N = 1 would lease the whole limit
  // while the others still spend their shares.
  double settle_ms = kHeartbeatTtlIntervals * config_.heartbeat_interval_ms;
  if (reconnected_) settle_ms += redis_->options().longestBackoffMs();
  auto settle_us = static_cast<int64_t>(settle_ms * 1000);
  if (live < was && received_us - connected_at_us_ < settle_us) return;
  nodes_.store(live, std::memory_order_release);
  spdlog::info("control: {} live nodes (was {})", live, was);
  if (on_nodes_changed_) on_nodes_changed_(live);
}

void Control::beginStop() {
  if (stopping_) return;
  stopping_ = true;
  for (uv_timer_t* timer : {&health_timer_, &heartbeat_timer_, &renew_timer_, &sweep_timer_}) {
    uv_close(reinterpret_cast<uv_handle_t*>(timer), nullptr);
  }
  if (leases_) lease_context_.broker->setWakeup(nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&wakeup_), nullptr);
  if (leases_ && redis_->connected()) {
    leases_->returnAll(kLeaveTimeoutMs, [this] { leave(); });
  } else {
    leave();
  }
}

void Control::leave() {
  if (!redis_->connected()) {
    closeLink();
    return;
  }
  std::vector<std::string> argv = scripts::heartbeatArgv(
      scripts::HeartbeatOp::kLeave, node_id_, kHeartbeatTtlIntervals * config_.heartbeat_interval_ms);
  std::vector<std::string_view> args(argv.begin(), argv.end());
  std::string_view keys[] = {members_key_};
  bool sent = redis_->evalsha(
      heartbeat_script_, keys, args,
      [this](const RedisResult& result) {
        if (result.status != RedisStatus::kOk) {
          spdlog::warn("control: could not leave the members set ({}: {}); this node drops out "
                       "when its heartbeat expires",
                       toString(result.status), result.error);
        }
        closeLink();
      },
      kLeaveTimeoutMs);
  if (!sent) closeLink();
}

void Control::closeLink() {
  if (link_closed_) return;
  link_closed_ = true;
  redis_->close([] {});
  if (renew_watch_) renew_watch_->close([] {});
  if (sentinel_) sentinel_->close([] {});
}

}  // namespace sluice

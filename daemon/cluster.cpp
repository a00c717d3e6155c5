// RedisCluster: the slot map, one link per master, routing and redirections;
// see cluster.h.
#include "cluster.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <utility>

namespace sluice {

// One routed script call, kept until its answer so that a redirection can
// send it again.
struct RedisCluster::Call {
  ScriptId script = 0;
  std::vector<std::string> keys;
  std::vector<std::string> args;
  RedisCallback callback;
  int64_t timeout_ms = 0;
  int redirects = 0;
  int try_agains = 0;
  uint64_t first_sent_ms = 0;  // uv_now when the caller made it
  RedisAddress sent_to;  // for a redirection that names no host
};

namespace {

// "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381": the slot and the
// node; nullopt for any other error. An empty host means "the node you asked".
struct Redirect {
  bool ask = false;
  uint16_t slot = 0;
  RedisAddress to;
};

std::optional<Redirect> parseRedirect(std::string_view error, const RedisAddress& asked) {
  Redirect redirect;
  if (error.starts_with("MOVED ")) {
    error.remove_prefix(6);
  } else if (error.starts_with("ASK ")) {
    redirect.ask = true;
    error.remove_prefix(4);
  } else {
    return std::nullopt;
  }
  size_t space = error.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  std::string_view slot = error.substr(0, space);
  auto [end, failed] = std::from_chars(slot.data(), slot.data() + slot.size(), redirect.slot);
  if (failed != std::errc() || end != slot.data() + slot.size() || redirect.slot >= kClusterSlots) {
    return std::nullopt;
  }
  std::string_view node = error.substr(space + 1);
  std::string problem;
  // An empty host ("MOVED 3999 :6381") means the node that answered.
  std::string text = node.starts_with(":") ? "h" + std::string(node) : std::string(node);
  if (!parseRedisAddress(text, &redirect.to, &problem)) return std::nullopt;
  if (node.starts_with(":")) redirect.to.host = asked.host;
  return redirect;
}

}  // namespace

RedisCluster::RedisCluster(uv_loop_t* loop, RedisConfig config, RedisLinkOptions link_options,
                           int64_t command_timeout_ms, std::string home_key)
    : loop_(loop),
      config_(std::move(config)),
      link_options_(std::move(link_options)),
      command_timeout_ms_(command_timeout_ms),
      home_slot_(clusterSlot(home_key)),
      slots_(kClusterSlots, nullptr) {
  if (config_.cluster_addresses.empty()) {
    spdlog::critical("RedisCluster without seed nodes (the config check lets none through)");
    std::abort();
  }
  uv_timer_init(loop_, &refresh_timer_);
  refresh_timer_.data = this;
  uv_timer_init(loop_, &again_timer_);
  again_timer_.data = this;
}

RedisCluster::~RedisCluster() {
  if (!closed_) {
    spdlog::critical("RedisCluster destroyed before its close() callback ran");
    std::abort();
  }
}

RedisConfig RedisCluster::nodeConfig(const RedisAddress& address) const {
  RedisConfig config = config_;
  config.url.clear();
  config.host = address.host;
  config.port = address.port;
  config.unix_path.clear();
  config.db = 0;
  return config;
}

RedisTarget::ScriptId RedisCluster::registerScript(std::string name, std::string source) {
  if (started_) {
    spdlog::critical("RedisCluster::registerScript({}) after start()", name);
    std::abort();
  }
  scripts_.push_back({std::move(name), std::move(source)});
  return scripts_.size() - 1;
}

void RedisCluster::start() {
  started_ = true;
  uv_timer_start(
      &refresh_timer_,
      [](uv_timer_t* timer) {
        auto* self = static_cast<RedisCluster*>(timer->data);
        self->retired_.freeClosed();
        if (!self->allSlotsUp()) self->refresh();
      },
      static_cast<uint64_t>(kRefreshIntervalMs), static_cast<uint64_t>(kRefreshIntervalMs));
  refresh();
}

std::string RedisCluster::address() const {
  std::string text;
  std::vector<const Master*> seen;
  for (const Master* master : slots_) {
    if (master == nullptr || std::find(seen.begin(), seen.end(), master) != seen.end()) continue;
    seen.push_back(master);
    if (!text.empty()) text += ',';
    text += master->link->address();
  }
  return text;
}

bool RedisCluster::allSlotsUp() const {
  return std::all_of(slots_.begin(), slots_.end(),
                     [](const Master* master) { return master != nullptr && master->up; });
}

// --- the slot map ---------------------------------------------------------------

void RedisCluster::refresh() {
  if (closing_) return;
  if (probe_) {
    refresh_again_ = true;
    return;
  }
  // The node that answered last first, then the masters (the connected
  // ones first), then the seeds.
  candidates_.clear();
  auto add = [&](const RedisAddress& address) {
    if (std::find(candidates_.begin(), candidates_.end(), address) == candidates_.end()) {
      candidates_.push_back(address);
    }
  };
  if (last_answered_) add(*last_answered_);
  for (bool up : {true, false}) {
    for (auto& [text, master] : masters_) {
      RedisAddress address;
      std::string problem;
      if (master.up == up && parseRedisAddress(text, &address, &problem)) add(address);
    }
  }
  for (const RedisAddress& seed : config_.cluster_addresses) add(seed);
  next_candidate_ = 0;
  probe_reasons_.clear();
  probeNext();
}

void RedisCluster::probeNext() {
  if (next_candidate_ == candidates_.size()) {
    std::string error = "no node answered CLUSTER SLOTS (" + probe_reasons_ + ")";
    if (error != last_map_error_) {
      spdlog::error("cluster: {}; trying again every {} ms", error, kRefreshIntervalMs);
      last_map_error_ = error;
    }
    refresh_again_ = false;
    return;
  }
  RedisAddress node = candidates_[next_candidate_++];
  RedisLinkOptions options = link_options_;
  options.quiet = true;  // probeNext's error says it all
  probe_ = std::make_unique<RedisLink>(loop_, nodeConfig(node), options);
  RedisLink* probe = probe_.get();
  probe->onConnected([this, probe, node] {
    bool sent = probe->command(
        {"CLUSTER", "SLOTS"},
        [this, probe, node](const RedisResult& result) {
          if (probe != probe_.get()) return;  // closed
          if (result.status != RedisStatus::kOk) {
            probeFailed(node.text() + ": " + std::string(result.error));
            return;
          }
          if (!applySlots(*result.reply, node)) {
            probeFailed(node.text() + ": CLUSTER SLOTS answered something else than a slot map");
            return;
          }
          last_answered_ = node;
          last_map_error_.clear();
          retired_.retire(std::move(probe_));
          if (refresh_again_) {
            refresh_again_ = false;
            refresh();
          }
        },
        command_timeout_ms_);
    if (!sent) probeFailed(node.text() + ": cannot send CLUSTER SLOTS");
  });
  probe->onDisconnected([this, probe, node](std::string_view reason) {
    if (probe == probe_.get()) probeFailed(node.text() + ": " + std::string(reason));
  });
  probe->start();
}

void RedisCluster::probeFailed(std::string_view reason) {
  if (!probe_reasons_.empty()) probe_reasons_ += "; ";
  probe_reasons_ += reason;
  retired_.retire(std::move(probe_));
  probeNext();
}

// CLUSTER SLOTS: an array of [start, end, [host, port, id, ...], replicas...].
bool RedisCluster::applySlots(const RedisReply& reply, const RedisAddress& from) {
  if (reply.kind() != RedisReply::Kind::kArray) return false;
  std::vector<std::string> owners(kClusterSlots);
  for (size_t i = 0; i < reply.size(); ++i) {
    RedisReply range = reply[i];
    if (range.kind() != RedisReply::Kind::kArray || range.size() < 3) return false;
    RedisReply first = range[0], last = range[1], node = range[2];
    if (first.kind() != RedisReply::Kind::kInteger || last.kind() != RedisReply::Kind::kInteger ||
        node.kind() != RedisReply::Kind::kArray || node.size() < 2 ||
        node[1].kind() != RedisReply::Kind::kInteger) {
      return false;
    }
    int64_t start = first.integer(), end = last.integer(), port = node[1].integer();
    if (start < 0 || end < start || end >= kClusterSlots || port < 1 || port > 65535) return false;
    // An empty host (or "?", an unknown endpoint) is the node that answered.
    std::string_view host = node[0].str();
    RedisAddress address{host.empty() || host == "?" ? from.host : std::string(host),
                         static_cast<uint16_t>(port)};
    std::string text = address.text();
    for (int64_t slot = start; slot <= end; ++slot) owners[static_cast<size_t>(slot)] = text;
  }
  std::string before = address();
  for (size_t slot = 0; slot < kClusterSlots; ++slot) {
    slots_[slot] = owners[slot].empty() ? nullptr : &masterAt(owners[slot]);
  }
  dropUnusedMasters();
  std::string after = address();
  if (after != before) {
    size_t covered = static_cast<size_t>(
        std::count_if(slots_.begin(), slots_.end(), [](const Master* m) { return m != nullptr; }));
    spdlog::info("cluster: slot map from {}: masters {} ({} of {} slots covered)", from.text(),
                 after, covered, kClusterSlots);
    if (on_masters_changed_) on_masters_changed_();
  }
  return true;
}

RedisCluster::Master& RedisCluster::masterAt(const std::string& address) {
  auto it = masters_.find(address);
  if (it != masters_.end()) return it->second;
  RedisAddress parsed;
  std::string problem;
  parseRedisAddress(address, &parsed, &problem);  // made by RedisAddress::text()
  Master& master = masters_[address];
  master.link = std::make_unique<RedisLink>(loop_, nodeConfig(parsed), link_options_);
  for (const Script& script : scripts_) master.link->registerScript(script.name, script.source);
  Master* self = &master;
  master.link->onConnected([this, self] { onMasterUp(*self); });
  master.link->onDisconnected([this, self](std::string_view reason) { onMasterDown(*self, reason); });
  master.link->start();
  return master;
}

void RedisCluster::onMasterUp(Master& master) {
  if (master.up) return;
  master.up = true;
  if (connected_links_++ == 0 && on_connected_) on_connected_();
}

void RedisCluster::onMasterDown(Master& master, std::string_view reason) {
  if (master.up) {
    master.up = false;
    if (--connected_links_ == 0 && on_disconnected_) on_disconnected_(reason);
  }
  // The slot may have a new master already (a failover): look at once, and
  // every kRefreshIntervalMs until every slot has a connected master.
  refresh();
}

void RedisCluster::dropUnusedMasters() {
  for (auto it = masters_.begin(); it != masters_.end();) {
    Master* master = &it->second;
    if (std::find(slots_.begin(), slots_.end(), master) != slots_.end()) {
      ++it;
      continue;
    }
    spdlog::info("cluster: {} serves no slot any more; closing its link", it->first);
    bool was_up = master->up;
    retired_.retire(std::move(master->link));
    it = masters_.erase(it);
    if (was_up && --connected_links_ == 0 && on_disconnected_) {
      on_disconnected_("no master of the slot map is connected");
    }
  }
}

// --- calls ------------------------------------------------------------------------

bool RedisCluster::command(std::span<const std::string_view> argv, RedisCallback callback,
                           int64_t timeout_ms) {
  Master* master = slots_[home_slot_];
  if (master == nullptr || !master->up) return false;
  return master->link->command(argv, std::move(callback), timeout_ms);
}

bool RedisCluster::evalsha(ScriptId script, std::span<const std::string_view> keys,
                           std::span<const std::string_view> args, RedisCallback callback,
                           int64_t timeout_ms) {
  uint16_t slot = keys.empty() ? home_slot_ : clusterSlot(keys.front());
  Master* master = slots_[slot];
  if (master == nullptr || !master->up) return false;
  auto call = std::make_shared<Call>();
  call->script = script;
  call->keys.assign(keys.begin(), keys.end());
  call->args.assign(args.begin(), args.end());
  call->callback = std::move(callback);
  call->timeout_ms = timeout_ms;
  call->first_sent_ms = uv_now(loop_);
  return send(call, master, false);
}

bool RedisCluster::send(const std::shared_ptr<Call>& call, Master* master, bool asking) {
  RedisLink& link = *master->link;
  std::string problem;
  parseRedisAddress(link.address(), &call->sent_to, &problem);
  if (asking) {
    // ASKING applies to the next command on this connection, which the
    // link writes right after it (commands of one tick go out in order).
    if (!link.command({"ASKING"}, [](const RedisResult&) {}, call->timeout_ms)) return false;
  }
  std::vector<std::string_view> keys(call->keys.begin(), call->keys.end());
  std::vector<std::string_view> args(call->args.begin(), call->args.end());
  return link.evalsha(
      call->script, keys, args,
      [this, call](const RedisResult& result) { onCallResult(call, result); }, call->timeout_ms);
}

void RedisCluster::onCallResult(const std::shared_ptr<Call>& call, const RedisResult& result) {
  if (result.status == RedisStatus::kRedisError && result.error.starts_with("TRYAGAIN") && !closing_ &&
      call->try_agains < kMaxTryAgains &&
      uv_now(loop_) + kTryAgainDelayMs < call->first_sent_ms + static_cast<uint64_t>(call->timeout_ms)) {
    // Its keys are split between a migrating slot's two nodes for now.
    ++call->try_agains;
    ++try_agains_;
    again_.emplace_back(uv_now(loop_) + kTryAgainDelayMs, call);
    if (again_.size() == 1) {
      uv_timer_start(&again_timer_, [](uv_timer_t* timer) {
        static_cast<RedisCluster*>(timer->data)->sendAgain();
      }, kTryAgainDelayMs, 0);
    }
    return;
  }
  std::optional<Redirect> redirect;
  if (result.status == RedisStatus::kRedisError) redirect = parseRedirect(result.error, call->sent_to);
  if (!redirect) {
    call->callback(result);
    return;
  }
  Master& target = masterAt(redirect->to.text());
  if (!redirect->ask) {
    // The slot moved for good: point it at its new owner now, and reload
    // the whole map (more slots usually moved with it).
    slots_[redirect->slot] = &target;
    refresh();
  }
  std::string why;
  if (++call->redirects > kMaxRedirects) {
    why = "too many redirections";
  } else if (!target.up || !send(call, &target, redirect->ask)) {
    why = std::string(redirect->ask ? "ASK" : "MOVED") + " to " + redirect->to.text() +
          ", which is not connected yet";
  } else {
    return;  // sent again: its answer comes back here
  }
  call->callback(RedisResult{RedisStatus::kDisconnected, nullptr, why, 0});
}

void RedisCluster::sendAgain() {
  const uint64_t now_ms = uv_now(loop_);
  std::vector<std::shared_ptr<Call>> due;
  size_t taken = 0;
  while (taken < again_.size() && again_[taken].first <= now_ms) due.push_back(std::move(again_[taken++].second));
  again_.erase(again_.begin(), again_.begin() + static_cast<std::ptrdiff_t>(taken));
  if (!again_.empty()) {
    uv_timer_start(&again_timer_, [](uv_timer_t* timer) {
      static_cast<RedisCluster*>(timer->data)->sendAgain();
    }, again_.front().first - now_ms, 0);
  }
  for (const std::shared_ptr<Call>& call : due) {
    // To the slot's owner now: a source that no longer holds the keys
    // answers ASK again, and the target has them all by then.
    Master* master = slots_[clusterSlot(call->keys.front())];
    if (master == nullptr || !master->up || !send(call, master, false)) {
      call->callback(RedisResult{RedisStatus::kDisconnected, nullptr,
                                 "TRYAGAIN, and then the slot's master was not connected", 0});
    }
  }
}

// --- closing ----------------------------------------------------------------------

void RedisCluster::maybeClosed() {
  if (!closing_ || !timer_closed_ || !again_timer_closed_ || retired_.closing() > 0 || closed_) return;
  closed_ = true;
  if (on_closed_) on_closed_();
}

void RedisCluster::close(std::function<void()> on_closed) {
  if (closing_) {
    spdlog::critical("RedisCluster::close() called twice");
    std::abort();
  }
  closing_ = true;
  on_closed_ = std::move(on_closed);
  std::fill(slots_.begin(), slots_.end(), nullptr);
  connected_links_ = 0;
  retired_.retire(std::move(probe_));
  for (auto& [address, master] : masters_) retired_.retire(std::move(master.link));
  masters_.clear();
  uv_close(reinterpret_cast<uv_handle_t*>(&refresh_timer_), [](uv_handle_t* handle) {
    auto* self = static_cast<RedisCluster*>(handle->data);
    self->timer_closed_ = true;
    self->maybeClosed();
  });
  // Calls waiting to be sent again end as a closed link's calls do.
  std::vector<std::pair<uint64_t, std::shared_ptr<Call>>> again;
  again.swap(again_);
  for (auto& [due_ms, call] : again) {
    call->callback(RedisResult{RedisStatus::kDisconnected, nullptr, "the cluster link closed", 0});
  }
  uv_close(reinterpret_cast<uv_handle_t*>(&again_timer_), [](uv_handle_t* handle) {
    auto* self = static_cast<RedisCluster*>(handle->data);
    self->again_timer_closed_ = true;
    self->maybeClosed();
  });
}

}  // namespace sluice

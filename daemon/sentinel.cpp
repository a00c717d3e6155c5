// Sentinel: resolving and following a Sentinel-managed master; see sentinel.h.
#include "sentinel.h"

#include <spdlog/spdlog.h>

#include <charconv>
#include <cstdlib>

namespace sluice {

Sentinel::Sentinel(uv_loop_t* loop, const RedisConfig& config, RedisLinkOptions link_options,
                   int64_t command_timeout_ms)
    : loop_(loop),
      master_name_(config.sentinel_master),
      sentinels_(config.sentinel_addresses),
      username_(config.sentinel_username),
      password_(config.sentinel_password),
      link_options_([&] {
        link_options.require_master = false;
        link_options.log_name = "sentinel";
        link_options.quiet = false;
        link_options.probe_interval_ms = kWatchProbeIntervalMs;  // the watch link's; see sentinel.h
        link_options.probe_timeout_ms = command_timeout_ms;
        return link_options;
      }()),
      command_timeout_ms_(command_timeout_ms) {
  if (sentinels_.empty()) {
    spdlog::critical("Sentinel without sentinels (the config check lets none through)");
    std::abort();
  }
}

Sentinel::~Sentinel() {
  if (!closed_) {
    spdlog::critical("Sentinel destroyed before its close() callback ran");
    std::abort();
  }
}

RedisConfig Sentinel::sentinelConfig(const RedisAddress& sentinel) const {
  RedisConfig config;
  config.url.clear();
  config.host = sentinel.host;
  config.port = sentinel.port;
  config.username = username_;
  config.password = password_;
  return config;
}

void Sentinel::start() {
  watch_ = std::make_unique<RedisLink>(loop_, sentinelConfig(sentinels_.front()), link_options_);
  watch_->resolveWith([this](const RedisLink::AddressCallback& done) {
    done(sentinels_[watch_next_++ % sentinels_.size()], "");
  });
  watch_->subscribe(std::string(kSwitchMasterChannel),
                    [this](std::string_view payload) { onSwitchMessage(payload); });
  watch_->start();
}

void Sentinel::resolve(RedisLink::AddressCallback done) {
  if (closing_) {
    done(std::nullopt, "sentinel: closing");
    return;
  }
  if (pending_) {
    retired_.retire(std::move(probe_));
    finishResolve(std::nullopt, "sentinel: superseded by a newer resolve");
  }
  retired_.freeClosed();
  if (announced_) {
    RedisAddress master = std::move(*announced_);
    announced_.reset();
    done(master, "");
    return;
  }
  pending_ = std::move(done);
  asked_ = 0;
  reasons_.clear();
  askNext();
}

void Sentinel::askNext() {
  if (asked_ == sentinels_.size()) {
    finishResolve(std::nullopt, "sentinel: no sentinel named the master " + master_name_ + " (" +
                                    reasons_ + ")");
    return;
  }
  size_t index = (first_ + asked_++) % sentinels_.size();
  const RedisAddress& sentinel = sentinels_[index];
  RedisLinkOptions options = link_options_;
  options.quiet = true;  // finishResolve's reason says it all, through the master link's log
  probe_ = std::make_unique<RedisLink>(loop_, sentinelConfig(sentinel), options);
  RedisLink* probe = probe_.get();
  probe->onConnected([this, probe, index, &sentinel] {
    bool sent = probe->command(
        {"SENTINEL", "get-master-addr-by-name", master_name_},
        [this, probe, index, &sentinel](const RedisResult& result) {
          if (probe != probe_.get()) return;  // superseded or closed
          if (result.status != RedisStatus::kOk) {
            probeFailed(sentinel, result.error);
            return;
          }
          const RedisReply& reply = *result.reply;
          if (reply.kind() == RedisReply::Kind::kNil) {
            probeFailed(sentinel, "does not know the master " + master_name_);
            return;
          }
          uint16_t port = 0;
          std::string_view port_text = reply.size() == 2 ? reply[1].str() : std::string_view();
          auto [end, error] =
              std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
          if (reply.kind() != RedisReply::Kind::kArray || reply.size() != 2 ||
              reply[0].str().empty() || error != std::errc() ||
              end != port_text.data() + port_text.size() || port == 0) {
            probeFailed(sentinel, "answered something else than [ip, port]");
            return;
          }
          first_ = index;
          finishResolve(RedisAddress{std::string(reply[0].str()), port}, "");
        },
        command_timeout_ms_);
    if (!sent) probeFailed(sentinel, "cannot send SENTINEL get-master-addr-by-name");
  });
  probe->onDisconnected([this, probe, &sentinel](std::string_view reason) {
    if (probe == probe_.get()) probeFailed(sentinel, reason);
  });
  probe->start();
}

void Sentinel::probeFailed(const RedisAddress& sentinel, std::string_view reason) {
  if (!reasons_.empty()) reasons_ += "; ";
  reasons_ += sentinel.text() + ": " + std::string(reason);
  retired_.retire(std::move(probe_));
  askNext();
}

void Sentinel::finishResolve(std::optional<RedisAddress> master, std::string_view reason) {
  if (probe_) retired_.retire(std::move(probe_));
  RedisLink::AddressCallback done = std::move(pending_);
  pending_ = nullptr;
  if (done) done(std::move(master), reason);
}

void Sentinel::onSwitchMessage(std::string_view payload) {
  // "<name> <old ip> <old port> <new ip> <new port>"
  std::vector<std::string_view> words;
  while (!payload.empty()) {
    size_t space = payload.find(' ');
    words.push_back(payload.substr(0, space));
    payload = space == std::string_view::npos ? std::string_view() : payload.substr(space + 1);
  }
  if (words.size() != 5 || words[0] != master_name_) return;
  uint16_t port = 0;
  auto [end, error] = std::from_chars(words[4].data(), words[4].data() + words[4].size(), port);
  if (error != std::errc() || end != words[4].data() + words[4].size() || port == 0) {
    spdlog::warn("sentinel: ignoring a malformed {} message", kSwitchMasterChannel);
    return;
  }
  RedisAddress master{std::string(words[3]), port};
  spdlog::warn("sentinel: {} moved from {}:{} to {}", master_name_, words[1], words[2],
               master.text());
  announced_ = master;
  if (on_switch_) on_switch_(master);
}

void Sentinel::onLinksDrained() {
  if (!closing_) return;
  closed_ = true;
  if (on_closed_) on_closed_();
}

void Sentinel::close(std::function<void()> on_closed) {
  if (closing_) {
    spdlog::critical("Sentinel::close() called twice");
    std::abort();
  }
  closing_ = true;
  on_closed_ = std::move(on_closed);
  if (pending_) finishResolve(std::nullopt, "sentinel: closed");
  retired_.retire(std::move(watch_));
  if (retired_.closing() == 0) onLinksDrained();
}

}  // namespace sluice

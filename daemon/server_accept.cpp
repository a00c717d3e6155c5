// Server: accepting connections on its listeners, and refusing those over
// max_connections or that [access] does not allow; see server.h.
#include "server.h"

#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <ctime>
#include <string>

#include <spdlog/spdlog.h>

namespace sluice {

namespace {

// How long accepting pauses when the process is out of file descriptors.
constexpr uint64_t kAcceptPauseMs = 100;
// A peer that [access] refuses is logged at most this often, so a client
// reconnecting in a loop cannot flood the log.
constexpr int64_t kForbiddenLogIntervalMs = 10'000;

}  // namespace

void Server::startAccepting() {
  uv_poll_start(&listener_, UV_READABLE, [](uv_poll_t* handle, int status, int) {
    auto* self = static_cast<Server*>(handle->data);
    if (status == 0) self->onAcceptable(self->listen_fd_, Protocol::kMsgpackRpc);
  });
  if (resp_fd_ >= 0) {
    uv_poll_start(&resp_listener_, UV_READABLE, [](uv_poll_t* handle, int status, int) {
      auto* self = static_cast<Server*>(handle->data);
      if (status == 0) self->onAcceptable(self->resp_fd_, Protocol::kResp);
    });
  }
  if (http_fd_ >= 0) {
    uv_poll_start(&http_listener_, UV_READABLE, [](uv_poll_t* handle, int status, int) {
      auto* self = static_cast<Server*>(handle->data);
      if (status == 0) self->onAcceptable(self->http_fd_, Protocol::kHttp);
    });
  }
}

void Server::onAcceptable(int listen_fd, Protocol protocol) {
  for (;;) {
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) {
        continue;
      }
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors or memory: the listener stays readable, so
        // polling on would spin. Pause accepting; clients wait in the backlog.
        spdlog::warn("accept: {}; pausing accepts for {} ms", std::strerror(errno),
                     kAcceptPauseMs);
        uv_poll_stop(&listener_);
        if (resp_fd_ >= 0) uv_poll_stop(&resp_listener_);
        if (http_fd_ >= 0) uv_poll_stop(&http_listener_);
        uv_timer_start(
            &accept_pause_,
            [](uv_timer_t* t) {
              auto* self = static_cast<Server*>(t->data);
              if (!self->stopping_) {
                self->startAccepting();
              }
            },
            kAcceptPauseMs, 0);
      } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
        spdlog::warn("accept: {}", std::strerror(errno));
      }
      return;
    }
    Worker* least = workers_.front().get();
    size_t open = 0;
    for (auto& worker : workers_) {
      open += worker->connections();
      if (worker->connections() < least->connections()) {
        least = worker.get();
      }
    }
    // Refused at once, so descriptors never run out; the client is told why.
    if (open >= config_.limits.max_connections) {
      refuse(fd, RefuseReason::kMaxConnections,
             fmt::format("the daemon holds its [limits] max_connections = {} connections; "
                         "retry later, or raise the limit",
                         config_.limits.max_connections),
             protocol);
      continue;
    }
    // A TCP peer has no credentials: [access] cannot apply (docs/resp.md,
    // docs/http.md). A peer it does not allow on a Unix [http] listener is
    // answered 403 to every request by its codec.
    const bool tcp = (protocol == Protocol::kResp && resp_unix_path_.empty()) ||
                     (protocol == Protocol::kHttp && http_unix_path_.empty());
    Peer peer;
    peer.allowed = true;
    if (!tcp) {
      peer = access_.admit(fd);
      if (!user_connections_.take(&peer)) {
        refuse(fd, RefuseReason::kMaxPerUser,
               fmt::format("uid {} holds its [access] max_connections_per_user = {} "
                           "connections; share a connection (requests pipeline on one), or "
                           "raise the limit",
                           peer.uid, config_.access.max_connections_per_user),
               protocol);
        continue;
      }
    }
    if (!peer.allowed) {
      metrics_.connectionsForbidden().add();
      logForbidden(peer);
      if (protocol == Protocol::kResp) {
        // A Redis client has no place for a per-request FORBIDDEN: say it
        // once and close.
        UserConnections::release(peer);
        std::string reply;
        resp::writeError(&reply, "FORBIDDEN this user may not use sluiced ([access])");
        (void)::send(fd, reply.data(), reply.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
        ::close(fd);
        continue;
      }
    }
    least->adopt(fd, peer, protocol);
  }
}

void Server::refuse(int fd, RefuseReason reason, std::string_view why, Protocol protocol) {
  // A fresh socket's send buffer is empty: the one small frame fits, and a
  // client that went away already costs nothing but the failed send.
  std::string notification;
  if (protocol == Protocol::kResp) {
    resp::writeError(&notification, "ERR max number of clients reached: " + std::string(why));
  } else if (protocol == Protocol::kHttp) {
    http::writeResponse(&notification, http::problem(503, why), "close",
                        http::imfDate(static_cast<int64_t>(std::time(nullptr))), true);
  } else {
    rpc::writeErrorNotification(&notification, rpc::ErrorCode::kOverloaded, why);
  }
  (void)::send(fd, notification.data(), notification.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  ::close(fd);
  metrics_.connectionsRefused(reason).add();
}

void Server::logForbidden(const Peer& peer) {
  auto now_ms = static_cast<int64_t>(uv_now(&loop_));
  if (forbidden_logged_ms_ >= 0 && now_ms - forbidden_logged_ms_ < kForbiddenLogIntervalMs) {
    return;
  }
  forbidden_logged_ms_ = now_ms;
  spdlog::warn("uid {} (pid {}) connected but [access] does not allow it: its requests are "
               "answered FORBIDDEN (logged at most every {} s; sluice_connections_forbidden_total "
               "counts them all)",
               peer.uid, peer.pid, kForbiddenLogIntervalMs / 1000);
}

}  // namespace sluice

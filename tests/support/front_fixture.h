// FrontTest: a fixture for the fronts' connection tests (http_front_test,
// resp_front_test): one real worker, serving the rules "local" and
// "global" (5 an hour each, on_redis_down = "open"; nobody answers the
// global one's leases), and clients on the far end of a socket pair or of
// a loopback TCP connection, whose near end the worker adopts as a
// connection of the protocol under test. Each test file keeps only its
// protocol's readers.
//
// The tests wait on conditions (test::waitFor, a client read timeout of
// 5 s), never on a fixed sleep; TearDown closes the clients, then stops and
// joins the worker. The worker's thread serves the connections; the test's
// thread is the clients'.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "clock.h"
#include "lease.h"
#include "test_status.h"
#include "test_support.h"
#include "worker.h"

namespace sluice::test {

inline constexpr int64_t kFrontMs = 1'000'000;  // ns in a ms

// A token bucket of 5 an hour named `name`.
inline Rule frontRule(uint32_t id, std::string name, Scope scope) {
  Rule rule;
  rule.id = id;
  rule.name = std::move(name);
  rule.scope = scope;
  rule.algorithm = Algorithm::kTokenBucket;
  rule.on_redis_down = RedisDownPolicy::kOpen;
  rule.limits = {Limit{.limit = 5, .period_ns = 3'600'000 * kFrontMs, .burst = 5}};
  return rule;
}

// The rules every front test starts with: "local" (id 1) and "global" (id 2).
inline std::vector<Rule> frontRules() {
  return {frontRule(1, "local", Scope::kLocal), frontRule(2, "global", Scope::kGlobal)};
}

class FrontTest : public ::testing::Test {
 protected:
  explicit FrontTest(Protocol protocol) : protocol_(protocol) {}

  // Starts the worker on `rules`; `throttle_rules` serves CL.THROTTLE (RESP).
  void start(WorkerOptions options, RespFront::EnsureRule throttle_rules = {},
             std::vector<Rule> rules = frontRules()) {
    broker_.setBreaker(Breaker::kClosed, monotonicNowNs());
    worker_ = std::make_unique<Worker>(0, options, keys_, metrics_.shard(0), status_,
                                       std::make_shared<const RuleSet>(std::move(rules), 1),
                                       &broker_, std::move(throttle_rules));
    worker_->start();
  }

  // A new client on a socket pair; `allowed`: whether [access] allows it;
  // `server_send_bytes` > 0 shrinks the daemon's send buffer (and the
  // client's receive buffer).
  int connect(bool allowed = true, int server_send_bytes = 0) {
    int pair[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
    if (server_send_bytes > 0) {
      setsockopt(pair[1], SOL_SOCKET, SO_SNDBUF, &server_send_bytes, sizeof(server_send_bytes));
      setsockopt(pair[0], SOL_SOCKET, SO_RCVBUF, &server_send_bytes, sizeof(server_send_bytes));
    }
    return adopt(pair[0], pair[1], allowed);
  }

  // A new client over loopback TCP, as the [http] and [resp] listeners
  // accept them (no peer credentials: allowed). `buffer_bytes` > 0 shrinks
  // the client's send buffer and the daemon's receive buffer, so that what
  // the client sends beyond them waits for the daemon to read it.
  int connectTcp(int buffer_bytes = 0) {
    int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (buffer_bytes > 0) {
      // Before listen() and connect(): the accepted socket inherits the
      // listener's, and the window is small from the start.
      setsockopt(listener, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof(buffer_bytes));
      setsockopt(client, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof(buffer_bytes));
    }
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof(address);
    EXPECT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), size), 0);
    EXPECT_EQ(::listen(listener, 1), 0);
    EXPECT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &size), 0);
    EXPECT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&address), size), 0);
    int served = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    EXPECT_GE(served, 0);
    ::close(listener);
    return adopt(client, served, true);
  }

  static void send(int fd, const std::string& bytes) {
    ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }

  // Sends all of `bytes`, blocking while the daemon does not read, until
  // an error (errno says which; the send timeout is 5 s); how many were
  // sent.
  static size_t sendAll(int fd, const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    return sent;
  }

  // Everything the daemon writes until the end of the stream (or an
  // error, or the read timeout).
  static std::string readAll(int fd) {
    std::string out;
    char buffer[4096];
    for (;;) {
      ssize_t n = ::read(fd, buffer, sizeof(buffer));
      if (n <= 0) break;
      out.append(buffer, static_cast<size_t>(n));
    }
    return out;
  }

  // How the stream ends after what the daemon writes: 0 for an orderly end
  // (the daemon closed or shut its sending side), else the read's errno
  // (ECONNRESET: the daemon reset it; EAGAIN: the read timed out).
  static int readToEnd(int fd) {
    char buffer[4096];
    for (;;) {
      ssize_t n = ::read(fd, buffer, sizeof(buffer));
      if (n == 0) return 0;
      if (n < 0) return errno;
    }
  }

  // Whether the daemon closes the connection within the read timeout.
  static bool closedByDaemon(int fd) {
    int end = readToEnd(fd);
    return end == 0 || end == ECONNRESET;
  }

  // Reloads: the worker decides later questions on `rules` alone.
  void reload(std::vector<Rule> rules) {
    worker_->setRules(std::make_shared<const RuleSet>(std::move(rules), 1));
  }

  // Decisions allowed and denied so far, of every mode.
  uint64_t decided() {
    uint64_t total = 0;
    for (const Counter& counter : metrics_.shard(0).allowed) total += counter.get();
    for (const Counter& counter : metrics_.shard(0).denied) total += counter.get();
    return total;
  }

  uint64_t closed(CloseReason reason) {
    return metrics_.shard(0).connections_closed[static_cast<size_t>(reason)].get();
  }

  void TearDown() override {
    for (int fd : clients_) ::close(fd);
    if (worker_) {
      worker_->stop();
      worker_->join();
    }
  }

  KeyTable keys_{KeyTableOptions{}};
  Metrics metrics_{1};
  TestStatus status_{metrics_, 1};
  LeaseBroker broker_{100 * kFrontMs};
  std::unique_ptr<Worker> worker_;
  std::vector<int> clients_;

 private:
  // Hands `served` to the worker and keeps `client`, with a read timeout.
  int adopt(int client, int served, bool allowed) {
    timeval timeout{.tv_sec = 5, .tv_usec = 0};
    setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    setsockopt(client, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    Peer peer;
    peer.allowed = allowed;
    worker_->adopt(served, peer, protocol_);
    clients_.push_back(client);
    return client;
  }

  Protocol protocol_;
};

}  // namespace sluice::test

// RedisServer: a real redis-server process for one test, on a free loopback
// port with its own temporary directory, killed and removed when the fixture
// ends. Tests that involve Redis use this, never a shared server.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "test_support.h"

namespace sluice::test {

class RedisServer {
 public:
  // Starts redis-server (REDIS_SERVER or /usr/bin/redis-server) with DEBUG
  // enabled for local connections and no persistence, plus `extra_args`
  // ("--requirepass", "secret", ...). Throws std::runtime_error when it does
  // not answer PING within 10 s.
  explicit RedisServer(std::vector<std::string> extra_args = {});
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  const std::string& host() const { return host_; }
  std::string url() const { return "redis://" + host_ + ":" + std::to_string(port_); }
  pid_t pid() const { return child_ ? child_->pid() : -1; }

  // Process control for fault tests.
  void kill();              // SIGKILL, and wait for it to die
  void stop();              // SIGSTOP: the server hangs, connections stay open
  void resume();            // SIGCONT
  void restart();           // start again on the same port (data is gone)

  // Runs a command with redis-cli and returns its output without the
  // trailing newline (for set-up and checks; not for the code under test).
  std::string cli(const std::vector<std::string>& args) const;

 private:
  // Starts redis-server on port_; a first start that finds the port taken
  // moves to another (may_move), a restart must not.
  void start(bool may_move);

  TempDir dir_;
  std::string host_ = "127.0.0.1";
  int port_ = 0;
  std::vector<std::string> extra_args_;
  std::unique_ptr<Child> child_;
};

// A loopback TCP port that nothing listens on at the moment of the call.
int freeLoopbackPort();

}  // namespace sluice::test

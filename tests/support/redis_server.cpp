// RedisServer: real redis-server processes for tests.
#include "redis_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <stdexcept>

namespace sluice::test {

int freeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;  // the kernel picks a free one
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    throw std::runtime_error("cannot find a free loopback port");
  }
  close(fd);
  return ntohs(addr.sin_port);
}

RedisServer::RedisServer(std::vector<std::string> extra_args) : extra_args_(std::move(extra_args)) {
  port_ = freeLoopbackPort();
  start(true);
}

RedisServer::~RedisServer() = default;  // Child kills and reaps

void RedisServer::start(bool may_move) {
  // The port was free when picked, but another test process may have
  // picked it too: then one redis-server cannot bind it and exits, and the
  // other's would answer this fixture's PINGs. Only this server's own log
  // saying it is ready proves the port is its own; a first start that lost
  // the race tries another port.
  for (int attempt = 1;; ++attempt) {
    std::vector<std::string> argv = {
        env("REDIS_SERVER", "/usr/bin/redis-server"),
        "--port", std::to_string(port_),
        "--bind", host_,
        "--dir", dir_.path(),
        "--save", "",
        "--appendonly", "no",
        "--enable-debug-command", "local",
        "--daemonize", "no",
        "--logfile", dir_.file("redis.log"),
    };
    argv.insert(argv.end(), extra_args_.begin(), extra_args_.end());
    ::unlink(dir_.file("redis.log").c_str());
    child_ = std::make_unique<Child>(argv);
    bool ready = waitFor(10'000, [&] {
      return !child_->running() ||
             readFile(dir_.file("redis.log")).find("Ready to accept connections") != std::string::npos;
    });
    if (ready && child_->running()) {
      std::vector<std::string> ping = {"PING"};
      bool up = waitFor(10'000, [&] {
        std::string answer = cli(ping);
        return answer.find("PONG") != std::string::npos || answer.find("NOAUTH") != std::string::npos;
      });
      if (up) return;
    }
    if (!may_move || attempt == 5 || child_->running()) {
      throw std::runtime_error("redis-server did not start on port " + std::to_string(port_) +
                               ": " + readFile(dir_.file("redis.log")));
    }
    port_ = freeLoopbackPort();
  }
}

void RedisServer::kill() {
  if (child_) {
    child_->signal(SIGKILL);
    child_->wait(10'000);
  }
}

void RedisServer::stop() {
  if (child_) child_->signal(SIGSTOP);
}

void RedisServer::resume() {
  if (child_) child_->signal(SIGCONT);
}

void RedisServer::restart() {
  kill();
  child_.reset();
  start(false);
}

std::string RedisServer::cli(const std::vector<std::string>& args) const {
  std::string command = "redis-cli -h " + host_ + " -p " + std::to_string(port_);
  for (const std::string& arg : args) {
    command += " '";
    for (char c : arg) {
      if (c == '\'') {
        command += "'\\''";
      } else {
        command += c;
      }
    }
    command += "'";
  }
  command += " 2>&1";
  std::string output;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return output;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  pclose(pipe);
  while (!output.empty() && output.back() == '\n') output.pop_back();
  return output;
}

}  // namespace sluice::test

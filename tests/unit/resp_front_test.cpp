// The Redis protocol front (resp_front.h) on a real loopback socket, with a
// fake worker: replies go out in request order however the answers come
// back, and a reply that needs no answer waits behind one that does.
#include "resp_front.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

namespace sluice {
namespace {

// What the fake worker was asked, in order.
struct Asked {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::pair<std::string, MsgId>> keys;  // (key, tag)
  Recipient* recipient = nullptr;
};

int freePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t size = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size);
  close(fd);
  return ntohs(address.sin_port);
}

int connectTo(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  timeval timeout{.tv_sec = 5, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  return fd;
}

// Reads until `expected` bytes have come (or the read times out).
std::string readBytes(int fd, size_t expected) {
  std::string out;
  char buffer[4096];
  while (out.size() < expected) {
    ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n <= 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  return out;
}

Answer allowedWith(int64_t remaining) {
  Answer answer;
  answer.decide(Decision{.allowed = true, .remaining = remaining, .limit = 9}, Mode::kLocal);
  return answer;
}

TEST(RespFrontTest, RepliesGoOutInRequestOrderWhateverOrderAnswersComeIn) {
  Asked asked;
  RespFront front;
  RespFront::Options options;
  const int port = freePort();
  options.listen = "127.0.0.1:" + std::to_string(port);
  auto submit = [&](size_t, HeldQuestion question, Recipient* recipient, MsgId tag) {
    std::lock_guard<std::mutex> lock(asked.mutex);
    asked.keys.emplace_back(std::string(question.question().items[0].key), tag);
    asked.recipient = recipient;
    asked.changed.notify_all();
  };
  std::string error;
  ASSERT_TRUE(front.start(options, 2, submit, nullptr, nullptr, &error)) << error;
  int fd = connectTo(port);
  const std::string pipeline =
      "*3\r\n$14\r\nSLUICE.ACQUIRE\r\n$3\r\napi\r\n$1\r\na\r\n"
      "PING\r\n"
      "*3\r\n$14\r\nSLUICE.ACQUIRE\r\n$3\r\napi\r\n$1\r\nb\r\n"
      "ECHO last\r\n";
  ASSERT_EQ(write(fd, pipeline.data(), pipeline.size()), static_cast<ssize_t>(pipeline.size()));
  {
    std::unique_lock<std::mutex> lock(asked.mutex);
    ASSERT_TRUE(asked.changed.wait_for(lock, std::chrono::seconds(5),
                                       [&] { return asked.keys.size() == 2; }));
  }
  // Nothing may be written before the first question is answered.
  timeval short_wait{.tv_sec = 0, .tv_usec = 100'000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &short_wait, sizeof(short_wait));
  char probe = 0;
  EXPECT_LT(read(fd, &probe, 1), 0) << "a reply went out ahead of its turn";
  timeval long_wait{.tv_sec = 5, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &long_wait, sizeof(long_wait));
  // The answers come back in reverse order, as a waiting question's would.
  asked.recipient->receive(asked.keys[1].second, allowedWith(2));
  asked.recipient->receive(asked.keys[0].second, allowedWith(1));
  const std::string expected =
      "*6\r\n:1\r\n:1\r\n:9\r\n:0\r\n:0\r\n$5\r\nlocal\r\n"
      "+PONG\r\n"
      "*6\r\n:1\r\n:2\r\n:9\r\n:0\r\n:0\r\n$5\r\nlocal\r\n"
      "$4\r\nlast\r\n";
  EXPECT_EQ(readBytes(fd, expected.size()), expected);
  EXPECT_EQ(asked.keys[0].first, "a");
  EXPECT_EQ(asked.keys[1].first, "b");
  close(fd);
  front.stop();
}

}  // namespace
}  // namespace sluice

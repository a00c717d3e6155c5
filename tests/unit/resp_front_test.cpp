// The Redis protocol front (resp_front.h) on a real worker: a client on one
// end of a socket pair, the worker's Connection with a RespCodec on the
// other. Replies go in request order however long a question waits; the
// main socket's bounds (frame and argument limits, the output cap, idle and
// partial-frame timeouts) close RESP connections too; CL.THROTTLE's rule is
// decided on the worker that asked for it at once; a closing connection
// lingers, so a client still sending reads its error; a reload that
// removes the rule of a waiting call answers -OVERLOADED. The fixture
// (front_fixture.h) waits on conditions (test::waitFor, a read timeout),
// never on a fixed sleep, and ends by stopping and joining the worker.
#include "resp_front.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "front_fixture.h"

namespace sluice {
namespace {

using test::kFrontMs;

// One worker serving RESP clients.
class RespConnectionTest : public test::FrontTest {
 protected:
  RespConnectionTest() : FrontTest(Protocol::kResp) {}

  // Reads until the bytes end with `last` or the connection ends.
  static std::string readUntil(int fd, const std::string& last) {
    std::string out;
    char buffer[4096];
    while (out.size() < last.size() || out.compare(out.size() - last.size(), last.size(), last)) {
      ssize_t n = ::read(fd, buffer, sizeof(buffer));
      if (n <= 0) break;
      out.append(buffer, static_cast<size_t>(n));
    }
    return out;
  }
};

std::string command(const std::vector<std::string>& words) {
  std::string out = "*" + std::to_string(words.size()) + "\r\n";
  for (const std::string& word : words) {
    out += "$" + std::to_string(word.size()) + "\r\n" + word + "\r\n";
  }
  return out;
}

TEST_F(RespConnectionTest, RepliesBehindAQuestionThatWaitsGoOutAfterItsAnswer) {
  WorkerOptions options;
  options.lease_timeout_ms = 200;  // nobody answers the lease: the policy does
  start(options);
  int client = connect();
  // One write: a cold global key waits for its first lease; the commands
  // behind it wait with it.
  send(client, command({"SLUICE.ACQUIRE", "global", "cold"}) + command({"PING"}) +
                   command({"SLUICE.ACQUIRE", "local", "k"}) + command({"ECHO", "last"}));
  std::string replies = readUntil(client, "$4\r\nlast\r\n");
  // The global acquire's answer (by on_redis_down = "open"), then the rest in order.
  const size_t waited = replies.find("$4\r\nopen\r\n");
  const size_t pong = replies.find("+PONG\r\n");
  const size_t local = replies.find("$5\r\nlocal\r\n");
  ASSERT_NE(waited, std::string::npos) << replies;
  EXPECT_EQ(replies.rfind("*6\r\n:1\r\n", 0), 0u) << replies;
  EXPECT_LT(waited, pong) << replies;
  EXPECT_LT(pong, local) << replies;
  EXPECT_TRUE(replies.ends_with("$4\r\nlast\r\n")) << replies;
}

TEST_F(RespConnectionTest, ThrottleRuleIsDecidedOnTheWorkerThatAddedItAtOnce) {
  std::atomic<int> ensured{0};
  start(WorkerOptions{}, [&](const resp::Throttle& throttle, std::string* error) -> RuleSetPtr {
    if (throttle.max_burst == 99) {
      *error = "no more parameter sets";
      return nullptr;
    }
    ++ensured;
    Rule rule;
    rule.id = 7;
    rule.name = resp::throttleRuleName(throttle);
    rule.algorithm = Algorithm::kGcra;
    rule.limits = {Limit{.limit = throttle.count,
                         .period_ns = throttle.period_s * 1000 * kFrontMs,
                         .burst = throttle.max_burst + 1}};
    std::vector<Rule> rules = test::frontRules();
    rules.push_back(rule);
    return std::make_shared<const RuleSet>(std::move(rules), 1);
  });
  int client = connect();
  send(client, command({"CL.THROTTLE", "u", "1", "10", "60"}) +
                   command({"CL.THROTTLE", "u", "1", "10", "60"}) +
                   command({"CL.THROTTLE", "u", "1", "10", "60"}) +
                   command({"CL.THROTTLE", "u", "99", "10", "60"}) + command({"ECHO", "end"}));
  std::string replies = readUntil(client, "$3\r\nend\r\n");
  // max_burst 1: two pass, the third is limited; one rule for the three.
  EXPECT_EQ(replies.rfind("*5\r\n:0\r\n:2\r\n:1\r\n:-1\r\n", 0), 0u) << replies;
  EXPECT_NE(replies.find("*5\r\n:0\r\n:2\r\n:0\r\n:-1\r\n"), std::string::npos) << replies;
  // Limited: one unit comes back every 60 s / 10.
  EXPECT_NE(replies.find("*5\r\n:1\r\n:2\r\n:0\r\n:6\r\n"), std::string::npos) << replies;
  EXPECT_NE(replies.find("-ERR no more parameter sets\r\n$3\r\nend\r\n"), std::string::npos)
      << replies;
  EXPECT_EQ(ensured.load(), 1);
}

TEST_F(RespConnectionTest, CommandWithTooManyArgumentsIsAnsweredAndClosed) {
  WorkerOptions options;
  options.resp.max_arguments = 4;
  start(options);
  int client = connect();
  send(client, command({"PING"}) + command({"ECHO", "a", "b", "c", "d"}) + command({"PING"}));
  std::string replies = readUntil(client, "(none)");
  EXPECT_EQ(replies, "+PONG\r\n-ERR Protocol error: too many arguments (at most 4)\r\n");
  ::shutdown(client, SHUT_WR);
  EXPECT_TRUE(test::waitFor(5'000, [&] { return closed(CloseReason::kUnreadable) == 1; }));
}

TEST_F(RespConnectionTest, CommandOverTheFrameLimitIsAnsweredAndClosed) {
  WorkerOptions options;
  options.resp.max_command_bytes = 1024;
  start(options);
  int client = connect();
  send(client, command({"ECHO", std::string(2000, 'x')}));
  std::string replies = readUntil(client, "(none)");
  EXPECT_TRUE(replies.starts_with("-ERR Protocol error: invalid bulk length")) << replies;
  ::shutdown(client, SHUT_WR);
  EXPECT_TRUE(test::waitFor(5'000, [&] { return closed(CloseReason::kUnreadable) == 1; }));
}

TEST_F(RespConnectionTest, MalformedCommandIsAnsweredWhileItsClientIsStillSending) {
  WorkerOptions options;
  options.resp.max_arguments = 4;
  start(options);
  int client = connectTcp(16 * 1024);
  send(client, command({"ECHO", "a", "b", "c", "d"}));
  // The daemon refuses the first command; the client is still sending: a
  // daemon that closed now would reset the connection, failing this send
  // and discarding the error.
  const std::string rest = std::string(200'000, 'x');
  EXPECT_EQ(sendAll(client, rest), rest.size()) << std::strerror(errno);
  const std::string error = "-ERR Protocol error: too many arguments (at most 4)\r\n";
  EXPECT_EQ(readUntil(client, error), error);
  EXPECT_EQ(readToEnd(client), 0);  // an orderly end, no reset
  ::shutdown(client, SHUT_WR);
  EXPECT_TRUE(test::waitFor(5'000, [&] { return closed(CloseReason::kUnreadable) == 1; }));
}

TEST_F(RespConnectionTest, AcquireWaitingForALeaseWhenAReloadRemovesItsRuleIsOverloaded) {
  WorkerOptions options;
  options.lease_timeout_ms = 300;  // nobody answers the lease
  start(options);
  int client = connect();
  send(client, command({"SLUICE.ACQUIRE", "global", "cold"}));
  ASSERT_TRUE(test::waitFor(5'000, [&] { return metrics_.shard(0).lease_deferred.get() == 1; }));
  reload({test::frontRule(1, "local", Scope::kLocal)});
  EXPECT_EQ(readUntil(client, "\r\n").rfind("-OVERLOADED rule \"global\" was removed by a reload", 0),
            0u);
}

TEST_F(RespConnectionTest, ClientThatDoesNotReadItsRepliesIsClosedAtTheOutputCap) {
  WorkerOptions options;
  options.max_output_bytes = 16 * 1024;
  start(options);
  int client = connect(/*allowed=*/true, 4096);
  std::string batch;
  for (int i = 0; i < 64; ++i) batch += command({"ECHO", std::string(1000, 'x')});
  // The daemon closes mid-batch: the rest of the write may fail.
  (void)::send(client, batch.data(), batch.size(), MSG_NOSIGNAL);
  EXPECT_TRUE(test::waitFor(5'000, [&] { return closed(CloseReason::kOutputCap) == 1; }));
}

TEST_F(RespConnectionTest, HalfSentCommandIsClosedAtThePartialFrameTimeout) {
  WorkerOptions options;
  options.partial_frame_timeout_ms = 100;
  start(options);
  int client = connect();
  send(client, "*1\r\n$4\r\nPI");
  EXPECT_TRUE(closedByDaemon(client));
  EXPECT_EQ(closed(CloseReason::kPartialFrame), 1u);
  EXPECT_EQ(closed(CloseReason::kIdle), 0u);
}

TEST_F(RespConnectionTest, SilentClientIsClosedAtTheIdleTimeout) {
  WorkerOptions options;
  options.idle_timeout_ms = 100;
  start(options);
  int client = connect();
  send(client, command({"PING"}));
  EXPECT_EQ(readUntil(client, "+PONG\r\n"), "+PONG\r\n");
  EXPECT_TRUE(closedByDaemon(client));
  EXPECT_EQ(closed(CloseReason::kIdle), 1u);
}

TEST_F(RespConnectionTest, QuitIsAnsweredThenTheConnectionCloses) {
  start(WorkerOptions{});
  int client = connect();
  send(client, command({"QUIT"}) + command({"PING"}));
  EXPECT_EQ(readUntil(client, "(none)"), "+OK\r\n");
  ::shutdown(client, SHUT_WR);
  EXPECT_TRUE(test::waitFor(5'000, [&] { return closed(CloseReason::kPeerClosed) == 1; }));
}

}  // namespace
}  // namespace sluice

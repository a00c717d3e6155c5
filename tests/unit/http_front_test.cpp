// The HTTP check front (http_front.h) on a real worker: a client on one end
// of a socket pair, the worker's Connection with an HttpCodec on the other.
// Keep-alive and pipelined requests are answered in request order however
// long a question waits; Connection: close and HTTP/1.0 close after their
// answer; a request the parser refuses is answered with its problem and
// closed; the main socket's bounds (request size, idle and partial-request
// timeouts) close HTTP connections too; [access] answers 403. A closing
// connection lingers, so a client still sending reads its answer; a
// reload that removes the rule of a waiting check answers 503 (or the
// decision already made). The fixture (front_fixture.h) waits on
// conditions (test::waitFor, a read timeout), never on a fixed sleep, and
// ends by stopping and joining the worker.
#include "http_front.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "front_fixture.h"

namespace sluice {
namespace {

// One worker serving HTTP clients.
class HttpConnectionTest : public test::FrontTest {
 protected:
  HttpConnectionTest() : FrontTest(Protocol::kHttp) {}

  // Reads an interim (1xx) response, which has no body, and no more.
  static std::string readInterim(int fd) {
    std::string interim;
    char byte = 0;
    while (!interim.ends_with("\r\n\r\n") && ::read(fd, &byte, 1) == 1) interim += byte;
    return interim;
  }

  // Reads `count` whole responses (each "Content-Length: N" head and body).
  static std::vector<std::string> readResponses(int fd, size_t count) {
    std::vector<std::string> responses;
    std::string buffer;
    char chunk[4096];
    while (responses.size() < count) {
      size_t head_end = buffer.find("\r\n\r\n");
      if (head_end != std::string::npos) {
        size_t length_at = buffer.find("Content-Length: ");
        size_t length = std::stoul(buffer.substr(length_at + 16));
        if (buffer.size() >= head_end + 4 + length) {
          responses.push_back(buffer.substr(0, head_end + 4 + length));
          buffer.erase(0, head_end + 4 + length);
          continue;
        }
      }
      ssize_t n = ::read(fd, chunk, sizeof(chunk));
      if (n <= 0) break;
      buffer.append(chunk, static_cast<size_t>(n));
    }
    return responses;
  }
};

std::string get(const std::string& target, const std::string& extra = "") {
  return "GET " + target + " HTTP/1.1\r\nHost: sluice\r\n" + extra + "\r\n";
}

std::string statusLine(const std::string& response) {
  return response.substr(0, response.find("\r\n"));
}

TEST_F(HttpConnectionTest, PipelinedRequestsAreAnsweredInOrderBehindOneThatWaits) {
  WorkerOptions options;
  options.lease_timeout_ms = 200;  // nobody answers the lease: the policy does
  start(options);
  int client = connect();
  // One write: a cold global key waits for its first lease; the requests
  // behind it wait with it.
  send(client, get("/v1/check?rule=global&key=cold") + get("/v1/check?rule=local&key=a") +
                   get("/v1/nothing") + get("/v1/peek?rule=local&key=a"));
  std::vector<std::string> responses = readResponses(client, 4);
  ASSERT_EQ(responses.size(), 4u);
  EXPECT_EQ(statusLine(responses[0]), "HTTP/1.1 200 OK");
  EXPECT_NE(responses[0].find("Sluice-Mode: open\r\n"), std::string::npos) << responses[0];
  EXPECT_NE(responses[1].find("RateLimit: \"local\";r=4;"), std::string::npos) << responses[1];
  EXPECT_EQ(statusLine(responses[2]), "HTTP/1.1 404 Not Found");
  EXPECT_NE(responses[3].find("RateLimit: \"local\";r=4;"), std::string::npos) << responses[3];
  // Keep-alive: nothing says close, and the connection answers again.
  EXPECT_EQ(responses[0].find("Connection:"), std::string::npos);
  send(client, get("/v1/check?rule=local&key=a"));
  EXPECT_NE(readResponses(client, 1).at(0).find("\"local\";r=3;"), std::string::npos);
}

TEST_F(HttpConnectionTest, ConnectionCloseIsAnsweredThenTheRestIsNotRead) {
  start(WorkerOptions{});
  int client = connect();
  send(client, get("/v1/check?rule=local&key=c", "Connection: close\r\n") +
                   get("/v1/check?rule=local&key=c"));
  std::string all = readAll(client);
  EXPECT_EQ(statusLine(all), "HTTP/1.1 200 OK");
  EXPECT_NE(all.find("Connection: close\r\n"), std::string::npos) << all;
  // One answer only: the second request was never asked.
  EXPECT_EQ(all.find("HTTP/1.1", 1), std::string::npos) << all;
  EXPECT_NE(all.find("\"local\";r=4;"), std::string::npos) << all;
  ::shutdown(client, SHUT_WR);  // done sending: the daemon stops lingering
  EXPECT_TRUE(test::waitFor(5'000, [&] { return closed(CloseReason::kPeerClosed) == 1; }));
}

TEST_F(HttpConnectionTest, Http10ClosesUnlessItAsksForKeepAlive) {
  start(WorkerOptions{});
  int kept = connect();
  send(kept, "GET /v1/check?rule=local&key=k HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
  std::vector<std::string> first = readResponses(kept, 1);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_NE(first[0].find("Connection: Keep-Alive\r\n"), std::string::npos) << first[0];
  send(kept, "GET /v1/check?rule=local&key=k HTTP/1.0\r\n\r\n");
  std::string last = readAll(kept);
  EXPECT_NE(last.find("Connection: close\r\n"), std::string::npos) << last;
  EXPECT_NE(last.find("\"local\";r=3;"), std::string::npos) << last;
}

TEST_F(HttpConnectionTest, MalformedRequestIsAnsweredWithItsProblemAndClosed) {
  start(WorkerOptions{});
  int client = connect();
  send(client, get("/v1/check?rule=local&key=m") + "GET /v1/check HTTP/1.1\r\nBad Name: x\r\n\r\n" +
                   get("/v1/check?rule=local&key=m"));
  std::string all = readAll(client);
  const size_t second = all.find("HTTP/1.1 400 Bad Request\r\nDate: ");
  ASSERT_NE(second, std::string::npos) << all;
  EXPECT_NE(all.find("GMT\r\nConnection: close\r\nContent-Type: application/problem+json\r\n",
                     second),
            std::string::npos)
      << all;
  EXPECT_EQ(statusLine(all), "HTTP/1.1 200 OK");
  EXPECT_NE(all.find("\"detail\":\"a header line must be NAME: VALUE", second), std::string::npos);
  EXPECT_EQ(all.find("HTTP/1.1", second + 1), std::string::npos) << all;
  ::shutdown(client, SHUT_WR);
  EXPECT_TRUE(test::waitFor(5'000, [&] { return closed(CloseReason::kUnreadable) == 1; }));
}

TEST_F(HttpConnectionTest, RequestOverTheFrameLimitIsRefusedWith413Or431) {
  WorkerOptions options;
  options.http.limits.max_request_bytes = 1024;
  start(options);
  int body = connect();
  send(body, "POST /v1/check?rule=local&key=b HTTP/1.1\r\nHost: s\r\nContent-Length: 5000\r\n\r\n");
  EXPECT_EQ(statusLine(readAll(body)), "HTTP/1.1 413 Content Too Large");
  int head = connect();
  send(head, get("/v1/check?rule=local&key=h", "X-Long: " + std::string(2000, 'x') + "\r\n"));
  EXPECT_EQ(statusLine(readAll(head)), "HTTP/1.1 431 Request Header Fields Too Large");
  ::shutdown(body, SHUT_WR);
  ::shutdown(head, SHUT_WR);
  EXPECT_TRUE(test::waitFor(5'000, [&] { return closed(CloseReason::kUnreadable) == 2; }));
}

TEST_F(HttpConnectionTest, BodyWithinTheBoundIsReadAndIgnoredEvenWhenItTrickles) {
  start(WorkerOptions{});
  int client = connect();
  send(client, "POST /v1/check?rule=local&key=t HTTP/1.1\r\nHost: s\r\nContent-Length: 10\r\n\r\n01234");
  send(client, "56789" + get("/v1/check?rule=local&key=t"));
  std::vector<std::string> responses = readResponses(client, 2);
  ASSERT_EQ(responses.size(), 2u);
  EXPECT_NE(responses[0].find("\"local\";r=4;"), std::string::npos) << responses[0];
  EXPECT_NE(responses[1].find("\"local\";r=3;"), std::string::npos) << responses[1];
}

TEST_F(HttpConnectionTest, ClientThatExpects100ContinueGetsItBeforeItsBody) {
  start(WorkerOptions{});
  int client = connect();
  send(client, "POST /v1/check?rule=local&key=e HTTP/1.1\r\nHost: s\r\n"
               "Expect: 100-continue\r\nContent-Length: 4\r\n\r\n");
  EXPECT_EQ(readInterim(client), "HTTP/1.1 100 Continue\r\n\r\n");
  send(client, "body");
  std::vector<std::string> responses = readResponses(client, 1);
  ASSERT_EQ(responses.size(), 1u);
  EXPECT_EQ(statusLine(responses[0]), "HTTP/1.1 200 OK");
  EXPECT_NE(responses[0].find("\"local\";r=4;"), std::string::npos) << responses[0];
}

TEST_F(HttpConnectionTest, ClientWhoseHeadArrivesInPiecesGets100ContinueBeforeItsBody) {
  start(WorkerOptions{});
  int client = connect();
  // The first piece is read with a whole request before it, which is
  // answered: the rest of the head comes in a read of its own.
  send(client, get("/v1/check?rule=local&key=p") +
                   "POST /v1/check?rule=local&key=p HTTP/1.1\r\nHost: s\r\n");
  ASSERT_EQ(readResponses(client, 1).size(), 1u);
  send(client, "Expect: 100-continue\r\nContent-");
  send(client, "Length: 4\r\n\r\n");
  EXPECT_EQ(readInterim(client), "HTTP/1.1 100 Continue\r\n\r\n");
  send(client, "body");
  std::vector<std::string> responses = readResponses(client, 1);
  ASSERT_EQ(responses.size(), 1u);
  EXPECT_EQ(statusLine(responses[0]), "HTTP/1.1 200 OK");
  EXPECT_NE(responses[0].find("\"local\";r=3;"), std::string::npos) << responses[0];
}

TEST_F(HttpConnectionTest, RefusedRequestIsAnsweredWhileItsClientIsStillSendingItsBody) {
  WorkerOptions options;
  options.http.limits.max_request_bytes = 1024;
  start(options);
  int client = connectTcp(16 * 1024);
  const std::string body(200'000, 'b');
  send(client, "POST /v1/check?rule=local&key=l HTTP/1.1\r\nHost: s\r\n"
               "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n");
  // Refused at its head, the request's body is still coming: a daemon that
  // closed now would reset the connection, failing this send and
  // discarding the answer.
  EXPECT_EQ(sendAll(client, body), body.size()) << std::strerror(errno);
  std::vector<std::string> responses = readResponses(client, 1);
  ASSERT_EQ(responses.size(), 1u);
  EXPECT_EQ(statusLine(responses[0]), "HTTP/1.1 413 Content Too Large");
  EXPECT_NE(responses[0].find("\"status\":413"), std::string::npos) << responses[0];
  EXPECT_EQ(readToEnd(client), 0);  // an orderly end, no reset
  EXPECT_EQ(closed(CloseReason::kUnreadable), 0u);  // lingering, until the client ends
  ::shutdown(client, SHUT_WR);
  EXPECT_TRUE(test::waitFor(5'000, [&] { return closed(CloseReason::kUnreadable) == 1; }));
}

TEST_F(HttpConnectionTest, LingeringEndsAtItsTimeBoundForAClientThatNeverCloses) {
  WorkerOptions options;
  options.linger_ms = 100;
  start(options);
  int client = connect();
  send(client, "BAD\r\n\r\n");
  EXPECT_EQ(statusLine(readAll(client)), "HTTP/1.1 400 Bad Request");
  EXPECT_TRUE(test::waitFor(5'000, [&] { return closed(CloseReason::kUnreadable) == 1; }));
}

TEST_F(HttpConnectionTest, LingeringEndsAtItsByteBoundForAClientThatSendsOn) {
  WorkerOptions options;
  options.linger_max_bytes = 1000;
  start(options);
  int client = connect();
  send(client, "BAD\r\n\r\n");
  EXPECT_EQ(statusLine(readAll(client)), "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(closed(CloseReason::kUnreadable), 0u);
  send(client, std::string(2000, 'x'));
  EXPECT_TRUE(test::waitFor(5'000, [&] { return closed(CloseReason::kUnreadable) == 1; }));
}

TEST_F(HttpConnectionTest, StoppingWorkerClosesALingeringConnectionAtOnce) {
  start(WorkerOptions{});
  int client = connect();
  send(client, "BAD\r\n\r\n");
  EXPECT_EQ(statusLine(readAll(client)), "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(closed(CloseReason::kUnreadable), 0u);  // lingering: the client has not closed
  worker_->stop();
  worker_->join();
  // Closed for its own reason, not cut off at the shutdown timeout.
  EXPECT_EQ(closed(CloseReason::kUnreadable), 1u);
  EXPECT_EQ(closed(CloseReason::kShutdown), 0u);
  worker_.reset();
}

TEST_F(HttpConnectionTest, CheckWaitingForALeaseWhenAReloadRemovesItsRuleIsAnswered503) {
  WorkerOptions options;
  options.lease_timeout_ms = 300;  // nobody answers the lease
  start(options);
  int client = connect();
  send(client, get("/v1/check?rule=global&key=cold"));
  ASSERT_TRUE(test::waitFor(5'000, [&] { return metrics_.shard(0).lease_deferred.get() == 1; }));
  reload({test::frontRule(1, "local", Scope::kLocal)});
  std::vector<std::string> responses = readResponses(client, 1);
  ASSERT_EQ(responses.size(), 1u);
  // The rule was there when asked: not a 404, and not the daemon's bug.
  EXPECT_EQ(statusLine(responses[0]), "HTTP/1.1 503 Service Unavailable");
  EXPECT_NE(responses[0].find("\r\nRetry-After: 1\r\n"), std::string::npos) << responses[0];
  EXPECT_NE(responses[0].find("rule \\\"global\\\" was removed by a reload"), std::string::npos)
      << responses[0];
  // A request after the reload names a rule that is not there.
  send(client, get("/v1/check?rule=global&key=cold"));
  EXPECT_EQ(statusLine(readResponses(client, 1).at(0)), "HTTP/1.1 404 Not Found");
}

TEST_F(HttpConnectionTest, CheckGivenItsUnitsBeforeAReloadRemovedItsRuleGetsItsDecision) {
  // One unit every 500 ms; a check may wait a second for its unit.
  Rule paced = test::frontRule(3, "paced", Scope::kLocal);
  paced.limits = {Limit{.limit = 1, .period_ns = 500 * test::kFrontMs, .burst = 1}};
  paced.max_wait_ns = 1'000 * test::kFrontMs;
  std::vector<Rule> rules = test::frontRules();
  rules.push_back(paced);
  start(WorkerOptions{}, {}, rules);
  int client = connect();
  send(client, get("/v1/check?rule=paced&key=w") + get("/v1/check?rule=paced&key=w"));
  // Both decided: the second holds its unit, due in about 500 ms.
  ASSERT_TRUE(test::waitFor(5'000, [&] { return decided() == 2; }));
  reload(test::frontRules());
  std::vector<std::string> responses = readResponses(client, 2);
  ASSERT_EQ(responses.size(), 2u);
  EXPECT_EQ(statusLine(responses[1]), "HTTP/1.1 200 OK") << responses[1];
  // Its policy is its limit alone: the rule's window went with it.
  EXPECT_NE(responses[1].find("\r\nRateLimit-Policy: \"paced\";q=1\r\n"), std::string::npos)
      << responses[1];
  EXPECT_NE(responses[1].find("\"allowed\":true"), std::string::npos) << responses[1];
}

TEST_F(HttpConnectionTest, ChunkedBodyIsRefusedWith411) {
  start(WorkerOptions{});
  int client = connect();
  send(client, "POST /v1/check?rule=local&key=c HTTP/1.1\r\nHost: s\r\n"
               "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
  std::string all = readAll(client);
  EXPECT_EQ(statusLine(all), "HTTP/1.1 411 Length Required");
  EXPECT_NE(all.find("\"status\":411"), std::string::npos) << all;
}

TEST_F(HttpConnectionTest, HalfSentRequestIsClosedAtThePartialFrameTimeout) {
  WorkerOptions options;
  options.partial_frame_timeout_ms = 100;
  start(options);
  int client = connect();
  send(client, "GET /v1/check?rule=local&key=p HTTP/1.1\r\nHost: s\r\n");
  EXPECT_TRUE(closedByDaemon(client));
  EXPECT_EQ(closed(CloseReason::kPartialFrame), 1u);
  EXPECT_EQ(closed(CloseReason::kIdle), 0u);
}

TEST_F(HttpConnectionTest, SilentClientIsClosedAtTheIdleTimeout) {
  WorkerOptions options;
  options.idle_timeout_ms = 100;
  start(options);
  int client = connect();
  send(client, get("/v1/check?rule=local&key=i"));
  EXPECT_EQ(readResponses(client, 1).size(), 1u);
  EXPECT_TRUE(closedByDaemon(client));
  EXPECT_EQ(closed(CloseReason::kIdle), 1u);
}

TEST_F(HttpConnectionTest, PeerThatAccessDoesNotAllowIsAnswered403) {
  start(WorkerOptions{});
  int client = connect(/*allowed=*/false);
  send(client, get("/v1/check?rule=local&key=f"));
  std::vector<std::string> responses = readResponses(client, 1);
  ASSERT_EQ(responses.size(), 1u);
  EXPECT_EQ(statusLine(responses[0]), "HTTP/1.1 403 Forbidden");
  EXPECT_NE(responses[0].find("[access]"), std::string::npos) << responses[0];
}

TEST_F(HttpConnectionTest, PercentEncodedParametersAreDecoded) {
  start(WorkerOptions{});
  int client = connect();
  send(client, get("/v1/check?rule=loc%61l&key=a+b%2Fc") + get("/v1/check?rule=local&key=a%20b/c"));
  std::vector<std::string> responses = readResponses(client, 2);
  ASSERT_EQ(responses.size(), 2u);
  EXPECT_NE(responses[0].find("\"local\";r=4;"), std::string::npos) << responses[0];
  // The same key, however it was encoded.
  EXPECT_NE(responses[1].find("\"local\";r=3;"), std::string::npos) << responses[1];
}

}  // namespace
}  // namespace sluice

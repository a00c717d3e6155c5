// EnvoyFront (envoy_front.h): a call whose deadline has passed is finished
// undecided, and a connection may open kMaxCallsPerConnection calls. The
// real front on a Unix socket, one worker with a lane and a
// local limit of 2 a minute, asked by gRPC's C++ client; the front reads
// deadlines on a clock the test sets ahead (DeadlineClock), so "passed" is
// decided by the test, not by how fast the machine is.
#include "envoy_front.h"

#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <optional>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "envoy_policy.h"
#include "key_table.h"
#include "metrics.h"
#include "test_status.h"
#include "test_support.h"
#include "worker.h"

namespace sluice {
namespace {

using envoy::service::ratelimit::v3::RateLimitRequest;
using envoy::service::ratelimit::v3::RateLimitResponse;
using envoy::service::ratelimit::v3::RateLimitService;
using std::chrono::system_clock;

constexpr std::string_view kYaml = R"(
domain: web
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
)";

RuleSetPtr rulesOf(const EnvoyPolicy& policy) {
  std::vector<Rule> rules = policy.rules;
  for (size_t i = 0; i < rules.size(); ++i) rules[i].id = static_cast<uint32_t>(i + 1);
  return std::make_shared<const RuleSet>(std::move(rules), 1);
}

class EnvoyFrontTest : public ::testing::Test {
 protected:
  EnvoyFrontTest() {
    const EnvoyRuleOptions options{.scope = Scope::kLocal};
    auto policy = std::make_shared<EnvoyPolicy>();
    EXPECT_EQ(readEnvoyYaml(kYaml, "rl.yaml", options, policy.get()), "");
    worker_ = std::make_unique<Worker>(0, WorkerOptions{}, keys_, metrics_.shard(0), status_,
                                       rulesOf(*policy), nullptr, RespFront::EnsureRule{},
                                       &metrics_.shard(1));
    worker_->start();
    EnvoyConfig envoy;
    envoy.listen = "unix:" + dir_.file("rls.sock");
    envoy.scope = Scope::kLocal;
    envoy.policy = policy;
    front_ = makeEnvoyFront([this] { return system_clock::now() + ahead_.load(); });
    std::string error;
    EXPECT_TRUE(front_->start(envoy, 0600, {worker_.get()}, [](const Rule&) { return false; },
                              EnvoyCounters{.overrides_refused = &refused_,
                                            .deadline_exceeded = &late_},
                              &error))
        << error;
    stub_ = RateLimitService::NewStub(
        grpc::CreateChannel(envoy.listen, grpc::InsecureChannelCredentials()));
  }

  ~EnvoyFrontTest() override {
    front_->stop();
    worker_->stop();
    worker_->join();
  }

  // One call for user `user`, with a deadline `timeout` away by the
  // client's clock (none when zero); the status, and the response in `out`.
  grpc::Status ask(std::chrono::seconds timeout, RateLimitResponse* out) {
    RateLimitRequest request;
    request.set_domain("web");
    auto* entry = request.add_descriptors()->add_entries();
    entry->set_key("user");
    entry->set_value("alice");
    grpc::ClientContext context;
    if (timeout.count() > 0) context.set_deadline(system_clock::now() + timeout);
    return stub_->ShouldRateLimit(&context, request, out);
  }

  // The SETTINGS_MAX_CONCURRENT_STREAMS the front sends a new HTTP/2
  // connection in its SETTINGS frame (RFC 9113, 6.5): read over a raw Unix
  // socket after the client preface; nullopt when the frame lacks it.
  std::optional<uint32_t> maxConcurrentStreams() {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    const std::string path = dir_.file("rls.sock");
    std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    static constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    static constexpr char kEmptySettings[] = {0, 0, 0, 4, 0, 0, 0, 0, 0};
    EXPECT_EQ(::write(fd, kPreface, sizeof(kPreface) - 1), ssize_t{sizeof(kPreface) - 1});
    EXPECT_EQ(::write(fd, kEmptySettings, sizeof(kEmptySettings)), ssize_t{sizeof(kEmptySettings)});
    auto readAll = [&](size_t n) {
      std::string out(n, '\0');
      for (size_t got = 0; got < n;) {
        const ssize_t r = ::read(fd, out.data() + got, n - got);
        if (r <= 0) return std::string();
        got += static_cast<size_t>(r);
      }
      return out;
    };
    std::optional<uint32_t> found;
    // The server's first frame is its SETTINGS (RFC 9113, 3.4).
    const std::string header = readAll(9);
    if (header.size() == 9 && header[3] == 4 && (header[4] & 1) == 0) {
      const size_t length = (size_t{static_cast<uint8_t>(header[0])} << 16) |
                            (size_t{static_cast<uint8_t>(header[1])} << 8) |
                            static_cast<uint8_t>(header[2]);
      const std::string payload = readAll(length);
      for (size_t at = 0; at + 6 <= payload.size(); at += 6) {
        const auto byte = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(payload[at + i])); };
        if ((byte(0) << 8 | byte(1)) == 3) {  // SETTINGS_MAX_CONCURRENT_STREAMS
          found = byte(2) << 24 | byte(3) << 16 | byte(4) << 8 | byte(5);
        }
      }
    }
    ::close(fd);
    return found;
  }

  test::TempDir dir_;
  KeyTable keys_{KeyTableOptions{}};
  Metrics metrics_{2};
  TestStatus status_{metrics_, 1};
  std::unique_ptr<Worker> worker_;
  Counter refused_;
  Counter late_;
  std::atomic<system_clock::duration> ahead_{system_clock::duration::zero()};
  std::unique_ptr<EnvoyFront> front_;
  std::unique_ptr<RateLimitService::Stub> stub_;
};

// Verifies that calls whose deadline has passed when the front reads them
// are answered DEADLINE_EXCEEDED, counted, and spend nothing: the limit of
// 2 is whole for the calls after them.
TEST_F(EnvoyFrontTest, ACallPastItsDeadlineIsAnsweredDeadlineExceededAndSpendsNothing) {
  ahead_ = std::chrono::hours(1);  // every deadline below an hour has passed
  RateLimitResponse response;
  for (int i = 0; i < 3; ++i) {
    const grpc::Status status = ask(std::chrono::seconds(60), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  }
  EXPECT_EQ(late_.get(), 3u);

  // Calls without a deadline are decided whatever the clock says.
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(ask(std::chrono::seconds(0), &response).ok());
    EXPECT_EQ(response.overall_code(), RateLimitResponse::OK) << i;
  }
  ASSERT_TRUE(ask(std::chrono::seconds(0), &response).ok());
  EXPECT_EQ(response.overall_code(), RateLimitResponse::OVER_LIMIT);
  EXPECT_EQ(late_.get(), 3u);
}

// Verifies that a call within its deadline is decided and spends its hit.
TEST_F(EnvoyFrontTest, ACallWithinItsDeadlineIsDecidedAndSpends) {
  RateLimitResponse response;
  ASSERT_TRUE(ask(std::chrono::seconds(60), &response).ok());
  EXPECT_EQ(response.overall_code(), RateLimitResponse::OK);
  ASSERT_EQ(response.statuses_size(), 1);
  EXPECT_EQ(response.statuses(0).limit_remaining(), 1u);
  EXPECT_EQ(late_.get(), 0u);
}

// Verifies that the front limits each connection to kMaxCallsPerConnection
// calls open at once, so that a client outrunning it queues its calls on
// its own side, where their deadlines end them (envoy_front.h).
TEST_F(EnvoyFrontTest, EachConnectionMayOpenAtMostKMaxCallsPerConnectionCalls) {
  const std::optional<uint32_t> streams = maxConcurrentStreams();
  ASSERT_TRUE(streams.has_value());
  EXPECT_EQ(*streams, static_cast<uint32_t>(kMaxCallsPerConnection));
}

}  // namespace
}  // namespace sluice

// EnvoyFront (envoy_front.h): a call whose deadline has passed is finished
// undecided. The real front on a Unix socket, one worker with a lane and a
// local limit of 2 a minute, asked by gRPC's C++ client; the front reads
// deadlines on a clock the test sets ahead (DeadlineClock), so "passed" is
// decided by the test, not by how fast the machine is.
#include "envoy_front.h"

#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
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

}  // namespace
}  // namespace sluice

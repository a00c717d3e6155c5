// Tests for LeaseManager against a real redis-server per test: what a burst
// of requests costs the control thread while it waits on the pipeline. The
// test drives the manager on its own loop, as the control thread does, waits
// on conditions with a guard timer (never a sleep), and ends by closing the
// link and checking that the loop closes with no handle left open.
#include "lease_manager.h"

#include <gtest/gtest.h>
#include <malloc.h>
#include <uv.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "redis_server.h"
#include "test_support.h"
#include "uv_loop.h"

namespace sluice {
namespace {

using test::RedisServer;

constexpr int64_t kMs = 1'000'000;


class LeaseManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(uv_loop_init(&loop_), 0);
    Rule shared;
    shared.name = "shared";
    shared.scope = Scope::kGlobal;
    shared.limits = {Limit{.limit = 1'000'000, .period_ns = 1'000 * kMs, .burst = 1'000'000}};
    std::vector<Rule> rules;
    rules.push_back(std::move(shared));
    rules_ = std::make_shared<const RuleSet>(std::move(rules));
    rule_id_ = rules_->find("shared")->id;

    config_.host = server_.host();
    config_.port = static_cast<uint16_t>(server_.port());
    link_ = std::make_unique<RedisLink>(&loop_, config_);
    LeaseContext context;
    context.keys = &keys_;
    context.broker = &broker_;
    context.rules = [this] { return rules_; };
    manager_ = std::make_unique<LeaseManager>(*link_, config_, context);
    link_->onConnected([this] { manager_->onUp(); });
    link_->onDisconnected([this](std::string_view) { manager_->onDown(); });
    link_->start();
    ASSERT_TRUE(runUntil([&] { return broker_.breaker() == Breaker::kClosed; }));
  }

  void TearDown() override {
    bool closed = false;
    link_->close([&] { closed = true; });
    ASSERT_TRUE(runUntil([&] { return closed; }));
    manager_.reset();
    link_.reset();
    uv_run(&loop_, UV_RUN_NOWAIT);
    EXPECT_EQ(uv_loop_close(&loop_), 0);
  }

  // Runs the loop until `done()` holds or timeout_ms passes; returns done().
  bool runUntil(const std::function<bool()>& done, int timeout_ms = 10'000) {
    return test::runLoopUntil(&loop_, done, timeout_ms);
  }

  // One return per key, as a sweep submits for the keys gone idle.
  void submitReturns(int count) {
    for (int i = 0; i < count; i++) {
      LeaseRequest back;
      back.kind = LeaseRequest::Kind::kReturn;
      back.rule_id = rule_id_;
      back.key = "idle-key-" + std::to_string(i);
      back.n = 1;
      broker_.submit(std::move(back));
    }
  }

  uint64_t returnedUnits() { return broker_.counters().returned_units.load(); }

  RedisServer server_;
  uv_loop_t loop_;
  RedisConfig config_;
  RuleSetPtr rules_;
  uint32_t rule_id_ = 0;
  KeyTable keys_{KeyTableOptions{}};
  LeaseBroker broker_{100 * kMs};
  std::unique_ptr<RedisLink> link_;
  std::unique_ptr<LeaseManager> manager_;
};

// Verifies that every return of a burst larger than the pipeline is sent,
// in turn, as replies make room.
TEST_F(LeaseManagerTest, ABurstOfReturnsIsSentInFull) {
  constexpr int kReturns = 10'000;
  submitReturns(kReturns);
  manager_->onWakeup();
  ASSERT_TRUE(runUntil([&] { return returnedUnits() == kReturns; }));
}

// Sanitizer allocators do not report through mallinfo2(), so sanitized builds
// leave this test out rather than skip it.
#ifndef SLUICE_SANITIZED
// Bytes the process's malloc has handed out and not had back: from every
// arena, and the large blocks it mapped on their own.
size_t heapInUse() {
  struct mallinfo2 info = mallinfo2();
  return info.uordblks + info.hblkhd;
}

// Verifies that a burst of 10,000 returns becomes script calls only as the
// pipeline has room (built all at once, they took some 7 MB), and that the
// burst's buffers are given back once it is served.
TEST_F(LeaseManagerTest, ABurstOfReturnsIsBuiltAsThePipelineAllowsAndLeavesNoMemoryBehind) {
  constexpr int kReturns = 10'000;
  size_t before = heapInUse();
  submitReturns(kReturns);
  size_t queued = heapInUse();
  manager_->onWakeup();
  // The pipeline's 128 calls take about 130 KB, hiredis's share included.
  EXPECT_LT(heapInUse() - queued, 1u << 20) << "script calls built beyond the pipeline's room";
  ASSERT_TRUE(runUntil([&] { return returnedUnits() == kReturns; }));
  EXPECT_LT(heapInUse(), before + 64 * 1024) << "the burst's buffers were kept";
}
#endif  // SLUICE_SANITIZED

}  // namespace
}  // namespace sluice

// Worker (worker.h): which lease news wakes it. Two real worker threads on
// one broker with no control thread (lease requests wait in its queue,
// unanswered); the test waits on conditions (test::waitFor), never on a
// fixed sleep, and ends by stopping and joining both workers.
#include "worker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "clock.h"
#include "lease.h"
#include "test_support.h"
#include "test_status.h"

namespace sluice {
namespace {

constexpr int64_t kMs = 1'000'000;

// Counts the answers a submitted question gets (on its worker's thread).
class Counter final : public Recipient {
 public:
  void receive(MsgId, const Answer&) override { answers.fetch_add(1); }
  std::atomic<int> answers{0};
};

RuleSetPtr globalRules() {
  Rule rule;
  rule.id = 1;
  rule.name = "g";
  rule.scope = Scope::kGlobal;
  rule.algorithm = Algorithm::kTokenBucket;
  rule.on_redis_down = RedisDownPolicy::kClosed;
  rule.limits = {Limit{.limit = 10, .period_ns = 1'000 * kMs, .burst = 10}};
  return std::make_shared<const RuleSet>(std::vector<Rule>{rule}, 1);
}

// Verifies that a lease reply wakes only the worker that holds a request
// waiting for a lease: an idle worker is never woken, a worker whose
// request waits wakes itself once when it starts waiting (for a reply that
// may have come first) and then on every reply.
TEST(WorkerTest, LeaseNewsWakesOnlyAWorkerWithRequestsWaitingForIt) {
  RuleSetPtr rules = globalRules();
  KeyTable keys{KeyTableOptions{}};
  Metrics metrics{2};
  TestStatus status(metrics, 2);
  LeaseBroker broker(100 * kMs);
  broker.setBreaker(Breaker::kClosed, monotonicNowNs());
  WorkerOptions options;
  options.lease_timeout_ms = 60'000;  // the request waits until the workers stop
  Worker idle(0, options, keys, metrics.shard(0), status, rules, &broker);
  Worker busy(1, options, keys, metrics.shard(1), status, rules, &broker);
  idle.start();
  busy.start();

  idle.notifyLeases();
  busy.notifyLeases();
  EXPECT_EQ(idle.leaseWakeups(), 0u);
  EXPECT_EQ(busy.leaseWakeups(), 0u);

  // A cold key: the acquire waits for its first lease, which nobody answers.
  Item item{.rule = "g", .key = "cold", .cost = 1};
  Counter counter;
  busy.submit(HeldQuestion(Question{Method::kAcquire, {&item, 1}}), &counter, 7);
  ASSERT_TRUE(test::waitFor(5'000, [&] { return busy.leaseWakeups() == 1; }));
  ASSERT_TRUE(test::waitFor(5'000, [&] {
    busy.notifyLeases();
    return busy.leaseWakeups() >= 2;
  }));
  for (int i = 0; i < 100; ++i) idle.notifyLeases();
  EXPECT_EQ(idle.leaseWakeups(), 0u);
  EXPECT_EQ(counter.answers.load(), 0);  // still waiting for its lease

  busy.stop();
  idle.stop();
  busy.join();
  idle.join();
  EXPECT_EQ(counter.answers.load(), 1);  // answered by its policy at the stop
}

}  // namespace
}  // namespace sluice

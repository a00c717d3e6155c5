// Worker (worker.h): which lease news wakes it, and its lane. Real worker
// threads on one broker with no control thread (lease requests wait in its
// queue, unanswered); the test waits on conditions (test::waitFor), never on a
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

RuleSetPtr localRules() {
  Rule rule;
  rule.id = 2;
  rule.name = "l";
  rule.scope = Scope::kLocal;
  rule.algorithm = Algorithm::kTokenBucket;
  rule.limits = {Limit{.limit = 1, .period_ns = 60'000 * kMs, .burst = 1}};
  return std::make_shared<const RuleSet>(std::vector<Rule>{rule}, 1);
}

uint64_t allowed(const MetricsShard& shard) {
  uint64_t sum = 0;
  for (const auto& counter : shard.allowed) sum += counter.get();
  return sum;
}

// Verifies that the lane decides an acquire on the calling thread, counted
// on the lane's own shard, and that it takes no question a worker without
// a lane, or a reservation (its table is the loop's), would need.
TEST(WorkerTest, TheLaneDecidesAcquiresAtOnceOnTheCallersThreadAndOnlyThem) {
  RuleSetPtr rules = localRules();
  KeyTable keys{KeyTableOptions{}};
  Metrics metrics{3};
  TestStatus status(metrics, 1);
  WorkerOptions options;
  Worker plain(0, options, keys, metrics.shard(0), status, rules);
  Worker laned(1, options, keys, metrics.shard(1), status, rules, nullptr, {}, &metrics.shard(2));
  plain.start();
  laned.start();
  Item item{.rule = "l", .key = "k", .cost = 1};
  Answer answer;
  Outcome outcome = Outcome::kWaitsForLease;
  Counter counter;

  EXPECT_FALSE(plain.decideOnLane(Question{Method::kAcquire, {&item, 1}}, &counter, 1, &answer,
                                  &outcome));
  EXPECT_FALSE(laned.decideOnLane(Question{Method::kReserve, {&item, 1}}, &counter, 1, &answer,
                                  &outcome));
  ASSERT_TRUE(laned.decideOnLane(Question{Method::kAcquire, {&item, 1}}, &counter, 1, &answer,
                                 &outcome));
  EXPECT_EQ(outcome, Outcome::kAnswered);
  ASSERT_EQ(answer.decisions.size(), 1u);
  EXPECT_TRUE(answer.decisions[0].allowed);
  // The limit is 1: the second acquire is denied.
  ASSERT_TRUE(laned.decideOnLane(Question{Method::kAcquire, {&item, 1}}, &counter, 2, &answer,
                                 &outcome));
  EXPECT_FALSE(answer.decisions[0].allowed);
  EXPECT_EQ(allowed(metrics.shard(2)), 1u);
  EXPECT_EQ(allowed(metrics.shard(1)), 0u);
  EXPECT_EQ(counter.answers.load(), 0);  // answered into `answer`, not to the recipient
  plain.stop();
  laned.stop();
  plain.join();
  laned.join();
}

// Verifies that a question the lane leaves waiting for a lease is the
// worker's: the worker wakes on lease news for it, and answers it on its
// own thread (here by its policy, at the stop) exactly once.
TEST(WorkerTest, AQuestionTheLaneLeavesWaitingIsAnsweredByItsWorker) {
  RuleSetPtr rules = globalRules();
  KeyTable keys{KeyTableOptions{}};
  Metrics metrics{2};
  TestStatus status(metrics, 1);
  LeaseBroker broker(100 * kMs);
  broker.setBreaker(Breaker::kClosed, monotonicNowNs());
  WorkerOptions options;
  options.lease_timeout_ms = 60'000;  // the request waits until the worker stops
  Worker worker(0, options, keys, metrics.shard(0), status, rules, &broker, {},
                &metrics.shard(1));
  worker.start();
  worker.notifyLeases();  // found nobody waiting: remembered
  EXPECT_EQ(worker.leaseWakeups(), 0u);

  Item item{.rule = "g", .key = "cold", .cost = 1};
  Counter counter;
  Answer answer;
  Outcome outcome = Outcome::kAnswered;
  ASSERT_TRUE(worker.decideOnLane(Question{Method::kAcquire, {&item, 1}}, &counter, 7, &answer,
                                  &outcome));
  EXPECT_EQ(outcome, Outcome::kWaitsForLease);
  ASSERT_TRUE(test::waitFor(5'000, [&] { return worker.leaseWakeups() == 1; }));
  ASSERT_TRUE(test::waitFor(5'000, [&] {
    worker.notifyLeases();
    return worker.leaseWakeups() >= 2;
  }));
  EXPECT_EQ(counter.answers.load(), 0);  // still waiting for its lease

  worker.stop();
  worker.join();
  EXPECT_EQ(counter.answers.load(), 1);  // answered by its policy at the stop
}

// Verifies that the worker's lease timer covers the lane's waiters: one
// waiting for a lease that never comes is answered at its deadline.
TEST(WorkerTest, AQuestionTheLaneLeavesWaitingIsAnsweredAtItsDeadline) {
  RuleSetPtr rules = globalRules();
  KeyTable keys{KeyTableOptions{}};
  Metrics metrics{2};
  TestStatus status(metrics, 1);
  LeaseBroker broker(100 * kMs);
  broker.setBreaker(Breaker::kClosed, monotonicNowNs());
  WorkerOptions options;
  options.lease_timeout_ms = 20;
  Worker worker(0, options, keys, metrics.shard(0), status, rules, &broker, {},
                &metrics.shard(1));
  worker.start();
  Item item{.rule = "g", .key = "cold", .cost = 1};
  Counter counter;
  Answer answer;
  Outcome outcome = Outcome::kAnswered;
  ASSERT_TRUE(worker.decideOnLane(Question{Method::kAcquire, {&item, 1}}, &counter, 7, &answer,
                                  &outcome));
  EXPECT_EQ(outcome, Outcome::kWaitsForLease);
  EXPECT_TRUE(test::waitFor(5'000, [&] { return counter.answers.load() == 1; }));
  worker.stop();
  worker.join();
  EXPECT_EQ(counter.answers.load(), 1);
}

}  // namespace
}  // namespace sluice

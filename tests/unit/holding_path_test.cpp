// The holding path (holding_path.h): a global concurrency rule's acquires,
// peeks and releases on its holding, with an in-process LeaseBroker (the
// test plays the control thread's grants), on a simulated clock.
#include "holding_path.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "holding.h"
#include "key_table.h"
#include "entry.h"
#include "lease.h"
#include "metrics.h"
#include "waiting.h"

namespace sluice {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kStart = 5'000 * kMs;

std::vector<Rule> testRules() {
  Rule jobs;
  jobs.id = 1;
  jobs.name = "jobs";
  jobs.scope = Scope::kGlobal;
  jobs.algorithm = Algorithm::kConcurrency;
  jobs.on_redis_down = RedisDownPolicy::kLocal;
  jobs.limits = {Limit{.limit = 8, .period_ns = 0, .burst = 8}};
  return {jobs};
}

class HoldingPathTest : public ::testing::Test {
 protected:
  HoldingPathTest() : keys_(options()), reader_(keys_.registerReader()), guard_(keys_, reader_) {
    broker_.setBreaker(Breaker::kHalfOpen, kStart);
    broker_.setBreaker(Breaker::kClosed, kStart);
  }
  static KeyTableOptions options() {
    KeyTableOptions options;
    options.max_keys = 16;
    options.max_readers = 1;
    return options;
  }
  const Rule& jobs() const { return rules_.rules().front(); }
  rpc::Item item(int64_t cost) const { return {"jobs", "k", cost, -1}; }
  Asker asker(bool may_wait) {
    Asker asker;
    asker.deadline_ns = kStart + 50 * kMs;
    asker.may_wait = may_wait;
    return asker;
  }
  // What came of an acquire: units held, an answer that holds nothing, or
  // a wait for the key's lease.
  enum class Got { kHeld, kAnswered, kWaitsForLease };
  Got acquire(int64_t cost, bool may_wait = false) {
    Verdict verdict;
    Outcome outcome = path_.acquire(rules_, jobs(), item(cost), now_ns_, asker(may_wait), &verdict);
    EXPECT_FALSE(verdict.failed);
    decision_ = verdict.decision;
    mode_ = verdict.mode;
    words_ = verdict.taken.held;
    if (outcome == Outcome::kWaitsForLease) return Got::kWaitsForLease;
    EXPECT_EQ(outcome, Outcome::kAnswered);
    return words_.empty() ? Got::kAnswered : Got::kHeld;
  }
  // What a granting lease reply does to the key's holding (lease_manager.cpp).
  void grant(int64_t units) {
    KeyTable::Entry* entry = keys_.find(jobs().id, "k");
    ASSERT_NE(entry, nullptr);
    auto words = entry->state();
    words[holding::kHeld].fetch_add(static_cast<uint64_t>(units));
    words[slice::kUnits].fetch_add(static_cast<uint64_t>(units));
    words[slice::kFlags].fetch_or(slice::kWarm);
    words[slice::kFlags].fetch_and(~slice::kInFlight);
  }

  KeyTable keys_;
  KeyTable::ReaderId reader_;
  KeyTable::ReadGuard guard_;
  Metrics metrics_{1};
  LeaseBroker broker_{100 * kMs};
  Waiting waiting_{metrics_.shard(0), &broker_, 50 * kMs};
  HoldingPath path_{keys_, metrics_.shard(0), &broker_, waiting_};
  RuleSet rules_{testRules(), 2};
  int64_t now_ns_ = kStart;
  Decision decision_;
  Mode mode_ = Mode::kLocal;
  std::span<std::atomic<uint64_t>> words_;
};

// Verifies an acquire on a cold key asks for one lease and waits for it.
TEST_F(HoldingPathTest, AColdKeyAsksForALeaseAndWaitsForIt) {
  EXPECT_EQ(acquire(1, true), Got::kWaitsForLease);
  EXPECT_EQ(waiting_.count(WaitKind::kLease), 1u);
  std::vector<LeaseRequest> sent;
  broker_.takeRequests(&sent);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].rule_id, jobs().id);
  EXPECT_GE(sent[0].need, 1);
}

// Verifies a request that may not wait, on a key with no units yet, is
// decided by the policy: "local" holds at the node's share, in fallback.
TEST_F(HoldingPathTest, ARequestThatMayNotWaitHoldsAtTheShareInFallback) {
  EXPECT_EQ(acquire(4), Got::kHeld);
  EXPECT_EQ(mode_, Mode::kFallback);
  EXPECT_EQ(decision_.limit, 4);  // 8 over 2 nodes
  EXPECT_EQ(acquire(1), Got::kAnswered);
  EXPECT_FALSE(decision_.allowed);
}

// Verifies granted units are held one acquire at a time, that a release
// gives them back into the pool, and that peek and release answer the
// state afterwards.
TEST_F(HoldingPathTest, GrantedUnitsAreHeldAndReleasedIntoThePool) {
  ASSERT_EQ(acquire(1, true), Got::kWaitsForLease);
  grant(3);
  EXPECT_EQ(acquire(2), Got::kHeld);
  EXPECT_EQ(mode_, Mode::kNormal);
  EXPECT_FALSE(words_.empty());
  EXPECT_EQ(holding::pool(words_), 1);
  Decision released = path_.look(rules_, jobs(), item(5), true, now_ns_, &mode_);
  EXPECT_TRUE(released.allowed);
  EXPECT_EQ(holding::pool(words_), 3);
  EXPECT_EQ(metrics_.snapshot().lease_units_released, 2u);
  Decision peeked = path_.look(rules_, jobs(), item(0), false, now_ns_, &mode_);
  EXPECT_EQ(peeked.remaining, released.remaining);
}

// Verifies remaining on a held key is the fleet's free units as far as the
// node can tell: its own free units plus what Redis had free at the key's
// last lease answer, at most the limit; without an answer from Redis, its
// own alone. See docs/protocol.md, "Remaining on a global rule".
TEST_F(HoldingPathTest, RemainingCountsWhatRedisHadFreeAtTheLastLease) {
  ASSERT_EQ(acquire(1, true), Got::kWaitsForLease);
  grant(3);
  EXPECT_EQ(acquire(1), Got::kHeld);
  EXPECT_EQ(decision_.remaining, 2);  // no lease answer noted: the node's own
  {
    KeyTable::Entry* entry = keys_.find(jobs().id, "k");
    ASSERT_NE(entry, nullptr);
    slice::noteRedisLeft(slice::of(entry->state()), jobs(), 4, now_ns_);
  }
  EXPECT_EQ(acquire(1), Got::kHeld);
  EXPECT_EQ(decision_.remaining, 1 + 4);
  Decision peeked = path_.look(rules_, jobs(), item(0), false, now_ns_, &mode_);
  EXPECT_EQ(peeked.remaining, 1 + 4);
  {
    KeyTable::Entry* entry = keys_.find(jobs().id, "k");
    slice::noteRedisLeft(slice::of(entry->state()), jobs(), 8, now_ns_);
  }
  peeked = path_.look(rules_, jobs(), item(0), false, now_ns_, &mode_);
  EXPECT_EQ(peeked.remaining, 8);  // 1 + 8, at most the limit
}

// Verifies a release on a key that holds nothing answers as peek does, and
// creates no key.
TEST_F(HoldingPathTest, AReleaseOnAKeyThatHoldsNothingAnswersAsPeek) {
  Decision released = path_.look(rules_, jobs(), item(9), true, now_ns_, &mode_);
  Decision peeked = path_.look(rules_, jobs(), item(0), false, now_ns_, &mode_);
  EXPECT_TRUE(released.allowed);
  EXPECT_FALSE(released.cost_exceeds_limit);
  EXPECT_EQ(released.remaining, peeked.remaining);
  EXPECT_EQ(keys_.find(jobs().id, "k"), nullptr);
}

// Verifies a cost over the limit can never pass, holding nothing.
TEST_F(HoldingPathTest, ACostOverTheLimitNeverPasses) {
  EXPECT_EQ(acquire(9), Got::kAnswered);
  EXPECT_TRUE(decision_.cost_exceeds_limit);
  EXPECT_EQ(keys_.find(jobs().id, "k"), nullptr);
}

// Verifies a group's refund gives held units back into the pool.
TEST_F(HoldingPathTest, ARefundGivesHeldUnitsBack) {
  ASSERT_EQ(acquire(1, true), Got::kWaitsForLease);
  grant(2);
  ASSERT_EQ(acquire(2), Got::kHeld);
  path_.refund(jobs(), words_, now_ns_, 2);
  EXPECT_EQ(holding::pool(words_), 2);
}

}  // namespace
}  // namespace sluice

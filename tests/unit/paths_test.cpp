// The local path (local_path.h) and the policy path (policy.h) on a
// simulated clock, against a real key table, with an in-process LeaseBroker
// where Redis is involved (the test plays the control thread).
#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "key_table.h"
#include "entry.h"
#include "lease.h"
#include "local_path.h"
#include "metrics.h"
#include "policy.h"
#include "waiting.h"

namespace sluice {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kS = 1000 * kMs;
constexpr int64_t kStart = 5 * kS;

Rule makeRule(uint32_t id, std::string name, Algorithm algorithm, Limit limit,
              Scope scope = Scope::kLocal,
              RedisDownPolicy on_redis_down = RedisDownPolicy::kLocal) {
  Rule rule;
  rule.id = id;
  rule.name = std::move(name);
  rule.algorithm = algorithm;
  rule.limits = {limit};
  rule.scope = scope;
  rule.on_redis_down = on_redis_down;
  return rule;
}

std::vector<Rule> testRules() {
  std::vector<Rule> rules = {
      makeRule(1, "api", Algorithm::kTokenBucket, {2, 1 * kS, 2}),
      makeRule(2, "wait", Algorithm::kTokenBucket, {2, 1 * kS, 2}),
      makeRule(3, "jobs", Algorithm::kConcurrency, {3, 0, 3}),
      makeRule(4, "g", Algorithm::kTokenBucket, {10, 1 * kS, 10}, Scope::kGlobal),
      makeRule(5, "g_open", Algorithm::kFixedWindow, {4, 1 * kS, 4}, Scope::kGlobal,
               RedisDownPolicy::kOpen),
      makeRule(6, "g_closed", Algorithm::kGcra, {4, 2 * kS, 4}, Scope::kGlobal,
               RedisDownPolicy::kClosed),
      makeRule(7, "g_pen", Algorithm::kTokenBucket, {1, 1 * kS, 1}, Scope::kGlobal),
  };
  rules[1].max_wait_ns = 1 * kS;
  rules[6].penalty = Penalty{.denials = 2, .window_ns = 1 * kS, .block_ns = 10 * kS};
  return rules;
}

class PathsTest : public ::testing::Test {
 protected:
  PathsTest() : keys_(options()), reader_(keys_.registerReader()), guard_(keys_, reader_) {}
  static KeyTableOptions options() {
    KeyTableOptions options;
    options.max_keys = 32;
    options.max_readers = 1;
    return options;
  }
  void redisUp() {
    broker_.setBreaker(Breaker::kHalfOpen, kStart);
    broker_.setBreaker(Breaker::kClosed, kStart);
  }
  const Rule& rule(std::string_view name) const { return *rules_.find(name); }
  // An acquire on the local path as the Dispatcher routes it.
  Outcome acquire(std::string_view name, int64_t cost = 1, bool may_wait = false) {
    const Rule& configured = rule(name);
    Route to = route(rules_, configured);
    Asker asker;
    asker.tag = 1;
    asker.may_wait = may_wait;
    verdict_ = Verdict{};
    return local_.acquire(rules_, configured, *to.rule, to.mode, {name, "k", cost, -1}, now_ns_,
                          asker, &verdict_);
  }
  std::vector<LeaseRequest> sent() {
    std::vector<LeaseRequest> requests;
    broker_.takeRequests(&requests);
    return requests;
  }

  KeyTable keys_;
  KeyTable::ReaderId reader_;
  KeyTable::ReadGuard guard_;
  Metrics metrics_{1};
  LeaseBroker broker_{100 * kMs};  // open (Redis down) until redisUp()
  Waiting waiting_{metrics_.shard(0), &broker_, 50 * kMs};
  PolicyPath policy_{keys_, metrics_.shard(0), &broker_};
  LocalPath local_{keys_, waiting_, policy_};
  RuleSet rules_{testRules(), 2};
  int64_t now_ns_ = kStart;
  Verdict verdict_;
};

// --- policy ----------------------------------------------------------------------

// Verifies each rule is routed to where its units come from while it does
// not lease: a local rule to itself, a global one by its on_redis_down.
TEST_F(PathsTest, RulesAreRoutedByScopeAndRedisDownPolicy) {
  EXPECT_EQ(route(rules_, rule("api")).rule, &rule("api"));
  EXPECT_EQ(route(rules_, rule("api")).mode, Mode::kLocal);
  EXPECT_EQ(route(rules_, rule("g")).rule, rules_.fallbackShare(rule("g")));
  EXPECT_EQ(route(rules_, rule("g")).mode, Mode::kFallback);
  EXPECT_EQ(route(rules_, rule("g_open")).rule, nullptr);
  EXPECT_EQ(route(rules_, rule("g_open")).mode, Mode::kOpen);
  EXPECT_EQ(route(rules_, rule("g_closed")).mode, Mode::kClosed);
}

// Verifies "open" allows everything and "closed" denies with a retry of one
// period, spending nothing.
TEST_F(PathsTest, OpenAllowsAndClosedDeniesForAPeriod) {
  Decision open = policyDecision(rule("g_open"), Mode::kOpen);
  EXPECT_TRUE(open.allowed);
  EXPECT_EQ(open.remaining, 4);
  Decision closed = policyDecision(rule("g_closed"), Mode::kClosed);
  EXPECT_FALSE(closed.allowed);
  EXPECT_EQ(closed.retry_after_ms, 2000);
}

// Verifies what a share admits while Redis is down is counted in the share
// for the recovery's debit, and while Redis is up is debited at once.
TEST_F(PathsTest, FallbackSpendsAreCountedWhileDownAndDebitedWhileUp) {
  const Rule& share = *rules_.fallbackShare(rule("g"));
  // What acquireShare spent, noted as the group path notes it once kept.
  auto spend = [&](int64_t cost) {
    Taken taken;
    std::optional<Decision> decision =
        policy_.acquireShare(rules_, share, "k", now_ns_, cost, true, &taken);
    ASSERT_TRUE(decision && decision->allowed);
    ASSERT_EQ(taken.share, &share);
    policy_.noteFallbackSpend(rules_, share, "k", taken.share_words, taken.cost);
  };
  spend(3);
  KeyTable::Entry* entry = keys_.find(share.id, "k");
  ASSERT_NE(entry, nullptr);
  EXPECT_EQ(undebited(share, entry->state()), 3);
  EXPECT_TRUE(sent().empty());
  redisUp();
  spend(1);
  std::vector<LeaseRequest> requests = sent();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].kind, LeaseRequest::Kind::kDebit);
  EXPECT_EQ(requests[0].n, 1);
  EXPECT_EQ(undebited(share, entry->state()), 3);
}

// Verifies the D-th denial of a global rule's key blocks it across the
// fleet while Redis is up: the block goes to Redis and the slice is emptied.
TEST_F(PathsTest, TheDthDenialOfAGlobalKeyBlocksItAcrossTheFleet) {
  redisUp();
  const Rule& pen = rule("g_pen");
  KeyTable::Entry* entry = keys_.findOrInsert(pen.id, "k", entryWords(pen), now_ns_);
  ASSERT_NE(entry, nullptr);
  entry->state()[slice::kUnits].store(5);
  Decision denied;
  denied.limit = 1;
  policy_.countDenial(pen, "k", entry->state(), denied, now_ns_);
  EXPECT_EQ(policy_.globalBlockedFor(pen, "k", now_ns_), 0);
  policy_.countDenial(pen, "k", entry->state(), denied, now_ns_ + 1 * kMs);
  EXPECT_EQ(policy_.globalBlockedFor(pen, "k", now_ns_ + 1 * kMs), 10 * kS);
  std::vector<LeaseRequest> requests = sent();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].kind, LeaseRequest::Kind::kBlock);
  EXPECT_EQ(requests[0].n, 10'000);
  EXPECT_EQ(entry->state()[slice::kUnits].load(), 0u);
  EXPECT_EQ(metrics_.snapshot().penalty_blocks, 1u);
}

// --- local path ------------------------------------------------------------------

// Verifies a local rule spends on its key and denies past its limit.
TEST_F(PathsTest, ALocalRuleSpendsOnItsKeyAndDeniesPastItsLimit) {
  EXPECT_EQ(acquire("api", 2), Outcome::kAnswered);
  EXPECT_TRUE(verdict_.decision.allowed);
  EXPECT_EQ(verdict_.mode, Mode::kLocal);
  EXPECT_EQ(acquire("api"), Outcome::kAnswered);
  EXPECT_FALSE(verdict_.decision.allowed);
  EXPECT_EQ(verdict_.decision.retry_after_ms, 500);
}

// Verifies a request that may wait is allowed on a reservation, answered
// when its units are due, and one that may not wait is denied.
TEST_F(PathsTest, ARequestThatMayWaitIsAllowedOnAReservation) {
  ASSERT_EQ(acquire("wait", 2, true), Outcome::kAnswered);
  EXPECT_EQ(verdict_.waited_ms, 0);
  EXPECT_EQ(acquire("wait", 1, true), Outcome::kWaitsReserved);
  EXPECT_TRUE(verdict_.decision.allowed);
  EXPECT_EQ(waiting_.count(WaitKind::kReserved), 1u);
  EXPECT_EQ(waiting_.nextDeadlineNs(), kStart + 500 * kMs);
  EXPECT_EQ(acquire("wait", 1, false), Outcome::kAnswered);
  EXPECT_FALSE(verdict_.decision.allowed);
}

// Verifies a global rule without Redis spends on its share, in fallback.
TEST_F(PathsTest, AGlobalRuleWithoutRedisSpendsOnItsShare) {
  EXPECT_EQ(acquire("g", 5), Outcome::kAnswered);
  EXPECT_TRUE(verdict_.decision.allowed);
  EXPECT_EQ(verdict_.mode, Mode::kFallback);
  EXPECT_EQ(verdict_.decision.limit, 5);  // 10 over 2 nodes
  EXPECT_EQ(acquire("g"), Outcome::kAnswered);
  EXPECT_FALSE(verdict_.decision.allowed);
}

// Verifies a release gives back held units, at most those held, and on a
// key that holds nothing answers as peek does.
TEST_F(PathsTest, AReleaseGivesBackWhatIsHeldAndOnAnIdleKeyAnswersAsPeek) {
  const Rule& jobs = rule("jobs");
  Verdict idle = local_.look(rules_, jobs, jobs, Mode::kLocal, {"jobs", "idle", 5, -1}, true,
                             now_ns_);
  EXPECT_TRUE(idle.decision.allowed);
  EXPECT_EQ(idle.decision.remaining, 3);
  EXPECT_EQ(keys_.find(jobs.id, "idle"), nullptr);
  ASSERT_EQ(acquire("jobs", 2), Outcome::kAnswered);
  Verdict released = local_.look(rules_, jobs, jobs, Mode::kLocal, {"jobs", "k", 5, -1}, true,
                                 now_ns_);
  EXPECT_EQ(released.decision.remaining, 3);
}

}  // namespace
}  // namespace sluice

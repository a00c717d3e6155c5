// Tests for the breaker (breaker.h) on a simulated clock, with no Redis and
// no sleeps:
//  - every transition of CircuitBreaker, driven by events, with a fake
//    BreakerActions;
//  - the lease manager's half of it (INFO, debits) on a fake RedisTarget
//    (fake_redis.h) that answers when the test says so;
//  - learning mode on a fleet of two nodes in one process (each a
//    dispatcher and a lease manager) on one fake Redis: the share cap, the
//    recheck of empty answers, per-rule learning, and health's and
//    /metrics' view of it.
#include "breaker.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "access.h"
#include "dispatch.h"
#include "fake_redis.h"
#include "lease_manager.h"
#include "metrics.h"
#include "prometheus.h"
#include "rate_lease.h"
#include "redis_keys.h"
#include "rpc.h"
#include "slice.h"

namespace sluice {
namespace {

using test::FakeRedis;

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kSecond = 1'000 * kMs;
constexpr int64_t kHour = 3'600 * kSecond;
// The simulated clock starts here (0 would read as "never").
constexpr int64_t kStart = 1'000 * kSecond;

// A global rule; `id` names its keys in the key table.
Rule globalRule(uint32_t id, std::string name, int64_t limit, int64_t period_ns,
                Algorithm algorithm = Algorithm::kTokenBucket) {
  Rule rule;
  rule.id = id;
  rule.name = std::move(name);
  rule.scope = Scope::kGlobal;
  rule.algorithm = algorithm;
  rule.limits = {Limit{.limit = limit, .period_ns = period_ns,
                       .burst = algorithm == Algorithm::kTokenBucket ? limit : 0}};
  return rule;
}

// Records what the breaker asks for; the test answers.
class FakeActions : public BreakerActions {
 public:
  bool askIdentity(uint64_t epoch) override {
    identity_epochs.push_back(epoch);
    return can_ask;
  }
  void recover(uint64_t epoch, bool state_lost, bool master_changed, int64_t fallback_span_ms) override {
    recoveries.push_back({epoch, state_lost, master_changed, fallback_span_ms});
    if (breaker != nullptr && calls > 0) breaker->expect(epoch, calls);
  }

  struct Recovery {
    uint64_t epoch;
    bool state_lost;
    bool master_changed;
    int64_t span_ms;
  };
  CircuitBreaker* breaker = nullptr;
  bool can_ask = true;
  size_t calls = 0;  // recovery calls each recover() sends
  std::vector<uint64_t> identity_epochs;
  std::vector<Recovery> recoveries;
};

RedisIdentity identity(std::string run_id, std::string replid = "r1", std::string replid2 = "") {
  return {std::move(run_id), std::move(replid), std::move(replid2)};
}

class BreakerTest : public ::testing::Test {
 protected:
  BreakerTest() {
    std::vector<Rule> rules;
    rules.push_back(globalRule(1, "per-second", 10, kSecond));
    rules.push_back(globalRule(2, "per-hour", 8, kHour));
    rules.push_back(globalRule(3, "slots", 4, 60 * kSecond, Algorithm::kConcurrency));
    rules_ = std::make_shared<const RuleSet>(std::move(rules), 2);
    actions_.breaker = &breaker_;
  }

  const Rule& rule(std::string_view name) { return *rules_->find(name); }

  // Up, identified as `who`, every recovery call answered: closed.
  void recoverAs(const RedisIdentity& who) {
    breaker_.up(now_);
    breaker_.identified(breaker_.epoch(), who, now_);
    while (breaker_.pending() > 0) breaker_.answered(breaker_.epoch(), now_);
    ASSERT_EQ(breaker_.state(), Breaker::kClosed);
  }

  int64_t now_ = kStart;
  RuleSetPtr rules_;
  LeaseBroker broker_{100 * kMs};
  FakeActions actions_;
  CircuitBreaker breaker_{broker_, actions_, {5 * kSecond, 2'400 * kMs}, [this] { return rules_; }};
};

// Verifies that a breaker starts open and goes half-open, asking Redis who
// it is, when Redis answers.
TEST_F(BreakerTest, StartsOpenAndGoesHalfOpenAskingWhoRedisIsWhenItAnswers) {
  EXPECT_EQ(breaker_.state(), Breaker::kOpen);
  EXPECT_FALSE(broker_.leasing());
  breaker_.up(now_);
  EXPECT_EQ(breaker_.state(), Breaker::kHalfOpen);
  EXPECT_EQ(broker_.breaker(), Breaker::kHalfOpen);
  ASSERT_EQ(actions_.identity_epochs.size(), 1u);
  EXPECT_EQ(actions_.identity_epochs[0], breaker_.epoch());
}

// Verifies that half-open closes only once the identity and every recovery
// call are answered, and that workers then lease.
TEST_F(BreakerTest, HalfOpenClosesOnlyOnceEveryRecoveryCallIsAnswered) {
  actions_.calls = 2;
  breaker_.up(now_);
  breaker_.identified(breaker_.epoch(), identity("a"), now_);
  ASSERT_EQ(actions_.recoveries.size(), 1u);
  EXPECT_EQ(breaker_.pending(), 2u);
  breaker_.answered(breaker_.epoch(), now_);
  EXPECT_EQ(breaker_.state(), Breaker::kHalfOpen);
  EXPECT_FALSE(broker_.leasing());
  breaker_.answered(breaker_.epoch(), now_);
  EXPECT_EQ(breaker_.state(), Breaker::kClosed);
  EXPECT_TRUE(broker_.leasing());
}

// Verifies that a down opens a closed breaker at once and counts an entry
// into fallback.
TEST_F(BreakerTest, ADownOpensAClosedBreaker) {
  recoverAs(identity("a"));
  uint64_t entries = broker_.stats(now_).fallback_entries;
  breaker_.down(now_);
  EXPECT_EQ(breaker_.state(), Breaker::kOpen);
  EXPECT_FALSE(broker_.leasing());
  EXPECT_EQ(broker_.stats(now_).fallback_entries, entries + 1);
}

// Verifies that the same run_id after an outage gets the fallback debits,
// charged over the whole fallback span, and starts no learning.
TEST_F(BreakerTest, TheSameRedisGetsDebitsOverTheFallbackSpanAndNoLearning) {
  recoverAs(identity("a"));
  breaker_.down(now_);
  now_ += 3 * kSecond;
  breaker_.down(now_);  // a second report of the same outage: the span began at the first
  now_ += 2 * kSecond;
  recoverAs(identity("a"));
  ASSERT_EQ(actions_.recoveries.size(), 2u);
  EXPECT_FALSE(actions_.recoveries[1].state_lost);
  EXPECT_FALSE(actions_.recoveries[1].master_changed);
  EXPECT_EQ(actions_.recoveries[1].span_ms, 5'000);
  EXPECT_FALSE(broker_.learning(rule("per-hour"), now_));
  EXPECT_EQ(broker_.stats(now_).learning_entries, 0u);
}

// Verifies that a Redis restarted empty (new run_id, another replication
// history) gets no debits and starts learning mode.
TEST_F(BreakerTest, ARestartedRedisGetsNoDebitsAndStartsLearning) {
  recoverAs(identity("a", "r1"));
  breaker_.down(now_);
  now_ += kSecond;
  recoverAs(identity("b", "r2"));
  ASSERT_EQ(actions_.recoveries.size(), 2u);
  EXPECT_TRUE(actions_.recoveries[1].state_lost);
  EXPECT_TRUE(actions_.recoveries[1].master_changed);
  EXPECT_TRUE(broker_.learning(rule("per-hour"), now_));
  EXPECT_TRUE(broker_.learningAny(now_));
  EXPECT_EQ(broker_.stats(now_).learning_entries, 1u);
}

// Verifies that a promoted replica (its master_replid2 is the old master's
// master_replid) gets the debits, and learning mode for what it missed.
TEST_F(BreakerTest, APromotedReplicaGetsDebitsAndStartsLearning) {
  recoverAs(identity("a", "r1"));
  breaker_.down(now_);
  recoverAs(identity("b", "r2", "r1"));
  EXPECT_FALSE(actions_.recoveries[1].state_lost);
  EXPECT_TRUE(actions_.recoveries[1].master_changed);
  EXPECT_TRUE(broker_.learning(rule("per-second"), now_));
}

// Verifies that a master change seen by an identity the fleet marker
// refused still reaches the recovery that follows: the next identity reads
// the new run_id as the last one seen, yet the node must end its rate
// leases (the new master may lack their last renewals).
TEST_F(BreakerTest, AMasterChangeSeenWhileRefusedReachesTheRecovery) {
  recoverAs(identity("a", "r1"));
  breaker_.down(now_);
  breaker_.up(now_);
  breaker_.identified(breaker_.epoch(), identity("b", "r2", "r1"), now_, kRedisStateVersion + 1);
  ASSERT_TRUE(breaker_.refused());
  ASSERT_EQ(actions_.recoveries.size(), 1u);
  now_ += kSecond;
  breaker_.identified(breaker_.epoch(), identity("b", "r2", "r1"), now_);
  ASSERT_EQ(actions_.recoveries.size(), 2u);
  EXPECT_TRUE(actions_.recoveries[1].master_changed);
  EXPECT_FALSE(actions_.recoveries[1].state_lost);
  // Reported once: the next outage on the same master is no change.
  breaker_.answered(breaker_.epoch(), now_);
  breaker_.down(now_);
  recoverAs(identity("b", "r2", "r1"));
  ASSERT_EQ(actions_.recoveries.size(), 3u);
  EXPECT_FALSE(actions_.recoveries[2].master_changed);
}

// Verifies that learning ends per rule: a rule of a second learns until
// every node can have reconnected (2.4 s here), one of an hour for its
// hour, a concurrency rule for lease_ttl.
TEST_F(BreakerTest, LearningEndsForEachRuleAfterItsOwnSpan) {
  recoverAs(identity("a", "r1"));
  breaker_.down(now_);
  recoverAs(identity("b", "r2"));
  int64_t began = now_;
  EXPECT_EQ(broker_.learningUntilNs(rule("per-second")), began + 2'400 * kMs);
  EXPECT_EQ(broker_.learningUntilNs(rule("per-hour")), began + kHour);
  EXPECT_EQ(broker_.learningUntilNs(rule("slots")), began + 5 * kSecond);

  EXPECT_TRUE(broker_.learning(rule("per-second"), began + 2'399 * kMs));
  EXPECT_FALSE(broker_.learning(rule("per-second"), began + 2'400 * kMs));
  EXPECT_TRUE(broker_.learning(rule("slots"), began + 4 * kSecond));
  EXPECT_FALSE(broker_.learning(rule("slots"), began + 5 * kSecond));
  EXPECT_TRUE(broker_.learning(rule("per-hour"), began + kHour - 1));
  EXPECT_FALSE(broker_.learning(rule("per-hour"), began + kHour));
  // The fleet-wide flag lasts as long as the longest rule.
  EXPECT_TRUE(broker_.learningAny(began + kHour - 1));
  EXPECT_FALSE(broker_.learningAny(began + kHour));
}

// Verifies that health's list of learning rules names each configured rule
// while it learns, with the time it has left, and drops it once it is done.
TEST_F(BreakerTest, LearningRulesListsEachRuleWhileItLearns) {
  recoverAs(identity("a", "r1"));
  breaker_.down(now_);
  recoverAs(identity("b", "r2"));
  now_ += 3 * kSecond;
  std::vector<LearningRule> learning = learningRules(*rules_, broker_, now_);
  ASSERT_EQ(learning.size(), 2u);
  EXPECT_EQ(learning[0].name, "per-hour");
  EXPECT_EQ(learning[0].left_ms, 3'597'000);
  EXPECT_EQ(learning[1].name, "slots");
  EXPECT_EQ(learning[1].left_ms, 2'000);
  EXPECT_TRUE(learningRules(*rules_, broker_, now_ + kHour).empty());
}

// Verifies that a rule of several limits learns while its longest part does.
TEST(LearningRules, ARuleOfSeveralLimitsLearnsWhileAnyPartDoes) {
  Rule rule = globalRule(1, "both", 10, kSecond);
  rule.limits.push_back(Limit{.limit = 100, .period_ns = kHour, .burst = 100});
  std::vector<Rule> rules;
  rules.push_back(std::move(rule));
  rules.push_back(globalRule(2, "local", 10, kHour));
  rules.back().scope = Scope::kLocal;
  RuleSet set(std::move(rules), 2);
  LeaseBroker broker(100 * kMs);
  EXPECT_TRUE(learningRules(set, broker, kStart).empty());
  broker.startLearning(kStart, 0, 0, kHour);
  std::vector<LearningRule> learning = learningRules(set, broker, kStart + kSecond);
  ASSERT_EQ(learning.size(), 1u);
  EXPECT_EQ(learning[0].name, "both");
  EXPECT_EQ(learning[0].left_ms, 3'599'000);
}

// Verifies that /metrics shows one sluice_learning_seconds sample per rule
// in learning mode.
TEST(LearningRules, MetricsShowSecondsLeftPerLearningRule) {
  MetricsView view;
  view.redis.emplace();
  view.redis->learning = true;
  view.redis->learning_rules = {{"hourly", 3'597'000}, {"slots", 2'500}};
  std::string text = renderPrometheus(view);
  EXPECT_NE(text.find("# TYPE sluice_learning_seconds gauge\n"), std::string::npos) << text;
  EXPECT_NE(text.find("sluice_learning_seconds{rule=\"hourly\"} 3597\n"), std::string::npos);
  EXPECT_NE(text.find("sluice_learning_seconds{rule=\"slots\"} 2.5\n"), std::string::npos);
  view.redis->learning_rules.clear();
  EXPECT_EQ(renderPrometheus(view).find("sluice_learning_seconds{"), std::string::npos);
}

// Verifies that a bucket whose burst is above its limit learns for its
// refill from empty, longer than its period.
TEST(LearningSpan, ABucketLearnsForItsRefillFromEmpty) {
  Rule rule = globalRule(1, "bursty", 10, kSecond);
  rule.limits.front().burst = 40;
  EXPECT_EQ(learningSpanNs(rule, 0, 0), 4 * kSecond);
  EXPECT_EQ(learningSpanNs(rule, 0, 9 * kSecond), 9 * kSecond);
}

// Verifies that a down during half-open opens the breaker again, and that
// the answers of that half-open state no longer count.
TEST_F(BreakerTest, ADownDuringHalfOpenReopensAndItsLateAnswersCountForNothing) {
  actions_.calls = 1;
  breaker_.up(now_);
  uint64_t old_epoch = breaker_.epoch();
  breaker_.identified(old_epoch, identity("a"), now_);
  EXPECT_EQ(breaker_.state(), Breaker::kHalfOpen);
  breaker_.down(now_);
  EXPECT_EQ(breaker_.state(), Breaker::kOpen);
  breaker_.answered(old_epoch, now_);
  EXPECT_EQ(breaker_.state(), Breaker::kOpen);

  // Up again: the late answer of the old epoch does not close it either.
  breaker_.up(now_);
  breaker_.identified(breaker_.epoch(), identity("a"), now_);
  EXPECT_EQ(breaker_.pending(), 1u);
  breaker_.answered(old_epoch, now_);
  EXPECT_EQ(breaker_.state(), Breaker::kHalfOpen);
  breaker_.answered(breaker_.epoch(), now_);
  EXPECT_EQ(breaker_.state(), Breaker::kClosed);
}

// Verifies that an identity answer of an older half-open state still
// records who Redis is, but starts no recovery.
TEST_F(BreakerTest, ALateIdentityStartsNoRecovery) {
  breaker_.up(now_);
  uint64_t old_epoch = breaker_.epoch();
  breaker_.down(now_);
  breaker_.identified(old_epoch, identity("a"), now_);
  EXPECT_TRUE(actions_.recoveries.empty());
  EXPECT_EQ(breaker_.state(), Breaker::kOpen);
}

// Verifies that when INFO cannot be sent the breaker recovers as for the
// same Redis (debits) and closes.
TEST_F(BreakerTest, AnIdentityThatCannotBeAskedRecoversWithDebits) {
  actions_.can_ask = false;
  breaker_.up(now_);
  ASSERT_EQ(actions_.recoveries.size(), 1u);
  EXPECT_FALSE(actions_.recoveries[0].state_lost);
  EXPECT_EQ(breaker_.state(), Breaker::kClosed);
}

// Verifies that recovery calls answered at once, from inside recover(),
// do not close the breaker before the others are sent.
TEST_F(BreakerTest, RecoveryCallsAnsweredAtOnceDoNotCloseTheBreakerEarly) {
  class Eager : public FakeActions {
   public:
    void recover(uint64_t epoch, bool, bool, int64_t) override {
      breaker->expect(epoch, 1);
      breaker->answered(epoch, kStart);  // failed at once (not sent)
      closed_between = breaker->state() == Breaker::kClosed;
      breaker->expect(epoch, 1);
      second_epoch = epoch;
    }
    bool closed_between = false;
    uint64_t second_epoch = 0;
  } eager;
  CircuitBreaker breaker(broker_, eager, {}, [this] { return rules_; });
  eager.breaker = &breaker;
  breaker.up(now_);
  breaker.identified(breaker.epoch(), identity("a"), now_);
  EXPECT_FALSE(eager.closed_between);
  EXPECT_EQ(breaker.state(), Breaker::kHalfOpen);
  breaker.answered(eager.second_epoch, now_);
  EXPECT_EQ(breaker.state(), Breaker::kClosed);
}

// Verifies that a new cluster master starts learning mode without opening
// the breaker.
TEST_F(BreakerTest, ANewClusterMasterStartsLearningWithoutOpening) {
  recoverAs(identity("a"));
  breaker_.newMaster(now_);
  EXPECT_EQ(breaker_.state(), Breaker::kClosed);
  EXPECT_TRUE(broker_.learning(rule("per-hour"), now_));
}

// --- The fleet marker: state versions -----------------------------------------

// Verifies that a fleet marker naming another state version refuses the
// node: it stays half-open (global rules follow on_redis_down), starts no
// recovery, and shows both versions; once the marker is its own, the same
// epoch's identity recovers and closes.
TEST_F(BreakerTest, AFleetOfAnotherStateVersionKeepsTheBreakerHalfOpenUntilTheMarkerIsOurs) {
  breaker_.up(now_);
  uint64_t epoch = breaker_.epoch();
  breaker_.identified(epoch, identity("a"), now_, kRedisStateVersion + 1);
  EXPECT_EQ(breaker_.state(), Breaker::kHalfOpen);
  EXPECT_TRUE(breaker_.refused());
  EXPECT_FALSE(broker_.leasing());
  EXPECT_TRUE(broker_.refused());
  EXPECT_EQ(broker_.fleetVersion(), kRedisStateVersion + 1);
  EXPECT_TRUE(actions_.recoveries.empty());
  EXPECT_EQ(breaker_.pending(), 1u);  // the identity, asked again by the manager

  now_ += 10 * kSecond;
  breaker_.identified(epoch, identity("a"), now_, kRedisStateVersion);
  EXPECT_FALSE(breaker_.refused());
  EXPECT_FALSE(broker_.refused());
  EXPECT_EQ(broker_.fleetVersion(), kRedisStateVersion);
  ASSERT_EQ(actions_.recoveries.size(), 1u);
  EXPECT_EQ(breaker_.state(), Breaker::kClosed);
}

// Verifies that a marker that could not be claimed (no answer) refuses as
// well: a node leases only once it knows the fleet runs its version.
TEST_F(BreakerTest, AMarkerThatCouldNotBeClaimedRefuses) {
  breaker_.up(now_);
  breaker_.identified(breaker_.epoch(), identity("a"), now_, std::nullopt);
  EXPECT_TRUE(breaker_.refused());
  EXPECT_EQ(broker_.fleetVersion(), 0);
  EXPECT_EQ(breaker_.state(), Breaker::kHalfOpen);
  EXPECT_TRUE(actions_.recoveries.empty());
}

// Verifies that a node whose own version differs from the build's (the
// tests' seam) is refused by a fleet of the build's version.
TEST_F(BreakerTest, TheNodesOwnStateVersionIsTheOneCompared) {
  CircuitBreaker breaker(broker_, actions_, {5 * kSecond, 2'400 * kMs, 7, "blue:"},
                         [this] { return rules_; });
  breaker.up(now_);
  breaker.identified(breaker.epoch(), identity("a"), now_, kRedisStateVersion);
  EXPECT_TRUE(breaker.refused());
  breaker.identified(breaker.epoch(), identity("a"), now_, 7);
  EXPECT_FALSE(breaker.refused());
}

// Verifies that a closed breaker whose periodic claim finds another version
// goes half-open, refused, in a new epoch, and debits what it admits from
// then on once it leases again; a failed claim or its own version changes
// nothing.
TEST_F(BreakerTest, AClosedBreakerThatFindsAnotherVersionGoesHalfOpenRefused) {
  recoverAs(identity("a"));
  breaker_.checked(std::nullopt, now_);
  breaker_.checked(0, now_);
  breaker_.checked(kRedisStateVersion, now_);
  EXPECT_EQ(breaker_.state(), Breaker::kClosed);
  uint64_t epoch = breaker_.epoch();

  breaker_.checked(kRedisStateVersion + 1, now_);
  EXPECT_EQ(breaker_.state(), Breaker::kHalfOpen);
  EXPECT_TRUE(breaker_.refused());
  EXPECT_FALSE(broker_.leasing());
  EXPECT_GT(breaker_.epoch(), epoch);

  now_ += 4 * kSecond;
  breaker_.identified(breaker_.epoch(), identity("a"), now_, kRedisStateVersion);
  ASSERT_EQ(actions_.recoveries.size(), 2u);
  EXPECT_FALSE(actions_.recoveries[1].state_lost);
  EXPECT_EQ(actions_.recoveries[1].span_ms, 4'000);
  EXPECT_EQ(breaker_.state(), Breaker::kClosed);
}

// Verifies that health's refusal shows on /metrics.
TEST(StateVersion, MetricsShowARefusal) {
  MetricsView view;
  view.redis.emplace();
  EXPECT_NE(renderPrometheus(view).find("sluice_state_refused 0\n"), std::string::npos);
  view.redis->state_refused = true;
  EXPECT_NE(renderPrometheus(view).find("sluice_state_refused 1\n"), std::string::npos);
}

// Verifies that INFO's fields are read from their lines, and that a text
// without run_id is no identity.
TEST(ParseInfo, ReadsRunIdAndReplicationIds) {
  std::string info =
      "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\ntcp_port:6379\r\n"
      "# Replication\r\nrole:master\r\nmaster_replid:r1\r\nmaster_replid2:r0\r\n";
  std::optional<RedisIdentity> who = parseInfo(info);
  ASSERT_TRUE(who);
  EXPECT_EQ(who->run_id, "abc123");
  EXPECT_EQ(who->master_replid, "r1");
  EXPECT_EQ(who->master_replid2, "r0");
  EXPECT_FALSE(parseInfo("# Server\r\nredis_version:7.0.15\r\n"));
  EXPECT_FALSE(parseInfo(""));
}

// --- The lease manager's half, on a fake Redis ---------------------------------

std::string info(const std::string& run_id, const std::string& replid,
                 const std::string& replid2 = "0000") {
  return "# Server\r\nrun_id:" + run_id + "\r\n# Replication\r\nmaster_replid:" + replid +
         "\r\nmaster_replid2:" + replid2 + "\r\n";
}

class ManagerBreakerTest : public ::testing::Test {
 protected:
  ManagerBreakerTest() {
    std::vector<Rule> rules;
    rules.push_back(globalRule(1, "hourly", 8, kHour));
    rules_ = std::make_shared<const RuleSet>(std::move(rules), 2);
    LeaseContext context;
    context.keys = &keys_;
    context.broker = &broker_;
    context.rules = [this] { return rules_; };
    context.node_id = "node-a";
    context.now_ns = [this] { return now_; };
    manager_ = std::make_unique<LeaseManager>(redis_, config_, context);
  }

  const Rule& hourly() { return *rules_->find("hourly"); }

  // Up, INFO answered as (run_id, replid), the fleet marker as `fleet`.
  void upAs(const std::string& run_id, const std::string& replid,
            int64_t fleet = kRedisStateVersion) {
    manager_->onUp();
    answerIdentity(run_id, replid, fleet);
  }

  // Answers the identity step: INFO, then the claim of the fleet marker.
  void answerIdentity(const std::string& run_id, const std::string& replid, int64_t fleet) {
    ASSERT_FALSE(redis_.calls.empty());
    ASSERT_EQ(redis_.calls.front().argv, std::vector<std::string>{"INFO"});
    redis_.answerString(info(run_id, replid));
    answerClaim(fleet);
  }

  void answerClaim(int64_t fleet) {
    ASSERT_FALSE(redis_.calls.empty());
    ASSERT_TRUE(redis_.calls.front().script);
    ASSERT_EQ(redis_.calls.front().keys, std::vector<std::string>{"sluice:version"});
    ASSERT_EQ(redis_.calls.front().argv,
              (std::vector<std::string>{"claim", std::to_string(kRedisStateVersion), "3000"}));
    redis_.answerIntegers({fleet});
  }

  // Counts `units` admitted in fallback on `key`'s share entry.
  void admitInFallback(std::string_view key, int64_t units) {
    const Rule& share = *rules_->fallbackShare(hourly());
    KeyTable::ReadGuard guard(keys_, reader_);
    KeyTable::Entry* entry = keys_.findOrInsert(share.id, key, entryWords(share), now_);
    ASSERT_NE(entry, nullptr);
    addUndebited(share, entry->state(), units);
  }

  int64_t now_ = kStart;
  RedisConfig config_;
  RuleSetPtr rules_;
  KeyTable keys_{KeyTableOptions{}};
  KeyTable::ReaderId reader_ = keys_.registerReader();
  LeaseBroker broker_{100 * kMs};
  FakeRedis redis_;
  std::unique_ptr<LeaseManager> manager_;
};

// Verifies that the same Redis after an outage is debited what the fallback
// share admitted, and that the breaker closes only once the debit is answered.
TEST_F(ManagerBreakerTest, TheSameRedisIsDebitedBeforeTheBreakerCloses) {
  upAs("run-a", "r1");
  ASSERT_EQ(broker_.breaker(), Breaker::kClosed);
  manager_->onDown();
  admitInFallback("k", 3);
  now_ += 4 * kSecond;
  upAs("run-a", "r1");
  ASSERT_EQ(redis_.calls.size(), 1u);
  EXPECT_TRUE(redis_.calls.front().script);
  EXPECT_EQ(redis_.calls.front().keys.front(), manager_->stateKey("hourly", "k"));
  EXPECT_EQ(broker_.breaker(), Breaker::kHalfOpen);
  redis_.answerIntegers({0, 5, 0, 0, kStart / kMs});
  EXPECT_EQ(broker_.breaker(), Breaker::kClosed);
  EXPECT_EQ(broker_.stats(now_).debited_units, 3u);
}

// Verifies that a Redis restarted empty is debited nothing, closes at once,
// and puts the rule in learning mode.
TEST_F(ManagerBreakerTest, ARestartedRedisIsDebitedNothingAndTheRuleLearns) {
  upAs("run-a", "r1");
  manager_->onDown();
  admitInFallback("k", 3);
  now_ += 4 * kSecond;
  upAs("run-b", "r2");
  EXPECT_TRUE(redis_.calls.empty());
  EXPECT_EQ(broker_.breaker(), Breaker::kClosed);
  EXPECT_TRUE(broker_.learning(hourly(), now_));
  EXPECT_EQ(broker_.learningUntilNs(hourly()), now_ + kHour);
}


// Verifies the identity step's second call: after INFO the manager claims
// the fleet marker; another version refuses, nothing is debited, and each
// checkFleet asks again until the marker is this node's; then what the
// refused node admitted in fallback is debited and the breaker closes.
TEST_F(ManagerBreakerTest, ARefusedNodeAsksAgainEachCheckAndLeasesOnceTheMarkerIsItsOwn) {
  upAs("run-a", "r1", kRedisStateVersion + 1);
  EXPECT_TRUE(redis_.calls.empty());
  EXPECT_EQ(broker_.breaker(), Breaker::kHalfOpen);
  EXPECT_TRUE(broker_.refused());
  admitInFallback("k", 3);

  now_ += kSecond;
  manager_->checkFleet();
  manager_->checkFleet();  // one identity at a time
  ASSERT_EQ(redis_.calls.size(), 1u);
  answerIdentity("run-a", "r1", kRedisStateVersion + 1);
  EXPECT_TRUE(broker_.refused());
  EXPECT_TRUE(redis_.calls.empty());

  now_ += kSecond;
  manager_->checkFleet();
  answerIdentity("run-a", "r1", kRedisStateVersion);
  EXPECT_FALSE(broker_.refused());
  ASSERT_EQ(redis_.calls.size(), 1u);  // the fallback's debit
  EXPECT_EQ(redis_.calls.front().keys.front(), manager_->stateKey("hourly", "k"));
  EXPECT_EQ(redis_.calls.front().argv[0], "debit");
  redis_.answerIntegers({0, 5, 0, 0, kStart / kMs});
  EXPECT_EQ(broker_.breaker(), Breaker::kClosed);
  EXPECT_EQ(broker_.stats(now_).debited_units, 3u);
}

// Verifies that a closed node claims the marker again at every check (its
// TTL is a members' TTL), and that finding another version there refuses it.
TEST_F(ManagerBreakerTest, AClosedNodeKeepsClaimingTheMarkerAndIsRefusedWhenItChanges) {
  upAs("run-a", "r1");
  ASSERT_EQ(broker_.breaker(), Breaker::kClosed);
  manager_->checkFleet();
  manager_->checkFleet();  // one claim at a time
  ASSERT_EQ(redis_.calls.size(), 1u);
  answerClaim(kRedisStateVersion);
  EXPECT_EQ(broker_.breaker(), Breaker::kClosed);
  manager_->checkFleet();
  answerClaim(kRedisStateVersion + 1);
  EXPECT_EQ(broker_.breaker(), Breaker::kHalfOpen);
  EXPECT_TRUE(broker_.refused());
}

// Verifies that the state keys carry the node's own state version.
TEST_F(ManagerBreakerTest, StateKeysCarryTheNodesStateVersion) {
  EXPECT_EQ(manager_->stateKey("hourly", "k"), redisStateKey("sluice:", "hourly", "k"));
  LeaseContext context;
  context.keys = &keys_;
  context.broker = &broker_;
  context.rules = [this] { return rules_; };
  context.state_version = 9;
  FakeRedis other;
  LeaseManager nine(other, config_, context);
  EXPECT_EQ(nine.stateKey("hourly", "k"), redisStateKey("sluice:", "hourly", "k", 9));
  EXPECT_EQ(nine.blockKey("hourly", "k"), redisBlockKey("sluice:", "hourly", "k", 9));
}

// --- Learning on a fleet of two nodes, in one process -------------------------

// One Redis shared by the nodes' fake links: a token bucket per Redis key
// (the rate scripts' lease, return and debit) and a pool per key
// (concurrency's lease, renew and return), on the test's clock.
class FakeRedisState {
 public:
  explicit FakeRedisState(const int64_t& now_ns) : now_ns_(now_ns) {}

  // Redis restarted empty: a new run_id and no keys.
  void restart(std::string run_id) {
    run_id_ = std::move(run_id);
    buckets_.clear();
    pools_.clear();
  }
  // A replica took over: a new run_id that continues the last master's
  // history, with its buckets but without the rate leases (their last
  // renewals had not reached it).
  void failover(std::string run_id) {
    replid2_ = "replid-" + run_id_;
    run_id_ = std::move(run_id);
    for (auto& [key, bucket] : buckets_) bucket.rates.clear();
  }
  const std::string& runId() const { return run_id_; }
  // INFO's master_replid2: the history a promoted replica continued.
  const std::string& replid2() const { return replid2_; }
  // Units debited so far.
  int64_t debited() const { return debited_; }
  // Rate leases run so far.
  int leases() const { return leases_; }
  // Units the bucket of `state_key` holds now.
  double& tokens(const std::string& state_key, double burst) {
    Bucket& bucket = bucket_(state_key, burst);
    return bucket.tokens;
  }

  std::vector<long long> run(const FakeRedis::Call& call) {
    const std::vector<std::string>& a = call.argv;
    const std::string& key = call.keys.front();
    long long now_ms = now_ns_ / kMs;
    if (a[0] == "claim") return {std::stoll(a[1])};  // the fleet marker: one version
    if (a.size() == 7 && a[0] != "peek" && !std::isdigit(static_cast<unsigned char>(a[5][0]))) {
      return concurrency(a, key, now_ms);  // {op, n, need, limit, ttl, node_id, now}
    }
    // A rate op (rate_lease.h): {"rate", rate, tokens, limit, period_ms,
    // burst, now_us, deadline_us, node, lease_ms}. The node's rate is
    // replaced by rate_lease::grant's (its max-min share of the demands
    // recorded, within what the others' rates leave of the limit) until now
    // + lease_ms; up to `tokens` are taken beside it;
    // the reply carries the block's time left, the rate and whether some
    // recorded demand is below its share (rate_lease::unmet). The bucket
    // refills at the limit less the rates held (refill()).
    const bool rate_op = a[0] == "rate";
    int64_t n = std::stoll(rate_op ? a[2] : a[1]);
    int64_t need = rate_op ? std::min<int64_t>(n, 1) : std::stoll(a[2]);
    double limit = std::stod(a[3]);
    double period_ms = std::stod(a[4]);
    Bucket& bucket = bucket_(key, std::stod(a[5]));
    refill(bucket, limit, period_ms);
    long long rate = 0;
    if (rate_op) {
      ++rate_ops_;
      const long long asked = std::stoll(a[1]);
      rate_asks_.push_back({a[8], now_ns_, asked});
      bucket.rates.erase(a[8]);
      std::vector<rate_lease::Held> live;
      for (const auto& [node, held] : bucket.rates) live.push_back({node, held.rate, held.until_ns, held.demand});
      rate = asked > 0 ? rate_lease::grant(live, a[8], asked, static_cast<int64_t>(limit)) : 0;
      // Kept with rate 0 too: its demand counts in the others' next grants.
      if (asked > 0) bucket.rates[a[8]] = {rate, now_ns_ + std::stoll(a[9]) * kMs, asked};
    }
    long long granted = 0;
    long long retry_ms = 0;
    if (a[0] == "lease" || (rate_op && n > 0)) {
      ++leases_;
      if (bucket.tokens >= static_cast<double>(need)) {
        granted = std::min<long long>(n, static_cast<long long>(bucket.tokens));
        bucket.tokens -= static_cast<double>(granted);
      } else {
        // As the scripts answer (rate_lease::heldWaitUs): the refill at the
        // limit less the rates held, or, with the whole limit held, after
        // the first of them ends.
        const auto wait_us = static_cast<int64_t>(
            std::ceil((static_cast<double>(need) - bucket.tokens) * period_ms * 1000 / limit));
        int64_t held_rate = 0;
        int64_t first_end_us = now_ns_ / 1000;
        for (const auto& [node, h] : bucket.rates) {
          if (h.rate <= 0) continue;
          first_end_us = held_rate == 0 ? h.until_ns / 1000 : std::min(first_end_us, h.until_ns / 1000);
          held_rate += h.rate;
        }
        retry_ms = (rate_lease::heldWaitUs(wait_us, held_rate, static_cast<int64_t>(limit), first_end_us,
                                           now_ns_ / 1000) + 999) / 1000;
      }
    } else if (a[0] == "return") {
      bucket.tokens = std::min(bucket.burst, bucket.tokens + static_cast<double>(n));
    } else if (a[0] == "debit") {
      bucket.tokens -= static_cast<double>(n);
      debited_ += n;
    }
    const long long left = std::max<long long>(static_cast<long long>(bucket.tokens), 0);
    if (rate_op) {
      std::vector<rate_lease::Held> after;
      for (const auto& [node, held] : bucket.rates) after.push_back({node, held.rate, held.until_ns, held.demand});
      const long long unmet = rate_lease::unmet(after, static_cast<int64_t>(limit)) ? 1 : 0;
      return {granted, left, retry_ms, 0, now_ms, 0, rate, unmet};
    }
    return {granted, left, retry_ms, 0, now_ms};
  }
  // Rate ops run so far.
  int rateOps() const { return rate_ops_; }
  // Each rate op run so far: the node, when, and the rate it asked for.
  struct RateAsk {
    std::string node;
    int64_t at_ns = 0;
    int64_t rate = 0;
  };
  const std::vector<RateAsk>& rateAsks() const { return rate_asks_; }

 private:
  struct Held {
    int64_t rate = 0;  // units per period
    int64_t until_ns = 0;
    int64_t demand = 0;  // the rate asked for
  };
  struct Bucket {
    double burst = 0;
    double tokens = 0;
    int64_t at_ns = 0;
    std::map<std::string, Held> rates;  // node -> its rate lease
  };
  // The bucket's refill up to now, span by span between the rates' ends:
  // the limit less the rates held, up to the burst. Ended rates are dropped.
  void refill(Bucket& bucket, double limit, double period_ms) {
    while (bucket.at_ns < now_ns_) {
      int64_t span_end = now_ns_;
      double held = 0;
      for (const auto& [node, h] : bucket.rates) {
        if (h.until_ns <= bucket.at_ns) continue;
        held += static_cast<double>(h.rate);
        span_end = std::min(span_end, h.until_ns);
      }
      bucket.tokens = std::min(bucket.burst, bucket.tokens + static_cast<double>(span_end - bucket.at_ns) /
                                                                 kMs * (limit - held) / period_ms);
      bucket.at_ns = span_end;
    }
    std::erase_if(bucket.rates, [this](const auto& entry) { return entry.second.until_ns <= now_ns_; });
  }
  Bucket& bucket_(const std::string& key, double burst) {
    auto [it, fresh] = buckets_.try_emplace(key);
    if (fresh) it->second = {burst, burst, now_ns_, {}};
    return it->second;
  }

  std::vector<long long> concurrency(const std::vector<std::string>& a, const std::string& key,
                                     long long now_ms) {
    std::map<std::string, long long>& held = pools_[key];
    long long limit = std::stoll(a[3]);
    long long in_use = 0;
    for (const auto& [node, units] : held) in_use += units;
    long long n = std::stoll(a[1]);
    long long need = std::stoll(a[2]);
    long long& mine = held[a[5]];
    long long granted = 0;
    if (a[0] == "lease" && limit - in_use >= need) {
      granted = std::min(n, limit - in_use);
      mine += granted;
      in_use += granted;
    } else if (a[0] == "return") {
      long long back = std::min(n, mine);
      mine -= back;
      in_use -= back;
    }
    return {granted, limit - in_use, granted == 0 && a[0] == "lease" ? 1000 : 0, 0, now_ms, mine};
  }

  const int64_t& now_ns_;
  int leases_ = 0;
  int rate_ops_ = 0;
  std::vector<RateAsk> rate_asks_;
  int64_t debited_ = 0;
  std::string run_id_ = "run-1";
  std::string replid2_ = "0000";
  std::map<std::string, Bucket> buckets_;
  std::map<std::string, std::map<std::string, long long>> pools_;
};

// One node: its key table, broker, lease manager (on a fake link to the
// shared Redis) and one worker's dispatcher, all on the test's clock.
class Node {
 public:
  Node(std::string id, FakeRedisState& redis, RuleSetPtr rules, const int64_t& now_ns)
      : redis_(redis), rules_(std::move(rules)), now_ns_(now_ns) {
    LeaseContext context;
    context.keys = &keys_;
    context.broker = &broker_;
    context.rules = [this] { return rules_; };
    context.node_id = std::move(id);
    context.now_ns = [this] { return now_ns_; };
    manager_ = std::make_unique<LeaseManager>(link_, config_, context);
    dispatcher_ = std::make_unique<Dispatcher>(keys_, metrics_.shard(0), &broker_);
    dispatcher_->setRules(rules_);
  }

  // Redis answers (again): the breaker goes through half-open to closed.
  void up() {
    manager_->onUp();
    pump();
  }
  void down() { manager_->onDown(); }
  // Redis answers, and is gone again before the breaker closes: a
  // recovery that fails (half-open, then open).
  void recoveryFails() {
    manager_->onUp();
    manager_->onDown();
    pump();
  }

  // One acquire of `cost` on (rule, key); true when allowed. Every call it
  // makes of Redis is answered before it returns.
  bool acquire(std::string_view rule, std::string_view key, int64_t cost = 1) {
    Answer answer = ask(rule, key, cost);
    EXPECT_FALSE(answer.failed) << answer.message;
    return answer.allowed;
  }

  // acquire()'s, answer and all.
  Answer ask(std::string_view rule, std::string_view key, int64_t cost = 1) {
    Item item{.rule = rule, .key = key, .cost = cost};
    Answer answer;
    {
      KeyTable::ReadGuard guard(keys_, reader_);
      dispatcher_->ask({Method::kAcquire, {&item, 1}}, now_ns_, Asker{}, &answer);
    }
    pump();
    return answer;
  }

  // One question of `method` on `item`, answered (and every call it makes
  // of Redis) before it returns.
  Answer question(Method method, Item item) {
    Answer answer;
    {
      KeyTable::ReadGuard guard(keys_, reader_);
      dispatcher_->ask({method, {&item, 1}}, now_ns_, Asker{}, &answer);
    }
    pump();
    return answer;
  }

  // Serves the broker's requests and answers every call, until none is left.
  void pump() {
    manager_->onWakeup();
    while (!link_.calls.empty()) {
      if (!link_.calls.front().script) {
        link_.answerString(info(redis_.runId(), "replid-" + redis_.runId(), redis_.replid2()));
      } else {
        std::vector<long long> reply = redis_.run(link_.calls.front());
        link_.answerIntegers(reply);
      }
      manager_->onWakeup();
    }
  }

  LeaseBroker& broker() { return broker_; }

 private:
  FakeRedisState& redis_;
  RuleSetPtr rules_;
  const int64_t& now_ns_;
  RedisConfig config_;
  KeyTable keys_{KeyTableOptions{}};
  KeyTable::ReaderId reader_ = keys_.registerReader();
  Metrics metrics_{1};
  LeaseBroker broker_{100 * kMs};
  FakeRedis link_;
  std::unique_ptr<LeaseManager> manager_;
  std::unique_ptr<Dispatcher> dispatcher_;
};

// Two nodes on one Redis that restarts empty: learning mode on both.
class LearningFleetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<Rule> rules;
    rules.push_back(globalRule(1, "hourly", 8, kHour));
    rules.push_back(globalRule(3, "slots", 4, 60 * kSecond, Algorithm::kConcurrency));
    rules_ = std::make_shared<const RuleSet>(std::move(rules), 2);
    a_ = std::make_unique<Node>("node-a", redis_, rules_, now_);
    b_ = std::make_unique<Node>("node-b", redis_, rules_, now_);
    a_->up();
    b_->up();
    ASSERT_TRUE(a_->broker().leasing());
    a_->down();
    b_->down();
    redis_.restart("run-2");
    now_ += kSecond;
    a_->up();
    b_->up();
    ASSERT_TRUE(a_->broker().leasing());
    ASSERT_TRUE(a_->broker().learning(*rules_->find("hourly"), now_));
  }

  // Acquires `count` times on `node`, a millisecond apart; how many passed.
  int acquires(Node& node, std::string_view rule, int count) {
    int allowed = 0;
    for (int i = 0; i < count; ++i) {
      now_ += kMs;
      if (node.acquire(rule, "k")) ++allowed;
    }
    return allowed;
  }

  // Node B finds Redis empty (the others leased everything) and caches its
  // "nothing for 7.5 minutes"; another node returns 3 units. Within
  // kEmptyRecheckNs B asks Redis again, and spends them.
  void expectRecheckFindsReturnedUnits() {
    redis_.tokens(stateKey("hourly"), 8) = 0;
    acquires(*b_, "hourly", 1);  // a cold key: its share may decide
    Answer denied = b_->ask("hourly", "k");
    ASSERT_FALSE(denied.allowed);
    EXPECT_GT(denied.decisions[0].retry_after_ms, 60'000);  // Redis's word on when
    redis_.tokens(stateKey("hourly"), 8) += 3;  // another node's idle return
    int leases = redis_.leases();
    now_ += slice::kEmptyRecheckNs;
    acquires(*b_, "hourly", 1);  // denied still, but it asks Redis again
    EXPECT_EQ(redis_.leases(), leases + 1);
    EXPECT_LT(redis_.tokens(stateKey("hourly"), 8), 3.0);
    EXPECT_EQ(acquires(*b_, "hourly", 1), 1);
  }

  std::string stateKey(std::string_view rule) {
    return redisStateKey(RedisConfig{}.key_prefix, rule, "k");
  }

  int64_t now_ = kStart;
  FakeRedisState redis_{now_};
  RuleSetPtr rules_;
  std::unique_ptr<Node> a_;
  std::unique_ptr<Node> b_;
};

// Two nodes on one Redis that stays up: no learning.
class SteadyFleetTest : public LearningFleetTest {
 protected:
  void SetUp() override {
    std::vector<Rule> rules;
    rules.push_back(globalRule(1, "hourly", 8, kHour));
    rules_ = std::make_shared<const RuleSet>(std::move(rules), 2);
    a_ = std::make_unique<Node>("node-a", redis_, rules_, now_);
    b_ = std::make_unique<Node>("node-b", redis_, rules_, now_);
    a_->up();
    b_->up();
    ASSERT_TRUE(b_->broker().leasing());
  }
};

// Verifies that a learning node leases no more than its share: after an
// empty restart, node A, asked far beyond its share, leaves the other half
// of an 8-an-hour bucket in Redis, and node B spends it.
TEST_F(LearningFleetTest, ALearningNodeLeasesNoMoreThanItsShare) {
  EXPECT_EQ(acquires(*a_, "hourly", 12), 4);
  EXPECT_GE(redis_.tokens(stateKey("hourly"), 8), 4.0);
  EXPECT_EQ(acquires(*b_, "hourly", 12), 4);
}

// Verifies that a learning node whose share holds just one request's units
// still leases them for a request that waits for its lease (an empty slice).
TEST_F(LearningFleetTest, AShareHoldingJustTheCostStillLeasesIt) {
  EXPECT_EQ(acquires(*a_, "hourly", 12), 4);
  now_ += 16 * 60 * kSecond;  // the share (4 an hour) has one unit again
  int leases = redis_.leases();
  EXPECT_TRUE(a_->acquire("hourly", "k"));
  EXPECT_EQ(redis_.leases(), leases + 1);
}

// Verifies that while a rule learns, Redis's "nothing until t" is asked
// again within kEmptyRecheckNs, so units another node gives back are spent
// long before t.
TEST_F(LearningFleetTest, ANegativeCacheDoesNotOutliveUnitsAnotherNodeReturns) {
  expectRecheckFindsReturnedUnits();
}

// Verifies that outside learning too, Redis's "nothing until t" is asked
// again within kEmptyRecheckNs, while denials still say t: units another
// node gives back (an idle key, a stop) are spent long before t, not
// refused until then.
TEST_F(SteadyFleetTest, ANegativeCacheDoesNotOutliveUnitsAnotherNodeReturns) {
  ASSERT_FALSE(b_->broker().learning(*rules_->find("hourly"), now_));
  expectRecheckFindsReturnedUnits();
}

// Verifies that a global concurrency rule is capped at its share only while
// it learns itself (lease_ttl and the reconnect backoff), not while another
// rule (an hourly one) still learns.
TEST_F(LearningFleetTest, AConcurrencyRuleIsCappedOnlyWhileItLearnsItself) {
  const Rule& slots = *rules_->find("slots");
  ASSERT_TRUE(a_->broker().learning(slots, now_));
  EXPECT_EQ(acquires(*a_, "slots", 4), 2);
  now_ = a_->broker().learningUntilNs(slots);
  ASSERT_TRUE(a_->broker().learning(*rules_->find("hourly"), now_));
  a_->pump();
  EXPECT_EQ(acquires(*a_, "slots", 2), 2);
}

// --- Rate leases keep the burst (rate_lease::wants), on one node -------------

// One node alone on a Redis that grants rate leases (FakeRedisState): a
// 10/s rule with a burst of 10 (one unit per 100 ms lease interval, the
// least that may lease a rate) and an 8-an-hour one.
class RateLeaseNodeTest : public LearningFleetTest {
 protected:
  void SetUp() override {
    std::vector<Rule> rules;
    rules.push_back(globalRule(1, "per-second", 10, kSecond));
    rules.push_back(globalRule(2, "hourly", 8, kHour));
    rules_ = std::make_shared<const RuleSet>(std::move(rules), 1);
    a_ = std::make_unique<Node>("node-a", redis_, rules_, now_);
    a_->up();
    ASSERT_TRUE(a_->broker().leasing());
    ASSERT_FALSE(a_->broker().learning(*rules_->find("per-second"), now_));
  }

  // Acquires `count` times on "k" at the same instant; how many passed.
  int atOnce(std::string_view rule, int count) {
    int allowed = 0;
    for (int i = 0; i < count; ++i) allowed += a_->acquire(rule, "k") ? 1 : 0;
    return allowed;
  }
};

// Verifies that a fresh key of 10/s with a burst of 10 admits its burst at
// once: its bucket is not drained, so no rate stands in for it.
TEST_F(RateLeaseNodeTest, AFreshKeyOfTenASecondAdmitsItsBurstOfTenAtOnce) {
  EXPECT_EQ(atOnce("per-second", 10), 10);
  EXPECT_EQ(atOnce("per-second", 5), 0);
}

// Verifies that a rule refilling less than a unit per lease interval (8 an
// hour) admits its 8 and never asks for a rate, however hot the key.
TEST_F(RateLeaseNodeTest, EightAnHourAdmitsEightAndNeverLeasesARate) {
  EXPECT_EQ(atOnce("hourly", 20), 8);
  EXPECT_EQ(acquires(*a_, "hourly", 500), 0);
  EXPECT_EQ(redis_.rateOps(), 0);
}

// Verifies the switch: a key hot past its limit spends the burst from
// Redis's bucket, and once a lease finds the bucket drained it holds a
// rate, which then refills its slice at 10/s with no call to Redis
// but the rate's renewal.
TEST_F(RateLeaseNodeTest, AHotKeyHoldsARateOnlyOnceItsBucketRanDry) {
  EXPECT_EQ(atOnce("per-second", 10), 10);  // the lease that emptied the bucket may ask for a rate
  // 3x the limit for 2 s: one acquire every 33 ms.
  int allowed = 0;
  for (int i = 0; i < 60; ++i) {
    now_ += 100 * kMs / 3;
    allowed += a_->acquire("per-second", "k") ? 1 : 0;
  }
  EXPECT_GE(redis_.rateOps(), 1);
  // About 20 refilled in 2 s, a unit either way for where the refills fell.
  EXPECT_GE(allowed, 19);
  EXPECT_LE(allowed, 21);
  const int calls = redis_.leases();
  for (int i = 0; i < 60; ++i) {
    now_ += 100 * kMs / 3;
    a_->acquire("per-second", "k");
  }
  // Renewals only: one per kMaxRenewNs begun.
  EXPECT_LE(redis_.leases() - calls, (2 * kSecond + rate_lease::kMaxRenewNs - 1) / rate_lease::kMaxRenewNs);
}

// Verifies that a key holding its rule's whole rate gets its burst back
// after a pause: tokens refill its slice up to the burst's share of its
// rate, not one lease interval's, as a token bucket of 10 would.
TEST_F(RateLeaseNodeTest, AKeyHoldingARateGetsItsBurstBackAfterAPause) {
  EXPECT_EQ(atOnce("per-second", 10), 10);
  for (int i = 0; i < 60; ++i) {
    now_ += 100 * kMs / 3;
    a_->acquire("per-second", "k");
  }
  ASSERT_GE(redis_.rateOps(), 1);
  now_ += kSecond;
  EXPECT_EQ(atOnce("per-second", 15), 10);
}

// Verifies that a key whose token lease finds the bucket kept empty by
// another node's rate (the whole limit, held 5 s: Redis's wait runs to its
// end) asks again within one lease interval, as a rate, so that its demand
// is recorded and the holder hears of it: not at Redis's wait, nor at the
// negative cache's 1 s recheck.
TEST_F(RateLeaseNodeTest, ATokenLeaseThatAnotherNodesRateLeftEmptyAsksForARateWithinAnInterval) {
  EXPECT_EQ(atOnce("per-second", 10), 10);
  for (int i = 0; i < 30; ++i) {
    now_ += 100 * kMs / 3;
    a_->acquire("per-second", "k");
  }
  ASSERT_GE(redis_.rateOps(), 1);
  Node b("node-b", redis_, rules_, now_);
  b.up();
  ASSERT_TRUE(b.broker().leasing());
  redis_.tokens(stateKey("per-second"), 10) = 0;  // what refilled before the rate: spent
  const int ops = redis_.rateOps();
  const int leases = redis_.leases();
  // Cold: answered from the share at once, while its first lease, of
  // tokens, finds nothing.
  b.acquire("per-second", "k");
  ASSERT_EQ(redis_.leases(), leases + 1);
  ASSERT_EQ(redis_.rateOps(), ops);
  int64_t asked_after_ns = -1;
  for (int64_t t = 0; t <= 200 * kMs && asked_after_ns < 0; t += 5 * kMs) {
    now_ += 5 * kMs;
    b.acquire("per-second", "k");
    if (redis_.rateOps() > ops) asked_after_ns = t + 5 * kMs;
  }
  ASSERT_GT(asked_after_ns, 0) << "no rate asked within 200 ms";
  EXPECT_LE(asked_after_ns, 100 * kMs + 5 * kMs);
}

// One node of eight on 80/s with a burst of 80 (its equal share: 10/s), the
// others idle: hot, it holds the whole rate.
// What the whole rate of 80/s refills in 2 s of fallback: 63/64 of 160.
constexpr int kFallback80In2s = 2 * 80 * (slice::kFallbackRateParts - 1) / slice::kFallbackRateParts;

class RateFallbackTest : public RateLeaseNodeTest {
 protected:
  void SetUp() override {
    std::vector<Rule> rules;
    rules.push_back(globalRule(1, "per-second", 80, kSecond));
    rules_ = std::make_shared<const RuleSet>(std::move(rules), 8);
    a_ = std::make_unique<Node>("node-a", redis_, rules_, now_);
    a_->up();
    ASSERT_TRUE(a_->broker().leasing());
  }

  // Acquires at 3x the limit (240/s) for `ns`; how many passed, and
  // whether every answer was in mode `mode`.
  int hot(int64_t ns, Mode mode, bool* all_in_mode) {
    int allowed = 0;
    *all_in_mode = true;
    for (int64_t t = 0; t < ns; t += kSecond / 240) {
      now_ += kSecond / 240;
      Answer answer = a_->ask("per-second", "k");
      allowed += answer.allowed ? 1 : 0;
      *all_in_mode = *all_in_mode && answer.modes.front() == mode;
    }
    return allowed;
  }
};

// Verifies the demand-weighted fallback share: through an outage a key that
// held the rule's whole rate keeps admitting at 63/64 of that rate
// (slice::kFallbackRateParts; mode fallback) until the rate ends, lease_ttl
// after its last renewal, and past that end until rate_lease::
// kFallbackHoldNs after the outage began, and only then at its equal
// share, limit / 8.
TEST_F(RateFallbackTest, AKeyHoldingARateSpendsItThroughAnOutageThenTheEqualShare) {
  bool in_mode = false;
  hot(kSecond, Mode::kNormal, &in_mode);
  ASSERT_GE(redis_.rateOps(), 1);
  a_->down();
  ASSERT_FALSE(a_->broker().leasing());
  // The rate (80/s) holds at least the first 2 s of the outage: the lease
  // lasts 5 s from its last renewal, due 2.5 s after it was sent.
  int allowed = hot(2 * kSecond, Mode::kFallback, &in_mode);
  EXPECT_TRUE(in_mode);
  EXPECT_GE(allowed, kFallback80In2s - 2);
  EXPECT_LE(allowed, kFallback80In2s);  // from the opening, its refill alone
  // Past the rate's end (within 4 s of the outage: its one op was sent in
  // the second before), within the hold: the rate still, and the burst of
  // 80 its slice saved up while the key was idle (a rate of the whole
  // limit refills its slice to the whole burst).
  now_ += 3 * kSecond;
  allowed = hot(2 * kSecond, Mode::kFallback, &in_mode);
  EXPECT_TRUE(in_mode);
  EXPECT_GE(allowed, kFallback80In2s + 80 - 2);
  EXPECT_LE(allowed, kFallback80In2s + 80 + 1);
  // Past the hold, 10 s after the outage began: the equal share, 10/s (its
  // burst of 10 first).
  now_ += rate_lease::kFallbackHoldNs - 7 * kSecond;
  allowed = hot(2 * kSecond, Mode::kFallback, &in_mode);
  EXPECT_TRUE(in_mode);
  EXPECT_GE(allowed, 2 * 10);
  EXPECT_LE(allowed, 2 * 10 + 10 + 1);
}

// Verifies that a recovery that fails goes on with the outage it was in:
// past the rate's end, and within the hold from the first opening, the key
// still spends its rate (not the equal share of 10/s from the second one),
// from the second opening, with what its slice saved up meanwhile dropped.
TEST_F(RateFallbackTest, ARecoveryThatFailsGoesOnWithTheOutageItWasIn) {
  bool in_mode = false;
  hot(kSecond, Mode::kNormal, &in_mode);
  ASSERT_GE(redis_.rateOps(), 1);
  a_->down();
  const int64_t opened = now_;
  hot(2 * kSecond, Mode::kFallback, &in_mode);
  now_ += 3 * kSecond;  // past the rate's end, as above
  a_->recoveryFails();
  ASSERT_FALSE(a_->broker().leasing());
  EXPECT_EQ(a_->broker().lastOpenedNs(), opened);
  const int allowed = hot(2 * kSecond, Mode::kFallback, &in_mode);
  EXPECT_TRUE(in_mode);
  EXPECT_GE(allowed, kFallback80In2s - 2);
  EXPECT_LE(allowed, kFallback80In2s);  // from the new opening, its refill alone
}

// Verifies that a failover can never let a rate pass the limit unknown to
// the new master: the promoted replica lacks the rate's last renewal, so
// what the key admitted on its rate through the outage is debited to it,
// and the rate ends at the change, where a slice refilling on at 80/s
// would admit beside a bucket that refills at the whole limit. Learning
// then asks the new master for the rate again, which it counts: the key
// admits no more than the limit.
TEST_F(RateFallbackTest, AFailoverDebitsWhatTheRateAdmittedAndEndsIt) {
  bool in_mode = false;
  hot(kSecond, Mode::kNormal, &in_mode);
  ASSERT_GE(redis_.rateOps(), 1);
  a_->down();
  const int64_t debited = redis_.debited();
  const int spent = hot(2 * kSecond, Mode::kFallback, &in_mode);
  ASSERT_TRUE(in_mode);
  ASSERT_GE(spent, kFallback80In2s - 2);
  redis_.failover("run-2");
  a_->up();
  ASSERT_TRUE(a_->broker().leasing());
  const Rule& rule = *rules_->find("per-second");
  ASSERT_TRUE(a_->broker().learning(rule, now_));
  EXPECT_EQ(redis_.debited() - debited, spent);
  const int ops = redis_.rateOps();  // the give-up at the change included
  const int learning = hot(kSecond, Mode::kNormal, &in_mode);
  EXPECT_GT(redis_.rateOps(), ops);  // the rate, asked of the new master
  EXPECT_LE(learning, 80 + 1);
}

// Verifies that the same master after an outage keeps the rate (it holds
// and charges it), and is debited what the rate admitted all the same, as
// the shares' admissions are: charged over the outage, it adds nothing to
// a bucket that counted the rate.
TEST_F(RateFallbackTest, TheSameMasterKeepsTheRateAndIsDebitedWhatItAdmitted) {
  bool in_mode = false;
  hot(kSecond, Mode::kNormal, &in_mode);
  ASSERT_GE(redis_.rateOps(), 1);
  a_->down();
  const int64_t debited = redis_.debited();
  const int spent = hot(kSecond, Mode::kFallback, &in_mode);
  ASSERT_TRUE(in_mode);
  a_->up();
  ASSERT_TRUE(a_->broker().leasing());
  EXPECT_EQ(redis_.debited() - debited, spent);
  EXPECT_FALSE(a_->broker().learning(*rules_->find("per-second"), now_));
  // Its rate refills on: past what the equal share (10/s, burst 10) admits.
  EXPECT_GT(hot(kSecond / 2, Mode::kNormal, &in_mode), 5 + 10 + 1);
}

// Verifies that only what a rate admits while Redis is unreachable is
// debited: after an outage, its units spent while Redis is up again (the
// same lone entry deciding each question) are counted nowhere, so a later
// outage that admits nothing debits nothing.
TEST_F(RateFallbackTest, UnitsARateSpendsWhileRedisIsUpAreNeverDebited) {
  bool in_mode = false;
  hot(kSecond, Mode::kNormal, &in_mode);
  ASSERT_GE(redis_.rateOps(), 1);
  a_->down();
  ASSERT_GT(hot(kSecond / 2, Mode::kFallback, &in_mode), 0);
  now_ += kSecond / 4;
  ASSERT_TRUE(a_->acquire("per-second", "k"));  // the last question: allowed on the rate
  a_->up();
  now_ += kSecond / 2;
  ASSERT_TRUE(a_->acquire("per-second", "k"));  // the rate's slice refilled meanwhile
  const int64_t debited = redis_.debited();
  a_->down();
  a_->up();
  EXPECT_EQ(redis_.debited(), debited);
}

// Verifies that a peek and a reserve agree with an acquire during an outage
// on a key holding a rate: they answer from the rate's slice (39 units
// after a 0.5 s pause at 63/64 of 80/s from the opening), not from the
// equal share (its burst of 10); a settle below the estimate gives the rest
// back to that slice, and the debit counts what the rate admitted net of
// it.
TEST_F(RateFallbackTest, PeekAndReserveDuringAnOutageUseTheRateAsAcquireDoes) {
  bool in_mode = false;
  hot(kSecond, Mode::kNormal, &in_mode);
  ASSERT_GE(redis_.rateOps(), 1);
  a_->down();
  const int64_t debited = redis_.debited();
  now_ += kSecond / 2;
  Answer peeked = a_->question(Method::kPeek, Item{.rule = "per-second", .key = "k", .cost = 20});
  ASSERT_FALSE(peeked.failed) << peeked.message;
  EXPECT_TRUE(peeked.allowed);
  EXPECT_EQ(peeked.modes.front(), Mode::kFallback);
  Answer short_of = a_->question(Method::kPeek, Item{.rule = "per-second", .key = "k", .cost = 60});
  EXPECT_FALSE(short_of.allowed);
  EXPECT_GT(short_of.decisions.front().retry_after_ms, 0);

  Answer reserved = a_->question(Method::kReserve, Item{.rule = "per-second", .key = "k", .cost = 30});
  ASSERT_FALSE(reserved.failed) << reserved.message;
  ASSERT_TRUE(reserved.allowed);
  EXPECT_EQ(reserved.modes.front(), Mode::kFallback);
  Answer settled = a_->question(Method::kSettle, Item{.rule = "per-second", .key = "k", .cost = 10,
                                                      .reservation = reserved.reservation});
  ASSERT_FALSE(settled.failed) << settled.message;
  EXPECT_EQ(settled.refunded, 20);
  // The refund is the rate's again: 29 units at once.
  EXPECT_TRUE(a_->acquire("per-second", "k", 29));
  EXPECT_FALSE(a_->acquire("per-second", "k"));
  a_->up();
  EXPECT_EQ(redis_.debited() - debited, 10 + 29);
}

// Verifies that without a rate an outage answers from the equal share at
// once: a key on token leases (its bucket never ran dry) gets limit / 8.
TEST_F(RateFallbackTest, AKeyOnTokenLeasesFallsBackToTheEqualShareAtOnce) {
  EXPECT_EQ(atOnce("per-second", 20), 20);
  ASSERT_EQ(redis_.rateOps(), 0);
  a_->down();
  bool in_mode = false;
  int allowed = hot(kSecond, Mode::kFallback, &in_mode);
  EXPECT_TRUE(in_mode);
  EXPECT_GE(allowed, 10);
  EXPECT_LE(allowed, 10 + 10 + 1);
}

// Verifies that a light node beside a hot one is not starved by the hot
// one's rate: once its token lease finds the bucket drained it asks for a
// rate too, the max-min division records its demand, and within a few
// renewals it admits what it asks (8/s of 80/s) while the hot node keeps
// the rest; the rates never sum past the limit.
TEST_F(RateFallbackTest, ALightNodeBesideAHotOneGetsItsDemandAsARate) {
  Node b("node-b", redis_, rules_, now_);
  b.up();
  bool in_mode = false;
  hot(kSecond, Mode::kNormal, &in_mode);  // node A holds the whole rate
  ASSERT_GE(redis_.rateOps(), 1);
  int light = 0;
  int hot_allowed = 0;
  for (int64_t t = 0; t < 10 * kSecond; t += kSecond / 240) {
    now_ += kSecond / 240;
    hot_allowed += a_->ask("per-second", "k").allowed ? 1 : 0;
    if (t % (kSecond / 8) < kSecond / 240 && t >= 5 * kSecond) light += b.acquire("per-second", "k") ? 1 : 0;
    else if (t % (kSecond / 8) < kSecond / 240) b.acquire("per-second", "k");
  }
  // Over the last 5 s B asked 40 times (8/s) and got nearly all of them.
  EXPECT_GE(light, 36);
  EXPECT_LE(hot_allowed + light, 10 * 80 + 80 + 2 * 8);
}

// Verifies on a simulated clock that a light node's rate settles on its
// demand within a second, not at its first renewal 2.5 s later: node B at
// 171.4/s (one request every 35/6 ms) beside node A at 3x a 2,000/s limit
// with a burst of 40. B's first asks rest on a few ms and then one
// interval of its requests; it renews at four times the time since its
// previous op (rate_lease::settleNs) and asks 171-173/s from 500 ms on.
// What it holds above its demand A cannot use: an ask of 180 would waste
// 8.6/s.
TEST_F(RateLeaseNodeTest, ALightNodesRateSettlesOnItsDemandWithinASecond) {
  std::vector<Rule> rules;
  rules.push_back(globalRule(1, "per-second", 2'000, kSecond));
  rules.front().limits.front().burst = 40;
  rules_ = std::make_shared<const RuleSet>(std::move(rules), 2);
  a_ = std::make_unique<Node>("node-a", redis_, rules_, now_);
  a_->up();
  Node b("node-b", redis_, rules_, now_);
  b.up();
  const int64_t start_ns = now_;
  const int64_t hot_gap_ns = kSecond / 6'000;
  const int64_t light_gap_ns = 35 * kMs / 6;
  int64_t next_light_ns = start_ns;
  while (now_ - start_ns < 2 * kSecond) {
    now_ += hot_gap_ns;
    a_->acquire("per-second", "k");
    if (now_ >= next_light_ns) {
      b.acquire("per-second", "k");
      next_light_ns += light_gap_ns;
    }
  }
  std::vector<int64_t> b_asks;
  int64_t last_ask_ns = 0;
  for (const FakeRedisState::RateAsk& ask : redis_.rateAsks()) {
    if (ask.node != "node-b") continue;
    b_asks.push_back(ask.rate);
    last_ask_ns = ask.at_ns;
    if (ask.at_ns - start_ns >= 500 * kMs) {
      EXPECT_GE(ask.rate, 171) << "at " << (ask.at_ns - start_ns) / kMs << " ms";
      EXPECT_LE(ask.rate, 173) << "at " << (ask.at_ns - start_ns) / kMs << " ms";
    }
  }
  ASSERT_GE(b_asks.size(), 3u);
  // It asked again after 500 ms (settling), and holds its demand to the end.
  EXPECT_GE(last_ask_ns - start_ns, 500 * kMs);
}

}  // namespace
}  // namespace sluice

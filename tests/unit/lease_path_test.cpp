// The lease path (lease_path.h): a leasable global rule's acquires and peeks
// on its slice, with an in-process LeaseBroker (the test plays the control
// thread's lease replies), on a simulated clock.
#include "lease_path.h"

#include <gtest/gtest.h>

#include <vector>

#include "key_table.h"
#include "entry.h"
#include "lease.h"
#include "metrics.h"
#include "policy.h"
#include "rate_lease.h"
#include "waiting.h"

namespace sluice {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kS = 1000 * kMs;
constexpr int64_t kStart = 5 * kS;

Rule globalBucket(uint32_t id, std::string name, int64_t limit) {
  Rule rule;
  rule.id = id;
  rule.name = std::move(name);
  rule.scope = Scope::kGlobal;
  rule.algorithm = Algorithm::kTokenBucket;
  rule.on_redis_down = RedisDownPolicy::kLocal;
  rule.limits = {Limit{.limit = limit, .period_ns = 1 * kS, .burst = limit}};
  return rule;
}

std::vector<Rule> testRules() {
  std::vector<Rule> rules = {globalBucket(1, "g", 10), globalBucket(2, "g_wait", 2),
                             globalBucket(3, "hot", 1000), globalBucket(4, "window", 10)};
  rules[1].max_wait_ns = 1 * kS;
  rules[2].limits.front().burst = 30;
  rules[3].algorithm = Algorithm::kFixedWindow;
  return rules;
}

class LeasePathTest : public ::testing::Test {
 protected:
  LeasePathTest() : keys_(options()), reader_(keys_.registerReader()), guard_(keys_, reader_) {
    broker_.setBreaker(Breaker::kHalfOpen, kStart);
    broker_.setBreaker(Breaker::kClosed, kStart);
  }
  static KeyTableOptions options() {
    KeyTableOptions options;
    options.max_keys = 16;
    options.max_readers = 1;
    return options;
  }
  const Rule& rule(std::string_view name) const { return *rules_.find(name); }
  Outcome acquire(std::string_view name, int64_t cost, bool may_wait = false) {
    verdict_ = Verdict{};
    Asker asker;
    asker.deadline_ns = now_ns_ + 50 * kMs;
    asker.may_wait = may_wait;
    return path_.acquire(rules_, rule(name), {name, "k", cost, -1}, now_ns_, asker, &verdict_);
  }
  // What a lease reply does to the key's slice (lease_manager.cpp): units
  // granted, Redis's "nothing until" (0: none) and what Redis had left
  // (-1: the answer is not recorded).
  void reply(std::string_view name, int64_t units, int64_t deny_until_ns = 0,
             int64_t redis_left = -1) {
    KeyTable::Entry* entry = keys_.find(rule(name).id, "k");
    ASSERT_NE(entry, nullptr);
    auto words = entry->state();
    if (redis_left >= 0) slice::noteRedisLeft(words, rule(name), redis_left, now_ns_);
    words[slice::kUnits].fetch_add(static_cast<uint64_t>(units));
    words[slice::kDenyUntil].store(static_cast<uint64_t>(deny_until_ns));
    words[slice::kFlags].fetch_or(slice::kWarm);
    words[slice::kFlags].fetch_and(~slice::kInFlight);
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
  LeaseBroker broker_{100 * kMs};
  Waiting waiting_{metrics_.shard(0), &broker_, 50 * kMs};
  PolicyPath policy_{keys_, metrics_.shard(0), &broker_};
  LeasePath path_{keys_, metrics_.shard(0), &broker_, waiting_, policy_};
  RuleSet rules_{testRules(), 2};
  int64_t now_ns_ = kStart;
  Verdict verdict_;
};

// Verifies an acquire on a cold key asks for one lease, big enough for its
// cost, and waits for it.
TEST_F(LeasePathTest, AColdKeyAsksForOneLeaseAndWaitsForIt) {
  EXPECT_EQ(acquire("g", 3, true), Outcome::kWaitsForLease);
  EXPECT_EQ(acquire("g", 1, true), Outcome::kWaitsForLease);
  std::vector<LeaseRequest> requests = sent();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].kind, LeaseRequest::Kind::kLease);
  EXPECT_GE(requests[0].need, 3);
  EXPECT_EQ(waiting_.count(WaitKind::kLease), 2u);
}

// Verifies a window's slice that runs low sends no refill ahead when its
// window ends before the key's demand would ask for another unit
// (slice::windowEndsFirst): the next request finds it empty and asks for
// itself. With the window's end after that unit, the refill goes ahead.
TEST_F(LeasePathTest, ASliceWhoseWindowEndsFirstAsksForNoRefillAhead) {
  ASSERT_EQ(acquire("window", 1, true), Outcome::kWaitsForLease);
  ASSERT_EQ(sent().size(), 1u);
  auto words = keys_.find(rule("window").id, "k")->state();
  for (const int64_t window_left : {60 * kMs, 800 * kMs}) {
    reply("window", 1);
    words[slice::kExpires].store(static_cast<uint64_t>(now_ns_ + window_left));
    // A measurement of one lease interval that this acquire's unit ends:
    // one unit an interval (100 ms).
    words[slice::kDemand].store(0);
    words[slice::kDemandSince].store(static_cast<uint64_t>(now_ns_ - 100 * kMs));
    ASSERT_EQ(acquire("window", 1), Outcome::kAnswered);
    ASSERT_TRUE(verdict_.decision.allowed);
    ASSERT_EQ(verdict_.mode, Mode::kNormal);
    if (window_left < 100 * kMs) {
      EXPECT_TRUE(sent().empty()) << "a refill ahead the window ends before";
      EXPECT_EQ(acquire("window", 1, true), Outcome::kWaitsForLease);
      EXPECT_EQ(sent().size(), 1u);
    } else {
      EXPECT_EQ(sent().size(), 1u) << "no refill ahead of the next unit";
    }
  }
}

// Verifies a request that may not wait, on a key with no units yet, is
// decided by the rule's policy: "local" spends on the node's share.
TEST_F(LeasePathTest, ARequestThatMayNotWaitIsDecidedOnTheShare) {
  EXPECT_EQ(acquire("g", 5), Outcome::kAnswered);
  EXPECT_FALSE(verdict_.failed);
  EXPECT_EQ(verdict_.mode, Mode::kFallback);
  EXPECT_TRUE(verdict_.decision.allowed);
  EXPECT_EQ(acquire("g", 1), Outcome::kAnswered);
  EXPECT_FALSE(verdict_.decision.allowed);  // the share of 10 over 2 nodes is spent
}

// Verifies granted units are spent in normal mode, one acquire at a time,
// and the verdict says they came from the key's slice.
TEST_F(LeasePathTest, GrantedUnitsAreSpentInNormalMode) {
  ASSERT_EQ(acquire("g", 1, true), Outcome::kWaitsForLease);
  reply("g", 3);
  EXPECT_EQ(acquire("g", 2), Outcome::kAnswered);
  EXPECT_EQ(verdict_.mode, Mode::kNormal);
  EXPECT_TRUE(verdict_.decision.allowed);
  EXPECT_EQ(verdict_.decision.remaining, 1);
  EXPECT_EQ(verdict_.taken.cost, 2);
  EXPECT_EQ(verdict_.taken.slice.data(), slice::of(keys_.find(rule("g").id, "k")->state()).data());
}

// Verifies a request that may not wait, decided on the share, says what it
// spent there and which share to note for the debit.
TEST_F(LeasePathTest, AFallbackSpendIsTakenFromTheShareAndNotedByItsGroup) {
  ASSERT_EQ(acquire("g", 2), Outcome::kAnswered);
  EXPECT_EQ(verdict_.mode, Mode::kFallback);
  EXPECT_TRUE(verdict_.taken.slice.empty());
  EXPECT_EQ(verdict_.taken.cost, 2);
  EXPECT_NE(verdict_.taken.limited, nullptr);
  EXPECT_EQ(verdict_.taken.share, rules_.fallbackShare(rule("g")));
}

// Verifies an allowed answer reports the fleet's remaining as far as the
// node can tell: the slice's units plus what Redis had left at the lease's
// answer, plus what refilled since (10 a second: a unit per 100 ms), never
// more than the burst; and that reset_after_ms follows from it.
TEST_F(LeasePathTest, AnAllowedAnswerReportsTheSlicePlusWhatRedisHadLeft) {
  ASSERT_EQ(acquire("g", 1, true), Outcome::kWaitsForLease);
  reply("g", 3, 0, 5);
  ASSERT_EQ(acquire("g", 1), Outcome::kAnswered);
  EXPECT_TRUE(verdict_.decision.allowed);
  EXPECT_EQ(verdict_.decision.remaining, 2 + 5);
  EXPECT_EQ(verdict_.decision.reset_after_ms, 300);  // 3 units short of 10
  now_ns_ += 250 * kMs;
  ASSERT_EQ(acquire("g", 1), Outcome::kAnswered);
  EXPECT_EQ(verdict_.decision.remaining, 1 + 5 + 2);
  now_ns_ += 10 * kS;
  ASSERT_EQ(acquire("g", 1), Outcome::kAnswered);
  EXPECT_EQ(verdict_.decision.remaining, 10);
  EXPECT_EQ(verdict_.decision.reset_after_ms, 0);
}

// Verifies a denial reports nothing remaining, whatever Redis had left: a
// cost of 5 where Redis had 4 and said "nothing until t".
TEST_F(LeasePathTest, ADenialReportsNothingRemaining) {
  ASSERT_EQ(acquire("g", 5, true), Outcome::kWaitsForLease);
  reply("g", 0, kStart + 300 * kMs, 4);
  ASSERT_EQ(acquire("g", 5), Outcome::kAnswered);
  EXPECT_FALSE(verdict_.decision.allowed);
  EXPECT_EQ(verdict_.decision.remaining, 0);
}

// Verifies a peek on a key whose slice is spent reports what Redis had
// left, not 0.
TEST_F(LeasePathTest, APeekOnASpentSliceReportsWhatRedisHadLeft) {
  ASSERT_EQ(acquire("g", 1, true), Outcome::kWaitsForLease);
  reply("g", 1, 0, 6);
  ASSERT_EQ(acquire("g", 1), Outcome::kAnswered);
  EXPECT_EQ(verdict_.decision.remaining, 6);
  Mode mode = Mode::kLocal;
  Decision peeked = path_.look(rules_, rule("g"), "k", now_ns_, 0, &mode);
  EXPECT_TRUE(peeked.allowed);
  EXPECT_EQ(peeked.remaining, 6);
  EXPECT_EQ(mode, Mode::kNormal);
}

// Verifies Redis's "nothing until t" is kept: acquires are denied here
// until then, with that retry hint.
TEST_F(LeasePathTest, RedisSayingNothingUntilADeadlineDeniesLocallyUntilThen) {
  ASSERT_EQ(acquire("g", 1, true), Outcome::kWaitsForLease);
  reply("g", 0, kStart + 300 * kMs);
  EXPECT_EQ(acquire("g", 1), Outcome::kAnswered);
  EXPECT_FALSE(verdict_.decision.allowed);
  EXPECT_EQ(verdict_.decision.retry_after_ms, 300);
  EXPECT_EQ(metrics_.snapshot().lease_negative_hits, 1u);
}

// Verifies a request that may wait, denied until a time within its wait,
// stands in the key's line and waits until then.
TEST_F(LeasePathTest, ARequestDeniedUntilWithinItsWaitWaitsUntilDue) {
  ASSERT_EQ(acquire("g_wait", 1), Outcome::kAnswered);  // on the share; a lease is asked for
  reply("g_wait", 0, kStart + 300 * kMs);
  EXPECT_EQ(acquire("g_wait", 1, true), Outcome::kWaitsUntilDue);
  EXPECT_EQ(waiting_.count(WaitKind::kDue), 1u);
  EXPECT_EQ(waiting_.nextDeadlineNs(), kStart + 300 * kMs);
}

// Verifies a request that may wait, behind one that waits for the key's
// lease, waits for its turn in the key's line.
TEST_F(LeasePathTest, ARequestBehindAWaiterWaitsInLine) {
  ASSERT_EQ(acquire("g_wait", 1, true), Outcome::kWaitsForLease);  // leads the empty line
  EXPECT_EQ(acquire("g_wait", 1, true), Outcome::kWaitsInLine);
  EXPECT_EQ(waiting_.count(WaitKind::kLine), 1u);
}

// Verifies a cost over what the fleet could ever lease never passes.
TEST_F(LeasePathTest, ACostOverTheLimitNeverPasses) {
  EXPECT_EQ(acquire("g", 11), Outcome::kAnswered);
  EXPECT_TRUE(verdict_.decision.cost_exceeds_limit);
  EXPECT_TRUE(sent().empty());
}

// Verifies a peek on a key with no slice reports a fresh key and creates
// nothing.
TEST_F(LeasePathTest, APeekOnAKeyWithNoSliceReportsAFreshKey) {
  Mode mode = Mode::kLocal;
  Decision peeked = path_.look(rules_, rule("g"), "k", now_ns_, 0, &mode);
  EXPECT_TRUE(peeked.allowed);
  EXPECT_EQ(peeked.remaining, 10);
  EXPECT_EQ(mode, Mode::kNormal);
  EXPECT_EQ(keys_.find(rule("g").id, "k"), nullptr);
}

// Redis restarts empty while the key "hot" (1,000/s, burst 30, N = 2: an
// equal share of 500/s) holds a rate of 900/s and wants 1,000/s: the
// breaker opens at kStart + 1 s and Redis is back at kStart + 6 s, and the
// rule then learns until kStart + 21 s (a long reconnect backoff).
class LearningTest : public LeasePathTest {
 protected:
  static constexpr int64_t kOpened = kStart + 1 * kS;
  static constexpr int64_t kBack = kStart + 6 * kS;
  static constexpr int64_t kRateEnd = kStart + 5 * kS;
  static constexpr int64_t kReopened = kStart + 5'500 * kMs;
  slice::Words words() { return slice::of(keys_.find(rule("hot").id, "k")->state()); }
  // With `failed_recovery`, a first recovery fails (the breaker opens again
  // from half-open at kReopened, past the rate's end).
  void restartEmpty(bool held_rate, bool failed_recovery = false) {
    ASSERT_EQ(acquire("hot", 1, true), Outcome::kWaitsForLease);
    sent();
    words()[slice::kFlags].fetch_and(~slice::kInFlight);
    words()[slice::kRate].store(100 * slice::kRateParts);  // units per lease interval: 1,000/s
    if (held_rate) {
      slice::applyRate(words(), rate_lease::nsPerUnit(limit(), 900), rate_lease::capUnits(limit(), 900, 100 * kMs),
                       kRateEnd, now_ns_ + 2 * kS, now_ns_);
    }
    broker_.setBreaker(Breaker::kOpen, kOpened);
    if (failed_recovery) {
      broker_.setBreaker(Breaker::kHalfOpen, kReopened - 100 * kMs);
      broker_.setBreaker(Breaker::kOpen, kReopened);
    }
    broker_.setBreaker(Breaker::kHalfOpen, kBack);
    slice::endRate(words(), kBack);  // LeaseManager::endRates
    broker_.startLearning(kBack, 5 * kS, 15 * kS, 15 * kS);
    broker_.setBreaker(Breaker::kClosed, kBack);
    now_ns_ = kBack;
    words()[slice::kDemand].store(0);  // a measurement starts
    words()[slice::kDemandSince].store(static_cast<uint64_t>(kBack));
  }
  const Limit& limit() const { return rule("hot").limits.front(); }
  // The lease an acquire that may wait asks for (it must ask one).
  LeaseRequest askedLease() {
    EXPECT_EQ(acquire("hot", 1, true), Outcome::kWaitsForLease);
    std::vector<LeaseRequest> requests = sent();
    EXPECT_EQ(requests.size(), 1u);
    return requests.empty() ? LeaseRequest{} : requests[0];
  }
  // Acquires of 1 every ms for `ms` ms: how many were allowed.
  int64_t admitEveryMs(int64_t ms) {
    int64_t allowed = 0;
    for (int64_t i = 0; i < ms; i++, now_ns_ += kMs) {
      EXPECT_EQ(acquire("hot", 1), Outcome::kAnswered);
      EXPECT_EQ(verdict_.mode, Mode::kNormal);
      allowed += verdict_.decision.allowed ? 1 : 0;
    }
    return allowed;
  }
};

// Verifies that a key which held a rate when Redis went away asks the
// fresh state for that rate again (not the 1,000/s it wants), and once
// granted spends it past the equal share of 500/s: Redis counts it.
TEST_F(LearningTest, AKeyThatHeldARateAsksTheFreshStateForItAgain) {
  restartEmpty(true);
  ASSERT_TRUE(broker_.learning(rule("hot"), now_ns_));
  LeaseRequest asked = askedLease();
  EXPECT_EQ(asked.rate, 900);
  EXPECT_EQ(asked.n, 0);  // no tokens beside it
  slice::applyRate(words(), rate_lease::nsPerUnit(limit(), 900), rate_lease::capUnits(limit(), 900, 100 * kMs),
                   now_ns_ + 5 * kS, now_ns_ + 2 * kS, now_ns_);
  slice::unclaim(words());
  const int64_t allowed = admitEveryMs(1000);
  EXPECT_GE(allowed, 890);
  EXPECT_LE(allowed, 900 + 90);  // and the slice's cap at most
}

// Verifies that the rate is asked for only while the fallback's hold
// lasts (rate_lease::kFallbackHoldNs from the opening); after it, a token
// lease within the equal share, while the rule still learns.
TEST_F(LearningTest, TheLearnedRateIsAskedForOnlyUntilTheFallbacksHoldEnds) {
  restartEmpty(true);
  now_ns_ = kOpened + rate_lease::kFallbackHoldNs;
  ASSERT_TRUE(broker_.learning(rule("hot"), now_ns_));
  LeaseRequest asked = askedLease();
  EXPECT_EQ(asked.rate, -1);  // a token lease
  EXPECT_LE(asked.n, 515);   // the equal share: 500/s and a burst of 15
}

// Verifies that a recovery that failed (half-open, then open again after
// the rate's end) goes on with the outage that began at the first opening:
// the key asks for the rate it held when Redis went away, not its share.
TEST_F(LearningTest, ARecoveryThatFailedKeepsTheRateHeldWhenRedisWentAway) {
  restartEmpty(true, true);
  ASSERT_TRUE(broker_.learning(rule("hot"), now_ns_));
  EXPECT_EQ(broker_.lastOpenedNs(), kOpened);
  EXPECT_EQ(askedLease().rate, 900);
}

// Verifies that a key which held no rate learns on the equal share: a
// token lease, no more than the share has left.
TEST_F(LearningTest, AKeyWithoutARateLearnsOnTheEqualShare) {
  restartEmpty(false);
  LeaseRequest asked = askedLease();
  EXPECT_EQ(asked.rate, -1);
  EXPECT_LE(asked.n, 515);
}

}  // namespace
}  // namespace sluice

// Slices (lease.h): spending leased units, the negative cache, the in-flight
// claim, window expiry and batch sizing, on a fake clock.
#include "lease.h"
#include "penalty.h"
#include "limiter.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace sluice {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kInterval = 100 * kMs;

class SliceTest : public ::testing::Test {
 protected:
  std::span<std::atomic<uint64_t>> words() { return {words_.data(), words_.size()}; }
  void grant(int64_t units) {
    words_[slice::kUnits].fetch_add(static_cast<uint64_t>(units));
    words_[slice::kFlags].fetch_or(slice::kWarm);
    words_[slice::kFlags].fetch_and(~slice::kInFlight);
  }
  uint64_t flags() const { return words_[slice::kFlags].load(); }

  std::vector<std::atomic<uint64_t>> words_ = std::vector<std::atomic<uint64_t>>(slice::kWords);
};

// Verifies a cold key has nothing to spend, and that exactly one caller
// claims its lease until the answer clears the bit.
TEST_F(SliceTest, ColdKeyIsEmptyAndOneCallerClaimsTheLease) {
  slice::TakeResult first = slice::take(words(), 1 * kMs, 1);
  EXPECT_EQ(first.outcome, slice::Outcome::kEmpty);
  EXPECT_TRUE(first.cold);
  EXPECT_TRUE(first.must_request);
  slice::TakeResult second = slice::take(words(), 2 * kMs, 1);
  EXPECT_EQ(second.outcome, slice::Outcome::kEmpty);
  EXPECT_FALSE(second.must_request);  // in flight already
  grant(10);
  EXPECT_EQ(flags() & slice::kInFlight, 0u);
}

// Verifies units are spent exactly, all-or-nothing per cost, and refunds
// put them back.
TEST_F(SliceTest, SpendsExactlyWhatWasGranted) {
  grant(5);
  words_[slice::kBatch].store(4);  // low water: 1
  EXPECT_EQ(slice::take(words(), kMs, 3).left, 2);
  slice::TakeResult too_much = slice::take(words(), kMs, 3);
  EXPECT_EQ(too_much.outcome, slice::Outcome::kEmpty);
  EXPECT_EQ(words_[slice::kUnits].load(), 2u);  // nothing spent by the failure
  slice::refund(words(), 3);
  EXPECT_EQ(words_[slice::kUnits].load(), 5u);
}

// Verifies a refill is asked for once the slice falls under a quarter of
// the last batch, and only once while it is in flight.
TEST_F(SliceTest, RefillBelowLowWater) {
  grant(40);
  words_[slice::kBatch].store(40);  // low water 10
  for (int i = 0; i < 30; ++i) {
    EXPECT_FALSE(slice::take(words(), kMs, 1).must_request) << i;
  }
  slice::TakeResult at_low = slice::take(words(), kMs, 1);
  EXPECT_EQ(at_low.left, 9);
  EXPECT_TRUE(at_low.must_request);
  EXPECT_FALSE(slice::take(words(), kMs, 1).must_request);
}

// Verifies the negative cache: after "nothing until t" the key is denied
// locally until t, without claiming a lease, and may lease again after.
TEST_F(SliceTest, NegativeCacheDeniesUntilItsTime) {
  words_[slice::kDenyUntil].store(50 * kMs);
  slice::TakeResult denied = slice::take(words(), 10 * kMs, 1);
  EXPECT_EQ(denied.outcome, slice::Outcome::kDenied);
  EXPECT_EQ(denied.until_ns, 50 * kMs);
  EXPECT_FALSE(denied.must_request);
  EXPECT_EQ(slice::look(words(), 10 * kMs, 1).outcome, slice::Outcome::kDenied);
  slice::TakeResult later = slice::take(words(), 50 * kMs, 1);
  EXPECT_EQ(later.outcome, slice::Outcome::kEmpty);
  EXPECT_TRUE(later.must_request);
}

// Verifies a key whose lease failed follows its policy until the backoff
// ends.
TEST_F(SliceTest, FailedLeaseSendsTheKeyToItsPolicy) {
  grant(3);
  words_[slice::kFallbackUntil].store(20 * kMs);
  EXPECT_EQ(slice::take(words(), 10 * kMs, 1).outcome, slice::Outcome::kFallback);
  EXPECT_EQ(words_[slice::kUnits].load(), 3u);
  EXPECT_EQ(slice::take(words(), 20 * kMs, 1).outcome, slice::Outcome::kTaken);
}

// Verifies units of an ended window are dropped, never spent in the next.
TEST_F(SliceTest, WindowUnitsExpireWithTheirWindow) {
  grant(5);
  words_[slice::kExpires].store(100 * kMs);
  EXPECT_EQ(slice::take(words(), 99 * kMs, 1).outcome, slice::Outcome::kTaken);
  EXPECT_EQ(slice::look(words(), 100 * kMs, 1).outcome, slice::Outcome::kEmpty);
  slice::TakeResult after = slice::take(words(), 100 * kMs, 1);
  EXPECT_EQ(after.outcome, slice::Outcome::kEmpty);
  EXPECT_EQ(after.dropped, 4);
  EXPECT_EQ(words_[slice::kUnits].load(), 0u);
}

Rule bucketRule(int64_t limit, int64_t period_ns, int64_t burst) {
  Rule rule;
  rule.scope = Scope::kGlobal;
  rule.algorithm = Algorithm::kTokenBucket;
  rule.limits = {Limit{.limit = limit, .period_ns = period_ns, .burst = burst}};
  return rule;
}

// Verifies the batch follows demand (about one lease interval of it),
// never exceeds the node's share of the capacity, never goes below the
// cost, and that a warm key waits for a quarter batch.
TEST_F(SliceTest, BatchFollowsDemandWithinTheShare) {
  Rule rule = bucketRule(10'000, 1'000 * kMs, 1000);  // 1000 refill per interval
  // Cold: one request's cost.
  slice::Batch cold = slice::nextBatch(words(), 1 * kMs, 1, rule, 2, kInterval);
  EXPECT_EQ(cold.n, 1);
  EXPECT_EQ(cold.need, 1);
  grant(1);
  // 200 units asked for over 200 ms: 100 per interval.
  words_[slice::kDemand].store(200);
  slice::Batch warm = slice::nextBatch(words(), 201 * kMs, 1, rule, 2, kInterval);
  EXPECT_EQ(warm.n, 100);
  EXPECT_EQ(warm.need, 25);
  EXPECT_EQ(words_[slice::kDemand].load(), 0u);  // reset for the next estimate
  // Far more demand than the share (1000 / 2 nodes).
  words_[slice::kDemand].store(1'000'000);
  EXPECT_EQ(slice::nextBatch(words(), 301 * kMs, 1, rule, 2, kInterval).n, 500);
  // A cost above the demand estimate still gets a batch it can pay with.
  EXPECT_EQ(slice::nextBatch(words(), 401 * kMs, 7, rule, 2, kInterval).n, 7);
}

// Verifies a key that leases every few milliseconds (a contended one: each
// lease brings a few units) still sizes its batch by its rate over a whole
// lease interval, not by the few units asked for since the last lease.
TEST_F(SliceTest, FrequentLeasesMeasureDemandOverAWholeInterval) {
  Rule rule = bucketRule(600, 1'000 * kMs, 600);
  grant(1);
  auto lease = [&](int64_t at_ms, int64_t asked_since_ms_ago) {
    words_[slice::kDemand].fetch_add(static_cast<uint64_t>(asked_since_ms_ago));  // 1 a ms
    return slice::nextBatch(words(), at_ms * kMs, 1, rule, 1, kInterval);
  };
  EXPECT_EQ(lease(1, 1).n, 1);  // the first: what it asks for
  for (int64_t t = 6; t < 101; t += 5) {
    lease(t, 5);  // within the first interval: at least what it has seen
  }
  EXPECT_EQ(lease(101, 5).n, 101);   // 101 units over 100 ms (from 1 to 101)
  EXPECT_EQ(lease(106, 5).n, 101);   // the rate holds between measurements
  EXPECT_EQ(lease(1'106, 50).n, 6);  // 55 units over the next 1,005 ms
}

// Verifies the batch doubles its span of demand after every grant that left
// Redis plenty (kRoomyFactor times the grant), up to 2^kMaxBoost lease
// intervals and never past the share, and falls back to one interval after
// a grant that left little.
TEST_F(SliceTest, RoomyGrantsGrowTheBatchAndATightOneResetsIt) {
  Rule rule = bucketRule(1'000'000, 1'000 * kMs, 100'000);  // share 50,000 on 2 nodes
  grant(1);
  int64_t now = 0;
  auto next = [&] {
    words_[slice::kDemand].store(100);  // 100 per interval
    now += kInterval;
    return slice::nextBatch(words(), now, 1, rule, 2, kInterval).n;
  };
  EXPECT_EQ(next(), 100);  // no grant seen yet
  std::vector<int64_t> sizes;
  for (int i = 0; i < slice::kMaxBoost + 2; ++i) {
    slice::noteGrant(words(), 100, 100 * slice::kRoomyFactor);  // plenty left
    sizes.push_back(next());
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{200, 400, 800, 1600, 1600, 1600}));
  slice::noteGrant(words(), 1600, 1600 * slice::kRoomyFactor - 1);  // tight
  EXPECT_EQ(next(), 100);
  slice::noteGrant(words(), 100, 1000);
  EXPECT_EQ(next(), 200);
  slice::noteGrant(words(), 0, 1000);  // nothing granted: no growth
  EXPECT_EQ(next(), 100);
  // The share still caps a grown batch.
  words_[slice::kDemand].store(40'000);
  slice::noteGrant(words(), 100, 1'000'000);
  now += kInterval;
  EXPECT_EQ(slice::nextBatch(words(), now, 1, rule, 2, kInterval).n, 50'000);
}

// Verifies that a warm key waits for a quarter batch exactly when its
// algorithm refills (algorithm.h): a bucket's units trickle back within a
// lease interval, a window's do not, so a window asks only for the cost.
TEST_F(SliceTest, AWarmKeyWaitsForAQuarterBatchExactlyWhereItsAlgorithmRefills) {
  for (const AlgorithmTraits& row : kAlgorithmTraits) {
    if (!row.leases_slice) continue;
    for (std::atomic<uint64_t>& word : words_) word.store(0);
    Rule rule = bucketRule(10'000, 1'000 * kMs, 1000);
    rule.algorithm = row.algorithm;
    ASSERT_TRUE(leasable(rule)) << row.name;
    slice::nextBatch(words(), 1 * kMs, 1, rule, 2, kInterval);
    grant(1);
    words_[slice::kDemand].store(200);
    slice::Batch warm = slice::nextBatch(words(), 201 * kMs, 1, rule, 2, kInterval);
    EXPECT_EQ(warm.n, 100) << row.name;
    EXPECT_EQ(warm.need, row.refills ? 25 : 1) << row.name;
  }
}

// Verifies a slow bucket (8 an hour) never asks for more than one request's
// cost, so its last units are not stranded in Redis; nor does a window,
// whose units do not trickle back.
TEST_F(SliceTest, SlowBucketsAndWindowsNeedOnlyTheCost) {
  grant(1);
  words_[slice::kDemand].store(400);
  Rule slow = bucketRule(8, 3'600'000 * kMs, 8);
  slice::Batch batch = slice::nextBatch(words(), 500 * kMs, 1, slow, 1, kInterval);
  EXPECT_EQ(batch.n, 8);
  EXPECT_EQ(batch.need, 1);
  Rule window = slow;
  window.algorithm = Algorithm::kFixedWindow;
  words_[slice::kDemand].store(400);
  EXPECT_EQ(slice::nextBatch(words(), 900 * kMs, 1, window, 1, kInterval).need, 1);
}

// Verifies which rules lease and what their capacity is.
TEST(LeasableTest, OnlySingleLimitRateRulesLease) {
  Rule rule;
  rule.scope = Scope::kGlobal;
  rule.limits = {Limit{.limit = 10, .period_ns = 1'000 * kMs, .burst = 20}};
  for (Algorithm algorithm : {Algorithm::kTokenBucket, Algorithm::kGcra, Algorithm::kFixedWindow,
                              Algorithm::kSlidingWindow}) {
    rule.algorithm = algorithm;
    EXPECT_TRUE(leasable(rule)) << algorithmName(algorithm);
  }
  rule.algorithm = Algorithm::kSlidingLog;
  EXPECT_FALSE(leasable(rule));
  rule.algorithm = Algorithm::kConcurrency;
  EXPECT_FALSE(leasable(rule));
  rule.algorithm = Algorithm::kTokenBucket;
  rule.limits.push_back(rule.limits.front());
  EXPECT_FALSE(leasable(rule));  // several limits decide on the share
  rule.limits.pop_back();
  rule.scope = Scope::kLocal;
  EXPECT_FALSE(leasable(rule));
  EXPECT_EQ(leaseCapacity(Limit{.limit = 10, .period_ns = kMs, .burst = 20}), 20);
  EXPECT_EQ(leaseCapacity(Limit{.limit = 10, .period_ns = kMs, .burst = 0}), 10);
}

// Verifies a request asked again (after waiting for a lease or for its
// units) is not counted in the key's demand twice.
TEST_F(SliceTest, AskingAgainCountsNoDemand) {
  slice::take(words(), 1 * kMs, 3);
  EXPECT_EQ(words_[slice::kDemand].load(), 3u);
  slice::take(words(), 2 * kMs, 3, /*again=*/true);
  EXPECT_EQ(words_[slice::kDemand].load(), 3u);
  slice::take(words(), 3 * kMs, 2);
  EXPECT_EQ(words_[slice::kDemand].load(), 5u);
}

// Verifies that while requests stand in a key's line only the first may
// spend its units: a later request is told kQueued (with the negative
// cache's end when Redis said "nothing until t"), its demand still counted.
TEST_F(SliceTest, OnlyTheFirstInLineSpends) {
  grant(3);
  words_[slice::kFlags].fetch_or(slice::kLine);
  slice::TakeResult later = slice::take(words(), 1 * kMs, 1);
  EXPECT_EQ(later.outcome, slice::Outcome::kQueued);
  EXPECT_EQ(later.until_ns, 0);
  EXPECT_EQ(words_[slice::kUnits].load(), 3u);
  EXPECT_EQ(words_[slice::kDemand].load(), 1u);
  EXPECT_EQ(slice::look(words(), 1 * kMs, 1).outcome, slice::Outcome::kQueued);
  slice::TakeResult first = slice::take(words(), 1 * kMs, 1, true, /*first_in_line=*/true);
  EXPECT_EQ(first.outcome, slice::Outcome::kTaken);
  EXPECT_EQ(first.left, 2);
  words_[slice::kDenyUntil].store(static_cast<uint64_t>(50 * kMs));
  EXPECT_EQ(slice::take(words(), 2 * kMs, 1).until_ns, 50 * kMs);
}

// Verifies a key's line: tickets are first in the order they joined,
// whatever order they leave in; joining marks the slice and the last to
// leave clears the mark; a leaving first counts a promotion; a mark the
// line outlived (its last ticket left without the key's words) is cleared
// by standing().
TEST(WaitLinesTest, FirstComeFirstServedPerKey) {
  std::vector<std::atomic<uint64_t>> a(slice::kWords), b(slice::kWords);
  std::span<std::atomic<uint64_t>> sa(a.data(), a.size()), sb(b.data(), b.size());
  WaitLines lines;
  int64_t ahead = 0;
  uint64_t a1 = lines.join(7, "a", sa, 1, 100, &ahead);
  uint64_t b1 = lines.join(7, "b", sb, 1, 100, &ahead);
  uint64_t a2 = lines.join(7, "a", sa, 1, 100, &ahead);
  uint64_t a3 = lines.join(7, "a", sa, 1, 100, &ahead);
  uint64_t other_rule = lines.join(8, "a", sb, 1, 100, &ahead);
  EXPECT_NE(a[slice::kFlags].load() & slice::kLine, 0u);
  EXPECT_TRUE(lines.first(a1));
  EXPECT_TRUE(lines.first(b1));
  EXPECT_TRUE(lines.first(other_rule));
  EXPECT_FALSE(lines.first(a2));
  EXPECT_EQ(lines.size(), 5u);

  uint64_t before = lines.promotions();
  EXPECT_FALSE(lines.leave(a3, sa));  // from the back: nobody moves up
  EXPECT_EQ(lines.promotions(), before);
  EXPECT_TRUE(lines.leave(a1, sa));
  EXPECT_EQ(lines.promotions(), before + 1);
  EXPECT_TRUE(lines.first(a2));
  EXPECT_FALSE(lines.first(a1));  // gone
  EXPECT_FALSE(lines.leave(a1, sa));  // twice: nothing
  EXPECT_NE(a[slice::kFlags].load() & slice::kLine, 0u);
  EXPECT_FALSE(lines.leave(a2, sa));  // the last: the mark goes
  EXPECT_EQ(a[slice::kFlags].load() & slice::kLine, 0u);

  EXPECT_FALSE(lines.leave(b1, {}));  // without the words: the mark stays
  EXPECT_NE(b[slice::kFlags].load() & slice::kLine, 0u);
  EXPECT_FALSE(lines.standing(7, "b", sb));
  EXPECT_EQ(b[slice::kFlags].load() & slice::kLine, 0u);
  b[slice::kFlags].fetch_or(slice::kLine);
  EXPECT_TRUE(lines.standing(8, "a", sb));  // rule 8's line still stands
  EXPECT_NE(b[slice::kFlags].load() & slice::kLine, 0u);
  EXPECT_EQ(lines.size(), 1u);
}

// Verifies a line is bounded by units: a request is refused when more units
// stand ahead of it than it may wait behind, and `ahead` says how many;
// the first of a line is never refused, and units leave with their tickets.
TEST(WaitLinesTest, LongLinesRefuseAtOnce) {
  std::vector<std::atomic<uint64_t>> a(slice::kWords);
  std::span<std::atomic<uint64_t>> sa(a.data(), a.size());
  WaitLines lines;
  int64_t ahead = -1;
  uint64_t big = lines.join(1, "k", sa, 5, 0, &ahead);  // first: joins whatever its bound
  EXPECT_NE(big, 0u);
  EXPECT_EQ(ahead, 0);
  EXPECT_NE(lines.join(1, "k", sa, 2, 5, &ahead), 0u);
  EXPECT_EQ(ahead, 5);
  EXPECT_EQ(lines.join(1, "k", sa, 1, 6, &ahead), 0u);  // 7 ahead
  EXPECT_EQ(ahead, 7);
  EXPECT_EQ(lines.size(), 2u);
  lines.leave(big, sa);
  EXPECT_NE(lines.join(1, "k", sa, 1, 6, &ahead), 0u);
  EXPECT_EQ(ahead, 2);
}

// Verifies the entry layouts: a leasable rule's slice, then its penalty's
// words, then the override word; a share's state, its undebited word and its
// override word; and that the override recorded for a key (any of them, the
// last one too) is read back as decidingRule chose it.
TEST(EntryLayoutTest, OverrideWordFollowsTheStateAndPenalty) {
  Rule rule;
  rule.name = "api";
  rule.id = 3;
  rule.scope = Scope::kGlobal;
  rule.limits = {Limit{.limit = 10, .period_ns = 1'000 * kMs, .burst = 10}};
  rule.penalty = Penalty{.denials = 3, .window_ns = 1'000 * kMs, .block_ns = 1'000 * kMs};
  rule.overrides = {Override{Override::Match::kPrefix, "pro:", {Limit{100, 1'000 * kMs, 100}}},
                    Override{Override::Match::kKey, "acme", {Limit{40, 1'000 * kMs, 40}}}};
  RuleSet rules({rule}, 2);
  const Rule& global = *rules.find("api");
  const Rule& share = *rules.fallbackShare(global);
  EXPECT_EQ(entryWords(global), size_t{slice::kWords} + penalty::kWords + 1);
  EXPECT_EQ(entryWords(share), stateWords(share) + 2);
  for (auto [key, which] : {std::pair{"free", 0u}, {"pro:1", 1u}, {"acme", 2u}}) {
    std::vector<std::atomic<uint64_t>> words(entryWords(global));
    std::span<std::atomic<uint64_t>> span(words.data(), words.size());
    EXPECT_EQ(storedOverride(global, span), 0u) << key;  // not resolved yet
    const Rule& deciding = decidingRule(rules, global, key, span);
    EXPECT_EQ(&deciding, &rules.variant(global, which)) << key;
    EXPECT_EQ(storedOverride(global, span), which) << key;
    EXPECT_EQ(words[size_t{slice::kWords} + penalty::kWords].load(), which + 1) << key;
    EXPECT_EQ(penaltyState(global, span).data(), words.data() + slice::kWords) << key;
  }
}

// Verifies learning mode lasts one of the rule's memory spans: a window,
// or the time its bucket takes to refill.
TEST(LeaseBrokerTest, LearningLastsOneRulePeriod) {
  LeaseBroker broker(kInterval);
  Rule window;
  window.algorithm = Algorithm::kFixedWindow;
  window.limits = {Limit{.limit = 10, .period_ns = 1'000 * kMs, .burst = 10}};
  Rule bucket;
  bucket.algorithm = Algorithm::kTokenBucket;
  bucket.limits = {Limit{.limit = 10, .period_ns = 1'000 * kMs, .burst = 30}};  // 3 s to refill
  EXPECT_FALSE(broker.learning(window, 5'000 * kMs));
  broker.startLearning(5'000 * kMs, 0, 0, 3'000 * kMs);
  EXPECT_TRUE(broker.learning(window, 5'999 * kMs));
  EXPECT_FALSE(broker.learning(window, 6'000 * kMs));
  EXPECT_TRUE(broker.learning(bucket, 7'999 * kMs));
  EXPECT_FALSE(broker.learning(bucket, 8'000 * kMs));
  EXPECT_TRUE(broker.learningAny(7'999 * kMs));
  EXPECT_EQ(broker.stats(0).learning_entries, 1u);
}

// Verifies the breaker's bookkeeping: entries into fallback and the time
// spent there.
TEST(LeaseBrokerTest, BreakerCountsFallbackTime) {
  LeaseBroker broker(kInterval);
  EXPECT_FALSE(broker.leasing());  // open until Redis answers
  broker.setBreaker(Breaker::kHalfOpen, 10 * kMs);
  broker.setBreaker(Breaker::kClosed, 11 * kMs);
  EXPECT_TRUE(broker.leasing());
  broker.setBreaker(Breaker::kOpen, 100 * kMs);
  EXPECT_FALSE(broker.leasing());
  EXPECT_EQ(broker.stats(150 * kMs).fallback_ms, 50u);
  broker.setBreaker(Breaker::kHalfOpen, 400 * kMs);
  EXPECT_EQ(broker.stats(1'000 * kMs).fallback_ms, 300u);
  EXPECT_EQ(broker.stats(1'000 * kMs).fallback_entries, 1u);
}

}  // namespace
}  // namespace sluice

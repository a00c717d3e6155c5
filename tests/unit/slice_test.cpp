// Slices (slice.h): spending leased units, the negative cache, the in-flight
// claim, window expiry, batch sizing, and each transition a lease's answer,
// a block, a reset or a return makes, on a fake clock.
#include "slice.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "entry.h"
#include "rate_lease.h"

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
  // The demand the words record per lease interval, in whole units: the
  // last full measurement (kRate, rounded), or the units asked in the one
  // under way (kDemand) when that is more.
  int64_t recordedDemand() const {
    const auto rate = static_cast<int64_t>(words_[slice::kRate].load());
    return std::max((rate + slice::kRateParts / 2) / slice::kRateParts,
                    static_cast<int64_t>(words_[slice::kDemand].load()));
  }

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
  slice::applyEmpty(words(), 0, 50 * kMs);
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

// An outage that began at the breaker's opening `open` (no recovery failed
// since), its hold until `hold`.
slice::Outage outageFrom(int64_t open, int64_t hold) {
  return {.opened_ns = open, .began_ns = open, .hold_until_ns = hold};
}

Rule bucketRule(int64_t limit, int64_t period_ns, int64_t burst) {
  Rule rule;
  rule.scope = Scope::kGlobal;
  rule.algorithm = Algorithm::kTokenBucket;
  rule.limits = {Limit{.limit = limit, .period_ns = period_ns, .burst = burst}};
  return rule;
}

Rule windowRule(Algorithm algorithm, int64_t limit, int64_t period_ns) {
  Rule rule;
  rule.scope = Scope::kGlobal;
  rule.algorithm = algorithm;
  rule.limits = {Limit{.limit = limit, .period_ns = period_ns, .burst = limit}};
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
  EXPECT_EQ(lease(101, 5).n, 100);   // 100 units over 100 ms (from 1 to 101)
  EXPECT_EQ(lease(106, 5).n, 100);   // the rate holds between measurements
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
    slice::noteGrant(words(), 100, 100 * slice::kRoomyFactor, false);  // plenty left
    sizes.push_back(next());
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{200, 400, 800, 1600, 1600, 1600}));
  slice::noteGrant(words(), 1600, 1600 * slice::kRoomyFactor - 1, false);  // tight
  EXPECT_EQ(next(), 100);
  slice::noteGrant(words(), 100, 1000, false);
  EXPECT_EQ(next(), 200);
  slice::noteGrant(words(), 0, 1000, true);  // nothing granted: no growth
  EXPECT_EQ(next(), 100);
  // The share still caps a grown batch.
  words_[slice::kDemand].store(40'000);
  slice::noteGrant(words(), 100, 1'000'000, false);
  now += kInterval;
  EXPECT_EQ(slice::nextBatch(words(), now, 1, rule, 2, kInterval).n, 50'000);
}

// Verifies that a bucket whose burst is too small for kRoomyFactor batches
// still grows a lone key's batch while each grant finds it full (to within
// the reply's rounding: it refilled what the key took since its last
// lease), as a key at or under its limit finds it, up to the share; that a
// grant finding it short of full by more than a unit resets the batch, as
// a key over its limit, or beside another node, finds it; and that a
// sliding window never grows on such answers (untouched() is never true
// for it).
TEST_F(SliceTest, AGrantThatFindsTheBucketFullGrowsTheBatch) {
  const Rule bucket = bucketRule(10, 1'000 * kMs, 10);  // one unit per interval, burst 10
  const Rule window = windowRule(Algorithm::kSlidingWindow, 10, 1'000 * kMs);
  grant(1);
  int64_t now = kInterval;
  slice::nextBatch(words(), now, 1, bucket, 1, kInterval);  // starts measuring demand
  // A grant's answer for a key of `rule`, then the next batch on `nodes`
  // nodes after a unit in two intervals (5/s).
  auto next = [&](int64_t granted, int64_t remaining, const Rule* rule = nullptr,
                  uint32_t nodes = 1) {
    slice::noteGrant(words(), granted, remaining,
                     slice::untouched(words(), rule ? *rule : bucket, now, granted, remaining));
    words_[slice::kDemand].store(1);
    now += 2 * kInterval;
    return slice::nextBatch(words(), now, 1, bucket, nodes, kInterval).n;
  };
  // Each grant found the bucket full, or 9.x of 10 (remaining is floored),
  // and left less than kRoomyFactor times itself from the third on.
  std::vector<int64_t> sizes;
  sizes.push_back(next(1, 9));
  sizes.push_back(next(1, 8));
  sizes.push_back(next(2, 7));
  sizes.push_back(next(4, 5));
  sizes.push_back(next(8, 1));
  sizes.push_back(next(8, 1));
  EXPECT_EQ(sizes, (std::vector<int64_t>{1, 2, 4, 8, 8, 8}));
  EXPECT_EQ(next(8, 0), 1);          // found 8.x of 10: others draw on it, or the key is over
  EXPECT_EQ(next(1, 9), 1);          // full again: grows from one
  EXPECT_EQ(next(1, 9), 2);
  EXPECT_EQ(next(2, 7, &window), 1);  // the same answers of a sliding window
  // The share caps a grown batch: 5 of the burst on two nodes.
  for (int i = 0; i < slice::kMaxBoost; ++i) next(1, 9);
  EXPECT_EQ(next(8, 1, &bucket, 2), 5);
}

// Verifies that a fixed window's grant is untouched when it finds the
// window as this node's last answer left it (no other node drew since, in
// the same window) or a fresh window full, and not when another node took
// even one unit; that the node's clock decides which window the lease was
// sent in (the slice's window ends at kExpires); and that neither a
// sliding window nor a sliding log is ever untouched.
TEST_F(SliceTest, AFixedWindowIsUntouchedAsTheNodesLastAnswerLeftIt) {
  const Rule fixed = windowRule(Algorithm::kFixedWindow, 10, 1'000 * kMs);
  EXPECT_TRUE(slice::untouched(words(), fixed, 5 * kMs, 1, 9));    // a fresh window, full
  EXPECT_FALSE(slice::untouched(words(), fixed, 5 * kMs, 1, 8));   // another node took one
  slice::applyGrant(words(), 1, 7'000, 500 * kMs, true);           // the window ends at 500 ms
  slice::noteRedisLeft(words(), fixed, 9, 5 * kMs);
  EXPECT_TRUE(slice::untouched(words(), fixed, 100 * kMs, 2, 7));  // 9 found, as left
  EXPECT_FALSE(slice::untouched(words(), fixed, 100 * kMs, 2, 6)); // 8 found
  slice::noteRedisLeft(words(), fixed, 0, 100 * kMs);
  EXPECT_TRUE(slice::untouched(words(), fixed, 500 * kMs, 2, 8));  // sent in the next window
  EXPECT_FALSE(slice::untouched(words(), fixed, 500 * kMs, 2, 7));

  for (Algorithm algorithm : {Algorithm::kSlidingWindow, Algorithm::kSlidingLog}) {
    const Rule other = windowRule(algorithm, 10, 1'000 * kMs);
    std::vector<std::atomic<uint64_t>> w(slice::kWords);
    std::span<std::atomic<uint64_t>> span(w.data(), w.size());
    EXPECT_FALSE(slice::untouched(span, other, 5 * kMs, 1, 9));
  }
}

// Verifies that a sliding log's batch never grows past one interval of
// demand, however roomy its grants: its leased units count from the lease,
// so the units a slice holds are its overshoot bound.
TEST_F(SliceTest, AStampedLeaseNeverGrowsItsBatch) {
  Rule rule = bucketRule(1'000, 1'000 * kMs, 1'000);  // share 500 on 2 nodes
  rule.algorithm = Algorithm::kSlidingLog;
  grant(1);
  int64_t now = 0;
  for (int i = 0; i < slice::kMaxBoost + 2; ++i) {
    slice::noteGrant(words(), 100, 100 * slice::kRoomyFactor, false);  // plenty left
    slice::noteRedisLeft(words(), rule, 1'000, now);
    words_[slice::kDemand].store(100);  // 100 per interval
    now += kInterval;
    EXPECT_EQ(slice::nextBatch(words(), now, 1, rule, 2, kInterval).n, 100) << i;
  }
}

// Verifies that a sliding log leases a part of an interval's demand unless
// Redis's log, at its last answer, had room for kRoomyFactor batches of
// every node: a unit leaves the log one period after its lease, so one
// spent long after it frees its place early.
TEST_F(SliceTest, AStampedLeaseIsSmallUnlessTheLogHasRoomForEveryNode) {
  Rule rule = bucketRule(1'000, 1'000 * kMs, 1'000);
  rule.algorithm = Algorithm::kSlidingLog;
  grant(1);
  int64_t now = 0;
  auto next = [&](int64_t left) {
    if (left >= 0) slice::noteRedisLeft(words(), rule, left, now);
    words_[slice::kDemand].store(100);  // 100 per interval
    now += kInterval;
    return slice::nextBatch(words(), now, 1, rule, 2, kInterval).n;
  };
  const int64_t roomy = slice::kRoomyFactor * 100 * 2;  // 2 nodes' batches
  const int64_t tight = 100 / slice::kTightStampedParts;
  EXPECT_EQ(next(-1), tight);  // no answer yet
  EXPECT_EQ(next(roomy), 100);
  EXPECT_EQ(next(roomy - 1), tight);
  EXPECT_EQ(next(0), tight);
  // A grant covers the cost, however small the part.
  words_[slice::kDemand].store(100);
  now += kInterval;
  EXPECT_EQ(slice::nextBatch(words(), now, 25, rule, 2, kInterval).n, 25);
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
    slice::noteRedisLeft(words(), rule, 10'000, 1 * kMs);  // room for a sliding log's whole batch
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

// Verifies that a grant fills the slice, ends the negative cache, warms the
// key and records Redis's clock; a grant of a new window drops the units of
// the old one and spends only until the new one ends.
TEST_F(SliceTest, AGrantFillsTheSliceAndANewWindowDropsTheOldOnesUnits) {
  slice::applyEmpty(words(), 1 * kMs, 50 * kMs);
  slice::applyGrant(words(), 5, 7'000, 0, false);
  EXPECT_EQ(slice::take(words(), 2 * kMs, 2).left, 3);
  EXPECT_NE(flags() & slice::kWarm, 0u);
  EXPECT_EQ(slice::leaseNowMs(words()), 7'000);
  slice::applyGrant(words(), 4, 8'000, 100 * kMs, true);
  EXPECT_EQ(slice::look(words(), 99 * kMs, 1).left, 3);  // 4 granted, the old 3 dropped, 1 looked
  EXPECT_EQ(slice::look(words(), 100 * kMs, 1).outcome, slice::Outcome::kEmpty);
}

// Verifies that Redis's "nothing until t" is believed until t when t is
// near; when it is far, denials still say t, but the first take after
// slice::kEmptyRecheckNs claims one lease to see whether other nodes gave
// units back, and the others wait for its answer.
TEST_F(SliceTest, AFarNegativeCacheClaimsOneLeaseAfterTheRecheckSpan) {
  slice::applyEmpty(words(), 10 * kMs, 30 * kMs);
  slice::TakeResult near = slice::take(words(), 39 * kMs, 1);
  EXPECT_EQ(near.outcome, slice::Outcome::kDenied);
  EXPECT_FALSE(near.must_request);
  EXPECT_EQ(slice::take(words(), 40 * kMs, 1).outcome, slice::Outcome::kEmpty);
  slice::unclaim(words());

  const int64_t at_ns = 100 * kMs;
  const int64_t t_ns = at_ns + 450'000 * kMs;  // 7.5 minutes
  slice::applyEmpty(words(), at_ns, t_ns - at_ns);
  slice::TakeResult before = slice::take(words(), at_ns + slice::kEmptyRecheckNs - 1, 1);
  EXPECT_EQ(before.outcome, slice::Outcome::kDenied);
  EXPECT_EQ(before.until_ns, t_ns);
  EXPECT_FALSE(before.must_request);
  slice::TakeResult due = slice::take(words(), at_ns + slice::kEmptyRecheckNs, 1);
  EXPECT_EQ(due.outcome, slice::Outcome::kDenied);
  EXPECT_EQ(due.until_ns, t_ns);
  EXPECT_TRUE(due.must_request);
  EXPECT_FALSE(slice::take(words(), at_ns + slice::kEmptyRecheckNs, 1).must_request);  // one lease
  // Its answer: still nothing, so the cache stands for another recheck span.
  slice::applyEmpty(words(), at_ns + slice::kEmptyRecheckNs, t_ns - at_ns - slice::kEmptyRecheckNs);
  slice::unclaim(words());
  EXPECT_FALSE(slice::take(words(), at_ns + 2 * slice::kEmptyRecheckNs - 1, 1).must_request);
  EXPECT_TRUE(slice::take(words(), at_ns + 2 * slice::kEmptyRecheckNs, 1).must_request);
}

// Verifies the wait after a lease that granted nothing: Redis's
// retry_after_ms (rounded up to a ms by the scripts), 1 at the least, but a
// ms less, 0 at the least, for a sliding log, whose units leased late are
// spent late again one period on: it may ask early, never late.
TEST_F(SliceTest, AStampedKeyWaitsAMsLessThanRedisRoundedWait) {
  Rule bucket = bucketRule(100, 1'000 * kMs, 100);
  EXPECT_EQ(slice::emptyWaitMs(bucket, 0), 1);
  EXPECT_EQ(slice::emptyWaitMs(bucket, 1), 1);
  EXPECT_EQ(slice::emptyWaitMs(bucket, 7), 7);
  Rule log = bucket;
  log.algorithm = Algorithm::kSlidingLog;
  EXPECT_EQ(slice::emptyWaitMs(log, 0), 0);
  EXPECT_EQ(slice::emptyWaitMs(log, 1), 0);  // the next request asks again
  EXPECT_EQ(slice::emptyWaitMs(log, 7), 6);
}

// Verifies that a block empties the slice and is asked of Redis again after
// kBlockRecheckNs (or when it ends, if sooner), not before.
TEST_F(SliceTest, ABlockEmptiesTheSliceUntilItsRecheck) {
  grant(6);
  slice::block(words(), 10 * kMs, 60 * slice::kBlockRecheckNs);
  EXPECT_FALSE(slice::holdsUnits(words()));
  EXPECT_EQ(slice::deniedUntilNs(words()), 10 * kMs + slice::kBlockRecheckNs);
  grant(2);  // a lease sent before the block answers late
  EXPECT_FALSE(slice::recheckBlock(words(), 10 * kMs + slice::kBlockRecheckNs - 1));
  EXPECT_TRUE(slice::holdsUnits(words()));
  EXPECT_TRUE(slice::recheckBlock(words(), 10 * kMs + slice::kBlockRecheckNs));
  EXPECT_FALSE(slice::holdsUnits(words()));
  slice::block(words(), 0, 5 * kMs);
  EXPECT_EQ(slice::deniedUntilNs(words()), 5 * kMs);
}

// Verifies that forgetting a key (the admin reset) clears every word but a
// lease's in-flight bit, which only the lease's answer clears.
TEST_F(SliceTest, ForgettingKeepsOnlyTheInFlightBit) {
  grant(3);
  slice::applyEmpty(words(), 0, 10 * kMs);
  EXPECT_EQ(slice::take(words(), 20 * kMs, 9).outcome, slice::Outcome::kEmpty);  // claims
  slice::failUntil(words(), 30 * kMs);
  slice::forget(words());
  EXPECT_EQ(flags(), slice::kInFlight);
  for (size_t i = 0; i < slice::kWords; ++i) {
    if (i != slice::kFlags) {
      EXPECT_EQ(words_[i].load(), 0u) << i;
    }
  }
  EXPECT_FALSE(slice::idle(words(), 0));
  slice::unclaim(words());
  EXPECT_TRUE(slice::idle(words(), 0));
}

// Verifies that taking a slice's units back (an idle key, an evicted one, a
// stop) empties it and hands over the units with Redis's clock at their
// lease, and hands over nothing once their window has ended.
TEST_F(SliceTest, TakingBackHandsOverUnitsOfAWindowNotYetEnded) {
  slice::applyGrant(words(), 5, 1'234, 100 * kMs, false);
  slice::Taken taken = slice::takeBack(words(), 99 * kMs);
  EXPECT_EQ(taken.units, 5);
  EXPECT_EQ(taken.lease_now_ms, 1'234);
  EXPECT_FALSE(slice::holdsUnits(words()));
  EXPECT_EQ(slice::takeBack(words(), 99 * kMs).units, 0);
  slice::applyGrant(words(), 5, 1'234, 100 * kMs, false);
  EXPECT_EQ(slice::takeBack(words(), 100 * kMs).units, 0);
  EXPECT_FALSE(slice::holdsUnits(words()));
}

// Verifies that a key knows nothing of Redis's left before a lease's answer
// has said it, and then exactly what the answer said.
TEST_F(SliceTest, RedisLeftIsNothingBeforeAnAnswerAndTheAnswersLeftAfterIt) {
  const Rule bucket = bucketRule(100, 1000 * kMs, 100);  // a unit per 10 ms
  EXPECT_EQ(slice::redisLeft(words(), bucket, 5 * kMs), 0);
  grant(4);  // warm, but no answer recorded
  EXPECT_EQ(slice::redisLeft(words(), bucket, 5 * kMs), 0);
  slice::noteRedisLeft(words(), bucket, 37, 5 * kMs);
  EXPECT_EQ(slice::redisLeft(words(), bucket, 5 * kMs), 37);
  EXPECT_EQ(slice::redisLeft(words(), bucket, 15 * kMs - 1), 37);
}

// Verifies that a bucket's left grows by the whole units refilled since the
// answer, at the scripts' interval, up to the burst, and never reads more
// than the burst however far time goes.
TEST_F(SliceTest, ABucketsLeftRefillsAtItsRateUpToTheBurst) {
  for (Algorithm algorithm : {Algorithm::kTokenBucket, Algorithm::kGcra}) {
    Rule bucket = bucketRule(100, 1000 * kMs, 50);
    bucket.algorithm = algorithm;
    std::vector<std::atomic<uint64_t>> w(slice::kWords);
    std::span<std::atomic<uint64_t>> span(w.data(), w.size());
    const int64_t read_ns = 3 * kInterval;
    slice::noteRedisLeft(span, bucket, 7, read_ns);
    EXPECT_EQ(slice::redisLeft(span, bucket, read_ns + 10 * kMs - 1), 7);
    EXPECT_EQ(slice::redisLeft(span, bucket, read_ns + 10 * kMs), 8);
    EXPECT_EQ(slice::redisLeft(span, bucket, read_ns + 100 * kMs), 17);
    EXPECT_EQ(slice::redisLeft(span, bucket, read_ns + 430 * kMs), 50);
    EXPECT_EQ(slice::redisLeft(span, bucket, INT64_MAX / 2), 50);
    // A clock read before the answer (another worker's now) reads what it said.
    EXPECT_EQ(slice::redisLeft(span, bucket, read_ns - 1), 6);
    // An answer above the burst is not believed beyond it.
    slice::noteRedisLeft(span, bucket, 1'000, read_ns);
    EXPECT_EQ(slice::redisLeft(span, bucket, read_ns), 50);
  }
}

// Verifies that a bucket's refill interval is the scripts' (period / limit
// in whole µs, rounded up), so the estimate never refills faster than Redis:
// 3 a second is a unit per 333,334 µs.
TEST_F(SliceTest, ABucketRefillsAtTheScriptsIntervalRoundedUp) {
  const Rule bucket = bucketRule(3, 1000 * kMs, 3);
  slice::noteRedisLeft(words(), bucket, 0, 0);
  EXPECT_EQ(slice::redisLeft(words(), bucket, 333'334'000 - 1), 0);
  EXPECT_EQ(slice::redisLeft(words(), bucket, 333'334'000), 1);
  EXPECT_EQ(slice::redisLeft(words(), bucket, 3 * 333'334'000 - 1), 2);
}

// Verifies that a window's left does not refill, and counts only while the
// slice's window lasts (kExpires): after it, or before any grant, nothing.
TEST_F(SliceTest, AWindowsLeftCountsUntilItsWindowEnds) {
  for (Algorithm algorithm : {Algorithm::kFixedWindow, Algorithm::kSlidingWindow}) {
    const Rule window = windowRule(algorithm, 100, 1000 * kMs);
    std::vector<std::atomic<uint64_t>> w(slice::kWords);
    std::span<std::atomic<uint64_t>> span(w.data(), w.size());
    slice::noteRedisLeft(span, window, 40, 10 * kMs);
    EXPECT_EQ(slice::redisLeft(span, window, 10 * kMs), 0);  // no window yet
    slice::applyGrant(span, 5, 7'000, 500 * kMs, true);
    EXPECT_EQ(slice::redisLeft(span, window, 10 * kMs), 40);
    EXPECT_EQ(slice::redisLeft(span, window, 500 * kMs - 1), 40);
    EXPECT_EQ(slice::redisLeft(span, window, 500 * kMs), 0);
    slice::noteRedisLeft(span, window, 140, 20 * kMs);
    EXPECT_EQ(slice::redisLeft(span, window, 20 * kMs), 100);  // never above the limit
  }
}

// Verifies that a window ends first when the key, at its measured demand,
// would ask for its next unit after the slice's window ends (2 a second:
// one per 500 ms), not while the next unit comes sooner, and never for a
// rule that is not windowed, nor once the window is over.
TEST_F(SliceTest, AWindowEndsFirstWhenTheNextUnitComesAfterIt) {
  const Rule fixed = windowRule(Algorithm::kFixedWindow, 10, 1'000 * kMs);
  const Rule bucket = bucketRule(10, 1'000 * kMs, 10);
  slice::applyGrant(words(), 1, 7'000, 1'000 * kMs, true);  // the window ends at 1 s
  words_[slice::kRate].store(slice::kRateParts / 5);          // 0.2 an interval: 2/s
  EXPECT_FALSE(slice::windowEndsFirst(words(), fixed, 400 * kMs, kInterval));
  EXPECT_TRUE(slice::windowEndsFirst(words(), fixed, 600 * kMs, kInterval));
  EXPECT_FALSE(slice::windowEndsFirst(words(), bucket, 600 * kMs, kInterval));
  EXPECT_FALSE(slice::windowEndsFirst(words(), fixed, 1'000 * kMs, kInterval));  // over
}

// Verifies that Redis's left shares the flags word without disturbing its
// bits (in flight, warm, roomy, the line, the boost) or being disturbed by
// them.
TEST_F(SliceTest, RedisLeftSharesTheFlagsWordWithTheOtherFlags) {
  const Rule window = windowRule(Algorithm::kFixedWindow, 0xFFFFFFFFLL, 1000 * kMs);
  slice::applyGrant(words(), 5, 7'000, 500 * kMs, true);
  ASSERT_EQ(slice::take(words(), 1 * kMs, 5).outcome, slice::Outcome::kTaken);
  EXPECT_EQ(slice::take(words(), 1 * kMs, 1).outcome, slice::Outcome::kEmpty);  // claims
  slice::markLine(words());
  const uint64_t before = flags();
  slice::noteRedisLeft(words(), window, 0xFFFFFFFFLL, 2 * kMs);  // the largest window limit
  EXPECT_EQ(flags() & 0xFFF, (before & 0xFFF) | slice::kRedisLeftKnown);
  EXPECT_EQ(slice::redisLeft(words(), window, 3 * kMs), 0xFFFFFFFFLL);
  slice::clearLine(words());
  slice::unclaim(words());
  slice::noteGrant(words(), 1, 100, false);
  slice::nextBatch(words(), 4 * kMs, 1, window, 2, kInterval);
  EXPECT_EQ(slice::redisLeft(words(), window, 4 * kMs), 0xFFFFFFFFLL);
  EXPECT_NE(flags() & slice::kWarm, 0u);
  EXPECT_EQ(flags() & (slice::kInFlight | slice::kLine), 0u);
}

// Verifies that forgetting a key forgets what Redis had left too.
TEST_F(SliceTest, ForgettingAKeyForgetsRedisLeft) {
  const Rule bucket = bucketRule(100, 1000 * kMs, 100);
  slice::noteRedisLeft(words(), bucket, 60, 0);
  slice::forget(words());
  EXPECT_EQ(slice::redisLeft(words(), bucket, 0), 0);
  EXPECT_EQ(slice::redisLeft(words(), bucket, 1000 * kMs), 0);
}

// Verifies the line mark: set and cleared only through markLine/clearLine.
TEST_F(SliceTest, TheLineMarkIsSetAndClearedAlone) {
  grant(1);
  slice::markLine(words());
  EXPECT_TRUE(slice::lineMarked(words()));
  EXPECT_NE(flags() & slice::kWarm, 0u);
  slice::clearLine(words());
  EXPECT_FALSE(slice::lineMarked(words()));
  EXPECT_NE(flags() & slice::kWarm, 0u);
}

// --- reservations: a settle on a leasing key --------------------------------------

// Verifies a settle's refund goes back into the slice, with no lease.
TEST_F(SliceTest, ARefundGoesBackIntoTheSlice) {
  grant(100);
  ASSERT_EQ(slice::take(words(), kMs, 80).outcome, slice::Outcome::kTaken);
  slice::refundSpent(words(), 50, kMs, 2 * kMs, kInterval);
  EXPECT_EQ(slice::balance(words(), 2 * kMs), 70);
  EXPECT_EQ(flags() & slice::kInFlight, 0u);
}

// Verifies a windowed slice takes a refund only for units spent in its
// window: those of an ended window were counted there and stay spent.
TEST_F(SliceTest, AWindowedSliceRefundsOnlyItsOwnWindow) {
  grant(100);
  words_[slice::kExpires].store(static_cast<uint64_t>(20 * kInterval));  // window [19, 20) intervals
  slice::refundSpent(words(), 30, 18 * kInterval, 19 * kInterval + kMs, kInterval);
  EXPECT_EQ(slice::balance(words(), 19 * kInterval + kMs), 100);
  slice::refundSpent(words(), 30, 19 * kInterval, 19 * kInterval + kMs, kInterval);
  EXPECT_EQ(slice::balance(words(), 19 * kInterval + kMs), 130);
  slice::refundSpent(words(), 30, 19 * kInterval, 20 * kInterval, kInterval);  // window over
  EXPECT_EQ(words_[slice::kUnits].load(), 130u);
}

// Verifies a debt past what the slice holds is carried as negative units:
// nothing is taken, the next lease asks for the debt on top of the cost, and
// the sweep's give-back leaves it for that lease.
TEST_F(SliceTest, ADebtIsCarriedUntilALeasePaysIt) {
  grant(10);
  EXPECT_EQ(slice::charge(words(), 25, 1000), 25);
  EXPECT_EQ(slice::balance(words(), kMs), -15);
  EXPECT_EQ(slice::owed(words(), kMs), 15);
  slice::TakeResult taken = slice::take(words(), kMs, 1);
  EXPECT_EQ(taken.outcome, slice::Outcome::kEmpty);
  ASSERT_TRUE(taken.must_request);
  Rule rule;
  rule.algorithm = Algorithm::kFixedWindow;
  rule.limits = {Limit{1000, 1'000 * kMs, 1000}};
  EXPECT_GE(slice::nextBatch(words(), kMs, 1, rule, 1, kInterval).n, 16);
  EXPECT_EQ(slice::takeBack(words(), kMs).units, 0);
  EXPECT_EQ(slice::balance(words(), kMs), -15);
  grant(20);  // the lease: pays the 15 and leaves 5
  EXPECT_EQ(slice::take(words(), 2 * kMs, 5).outcome, slice::Outcome::kTaken);
}

// Verifies a slice carries at most its debt bound: a charge takes what the
// slice holds and the bound past it, and nothing once the bound is owed.
TEST_F(SliceTest, ADebtIsChargedUpToTheBound) {
  grant(10);
  EXPECT_EQ(slice::charge(words(), 100, 30), 10 + 30);
  EXPECT_EQ(slice::balance(words(), kMs), -30);
  EXPECT_EQ(slice::charge(words(), 5, 30), 0);
  EXPECT_EQ(slice::owed(words(), kMs), 30);
  grant(25);  // a lease pays part of it
  EXPECT_EQ(slice::charge(words(), 50, 30), 25);
  EXPECT_EQ(slice::owed(words(), kMs), 30);
}

// Verifies a windowed slice's debt is owed only while its window lasts: it
// was owed to that window alone.
TEST_F(SliceTest, AWindowedDebtIsOwedUntilItsWindowEnds) {
  grant(10);
  words_[slice::kExpires].store(static_cast<uint64_t>(20 * kInterval));
  EXPECT_EQ(slice::charge(words(), 40, 100), 40);
  EXPECT_EQ(slice::owed(words(), 20 * kInterval - 1), 30);
  EXPECT_EQ(slice::owed(words(), 20 * kInterval), 0);
}

// --- Rate leases (rate_lease.h) ----------------------------------------------

// Verifies that a rate lease refills the slice here, one unit per
// ns_per_unit, and never past its cap however long the key sits idle.
TEST_F(SliceTest, ARateRefillsTheSliceLocallyUpToItsCap) {
  slice::applyRate(words(), kMs, 100, 5'000 * kMs, 2'500 * kMs, 0);
  EXPECT_TRUE(slice::holdsRate(words(), 0));
  slice::TakeResult first = slice::take(words(), 50 * kMs, 1);
  ASSERT_EQ(first.outcome, slice::Outcome::kTaken);
  EXPECT_EQ(first.left, 49);
  EXPECT_FALSE(first.must_request);  // a rate asks Redis only to renew
  EXPECT_EQ(slice::take(words(), 60 * kMs, 20).left, 39);
  EXPECT_EQ(slice::look(words(), 1'000 * kMs, 1).left, 99);  // capped: 100
  EXPECT_EQ(slice::take(words(), 1'000 * kMs, 1).left, 99);
  EXPECT_EQ(slice::rateCapUnits(words(), 1'000 * kMs), 100);
}

// Verifies that an empty rate slice is denied until its refill brings the
// cost, without a lease, and that the take after the renewal time claims one.
TEST_F(SliceTest, AnEmptyRateSliceDeniesUntilItsRefillAndAsksRedisOnlyToRenew) {
  slice::applyRate(words(), 10 * kMs, 10, 1'000 * kMs, 500 * kMs, 0);
  slice::TakeResult empty = slice::take(words(), 5 * kMs, 3);
  EXPECT_EQ(empty.outcome, slice::Outcome::kDenied);
  EXPECT_EQ(empty.until_ns, 30 * kMs);
  EXPECT_FALSE(empty.must_request);
  EXPECT_EQ(slice::take(words(), 30 * kMs, 3).outcome, slice::Outcome::kTaken);
  slice::TakeResult renew = slice::take(words(), 500 * kMs, 1);
  EXPECT_EQ(renew.outcome, slice::Outcome::kTaken);
  EXPECT_TRUE(renew.must_request);
  EXPECT_FALSE(slice::take(words(), 510 * kMs, 1).must_request);  // claimed once
}

// Verifies that word of freed rate (the `renew` channel) makes the key's
// next take claim the renewal at once, 2.5 s before its schedule, once;
// and that a key that holds no rate, or is due already, is left alone.
TEST_F(SliceTest, FreedRateMakesTheNextTakeRenewTheRateAtOnce) {
  EXPECT_FALSE(slice::renewRateNow(words(), 0));  // no rate held
  slice::applyRate(words(), kMs, 100, 5'000 * kMs, 2'600 * kMs, 0);
  EXPECT_FALSE(slice::take(words(), 100 * kMs, 1).must_request);
  EXPECT_TRUE(slice::renewRateNow(words(), 100 * kMs));
  EXPECT_FALSE(slice::renewRateNow(words(), 101 * kMs));  // due already
  slice::TakeResult renew = slice::take(words(), 102 * kMs, 1);
  EXPECT_EQ(renew.outcome, slice::Outcome::kTaken);
  EXPECT_TRUE(renew.must_request);
  EXPECT_FALSE(slice::take(words(), 103 * kMs, 1).must_request);  // claimed once
  EXPECT_FALSE(slice::renewRateNow(words(), 6'000 * kMs));        // the rate ended
}

// Verifies that the same word makes a key that holds no rate and waits to
// ask again (its rate op got nothing: deny for 25 ms) ask at its next
// take, once, instead of at the wait's end; and that a key not waiting,
// or past its wait, is left alone.
TEST_F(SliceTest, AWordToRenewMakesAKeyWaitingToAskAskAtItsNextTake) {
  slice::applyEmpty(words(), 0, 25 * kMs);
  slice::TakeResult before = slice::take(words(), 5 * kMs, 1);
  EXPECT_EQ(before.outcome, slice::Outcome::kDenied);
  EXPECT_FALSE(before.must_request);
  EXPECT_TRUE(slice::renewRateNow(words(), 6 * kMs));
  EXPECT_FALSE(slice::renewRateNow(words(), 7 * kMs));  // due already
  slice::TakeResult ask = slice::take(words(), 8 * kMs, 1);
  EXPECT_EQ(ask.outcome, slice::Outcome::kDenied);
  EXPECT_TRUE(ask.must_request);
  EXPECT_FALSE(slice::take(words(), 9 * kMs, 1).must_request);  // claimed once
  EXPECT_FALSE(slice::renewRateNow(words(), 30 * kMs));          // the wait is over
}

// Verifies that a renewal keeps the refill where it was (no units twice,
// none lost), and that at its end the rate stops and the key leases tokens
// again.
TEST_F(SliceTest, ARenewedRateRefillsOnAndAnEndedOneLeasesTokensAgain) {
  slice::applyRate(words(), 10 * kMs, 100, 1'000 * kMs, 500 * kMs, 0);
  EXPECT_EQ(slice::take(words(), 500 * kMs, 50).left, 0);
  slice::unclaim(words());
  slice::applyRate(words(), 10 * kMs, 100, 1'500 * kMs, 1'000 * kMs, 505 * kMs);
  EXPECT_EQ(slice::take(words(), 600 * kMs, 10).left, 0);
  // Not renewed again: refilled up to 1,500 ms (90 units), then tokens.
  EXPECT_FALSE(slice::holdsRate(words(), 1'500 * kMs));
  slice::TakeResult last = slice::take(words(), 2'000 * kMs, 90);
  EXPECT_EQ(last.outcome, slice::Outcome::kTaken);
  EXPECT_TRUE(last.must_request);  // a token lease, as any empty slice asks
  slice::unclaim(words());
  EXPECT_EQ(slice::take(words(), 3'000 * kMs, 1).outcome, slice::Outcome::kEmpty);
  EXPECT_EQ(slice::rateCapUnits(words(), 3'000 * kMs), 0);
  // A grant of rate 0 ends a rate at once.
  slice::applyRate(words(), 10 * kMs, 100, 5'000 * kMs, 4'000 * kMs, 3'000 * kMs);
  EXPECT_TRUE(slice::holdsRate(words(), 3'000 * kMs));
  slice::applyRate(words(), 0, 0, 0, 0, 3'100 * kMs);
  EXPECT_FALSE(slice::holdsRate(words(), 3'100 * kMs));
}

// Verifies that a rate op whose reply was lost slows the key's rate to the
// rate it asked for when that is slower, keeping what the old rate refilled
// until then and the rate's end; that a faster ask changes nothing (Redis
// may not have granted it); and that asking for none ends the rate.
TEST_F(SliceTest, ALostRenewalHoldsTheSmallerOfTheHeldAndTheAskedRate) {
  slice::applyRate(words(), kMs, 100, 5'000 * kMs, 2'500 * kMs, 0);
  EXPECT_EQ(slice::take(words(), 50 * kMs, 50).left, 0);
  slice::holdAtMostRate(words(), 4 * kMs, 25, 60 * kMs);  // 50..60 ms refilled at 1 ms a unit
  EXPECT_EQ(slice::rateNsPerUnit(words(), 60 * kMs), 4 * kMs);
  EXPECT_EQ(slice::rateCapUnits(words(), 60 * kMs), 25);
  EXPECT_EQ(slice::look(words(), 60 * kMs, 1).left, 9);
  EXPECT_EQ(slice::look(words(), 100 * kMs, 1).left, 19);  // 10 more, 4 ms each
  slice::holdAtMostRate(words(), kMs, 100, 100 * kMs);
  EXPECT_EQ(slice::rateNsPerUnit(words(), 100 * kMs), 4 * kMs);
  EXPECT_EQ(slice::rateCapUnits(words(), 100 * kMs), 25);
  EXPECT_TRUE(slice::holdsRate(words(), 4'999 * kMs));
  EXPECT_FALSE(slice::holdsRate(words(), 5'000 * kMs));
  slice::holdAtMostRate(words(), 0, 0, 200 * kMs);
  EXPECT_FALSE(slice::holdsRate(words(), 200 * kMs));
}

// Verifies that a rate holder whose demand moves from what it asked (100
// units/s of 1,000/s here) asks for its renewal before its renewal time
// (500 ms): as soon as twice what it asked over a window (160 ms here: 16
// units at 100/s) has come, at the end of a window with less than
// half of it, but not at the demand it asked for, nor past the whole limit
// it asked; and that a drop after a long spell as asked is seen in the
// first whole window after it.
TEST_F(SliceTest, ARateHolderWhoseDemandMovedRenewsBeforeItsRenewalTime) {
  const Limit limit{1'000, 1'000 * kMs, 10};
  // Takes of one unit every gap_ms from 1 ms (every later_gap_ms from
  // 300 ms): the first that asks Redis.
  auto firstRequestMs = [&](int64_t asked, int64_t gap_ms, int64_t later_gap_ms) -> int64_t {
    for (auto& w : words_) w.store(0);
    slice::applyRate(words(), kMs, 1'000, 5'000 * kMs, 500 * kMs, 0);
    slice::noteAsked(words(), limit, asked, kInterval, 0);
    for (int64_t t = 1; t < 600; t += t < 300 ? gap_ms : later_gap_ms) {
      if (slice::take(words(), t * kMs, 1).must_request) return t;
    }
    return -1;
  };
  EXPECT_EQ(firstRequestMs(100, 2, 2), 65);    // 500/s: the 33rd unit passes 32 in 160 ms
  EXPECT_EQ(firstRequestMs(100, 40, 40), 161);  // 25/s: moved down, at the window's end
  EXPECT_EQ(firstRequestMs(100, 10, 10), 501);  // 100/s as asked: at the renewal time
  EXPECT_EQ(firstRequestMs(100, 6, 6), 505);    // 167/s is not above twice
  EXPECT_EQ(firstRequestMs(limit.limit, 2, 2), 501);  // asked the whole limit already
  EXPECT_EQ(firstRequestMs(0, 2, 2), 501);      // no rate asked: nothing moves
  // 500/s as asked, then 50/s from 300 ms: windows of 32 ms (16 units at
  // 500/s), and the one from 289 ms holds 7 units.
  EXPECT_EQ(firstRequestMs(500, 2, 20), 321);
  // The renewal asks for that window's demand per lease interval (7 units
  // in 32 ms: 22 in 100), not the average since the last renewal.
  EXPECT_EQ(recordedDemand(), 22);
}

// The shifting skew of bench/fleet.py on one key of 2,000/s, lease
// interval 100 ms: the node that turns hot asked 300/s and now sees
// 5,400/s; the one that turns cold asked the whole limit and now sees
// 300/s. Takes of one unit at `before_per_s` until shift_ms, then at
// `after_per_s`: the time of the first take that asks Redis (-1: none
// within 500 ms).
class ShiftTest : public SliceTest {
 protected:
  const Limit limit_{2'000, 1'000 * kMs, 40};

  int64_t firstRequestNs(int64_t asked, double before_per_s, double after_per_s, int64_t shift_ns) {
    slice::applyRate(words(), kMs / 10, 10'000, 5'000 * kMs, 2'500 * kMs, 0);
    slice::noteAsked(words(), limit_, asked, kInterval, 0);
    double t = 0;
    while (t < 500.0 * kMs) {
      t += 1e9 / (t < static_cast<double>(shift_ns) ? before_per_s : after_per_s);
      if (slice::take(words(), static_cast<int64_t>(t), 1).must_request) return static_cast<int64_t>(t);
    }
    return -1;
  }
};

// Verifies that a holder whose demand rises far past what it asked asks
// again within a few ms of the rise, not at the end of its window, and
// asks for more than twice what it held.
TEST_F(ShiftTest, AHolderWhoseDemandRisesAsksWithinMsOfTheRise) {
  const int64_t at = firstRequestNs(300, 300, 5'400, 60 * kMs);
  ASSERT_GT(at, 60 * kMs);
  EXPECT_LT(at, 70 * kMs);
  // What came since the window began, per 100 ms: more than twice 300/s.
  EXPECT_GT(recordedDemand(), 2 * 30);
}

// Verifies that a holder whose demand falls to a tenth asks again within
// two windows of 12.5 ms (an eighth of the interval) of the fall, for about
// its new demand: its rate goes back to the fleet before the new hot node
// has lost much of its share.
TEST_F(ShiftTest, AHolderWhoseDemandFallsAsksWithinAQuarterLeaseInterval) {
  const int64_t at = firstRequestNs(limit_.limit, 5'400, 300, 60 * kMs);
  ASSERT_GT(at, 60 * kMs);
  EXPECT_LE(at, 60 * kMs + 25 * kMs);
  EXPECT_LE(recordedDemand(), 2 * 30);  // about 300/s, per 100 ms
}

// Verifies that a holder granted less than it asked (a contending node's
// share: 666/s of 2,000/s asked) does not read a stall of its requests as a
// fall of its demand: at 2,000/s with none for as long as the sweep waits
// before it reads the key as idle (slice::idleAfterNs, 10 ms; a longer
// stall gives the rate up there), the window across the gap still brings
// more than half of what it holds, and a renewal would change nothing. A
// fall to 200/s is one.
TEST_F(ShiftTest, AGapInAContendingHoldersRequestsIsNoFall) {
  slice::applyRate(words(), 1'500'000, 10'000, 5'000 * kMs, 2'500 * kMs, 0);  // 666/s
  slice::noteAsked(words(), limit_, limit_.limit, kInterval, 0);
  const int64_t stall_ns = slice::idleAfterNs(words());
  ASSERT_EQ(stall_ns, 10 * kMs);
  for (int64_t t = kMs / 2; t < 200 * kMs; t += kMs / 2) {
    if (t >= 40 * kMs && t < 40 * kMs + stall_ns) continue;  // the stall
    ASSERT_FALSE(slice::take(words(), t, 1).must_request) << t / kMs << " ms";
  }
  int64_t asked_at = -1;
  for (int64_t t = 200 * kMs; t < 400 * kMs && asked_at < 0; t += 5 * kMs) {
    if (slice::take(words(), t, 1).must_request) asked_at = t;
  }
  EXPECT_GE(asked_at, 200 * kMs);
  EXPECT_LE(asked_at, 200 * kMs + 2 * kInterval / slice::kMovedWindowsPerInterval);
}

// Verifies that a move is reported to one taker and then not again until
// the renewal's answer re-arms the check (noteAsked), so the takes that
// follow neither claim again nor overwrite the demand the renewal asks.
TEST_F(ShiftTest, AMoveIsReportedOnceUntilTheRenewalAnswers) {
  const int64_t at = firstRequestNs(300, 300, 5'400, 10 * kMs);
  ASSERT_GT(at, 0);
  const int64_t asked = recordedDemand();
  slice::unclaim(words());
  for (int64_t t = at + kMs; t < at + 50 * kMs; t += kMs) {
    EXPECT_FALSE(slice::demandMoved(words(), t));
  }
  EXPECT_GE(recordedDemand(), asked);
  slice::noteAsked(words(), limit_, limit_.limit, kInterval, at + 50 * kMs);
  // Asked the whole limit: 300/s is below half of it.
  EXPECT_TRUE(slice::demandMoved(words(), at + 50 * kMs + kInterval));
}

// Verifies the control thread's sweep of a rate holder that gets no
// requests at all: no take sees its demand fall, so claimMovedRenewal
// does, once it has been idle for idleAfterNs (not before), claims the
// renewal once, and leaves a key that holds no rate alone.
TEST_F(ShiftTest, TheSweepClaimsTheRenewalOfARateHolderThatGetsNoRequests) {
  EXPECT_FALSE(slice::claimMovedRenewal(words(), 0, 0));  // no rate held
  slice::applyRate(words(), rate_lease::nsPerUnit(limit_, limit_.limit), 100, 5'000 * kMs, 2'500 * kMs, 0);
  slice::noteAsked(words(), limit_, limit_.limit, kInterval, 0);
  const int64_t idle_ns = slice::idleAfterNs(words());
  EXPECT_FALSE(slice::claimMovedRenewal(words(), kMs, 0));
  int64_t claimed_at = 0;
  for (int64_t t = 2 * kMs; t <= 4 * kInterval && claimed_at == 0; t += kMs) {
    if (slice::claimMovedRenewal(words(), t, 0)) claimed_at = t;
  }
  ASSERT_GT(claimed_at, 0);
  EXPECT_EQ(claimed_at, idle_ns);
  EXPECT_EQ(recordedDemand(), 0);  // what the renewal asks: none
  EXPECT_FALSE(slice::claimMovedRenewal(words(), claimed_at + kMs, 0));  // claimed once
}

// Verifies that a contending holder whose requests stop (its load left
// the node) gives its rate up within its idle time of the last request
// plus one sweep, not at the end of a window that began before the stop:
// at 2,000/s asked, 16 units take 8 ms, so the idle time is the floor, a
// tenth of the lease interval. A gap shorter than that, in requests that
// go on, is no stop.
TEST_F(ShiftTest, AHolderWhoseRequestsStopGivesItsRateUpWithinItsIdleTime) {
  slice::applyRate(words(), 1'500'000, 10'000, 5'000 * kMs, 2'500 * kMs, 0);  // 666/s
  slice::noteAsked(words(), limit_, limit_.limit, kInterval, 0);
  const int64_t idle_ns = slice::idleAfterNs(words());
  EXPECT_EQ(idle_ns, kInterval / slice::kIdleWindowsPerInterval);
  const int64_t sweep_ns = idle_ns / 2;  // LeaseManager::sweepIntervalMs
  int64_t last_use = 0;
  int64_t claimed_at = -1;
  // Requests every 0.5 ms but for a gap just short of the idle time, then
  // none from 120 ms; the sweep runs every sweep_ns.
  for (int64_t t = kMs / 2, swept = 0; t < 400 * kMs && claimed_at < 0; t += kMs / 2) {
    const bool gap = t >= 40 * kMs && t < 40 * kMs + idle_ns - kMs;
    if (!gap && t < 120 * kMs) {
      last_use = t;
      ASSERT_FALSE(slice::take(words(), t, 1).must_request) << t / kMs << " ms";
    }
    if (t - swept >= sweep_ns) {
      swept = t;
      if (slice::claimMovedRenewal(words(), t, last_use)) claimed_at = t;
    }
  }
  EXPECT_GE(claimed_at, last_use + idle_ns);
  EXPECT_LE(claimed_at, last_use + idle_ns + sweep_ns);
  EXPECT_EQ(recordedDemand(), 0);  // the renewal gives the rate up
}

// Verifies that a sweep which looks at a holder only when moveCheckDueNs
// says it can be due (and within a lease interval), as LeaseManager's does,
// sees what one that looks every pass sees, at the same pass: the first
// claim of the key's renewal (by a take or by the sweep) comes at the same
// time from the same side, for a demand that falls to a tenth (a take
// sees it), to one request every 8 ms (below the idle time of 10 ms), for
// one that stops (the sweep sees it idle), and for one that goes on as
// asked (no claim within 400 ms).
TEST_F(ShiftTest, ASweepThatLooksWhenDueSeesWhatOneThatLooksEveryPassSees) {
  struct Claim {
    int64_t at_ns = -1;
    bool by_sweep = false;
    bool operator==(const Claim&) const = default;
  };
  // Requests every 0.5 ms until `fall_ns`, every `then_ns` until `stop_ns`,
  // then none; the sweep every 5 ms.
  auto firstClaim = [&](bool when_due, int64_t fall_ns, int64_t then_ns, int64_t stop_ns) {
    words_ = std::vector<std::atomic<uint64_t>>(slice::kWords);
    slice::applyRate(words(), 500'000, 10'000, 5'000 * kMs, 2'500 * kMs, 0);  // 2,000/s
    slice::noteAsked(words(), limit_, limit_.limit, kInterval, 0);
    int64_t last_use = 0;
    int64_t next_request = kMs / 2;
    int64_t look_at = 0;
    for (int64_t t = 0; t < 400 * kMs; t += kMs / 2) {
      if (t == next_request && t < stop_ns) {
        last_use = t;
        if (slice::take(words(), t, 1).must_request) return Claim{t, false};
        next_request += t < fall_ns ? kMs / 2 : then_ns;
      }
      if (t % (5 * kMs) != 0 || (when_due && t < look_at)) continue;
      if (slice::claimMovedRenewal(words(), t, last_use)) return Claim{t, true};
      look_at = std::min(slice::moveCheckDueNs(words(), last_use), t + kInterval);
    }
    return Claim{};
  };
  struct Case {
    int64_t fall_ns, then_ns, stop_ns;
    bool claimed;
  };
  for (const Case& c : {Case{60 * kMs, 5 * kMs, 400 * kMs, true}, Case{60 * kMs, 8 * kMs, 400 * kMs, true},
                        Case{400 * kMs, kMs, 120 * kMs, true}, Case{400 * kMs, kMs, 400 * kMs, false}}) {
    const Claim every_pass = firstClaim(false, c.fall_ns, c.then_ns, c.stop_ns);
    const Claim when_due = firstClaim(true, c.fall_ns, c.then_ns, c.stop_ns);
    std::cout << "measured: fall at " << c.fall_ns / kMs << " ms to every " << c.then_ns / kMs
              << " ms, stop at " << c.stop_ns / kMs << " ms: "
              << (every_pass.at_ns < 0 ? "no claim"
                                       : "claimed at " + std::to_string(every_pass.at_ns / kMs) + " ms by the " +
                                             (every_pass.by_sweep ? "sweep" : "take"))
              << "\n";
    EXPECT_EQ(when_due, every_pass) << c.fall_ns / kMs << " " << c.then_ns / kMs << " " << c.stop_ns / kMs;
    EXPECT_EQ(every_pass.at_ns >= 0, c.claimed) << c.fall_ns / kMs << " " << c.then_ns / kMs;
  }
}

// Verifies that while Redis is unreachable a rate that held when the
// breaker opened refills on past its end until the hold ends, and that
// then (or for a rate that had ended before the opening) the equal share
// decides.
TEST_F(SliceTest, InFallbackARateHeldAtTheOpeningRefillsOnPastItsEndUntilTheHoldEnds) {
  // 100 units/s until 1 s; the breaker opens at 500 ms, the hold ends at 3 s.
  slice::applyRate(words(), 10 * kMs, 10, 1'000 * kMs, 800 * kMs, 0);
  const int64_t open = 500 * kMs;
  const int64_t hold = 3'000 * kMs;
  const slice::Outage out{.opened_ns = open, .began_ns = open, .hold_until_ns = hold};
  slice::TakeResult before = slice::takeOnRate(words(), 900 * kMs, 10, out);
  ASSERT_EQ(before.outcome, slice::Outcome::kTaken);
  // Refilled at the rate past the end: 10 units by 1,000 ms, 10 more by 2,000 ms.
  EXPECT_EQ(slice::takeOnRate(words(), 1'000 * kMs, 10, out).outcome, slice::Outcome::kTaken);
  // A look agrees past the end too (peek and reserve in fallback).
  EXPECT_EQ(slice::lookOnRate(words(), 1'099 * kMs, 10, out).outcome, slice::Outcome::kDenied);
  EXPECT_EQ(slice::lookOnRate(words(), 1'100 * kMs, 10, out).outcome, slice::Outcome::kTaken);
  EXPECT_EQ(slice::lookOnRate(words(), 1'100 * kMs, 10).outcome, slice::Outcome::kFallback);
  slice::TakeResult after = slice::takeOnRate(words(), 1'099 * kMs, 10, out);
  EXPECT_EQ(after.outcome, slice::Outcome::kDenied);
  // At the fallback's refill (63/64 of the rate): the tenth unit is due
  // between 1,099 and 1,100 ms.
  EXPECT_GT(after.until_ns, 1'099 * kMs);
  EXPECT_LE(after.until_ns, 1'100 * kMs);
  slice::TakeResult past = slice::takeOnRate(words(), 1'100 * kMs, 10, out);
  ASSERT_EQ(past.outcome, slice::Outcome::kTaken);
  // The hold ends: the equal share decides.
  EXPECT_EQ(slice::takeOnRate(words(), hold - 1, 1, out).outcome, slice::Outcome::kTaken);
  EXPECT_EQ(slice::takeOnRate(words(), hold, 1, out).outcome, slice::Outcome::kFallback);
  EXPECT_EQ(slice::lookOnRate(words(), hold, 1, out).outcome, slice::Outcome::kFallback);
  // Without a hold (half-open, or a rate that ended before the opening):
  // the equal share from the rate's end.
  EXPECT_EQ(slice::takeOnRate(words(), 1'100 * kMs, 1).outcome, slice::Outcome::kFallback);
  EXPECT_EQ(slice::takeOnRate(words(), 1'100 * kMs, 1,
                              {.opened_ns = 1'000 * kMs, .began_ns = 1'000 * kMs, .hold_until_ns = 4'000 * kMs})
                .outcome,
            slice::Outcome::kFallback);
}

// Verifies that after a recovery that failed, a rate that held when the
// outage began is spent again from the new opening, past its end until
// the outage's hold ends, and that the new opening drops what the slice
// saved up meanwhile: from it, the fallback's refill alone.
TEST_F(SliceTest, AfterAFailedRecoveryTheRateHeldWhenTheOutageBeganIsSpentFromTheNewOpening) {
  // 100 units/s until 1 s; the outage began at 500 ms, and the breaker
  // opened again at 2,000 ms (past the rate's end), the hold ends at 3 s.
  slice::applyRate(words(), 10 * kMs, 10, 1'000 * kMs, 800 * kMs, 0);
  const slice::Outage first{.opened_ns = 500 * kMs, .began_ns = 500 * kMs, .hold_until_ns = 3'000 * kMs};
  ASSERT_EQ(slice::takeOnRate(words(), 900 * kMs, 10, first).outcome, slice::Outcome::kTaken);
  const slice::Outage again{.opened_ns = 2'000 * kMs, .began_ns = 500 * kMs, .hold_until_ns = 3'000 * kMs};
  // The 10 units refilled since 900 ms were dropped at the new opening.
  EXPECT_EQ(slice::lookOnRate(words(), 2'000 * kMs, 1, again).outcome, slice::Outcome::kDenied);
  EXPECT_EQ(slice::takeOnRate(words(), 2'000 * kMs, 1, again).outcome, slice::Outcome::kDenied);
  // 100 ms at 63/64 of 100/s: 9 units.
  EXPECT_EQ(slice::takeOnRate(words(), 2'100 * kMs, 9, again).outcome, slice::Outcome::kTaken);
  EXPECT_EQ(slice::takeOnRate(words(), 2'100 * kMs, 1, again).outcome, slice::Outcome::kDenied);
  // Counted from the new opening, the rate ended before it: the equal share.
  const slice::Outage reopened{.opened_ns = 2'000 * kMs, .began_ns = 2'000 * kMs, .hold_until_ns = 12'000 * kMs};
  EXPECT_EQ(slice::takeOnRate(words(), 2'200 * kMs, 1, reopened).outcome, slice::Outcome::kFallback);
}

// Verifies that a rate ended by a change of master stops refilling the
// token path, but keeps its refill for the fallback's hold: a rate that
// held at the opening is spent on (at 63/64) until the hold ends.
TEST_F(SliceTest, ARateEndedByANewMasterIsKeptForTheHoldAlone) {
  // 100 units/s until 5 s; the breaker opens at 500 ms, Redis is back at 1 s.
  slice::applyRate(words(), 10 * kMs, 10, 5'000 * kMs, 2'500 * kMs, 0);
  const int64_t open = 500 * kMs;
  const int64_t hold = open + rate_lease::kFallbackHoldNs;
  // 9 units refilled since the opening (one per 10.16 ms): 4 are left.
  ASSERT_EQ(slice::takeOnRate(words(), 600 * kMs, 5, outageFrom(open, hold)).left, 4);
  slice::endRate(words(), 1'000 * kMs);
  EXPECT_FALSE(slice::holdsRate(words(), 1'000 * kMs));
  EXPECT_EQ(slice::rateNsPerUnit(words(), 1'000 * kMs), 0);
  // The token path finds the 4 units, and nothing the ended rate refilled
  // from 600 to 1,000 ms.
  EXPECT_EQ(slice::take(words(), 1'010 * kMs, 5).outcome, slice::Outcome::kEmpty);
  slice::unclaim(words());
  // The hold refills from the end on: 4 more by 1,050 ms, 6 by 1,070 ms.
  EXPECT_EQ(slice::takeOnRate(words(), 1'050 * kMs, 10, outageFrom(open, hold)).outcome, slice::Outcome::kDenied);
  EXPECT_EQ(slice::takeOnRate(words(), 1'070 * kMs, 10, outageFrom(open, hold)).outcome, slice::Outcome::kTaken);
  EXPECT_EQ(slice::takeOnRate(words(), hold, 1, outageFrom(open, hold)).outcome, slice::Outcome::kFallback);
  // A rate that had ended before the opening has no hold.
  EXPECT_EQ(slice::takeOnRate(words(), 1'200 * kMs, 1, outageFrom(1'100 * kMs, 1'100 * kMs + rate_lease::kFallbackHoldNs))
                .outcome,
            slice::Outcome::kFallback);
}

// Verifies the units a rate refills in a period, for the overshoot bound
// in fallback: rounded up, and 0 without a rate.
TEST_F(SliceTest, RatePerPeriodCountsTheLastRatesUnits) {
  EXPECT_EQ(slice::ratePerPeriod(words(), 1'000 * kMs), 0);
  slice::applyRate(words(), 3 * kMs, 10, 1'000 * kMs, 800 * kMs, 0);
  EXPECT_EQ(slice::ratePerPeriod(words(), 1'000 * kMs), 334);
}

// Verifies that the demand a rate lease is asked by counts the units asked
// in the measurement under way once they pass the last full one, so that a
// key that turns hot asks for a rate within its first interval.
TEST_F(SliceTest, DemandPerIntervalCountsTheMeasurementUnderWay) {
  const Rule rule = bucketRule(1'000, 1'000 * kMs, 30);
  grant(100);
  slice::nextBatch(words(), 1 * kMs, 1, rule, 1, kInterval);  // starts a measurement
  for (int i = 0; i < 40; ++i) slice::take(words(), 1 * kMs, 1);
  EXPECT_EQ(recordedDemand(), 40);
  slice::nextBatch(words(), 1 * kMs + kInterval, 1, rule, 1, kInterval);  // ends it: 40
  slice::take(words(), 1 * kMs + kInterval, 1);
  EXPECT_EQ(recordedDemand(), 40);
}

// Verifies on a simulated clock that a key's first demand measurement
// counts from the request after the one that starts it: a key at 171.4/s
// (one request every 5.833 ms) measured over 105 ms reads 17.14 per
// 100-ms interval, as later measurements do, not 18.1 (the 19 requests
// span 18 gaps, 105 ms, from the first): a rate lease asks 172/s, not 181.
TEST_F(SliceTest, TheFirstDemandMeasurementCountsFromTheRequestAfterItsStart) {
  Rule rule = bucketRule(2'000, 1'000 * kMs, 40);
  const int64_t t0 = 1'000 * kMs;
  const int64_t gap_ns = 35 * kMs / 6;  // 171.4/s
  slice::take(words(), t0, 1);
  slice::nextBatch(words(), t0, 1, rule, 8, kInterval);  // the first lease: the measurement starts
  for (int i = 1; i <= 18; ++i) slice::take(words(), t0 + i * gap_ns, 1);
  slice::nextBatch(words(), t0 + 18 * gap_ns, 1, rule, 8, kInterval);  // 105 ms: it ends
  EXPECT_EQ(recordedDemand(), 17);
  const int64_t ask_ns = t0 + 18 * gap_ns;
  EXPECT_EQ(rate_lease::askedRate(rule.limits.front(), slice::demandPerInterval(words(), ask_ns, kInterval), kInterval),
            172);
  for (int i = 19; i <= 36; ++i) slice::take(words(), t0 + i * gap_ns, 1);
  slice::nextBatch(words(), t0 + 36 * gap_ns, 1, rule, 8, kInterval);  // the next 105 ms
  EXPECT_EQ(recordedDemand(), 17);
}

// Verifies on a simulated clock that a rate asks for the key's demand to
// a fraction of a unit per lease interval: a key at 85.7/s (60 requests
// in 700 ms) measures 8.571 per 100-ms interval and asks 86/s; in whole
// units per interval it would ask 90/s (9), and seven such keys beside a
// hot one would hold 30/s of the limit they never spend.
TEST_F(SliceTest, ARateAsksForTheDemandToAFractionOfAUnitPerInterval) {
  Rule rule = bucketRule(2'000, 1'000 * kMs, 40);
  const int64_t t0 = 1'000 * kMs;
  slice::take(words(), t0, 1);
  slice::nextBatch(words(), t0, 1, rule, 8, kInterval);
  for (int i = 1; i <= 60; ++i) slice::take(words(), t0 + i * 35 * kMs / 3, 1);
  const int64_t end_ns = t0 + 700 * kMs;
  slice::nextBatch(words(), end_ns, 1, rule, 8, kInterval);
  EXPECT_EQ(recordedDemand(), 9);  // whole units, rounded
  EXPECT_NEAR(slice::demandPerInterval(words(), end_ns, kInterval), 8.571, 0.0005);
  EXPECT_EQ(rate_lease::askedRate(rule.limits.front(), slice::demandPerInterval(words(), end_ns, kInterval), kInterval),
            86);
}

// Verifies on a simulated clock that a rate ask scales the demand
// measurement under way to a whole lease interval (100 ms): a key at 750/s
// whose first lease started the measurement asks, 8 ms later, for 70 per
// interval (7 units over the least span of 10 ms), not for the 7 counted;
// 20 ms in, for 80 (16 units); a measurement past a whole interval is not
// scaled down, and a full one (kRate) that is more stands.
TEST_F(SliceTest, ARateAskScalesTheMeasurementUnderWayToAWholeInterval) {
  Rule rule = bucketRule(2'000, 1'000 * kMs, 20);
  const int64_t t0 = 1'000 * kMs;
  slice::nextBatch(words(), t0, 1, rule, 8, kInterval);  // the first lease: the measurement starts
  auto takeUntil = [&](int64_t from_ns, int64_t until_ns) {
    for (int64_t t = from_ns; t <= until_ns; t += 4 * kMs / 3) slice::take(words(), t0 + t, 1);
  };
  takeUntil(0, 8 * kMs);  // 0, 1.33, ..., 8 ms: 7 units
  EXPECT_EQ(recordedDemand(), 7);
  EXPECT_EQ(slice::demandPerInterval(words(), t0 + 8 * kMs, kInterval), 70);
  takeUntil(8 * kMs + 4 * kMs / 3, 20 * kMs);  // 16 units by 20 ms
  EXPECT_EQ(slice::demandPerInterval(words(), t0 + 20 * kMs, kInterval), 80);
  // Past a whole interval the count is what it is (nextBatch has not ended it).
  EXPECT_EQ(slice::demandPerInterval(words(), t0 + 300 * kMs, kInterval), 16);
  words_[slice::kRate].store(120 * slice::kRateParts);
  EXPECT_EQ(slice::demandPerInterval(words(), t0 + 20 * kMs, kInterval), 120);
}

// Verifies on a simulated clock (lease interval 100 ms) that a key whose
// rate ops come back short of their ask while demand is unmet asks again
// quickly for two lease intervals from the first such reply and no longer
// (a holder that keeps more than its share, a crashed node's rate, costs
// one ask an interval after that), and that a reply that is not short, or
// says every demand is met, ends the spell so the next one starts anew.
TEST_F(SliceTest, AShortRateAsksAgainQuicklyForTwoLeaseIntervals) {
  const int64_t t0 = 1'000 * kMs;
  EXPECT_TRUE(slice::noteRateShort(words(), true, t0, kInterval, 2));
  EXPECT_TRUE(slice::noteRateShort(words(), true, t0 + 25 * kMs, kInterval, 2));
  EXPECT_TRUE(slice::noteRateShort(words(), true, t0 + 199 * kMs, kInterval, 2));
  EXPECT_FALSE(slice::noteRateShort(words(), true, t0 + 200 * kMs, kInterval, 2));
  EXPECT_FALSE(slice::noteRateShort(words(), true, t0 + 900 * kMs, kInterval, 2));
  EXPECT_FALSE(slice::noteRateShort(words(), false, t0 + 1'000 * kMs, kInterval, 2));
  EXPECT_TRUE(slice::noteRateShort(words(), true, t0 + 1'100 * kMs, kInterval, 2));
  EXPECT_TRUE(slice::noteRateShort(words(), true, t0 + 1'250 * kMs, kInterval, 2));
}

// Verifies the sum the fallback keeps, on a simulated clock: the rates of
// the outage-under-skew shape at N = 3 (1,400, 300 and 300 of 2,000/s,
// the whole limit), each slice holding its cap when the breaker opens,
// and every node taking a unit every 0.1 ms through a 5 s outage. Over
// every span from the opening, the fleet admits at most 63/64 of limit x
// span (the units held at the opening are dropped, the rates refill at
// 63/64 from there), so what the nodes spent of their slices between
// Redis's end and the opening has room; and at least 0.9 of it.
TEST_F(SliceTest, InFallbackTheRatesAdmitLessThanTheLimitOverEverySpanFromTheOpening) {
  const Limit limit{2'000, 1'000 * kMs, 40};
  const int64_t open = 10'000 * kMs;
  std::vector<std::vector<std::atomic<uint64_t>>> nodes;
  for (int64_t rate : {1'400, 300, 300}) {
    nodes.emplace_back(slice::kWords);
    slice::Words w{nodes.back().data(), slice::kWords};
    // Granted at 9 s until 14 s (the hold carries it past), its slice full.
    slice::applyRate(w, rate_lease::nsPerUnit(limit, rate), rate_lease::capUnits(limit, rate, kInterval),
                     14'000 * kMs, 11'500 * kMs, 9'000 * kMs);
    w[slice::kUnits].store(static_cast<uint64_t>(rate_lease::capUnits(limit, rate, kInterval)));
    w[slice::kRateRefilledAt].store(static_cast<uint64_t>(open - kMs / 2));
  }
  int64_t admitted = 0;
  for (int64_t t = open; t <= open + 5'000 * kMs; t += kMs / 10) {
    for (auto& node : nodes) {
      slice::Words w{node.data(), slice::kWords};
      if (slice::takeOnRate(w, t, 1, outageFrom(open, open + rate_lease::kFallbackHoldNs)).outcome == slice::Outcome::kTaken) {
        ++admitted;
      }
    }
    const double span_s = static_cast<double>(t - open) / 1e9;
    ASSERT_LE(static_cast<double>(admitted), 63.0 / 64.0 * 2'000 * span_s) << (t - open) / kMs << " ms";
  }
  EXPECT_GE(admitted, 9'000);
}

}  // namespace
}  // namespace sluice

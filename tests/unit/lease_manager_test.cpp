// Tests for LeaseManager against a real redis-server per test: what a burst
// of requests costs the control thread while it waits on the pipeline. The
// test drives the manager on its own loop, as the control thread does, waits
// on conditions with a guard timer (never a sleep), and ends by closing the
// link and checking that the loop closes with no handle left open.
#include "lease_manager.h"

#include <gtest/gtest.h>
#include <malloc.h>
#include <uv.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "clock.h"
#include "entry.h"
#include "holding.h"
#include "rate_lease.h"
#include "slice.h"
#include "redis_server.h"
#include "test_support.h"
#include "uv_loop.h"

namespace sluice {
namespace {

using test::RedisServer;

constexpr int64_t kMs = 1'000'000;


// A LeaseManager on its own loop, as the control thread runs it, linked to
// a redis-server of its own. Each fixture builds its rules and starts it.
class ManagerFixture : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(uv_loop_init(&loop_), 0); }

  // Builds the manager on `rules` (its config_ and node_id_ as the fixture
  // set them) and runs the loop until the breaker closes. With
  // `follow_link`, it is told of every connect and disconnect, as Control
  // does; without, only of the first connect.
  void start(std::vector<Rule> rules, bool follow_link = true) {
    rules_ = std::make_shared<const RuleSet>(std::move(rules));
    config_.host = server_.host();
    config_.port = static_cast<uint16_t>(server_.port());
    link_ = std::make_unique<RedisLink>(&loop_, config_);
    LeaseContext context;
    context.keys = &keys_;
    context.broker = &broker_;
    context.rules = [this] { return rules_; };
    context.node_id = node_id_;
    context.now_ns = now_ns_;
    manager_ = std::make_unique<LeaseManager>(*link_, config_, context);
    link_->onConnected([this, follow_link] {
      if (follow_link || !told_up_) manager_->onUp();
      told_up_ = true;
    });
    if (follow_link) link_->onDisconnected([this](std::string_view) { manager_->onDown(); });
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

  RedisServer server_;
  uv_loop_t loop_;
  RedisConfig config_;
  std::string node_id_;
  // The manager's clock (LeaseContext::now_ns), as start() finds it.
  std::function<int64_t()> now_ns_ = monotonicNowNs;
  RuleSetPtr rules_;
  KeyTable keys_{[] {
    KeyTableOptions options;
    options.sweep_min_idle_ns = 0;
    return options;
  }()};
  KeyTable::ReaderId reader_ = keys_.registerReader();
  LeaseBroker broker_{100 * kMs};
  std::unique_ptr<RedisLink> link_;
  std::unique_ptr<LeaseManager> manager_;
  bool told_up_ = false;
};

class LeaseManagerTest : public ManagerFixture {
 protected:
  void SetUp() override {
    ManagerFixture::SetUp();
    Rule shared;
    shared.name = "shared";
    shared.scope = Scope::kGlobal;
    shared.limits = {Limit{.limit = 1'000'000, .period_ns = 1'000 * kMs, .burst = 1'000'000}};
    std::vector<Rule> rules;
    rules.push_back(std::move(shared));
    // Returns are sent with lease_timeout as their deadline: these tests are
    // about what a burst costs, not deadlines, and a loaded machine may stall
    // Redis past the default 50 ms (the link then drops the connection).
    config_.lease_timeout_ms = 1'000;
    ASSERT_NO_FATAL_FAILURE(start(std::move(rules), follow_link()));
    rule_id_ = rules_->find("shared")->id;
  }
  virtual bool follow_link() const { return true; }

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

  uint32_t rule_id_ = 0;
};

// Verifies that every return of a burst larger than the pipeline is sent,
// in turn, as replies make room.
TEST_F(LeaseManagerTest, ABurstOfReturnsIsSentInFull) {
  constexpr int kReturns = 10'000;
  submitReturns(kReturns);
  manager_->onWakeup();
  ASSERT_TRUE(runUntil([&] { return returnedUnits() == kReturns; }));
}

// A global rule of several limits (RuleSet::parts): 10 a second and 3 an hour.
class PartsManagerTest : public ManagerFixture {
 protected:
  void SetUp() override {
    ManagerFixture::SetUp();
    Rule pair;
    pair.name = "pair";
    pair.id = 77;
    pair.scope = Scope::kGlobal;
    pair.limits = {Limit{.limit = 10, .period_ns = 1'000 * kMs, .burst = 10},
                   Limit{.limit = 3, .period_ns = 3'600'000 * kMs, .burst = 3}};
    ASSERT_NO_FATAL_FAILURE(start({pair}));
    parts_ = rules_->parts(*rules_->find("pair"));
    ASSERT_EQ(parts_.size(), 2u);
  }

  // The slice words of `part`'s entry for key "k".
  std::span<std::atomic<uint64_t>> slice(const Rule& part) {
    KeyTable::ReadGuard guard(keys_, reader_);
    return keys_.findOrInsert(part.id, "k", entryWords(part), monotonicNowNs())->state();
  }

  std::span<const Rule> parts_;
};

// Verifies each part leases on its own: its lease finds the part by id, runs
// the script with the part's limit on the part's own Redis key, and lands in
// the part's slice with what Redis had left after it; the rule's own name
// has no state in Redis.
TEST_F(PartsManagerTest, EachPartLeasesItsOwnKey) {
  for (const Rule& part : parts_) {
    slice(part)[slice::kFlags].fetch_or(slice::kInFlight);  // as the worker that claims it
    LeaseRequest request;
    request.rule_id = part.id;
    request.key = "k";
    request.n = 5;  // more than the hourly part has
    request.need = 1;
    broker_.submit(std::move(request));
  }
  manager_->onWakeup();
  ASSERT_TRUE(runUntil([&] {
    return std::none_of(parts_.begin(), parts_.end(), [&](const Rule& part) {
      return (slice(part)[slice::kFlags].load() & slice::kInFlight) != 0;
    });
  }));
  EXPECT_EQ(slice(parts_[0])[slice::kUnits].load(), 5u);
  EXPECT_EQ(slice(parts_[1])[slice::kUnits].load(), 3u);
  // 5 of the 10 a second were left (and a unit refills per 100 ms since);
  // none of the 3 an hour.
  const int64_t now_ns = monotonicNowNs();
  EXPECT_GE(slice::redisLeft(slice(parts_[0]), parts_[0], now_ns), 5);
  EXPECT_LE(slice::redisLeft(slice(parts_[0]), parts_[0], now_ns), 10);
  EXPECT_NE(slice(parts_[1])[slice::kFlags].load() & slice::kRedisLeftKnown, 0u);
  EXPECT_EQ(slice::redisLeft(slice(parts_[1]), parts_[1], now_ns), 0);
  for (const Rule& part : parts_) {
    EXPECT_GT(std::stoll(server_.cli({"PTTL", manager_->stateKey(part.name, "k")})), 0) << part.id;
  }
  EXPECT_EQ(server_.cli({"EXISTS", manager_->stateKey("pair", "k")}), "0");
}

// A global sliding log of 3 a second. The manager's clock is the host's
// plus ahead_ns_, which a test moves forward while a lease is out.
class SlidingLogManagerTest : public ManagerFixture {
 protected:
  void SetUp() override {
    ManagerFixture::SetUp();
    Rule log;
    log.name = "log";
    log.scope = Scope::kGlobal;
    log.algorithm = Algorithm::kSlidingLog;
    log.limits = {Limit{.limit = 3, .period_ns = 1'000 * kMs, .burst = 3}};
    now_ns_ = [this] { return monotonicNowNs() + ahead_ns_; };
    ASSERT_NO_FATAL_FAILURE(start({log}));
    rule_ = rules_->find("log");
  }

  std::span<std::atomic<uint64_t>> words() {
    KeyTable::ReadGuard guard(keys_, reader_);
    return keys_.findOrInsert(rule_->id, "k", entryWords(*rule_), monotonicNowNs())->state();
  }
  // What a worker does when its acquire claims the key's lease; the reply
  // is applied by the time it returns.
  void lease(int64_t n, const std::function<void()>& after_send = [] {}) {
    words()[slice::kFlags].fetch_or(slice::kInFlight);
    LeaseRequest request;
    request.rule_id = rule_->id;
    request.key = "k";
    request.n = n;
    request.need = 1;
    broker_.submit(std::move(request));
    manager_->onWakeup();  // sends it
    after_send();
    ASSERT_TRUE(runUntil([&] { return (words()[slice::kFlags].load() & slice::kInFlight) == 0; }));
  }

  const Rule* rule_ = nullptr;
  int64_t ahead_ns_ = 0;
};

// Verifies a denial's wait runs from the lease's send, not from its reply:
// Redis's retry_after counts from when the script ran, which is after the
// send. Counted from the reply, every denial would add the reply's way back,
// and a saturated log's next lease would come that much late each period.
// The reply is made to arrive 200 ms after the send, by the manager's clock.
TEST_F(SlidingLogManagerTest, ADenialWaitsFromTheSendNotTheReply) {
  const int64_t first_sent_ns = monotonicNowNs();
  lease(3);  // fills the log: its entries leave one period after the lease ran
  const int64_t first_answered_ns = monotonicNowNs();
  ASSERT_EQ(words()[slice::kUnits].load(), 3u);
  lease(1, [&] { ahead_ns_ = 200 * kMs; });
  const int64_t second_answered_ns = monotonicNowNs();
  const auto deny_ns = static_cast<int64_t>(words()[slice::kDenyUntil].load());
  // Redis's wait (rounded up to a ms, less the ms a sliding log takes off
  // it) ends one period after the first lease ran, which was before
  // first_answered_ns; the second ran after its send. Counted from the
  // reply, the wait would end 200 ms later. (1 ms more for Redis's clock
  // against this host's monotonic one.)
  EXPECT_LE(deny_ns, first_answered_ns + 1'000 * kMs + 1 * kMs);
  EXPECT_GE(deny_ns, first_sent_ns + 1'000 * kMs - (second_answered_ns - first_answered_ns) - 2 * kMs);
}

// Holdings of a global concurrency rule (holding.h) against a real Redis:
// leases, returns, renewals, reconciliation with what Redis holds. The
// manager's clock is the host's plus ahead_ns_, which a test moves on in
// place of waiting; what Redis's own clock would do meanwhile (a holding
// ending) the test does to Redis's state.
class HoldingManagerTest : public ManagerFixture {
 protected:
  static constexpr int64_t kTtlMs = 600;

  void SetUp() override {
    ManagerFixture::SetUp();
    now_ns_ = [this] { return monotonicNowNs() + ahead_ns_; };
    Rule jobs;
    jobs.name = "jobs";
    jobs.scope = Scope::kGlobal;
    jobs.algorithm = Algorithm::kConcurrency;
    jobs.limits = {Limit{.limit = 10, .period_ns = 60'000 * kMs, .burst = 10}};
    std::vector<Rule> rules;
    rules.push_back(std::move(jobs));
    config_.lease_ttl_ms = kTtlMs;
    node_id_ = "node-a";
    ASSERT_NO_FATAL_FAILURE(start(std::move(rules)));
    rule_ = rules_->find("jobs");
  }

  std::span<std::atomic<uint64_t>> words(const std::string& key) {
    KeyTable::ReadGuard guard(keys_, reader_);
    KeyTable::Entry* entry = keys_.findOrInsert(rule_->id, key, entryWords(*rule_), monotonicNowNs());
    return entry->state();  // the test's entries are never swept while in use
  }
  int64_t word(const std::string& key, size_t which) {
    return static_cast<int64_t>(words(key)[which].load());
  }
  bool inFlight(const std::string& key) {
    return (words(key)[slice::kFlags].load() & slice::kInFlight) != 0;
  }
  // What a worker does when its acquire claims the key's lease.
  void lease(const std::string& key, int64_t n, int64_t need) {
    words(key)[slice::kFlags].fetch_or(slice::kInFlight);
    LeaseRequest request;
    request.rule_id = rule_->id;
    request.key = key;
    request.n = n;
    request.need = need;
    broker_.submit(std::move(request));
    manager_->onWakeup();
    ASSERT_TRUE(runUntil([&] { return !inFlight(key); }));
  }
  // The units Redis holds for node-a on `key` (0: none).
  int64_t redisHeld(const std::string& key) {
    std::string field = server_.cli({"HGET", manager_->stateKey("jobs", key), "node-a"});
    return field.empty() ? 0 : std::stoll(field.substr(0, field.find(':')));
  }
  // When node-a's holding on `key` ends (µs, Redis's clock; 0: none).
  int64_t redisDeadlineUs(const std::string& key) {
    std::string field = server_.cli({"HGET", manager_->stateKey("jobs", key), "node-a"});
    return field.empty() ? 0 : std::stoll(field.substr(field.find(':') + 1));
  }
  // Redis's clock (TIME), µs.
  int64_t redisNowUs() {
    std::string time = server_.cli({"TIME"});  // seconds, a newline, µs
    return std::stoll(time.substr(0, time.find('\n'))) * 1'000'000 + std::stoll(time.substr(time.find('\n') + 1));
  }

  const Rule* rule_ = nullptr;
  int64_t ahead_ns_ = 0;
};

// Verifies a lease puts its units into the pool and the node's holding in
// Redis (and notes what the fleet had free after it), and a return (as the sweep sends for a key gone idle) takes them
// out of both.
TEST_F(HoldingManagerTest, ALeaseHoldsUnitsInRedisUntilTheyAreReturned) {
  lease("k", 4, 1);
  EXPECT_EQ(word("k", slice::kUnits), 4);
  EXPECT_EQ(word("k", holding::kHeld), 4);
  EXPECT_EQ(redisHeld("k"), 4);
  // The reply's free units across the fleet, kept for remaining: 10 - 4.
  EXPECT_EQ(slice::redisLeft(slice::of(words("k")), *rule_, monotonicNowNs()), 6);
  // The sweep empties the pool, then asks for the return.
  int64_t units = static_cast<int64_t>(words("k")[slice::kUnits].exchange(0));
  LeaseRequest back;
  back.kind = LeaseRequest::Kind::kReturn;
  back.rule_id = rule_->id;
  back.key = "k";
  back.n = units;
  broker_.submit(std::move(back));
  manager_->onWakeup();
  ASSERT_TRUE(runUntil([&] { return broker_.counters().returned_units.load() == 4; }));
  EXPECT_EQ(redisHeld("k"), 0);
  EXPECT_EQ(word("k", holding::kHeld), 0);
}

// Verifies a node cannot lease more than the limit leaves free, and that
// "nothing free" is cached for at most a lease interval.
TEST_F(HoldingManagerTest, ALeaseGetsWhatIsFreeAndNoMore) {
  server_.cli({"HSET", manager_->stateKey("jobs", "k"), "node-b",
               "8:" + std::to_string(int64_t{1} << 52)});
  lease("k", 5, 1);
  EXPECT_EQ(word("k", holding::kHeld), 2);
  lease("k", 1, 1);
  EXPECT_EQ(word("k", holding::kHeld), 2);
  int64_t deny_ns = word("k", slice::kDenyUntil) - monotonicNowNs();
  EXPECT_GT(deny_ns, 0);
  EXPECT_LE(deny_ns, 100 * kMs);
}

// Verifies a renewal pass moves a holding whose units are held here a TTL
// on, though the key makes no call of its own: set in Redis to end 50 ms
// from now, it ends a TTL after a pass made a renewal interval (TTL /
// kRenewalsPerTtl) after the lease.
TEST_F(HoldingManagerTest, APassRenewsAHeldHoldingATtlOn) {
  lease("k", 3, 1);
  ASSERT_EQ(holding::acquire(words("k"), rule_->limits.front(), monotonicNowNs(), 3, false, 0)
                .taken.outcome,
            slice::Outcome::kTaken);
  const int64_t redis_now_us = redisNowUs();
  server_.cli({"HSET", manager_->stateKey("jobs", "k"), "node-a", "3:" + std::to_string(redis_now_us + 50'000)});
  ahead_ns_ = kTtlMs * kMs / kRenewalsPerTtl;
  manager_->renewHoldings();
  EXPECT_EQ(broker_.counters().renewed.load(), 1u);
  ASSERT_TRUE(runUntil([&] { return redisDeadlineUs("k") != redis_now_us + 50'000; }));
  EXPECT_GE(redisDeadlineUs("k"), redis_now_us + kTtlMs * 1000);
  EXPECT_EQ(redisHeld("k"), 3);
  EXPECT_EQ(word("k", holding::kHeld), 3);
}

// Verifies a holding that expired in Redis (no renewal for a TTL) is found
// out at the next call: its units leave the pool, the units callers hold
// here become a debt, and the next lease asks for it and pays it first.
TEST_F(HoldingManagerTest, AnExpiredHoldingTurnsUnitsInUseIntoADebt) {
  lease("k", 3, 1);
  const Limit& limit = rule_->limits.front();
  int64_t now_ns = monotonicNowNs();
  ASSERT_EQ(holding::acquire(words("k"), limit, now_ns, 2, false, 0).taken.outcome,
            slice::Outcome::kTaken);
  // A TTL and more pass with no call: the holding, the key's only one,
  // ends in Redis, and the key with it (its TTL is the last deadline).
  server_.cli({"DEL", manager_->stateKey("jobs", "k")});
  ahead_ns_ = (kTtlMs + 100) * kMs;
  manager_->renewHoldings();
  ASSERT_TRUE(runUntil([&] { return broker_.counters().lost_units.load() == 3; }));
  EXPECT_EQ(word("k", holding::kHeld), 0);
  EXPECT_EQ(holding::pool(words("k")), -2);
  // A leasing acquire: nothing to hand out, a lease for the debt and the cost.
  holding::Acquired again = holding::acquire(words("k"), limit, monotonicNowNs(), 1, false, 0);
  EXPECT_EQ(again.taken.outcome, slice::Outcome::kEmpty);
  ASSERT_TRUE(again.taken.must_request);
  slice::Batch batch = holding::nextBatch(words("k"), monotonicNowNs(), 1, *rule_, 1, 100 * kMs);
  EXPECT_EQ(batch.need, 3);
  words("k")[slice::kFlags].fetch_and(~slice::kInFlight);
  lease("k", batch.n, batch.need);
  EXPECT_EQ(redisHeld("k"), word("k", holding::kHeld));
  EXPECT_EQ(holding::pool(words("k")) + holding::live(words("k"), monotonicNowNs()),
            word("k", holding::kHeld));
  EXPECT_GE(holding::pool(words("k")), 1);
}

// Verifies units unused through a whole renewal pass go back to Redis, where
// another node may lease them.
TEST_F(HoldingManagerTest, ASurplusUnusedForAPassGoesBack) {
  lease("k", 4, 1);
  manager_->renewHoldings();  // measures
  runUntil([] { return false; }, 10);
  EXPECT_EQ(redisHeld("k"), 4);
  manager_->renewHoldings();  // nothing asked for since: all of it
  ASSERT_TRUE(runUntil([&] { return redisHeld("k") == 0; }));
  EXPECT_EQ(word("k", holding::kHeld), 0);
  EXPECT_EQ(word("k", slice::kUnits), 0);
}

// Verifies units Redis holds for this node that the node does not know of
// (a lease that timed out but ran) are given back at the next answer.
TEST_F(HoldingManagerTest, UnitsRedisHoldsThatTheNodeDoesNotKnowAreReturned) {
  server_.cli({"HSET", manager_->stateKey("jobs", "k"), "node-a",
               "5:" + std::to_string(int64_t{1} << 52)});
  lease("k", 1, 1);
  EXPECT_EQ(word("k", holding::kHeld), 1);
  ASSERT_TRUE(runUntil([&] { return redisHeld("k") == 1; }));
}

// Verifies a key gone from the table (evicted with units in use) has what
// Redis holds for it returned by the next pass.
TEST_F(HoldingManagerTest, AKeyGoneFromTheTableReturnsWhatRedisHolds) {
  lease("k", 3, 1);
  keys_.sweep(monotonicNowNs() + kMs, [](KeyTable::Entry&) { return true; });
  ASSERT_EQ(keys_.size(), 0u);
  manager_->renewHoldings();
  ASSERT_TRUE(runUntil([&] { return server_.cli({"EXISTS", manager_->stateKey("jobs", "k")}) == "0"; }));
}

// Verifies the units acquired in fallback beyond the pool (a debt) are
// leased back while the breaker is half open, so Redis counts them before
// the node leases anything new.
TEST_F(HoldingManagerTest, RecoveryLeasesBackWhatFallbackHeld) {
  words("k");  // the key exists before the outage
  server_.kill();
  ASSERT_TRUE(runUntil([&] { return broker_.breaker() == Breaker::kOpen; }));
  int64_t reclaimed = 0;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(holding::acquireLocal(words("k"), rule_->limits.front(), monotonicNowNs(), 1, 5,
                                      &reclaimed));
  }
  ASSERT_EQ(holding::pool(words("k")), -3);
  server_.restart();
  ASSERT_TRUE(runUntil([&] { return broker_.breaker() == Breaker::kClosed; }));
  EXPECT_EQ(redisHeld("k"), 3);  // before the breaker closed
  EXPECT_EQ(word("k", holding::kHeld), 3);
  EXPECT_EQ(holding::pool(words("k")), 0);
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

// The setting of LeaseManager::retryDebits(). In a cluster, one master's
// link can be down while the others keep Redis up: the breaker stays closed,
// and a debit for a key on that master is refused by the link without being
// sent. Here the one link plays that master: the manager hears of its first
// connection (the breaker closes) and of nothing after, so a killed server
// looks like a lost master, not like Redis down.
// A token bucket whose keys lease rates (rate_lease::eligible), with a
// lease_timeout short enough that a SIGSTOPped Redis loses a reply soon.
class RateManagerTest : public ManagerFixture {
 protected:
  void SetUp() override {
    ManagerFixture::SetUp();
    Rule hot;
    hot.name = "hot";
    hot.scope = Scope::kGlobal;
    hot.algorithm = Algorithm::kTokenBucket;
    hot.limits = {Limit{.limit = 1'000, .period_ns = 1'000 * kMs, .burst = 10}};
    std::vector<Rule> rules;
    rules.push_back(std::move(hot));
    config_.lease_timeout_ms = 100;
    node_id_ = "node-a";
    now_ns_ = [this] { return monotonicNowNs() + ahead_ns_; };
    ASSERT_NO_FATAL_FAILURE(start(std::move(rules)));
    rule_ = rules_->find("hot");
    ASSERT_TRUE(rate_lease::eligible(*rule_));
  }
  void TearDown() override {
    if (stopped_) server_.resume();
    ManagerFixture::TearDown();
  }

  std::span<std::atomic<uint64_t>> words(const std::string& key) {
    KeyTable::ReadGuard guard(keys_, reader_);
    KeyTable::Entry* entry = keys_.findOrInsert(rule_->id, key, entryWords(*rule_), monotonicNowNs());
    return entry->state();  // the test's entries are never swept while in use
  }
  // What a worker does when its take claims the key's rate op: asks for
  // `rate` units per second and no tokens, and waits for the answer (or
  // its loss).
  void askRate(const std::string& key, int64_t rate) {
    words(key)[slice::kFlags].fetch_or(slice::kInFlight);
    LeaseRequest request;
    request.rule_id = rule_->id;
    request.key = key;
    request.n = 0;
    request.need = 0;
    request.rate = rate;
    broker_.submit(std::move(request));
    manager_->onWakeup();
    ASSERT_TRUE(runUntil([&] { return (words(key)[slice::kFlags].load() & slice::kInFlight) == 0; }));
  }
  int64_t nsPerUnit(const std::string& key) {
    return slice::rateNsPerUnit(slice::of(words(key)), monotonicNowNs());
  }
  // Marks `key` used 2 ms from now on the host's clock (past the table's
  // touch resolution, so it is the key's last use exactly), and returns
  // that time.
  int64_t use(const std::string& key) {
    const int64_t at_ns = monotonicNowNs() + 2 * kMs;
    KeyTable::ReadGuard guard(keys_, reader_);
    EXPECT_EQ(keys_.findOrInsert(rule_->id, key, entryWords(*rule_), at_ns)->lastUsedNs(), at_ns);
    return at_ns;
  }
  // Runs sweep passes 5 ms apart on the manager's clock, with no request
  // for any key meanwhile, until one sends a rate op; how long after
  // `used_ns` (the host's clock, the key's last use) that pass came, -1
  // for none within a second. ahead_ns_ is back at 0 after.
  int64_t idleUntilGivenUp(int64_t used_ns) {
    const uint64_t sent = broker_.counters().requested.load();
    int64_t after_ns = -1;
    for (ahead_ns_ = 0; ahead_ns_ <= 1'000 * kMs; ahead_ns_ += 5 * kMs) {
      manager_->sweepIdleRates();
      if (broker_.counters().requested.load() > sent) {
        after_ns = now_ns_() - used_ns;
        break;
      }
    }
    ahead_ns_ = 0;
    return after_ns;
  }

  const Rule* rule_ = nullptr;
  bool stopped_ = false;
  int64_t ahead_ns_ = 0;  // the manager's clock is the host's plus this
};

// Verifies that the sweep gives a rate up once its key has gone unused for
// its idle time (slice::idleAfterNs: 160 ms at 100/s, 16 units), within a
// pass of it, though a pass looks a key up only when it can be due; and
// that an answer which shortens the idle time (a renewal from 10/s,
// 400 ms, to 800/s, 20 ms) brings the look forward, where the slow rate
// had put it up to a lease interval (100 ms) away. The demand window the
// answer began ends a few ms before the idle time at 100/s (the use comes
// 2 ms after the answer), and whichever comes first claims: hence the
// lower bound's 5 ms.
TEST_F(RateManagerTest, TheSweepGivesAnIdleRateUpAtItsIdleTime) {
  askRate("k", 100);
  int64_t idle_ns = slice::idleAfterNs(slice::of(words("k")));
  ASSERT_EQ(idle_ns, 160 * kMs);
  int64_t after_ns = idleUntilGivenUp(use("k"));
  std::cout << "measured: 100/s given up " << after_ns / kMs << " ms after its last use\n";
  EXPECT_GE(after_ns, idle_ns - 5 * kMs);
  EXPECT_LE(after_ns, idle_ns + 10 * kMs);
  ASSERT_TRUE(runUntil([&] { return !slice::inFlight(slice::of(words("k"))); }));

  askRate("j", 10);
  ASSERT_EQ(slice::idleAfterNs(slice::of(words("j"))), 400 * kMs);
  manager_->sweepIdleRates();  // looks at j, and next when it can be due
  askRate("j", 800);
  idle_ns = slice::idleAfterNs(slice::of(words("j")));
  ASSERT_EQ(idle_ns, 20 * kMs);
  after_ns = idleUntilGivenUp(use("j"));
  std::cout << "measured: 800/s given up " << after_ns / kMs << " ms after its last use\n";
  EXPECT_GE(after_ns, idle_ns - 5 * kMs);
  EXPECT_LE(after_ns, idle_ns + 10 * kMs);
}

// Verifies that a renewal asking for a smaller rate whose reply is lost as
// Redis stops holds the key to the smaller rate (Redis may have granted
// it), and that a lost one asking for more leaves it where it was.
TEST_F(RateManagerTest, ALostRenewalThatShrankTheRateHoldsTheSmallerRate) {
  const Limit& limit = rule_->limits.front();
  askRate("k", 800);
  ASSERT_EQ(nsPerUnit("k"), rate_lease::nsPerUnit(limit, 800));
  server_.stop();
  stopped_ = true;
  askRate("k", 200);
  EXPECT_EQ(nsPerUnit("k"), rate_lease::nsPerUnit(limit, 200));
  EXPECT_EQ(slice::rateCapUnits(slice::of(words("k")), monotonicNowNs()),
            rate_lease::capUnits(limit, 200, broker_.leaseIntervalNs()));
  askRate("k", 900);
  EXPECT_EQ(nsPerUnit("k"), rate_lease::nsPerUnit(limit, 200));
}

// Verifies that a graceful stop gives up the rate the node holds: Redis
// holds no rate on the key afterwards (its state is the bucket's T alone,
// or gone once the bucket is full again; a MessagePack array only while a
// rate is held), so the other nodes may take it at once instead of when it
// would have ended.
TEST_F(RateManagerTest, AGracefulStopGivesUpTheRatesTheNodeHolds) {
  askRate("k", 800);
  ASSERT_GT(nsPerUnit("k"), 0);
  const std::string state_key = manager_->stateKey("hot", "k");
  auto holdsNoRate = [&] {
    std::string state = server_.cli({"GET", state_key});
    return state.find_first_not_of("-0123456789") == std::string::npos;
  };
  ASSERT_FALSE(holdsNoRate());
  bool done = false;
  manager_->returnAll(1'000, [&] { done = true; });
  ASSERT_TRUE(runUntil([&] { return done; }));
  EXPECT_EQ(nsPerUnit("k"), 0);
  EXPECT_TRUE(holdsNoRate()) << server_.cli({"GET", state_key});
}

class UnsentDebitsTest : public LeaseManagerTest {
 protected:
  // Told of the first connect only: the breaker stays closed while the link
  // is lost and back, as in a cluster whose other masters stay up.
  bool follow_link() const override { return false; }

  // A worker's debit of `units` admitted just now for `key`.
  void submitDebit(const std::string& key, int64_t units) {
    LeaseRequest debit;
    debit.kind = LeaseRequest::Kind::kDebit;
    debit.rule_id = rule_id_;
    debit.key = key;
    debit.n = units;
    broker_.submit(std::move(debit));
  }

  // Kills the server and runs the loop until the link has noticed.
  void loseTheLink() {
    server_.kill();
    ASSERT_TRUE(runUntil([&] { return !link_->connected(); }));
  }

  // Starts the server again (empty) and runs the loop until the link is back.
  void bringBackTheLink() {
    server_.restart();
    ASSERT_TRUE(runUntil([&] { return link_->connected(); }));
  }

  // Runs the loop until Redis has answered a PING sent now: every call sent
  // before it on the link has been answered too (Redis answers in order).
  void drainTheLink() {
    bool answered = false;
    ASSERT_TRUE(link_->command({"PING"}, [&](const RedisResult&) { answered = true; }, 5'000));
    ASSERT_TRUE(runUntil([&] { return answered; }));
  }

  bool stateExists(const std::string& key) {
    return server_.cli({"EXISTS", manager_->stateKey("shared", key)}) == "1";
  }

  // Script calls the server has run since it started (INFO commandstats).
  int64_t scriptCalls() {
    std::string stats = server_.cli({"INFO", "commandstats"});
    int64_t calls = 0;
    for (std::string name : {"cmdstat_evalsha:calls=", "cmdstat_eval:calls="}) {
      size_t at = stats.find(name);
      if (at != std::string::npos) calls += std::stoll(stats.substr(at + name.size()));
    }
    return calls;
  }

  uint64_t debitedUnits() { return broker_.counters().debited_units.load(); }
};

// Verifies that a debit the link refused while it was down is kept, kept
// again through a retry that is refused too, and sent once, in full, by the
// first retry after the link is back (Control retries on every health ping).
TEST_F(UnsentDebitsTest, ADebitRefusedByADownLinkIsDeliveredOnceTheLinkIsBack) {
  // Units that take the rule 100 s to refill: the key's state outlives the test.
  loseTheLink();
  submitDebit("debited-key", 70'000);
  submitDebit("debited-key", 30'000);  // the same key: its units add up
  manager_->onWakeup();
  manager_->retryDebits();  // still down: refused again, and kept
  EXPECT_EQ(debitedUnits(), 0u);

  bringBackTheLink();
  EXPECT_FALSE(stateExists("debited-key"));  // the restarted server is empty
  manager_->retryDebits();
  ASSERT_TRUE(runUntil([&] { return debitedUnits() >= 100'000; })) << debitedUnits();
  EXPECT_TRUE(stateExists("debited-key"));
  EXPECT_EQ(scriptCalls(), 1);  // one debit for the key, of both requests' units

  // Delivered: a later retry has nothing left to send.
  manager_->retryDebits();
  drainTheLink();
  EXPECT_EQ(debitedUnits(), 100'000u);
  EXPECT_EQ(scriptCalls(), 1);
}

// Verifies that at most kMaxUnsentDebits keys' debits wait: a debit for a
// key beyond the cap is dropped, one for a key already waiting still adds
// its units, and the keys that waited are all delivered, one script call
// each, once the link is back. (Their states expire at once: a unit refills
// in a millisecond.)
TEST_F(UnsentDebitsTest, AtMostMaxUnsentDebitsKeysWaitAndTheRestAreDropped) {
  loseTheLink();
  for (size_t i = 0; i < kMaxUnsentDebits; i++) submitDebit("key-" + std::to_string(i), 1);
  submitDebit("one-too-many", 1);
  submitDebit("key-0", 1);
  manager_->onWakeup();

  bringBackTheLink();
  manager_->retryDebits();
  ASSERT_TRUE(runUntil([&] { return debitedUnits() >= kMaxUnsentDebits + 1; }, 60'000))
      << debitedUnits();
  drainTheLink();
  EXPECT_EQ(debitedUnits(), kMaxUnsentDebits + 1);
  // One debit per key that waited (the restarted server counts from zero).
  EXPECT_EQ(scriptCalls(), static_cast<int64_t>(kMaxUnsentDebits));
}

}  // namespace
}  // namespace sluice

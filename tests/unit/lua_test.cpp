// Lua scripts of the lease path (lua/*.lua through daemon/scripts.h), run on a
// real redis-server with SCRIPT LOAD and EVALSHA: cross-tested against the C++
// algorithms of the same name, plus batch leases, returns, debts, TTLs, binary
// keys, NOSCRIPT, concurrency leases and heartbeats. Time comes from the
// scripts' now_us test seam, never from sleeping.
#include "scripts.h"

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <atomic>
#include <cstdint>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "algorithms/fixed_window.h"
#include "algorithms/gcra.h"
#include "algorithms/sliding_log.h"
#include "algorithms/sliding_window.h"
#include "algorithms/token_bucket.h"
#include "redis_server.h"

namespace sluice {
namespace {

using scripts::Op;
using scripts::Script;

// A plausible Redis TIME in µs (late 2023), a whole number of seconds so
// that windows of whole seconds start on it.
constexpr int64_t kBaseUs = 1'700'000'000'000'000;
constexpr int64_t kMsUs = 1'000;
constexpr int64_t kSecondUs = 1'000'000;

using ReplyPtr = std::unique_ptr<redisReply, decltype(&freeReplyObject)>;

// One synchronous hiredis connection; binary-safe commands.
class Redis {
 public:
  explicit Redis(const test::RedisServer& server) : ctx_(redisConnect(server.host().c_str(), server.port())) {
    if (ctx_ == nullptr || ctx_->err != 0) throw std::runtime_error("cannot connect to redis-server");
  }
  ~Redis() { redisFree(ctx_); }
  Redis(const Redis&) = delete;
  Redis& operator=(const Redis&) = delete;

  ReplyPtr command(const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& arg : args) {
      argv.push_back(arg.data());
      lens.push_back(arg.size());
    }
    auto* reply = static_cast<redisReply*>(redisCommandArgv(ctx_, static_cast<int>(args.size()), argv.data(), lens.data()));
    if (reply == nullptr) throw std::runtime_error("redis connection lost");
    return ReplyPtr(reply, freeReplyObject);
  }

  int64_t integer(const std::vector<std::string>& args) {
    ReplyPtr reply = command(args);
    EXPECT_EQ(reply->type, REDIS_REPLY_INTEGER) << (reply->str ? reply->str : "");
    return reply->integer;
  }

 private:
  redisContext* ctx_;
};

class LuaTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new test::RedisServer(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }

  void SetUp() override {
    redis_ = std::make_unique<Redis>(*server_);
    redis_->command({"FLUSHALL"});
    for (const auto& script : scripts::all()) {
      ReplyPtr reply = redis_->command({"SCRIPT", "LOAD", std::string(script.source)});
      ASSERT_EQ(reply->type, REDIS_REPLY_STRING) << script.name << ": " << (reply->str ? reply->str : "");
      sha_[static_cast<size_t>(script.script)] = std::string(reply->str, reply->len);
      reply = redis_->command({"SCRIPT", "LOAD", std::string(kTimeless) + std::string(script.source)});
      ASSERT_EQ(reply->type, REDIS_REPLY_STRING) << script.name << ": " << (reply->str ? reply->str : "");
      timeless_sha_[static_cast<size_t>(script.script)] = std::string(reply->str, reply->len);
    }
  }

  // Prefixed to a script, makes it set no TTL on KEYS[1] (PEXPIRE, EXPIRE,
  // SET ... PX): the key lives until the test deletes it. TTLs are relative
  // to the script's (test seam) clock but run out on Redis's real one;
  // worse, Redis deletes a key at once when its real clock ticks between
  // computing an expiry's deadline and checking it, so a 1 ms TTL on a
  // loaded machine can lose state that still matters at the test's
  // simulated time. (A local `redis` shadows the global one for the chunk.)
  static constexpr std::string_view kTimeless =
      "local real_redis = redis "
      "local redis = setmetatable({call = function(command, key, value, option, ...) "
      "if key == KEYS[1] then "
      "if command == 'PEXPIRE' or command == 'EXPIRE' then return 1 end "
      "if command == 'SET' and (option == 'PX' or option == 'EX') then "
      "return real_redis.call('SET', key, value) end "
      "end "
      "if key == nil then return real_redis.call(command) end "
      "if value == nil then return real_redis.call(command, key) end "
      "if option == nil then return real_redis.call(command, key, value) end "
      "return real_redis.call(command, key, value, option, ...) end}, {__index = real_redis}) ";

  // EVALSHA of `script` on `key`; the reply must be an array of integers.
  // With `persist`, the script's timeless form runs (kTimeless): its keys get
  // no TTL. Tests of the maths persist; tests of TTLs use Redis's own clock.
  std::vector<int64_t> eval(Script script, const std::string& key, const std::vector<std::string>& argv,
                            bool persist = false) {
    const size_t index = static_cast<size_t>(script);
    std::vector<std::string> args = {"EVALSHA", persist ? timeless_sha_[index] : sha_[index], "1", key};
    args.insert(args.end(), argv.begin(), argv.end());
    ReplyPtr exec = redis_->command(args);
    const redisReply* reply = exec.get();
    std::vector<int64_t> values;
    if (reply->type != REDIS_REPLY_ARRAY) {
      ADD_FAILURE() << scripts::get(script).name << " answered " << (reply->str ? reply->str : "a non-array");
      return values;
    }
    for (size_t i = 0; i < reply->elements; ++i) {
      EXPECT_EQ(reply->element[i]->type, REDIS_REPLY_INTEGER);
      values.push_back(reply->element[i]->integer);
    }
    return values;
  }

  scripts::LeaseReply rate(Script script, const std::string& key, Op op, int64_t n, int64_t need, const Limit& limit,
                           int64_t now_us, bool persist = false) {
    auto reply = scripts::parseLeaseReply(eval(script, key, scripts::rateArgv(op, n, need, limit, now_us), persist));
    if (!reply) throw std::runtime_error("malformed lease reply");
    return *reply;
  }

  // A return of n units leased in window `lease_window` (scripts::leaseWindow).
  scripts::LeaseReply giveBack(Script script, const std::string& key, int64_t n, const Limit& limit,
                               int64_t lease_window, int64_t now_us, bool persist = false) {
    auto reply = scripts::parseLeaseReply(eval(script, key, scripts::returnArgv(n, limit, lease_window, now_us), persist));
    if (!reply) throw std::runtime_error("malformed lease reply");
    return *reply;
  }

  std::string field(const std::string& key, const std::string& name) {
    ReplyPtr reply = redis_->command({"HGET", key, name});
    return reply->type == REDIS_REPLY_STRING ? std::string(reply->str, reply->len) : std::string("(nil)");
  }

  scripts::LeaseReply conc(const std::string& key, Op op, int64_t n, int64_t need, const Limit& limit,
                           int64_t lease_ttl_ms, const std::string& node, int64_t now_us) {
    auto reply = scripts::parseLeaseReply(
        eval(Script::kConcurrency, key, scripts::concurrencyArgv(op, n, need, limit, lease_ttl_ms, node, now_us)),
        Script::kConcurrency);
    if (!reply) throw std::runtime_error("malformed lease reply");
    return *reply;
  }

  scripts::HeartbeatReply beat(const std::string& key, scripts::HeartbeatOp op, const std::string& node,
                               int64_t ttl_ms, int64_t now_us) {
    auto reply = scripts::parseHeartbeatReply(eval(Script::kHeartbeat, key, scripts::heartbeatArgv(op, node, ttl_ms, now_us)));
    if (!reply) throw std::runtime_error("malformed heartbeat reply");
    return *reply;
  }

  static test::RedisServer* server_;
  std::unique_ptr<Redis> redis_;
  std::string sha_[static_cast<size_t>(Script::kFleetVersion) + 1];           // by Script
  std::string timeless_sha_[static_cast<size_t>(Script::kFleetVersion) + 1];  // kTimeless forms
};

test::RedisServer* LuaTest::server_ = nullptr;

// ---------------------------------------------------------------------------
// Embedding and argument lists.

// Verifies that every embedded script is byte for byte its preludes' files
// in lua/ and then its own, so the .lua files really are the single source
// of truth.
TEST(Scripts, EmbedsEachLuaFileExactly) {
  ASSERT_EQ(scripts::all().size(), 9u);
  auto read = [](std::string_view name) {
    std::ifstream in(std::string(SLUICE_SOURCE_DIR) + "/lua/" + std::string(name), std::ios::binary);
    EXPECT_TRUE(in) << name;
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  };
  for (const auto& script : scripts::all()) {
    std::string text;
    for (std::string_view prelude : script.preludes) text += read(prelude);
    EXPECT_EQ(text + read(script.name), script.source) << script.name;
    EXPECT_EQ(&scripts::get(script.script), &script);
  }
}

// Verifies that every script begins with lua/common.lua, and that the two
// rate scripts then share lua/rate_lease.lua, which no other script carries.
TEST(Scripts, PrependsCommonToEveryScriptAndRateLeaseToBothRateScriptsOnly) {
  for (const auto& script : scripts::all()) {
    const bool rate = script.script == scripts::Script::kTokenBucket || script.script == scripts::Script::kGcra;
    const std::vector<std::string_view> preludes(script.preludes.begin(), script.preludes.end());
    std::vector<std::string_view> expected = {"common.lua"};
    if (rate) expected.push_back("rate_lease.lua");
    EXPECT_EQ(preludes, expected) << script.name;
    EXPECT_TRUE(script.source.starts_with("-- common.lua:")) << script.name;
    EXPECT_EQ(script.source.find("local function rate_lease(") != std::string_view::npos, rate) << script.name;
  }
}

// Verifies the ARGV order the scripts document, and that periods go over in ms.
TEST(Scripts, BuildsArgvInTheDocumentedOrder) {
  const Limit limit{100, 60'000'000'000, 20};
  EXPECT_EQ(scripts::rateArgv(Op::kLease, 10, 1, limit),
            (std::vector<std::string>{"lease", "10", "1", "100", "60000", "20", "0"}));
  EXPECT_EQ(scripts::returnArgv(3, limit, 28'333'333, 42),
            (std::vector<std::string>{"return", "3", "0", "100", "60000", "20", "42", "28333333"}));
  // The window of a lease replied at now_ms: floor(now_ms / period_ms).
  EXPECT_EQ(scripts::leaseWindow(1'700'000'059'999, limit), 28'333'334);
  EXPECT_EQ(scripts::leaseWindow(1'700'000'040'000, limit), 28'333'334);
  EXPECT_EQ(scripts::leaseWindow(1'700'000'039'999, limit), 28'333'333);
  EXPECT_EQ(scripts::concurrencyArgv(Op::kRenew, 0, 0, Limit{5, 0, 5}, 30'000, "node-a", 42),
            (std::vector<std::string>{"renew", "0", "0", "5", "30000", "node-a", "42"}));
  EXPECT_EQ(scripts::heartbeatArgv(scripts::HeartbeatOp::kBeat, "node-a", 15'000),
            (std::vector<std::string>{"beat", "node-a", "15000", "0"}));
  EXPECT_EQ(scripts::fleetVersionArgv(scripts::FleetVersionOp::kClaim, 2, 3'000),
            (std::vector<std::string>{"claim", "2", "3000"}));
  EXPECT_EQ(scripts::fleetVersionArgv(scripts::FleetVersionOp::kPeek, 2, 3'000),
            (std::vector<std::string>{"peek", "2", "3000"}));
  EXPECT_EQ(scripts::forAlgorithm(Algorithm::kGcra), Script::kGcra);
  EXPECT_EQ(scripts::forAlgorithm(Algorithm::kSlidingLog), Script::kSlidingLog);
  // A return names the lease's window; a sliding log's, the lease's ms.
  EXPECT_EQ(scripts::returnMark(1'700'000'059'999, Algorithm::kFixedWindow, limit), 28'333'334);
  EXPECT_EQ(scripts::returnMark(1'700'000'059'999, Algorithm::kSlidingLog, limit), 1'700'000'059'999);
}

// Verifies that a -1 retry (a need no limit can ever meet) parses as `never`.
TEST(Scripts, ParsesNeverAndRejectsWrongArity) {
  const int64_t never[] = {0, 3, -1, 10, 5};
  auto reply = scripts::parseLeaseReply(never);
  ASSERT_TRUE(reply);
  EXPECT_TRUE(reply->never);
  EXPECT_EQ(reply->retry_after_ms, 0);
  const int64_t short_reply[] = {1, 2, 3};
  EXPECT_FALSE(scripts::parseLeaseReply(short_reply));
}

// Verifies replies no script sends are refused rather than applied (a
// negative grant would wrap a slice's unit count), and that waits are cut
// to 2^41 ms so that none overflows as a deadline in ns.
TEST(Scripts, RejectsRepliesOutOfRange) {
  constexpr int64_t kNowMs = 1'790'000'000'000;  // 2026
  const int64_t good[] = {3, 5, 0, 10, kNowMs};
  ASSERT_TRUE(scripts::parseLeaseReply(good));
  const int64_t debt[] = {0, -4, 20, 10, kNowMs};
  ASSERT_TRUE(scripts::parseLeaseReply(debt));
  EXPECT_EQ(scripts::parseLeaseReply(debt)->remaining, 0);
  for (int field : {0, 2, 3, 4}) {
    int64_t negative[] = {3, 5, 0, 10, kNowMs};
    negative[field] = field == 2 ? -2 : -1;
    EXPECT_FALSE(scripts::parseLeaseReply(negative)) << field;
    int64_t huge[] = {3, 5, 0, 10, kNowMs};
    huge[field] = INT64_MAX;
    auto reply = scripts::parseLeaseReply(huge);
    if (field == 2 || field == 3) {
      ASSERT_TRUE(reply) << field;
      EXPECT_EQ(field == 2 ? reply->retry_after_ms : reply->reset_after_ms, int64_t{1} << 41);
    } else {
      EXPECT_FALSE(reply) << field;
    }
  }
  const int64_t held_negative[] = {1, 2, 0, 10, kNowMs, -1};
  EXPECT_FALSE(scripts::parseLeaseReply(held_negative));
}

// ---------------------------------------------------------------------------
// Cross-tests: script and C++ algorithm on the same times and costs.
//
// Every shape's emission interval (period / limit) is a whole number of
// microseconds, so the script's µs maths and the C++ ns maths describe the
// same instants exactly; times are converted with ns = µs * 1000.

// An algorithm's acquire on its state words (limit.limit of them: the
// sliding log's slots; the one-word algorithms use the first).
using AcquireFn = Decision (*)(std::span<std::atomic<uint64_t>>, const Limit&, int64_t, int64_t);

template <Decision (*Acquire)(uint64_t&, const Limit&, int64_t, int64_t)>
Decision onFirstWord(std::span<std::atomic<uint64_t>> state, const Limit& limit, int64_t now_ns, int64_t cost) {
  uint64_t word = state[0].load();
  const Decision decision = Acquire(word, limit, now_ns, cost);
  state[0].store(word);
  return decision;
}

// Token bucket and GCRA as the scripts decide them: without waiting.
Decision tokenBucketNow(uint64_t& state, const Limit& limit, int64_t now_ns, int64_t cost) {
  return token_bucket::acquire(state, limit, now_ns, cost);
}
Decision gcraNow(uint64_t& state, const Limit& limit, int64_t now_ns, int64_t cost) {
  return gcra::acquire(state, limit, now_ns, cost);
}
constexpr AcquireFn kTokenBucketNow = onFirstWord<tokenBucketNow>;
constexpr AcquireFn kGcraNow = onFirstWord<gcraNow>;
constexpr AcquireFn kFixedWindow = onFirstWord<fixed_window::acquire>;
constexpr AcquireFn kSlidingWindow = onFirstWord<sliding_window::acquire>;

struct CrossCase {
  const char* name;
  Script script;
  AcquireFn acquire;
  Limit limit;  // period_ns a whole number of ms
  // Whether the schedule steps time backwards. Not for the sliding log: its
  // C++ slots keep units that left the window until a claim overwrites them,
  // and a clock stepped back sees those again, whereas the script deletes
  // them (SlidingLogCountsUnitsFromTheFutureUntilTheyLeave covers the log's
  // backward steps).
  bool steps_back = true;
};

// What a script reports as remaining for the C++ algorithm's decision. The
// scripts keep no debt (a global key's debt stays in the node's slice,
// slice.h), so they report at 0 what the algorithm reports below 0: a
// settle's debt, or, on a clock stepped back past units it admitted, the
// sliding window's weight of them.
int64_t scriptRemaining(const Decision& decision) { return std::max<int64_t>(decision.remaining, 0); }

std::ostream& operator<<(std::ostream& os, const CrossCase& c) { return os << c.name; }

class LuaCrossTest : public LuaTest, public ::testing::WithParamInterface<CrossCase> {};

// Verifies identical decisions over a deterministic schedule of bursts,
// gaps, window boundaries, costs above 1 (and above the limit) and time
// stepping backwards: granted == cost exactly when the C++ algorithm allows,
// the same remaining, retry_after_ms and reset_after_ms.
TEST_P(LuaCrossTest, LeasingMatchesTheCppAlgorithmStepByStep) {
  const CrossCase c = GetParam();
  const int64_t period_us = c.limit.period_ns / 1000;
  const int64_t interval_us = period_us / c.limit.limit;
  const int64_t capacity = std::max(c.limit.burst, c.limit.limit);
  std::mt19937_64 rng(20240611);
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };

  std::vector<std::atomic<uint64_t>> state(static_cast<size_t>(c.limit.limit));
  int64_t now_us = kBaseUs + 3 * kMsUs;
  int allowed = 0;
  int denied = 0;
  for (int step = 0; step < 1500; ++step) {
    const int64_t action = uniform(0, 99);
    if (action < 35) {
      // Burst: the same instant again.
    } else if (action < 60) {
      now_us += uniform(1, interval_us);
    } else if (action < 70) {
      now_us += uniform(2 * period_us, 5 * period_us);
    } else if (action < 85) {
      // A window boundary (for the buckets: a refill instant) or next to it.
      now_us = (now_us / period_us + 1) * period_us + uniform(-1, 1);
    } else {
      const int64_t back_us = uniform(1, period_us / 2);
      now_us += c.steps_back ? -back_us : back_us;
    }
    const int64_t cost = uniform(0, 9) < 8 ? 1 : uniform(2, capacity + 1);
    const Decision want = c.acquire(state, c.limit, now_us * 1000, cost);
    const scripts::LeaseReply got = rate(c.script, "k", Op::kLease, cost, cost, c.limit, now_us, /*persist=*/true);
    const std::string where = "step " + std::to_string(step) + " at +" + std::to_string(now_us - kBaseUs) +
                              " us, cost " + std::to_string(cost);
    ASSERT_EQ(got.granted, want.allowed ? cost : 0) << where;
    ASSERT_EQ(got.remaining, scriptRemaining(want)) << where;
    ASSERT_EQ(got.never, want.cost_exceeds_limit) << where;
    ASSERT_EQ(got.retry_after_ms, want.retry_after_ms) << where;
    ASSERT_EQ(got.reset_after_ms, want.reset_after_ms) << where;
    ASSERT_EQ(got.now_ms, now_us / 1000) << where;
    (want.allowed ? allowed : denied) += 1;
  }
  // The schedule must exercise both answers, or the test proves little.
  EXPECT_GT(allowed, 100);
  EXPECT_GT(denied, 100);
}

// Verifies what a batch lease's reply says Redis has left (the daemon's
// estimate of the fleet's remaining rests on it): a lease of up to n units
// when at least `need` are there leaves exactly what the C++ algorithm
// leaves after acquiring the units granted, grants all there is when it
// grants less than n, and grants nothing, reporting what is there, when
// the algorithm would deny `need`.
TEST_P(LuaCrossTest, ABatchLeaseLeavesWhatTheCppAlgorithmLeavesAfterItsGrant) {
  const CrossCase c = GetParam();
  const int64_t period_us = c.limit.period_ns / 1000;
  const int64_t interval_us = period_us / c.limit.limit;
  const int64_t capacity = std::max(c.limit.burst, c.limit.limit);
  std::mt19937_64 rng(20261127);
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };

  std::vector<std::atomic<uint64_t>> state(static_cast<size_t>(c.limit.limit));
  // The algorithm's answer on a copy of the state, which it leaves as it was.
  auto onCopy = [&](int64_t now_ns, int64_t cost) {
    std::vector<std::atomic<uint64_t>> copy(state.size());
    for (size_t i = 0; i < state.size(); ++i) copy[i].store(state[i].load());
    return c.acquire(copy, c.limit, now_ns, cost);
  };
  int64_t now_us = kBaseUs + 3 * kMsUs;
  int whole = 0;
  int partial = 0;
  int refused = 0;
  for (int step = 0; step < 1000; ++step) {
    const int64_t action = uniform(0, 99);
    if (action < 30) {
      // The same instant again.
    } else if (action < 60) {
      now_us += uniform(1, 3 * interval_us);
    } else if (action < 75) {
      now_us += uniform(period_us / 2, 2 * period_us);
    } else if (action < 90) {
      now_us = (now_us / period_us + 1) * period_us + uniform(-1, 1);
    } else {
      const int64_t back_us = uniform(1, period_us / 2);
      now_us += c.steps_back ? -back_us : back_us;
    }
    const int64_t n = uniform(1, capacity + 2);
    const int64_t need = uniform(1, n);
    const scripts::LeaseReply got = rate(c.script, "k", Op::kLease, n, need, c.limit, now_us, /*persist=*/true);
    const std::string where = "step " + std::to_string(step) + " at +" + std::to_string(now_us - kBaseUs) +
                              " us, n " + std::to_string(n) + ", need " + std::to_string(need);
    if (got.granted == 0) {
      const Decision want = onCopy(now_us * 1000, need);
      ASSERT_FALSE(want.allowed) << where;
      ASSERT_EQ(got.remaining, scriptRemaining(want)) << where;
      ++refused;
      continue;
    }
    ASSERT_GE(got.granted, need) << where;
    ASSERT_LE(got.granted, n) << where;
    if (got.granted < n) {
      ASSERT_FALSE(onCopy(now_us * 1000, got.granted + 1).allowed) << where;
      ++partial;
    } else {
      ++whole;
    }
    const Decision want = c.acquire(state, c.limit, now_us * 1000, got.granted);
    ASSERT_TRUE(want.allowed) << where;
    ASSERT_EQ(got.remaining, scriptRemaining(want)) << where;
  }
  // Each kind of answer must come up often, or the test proves little.
  EXPECT_GT(whole, 20);
  EXPECT_GT(partial, 20);
  EXPECT_GT(refused, 20);
}

constexpr int64_t kMsNs = 1'000'000;

INSTANTIATE_TEST_SUITE_P(
    AllRateScripts, LuaCrossTest,
    ::testing::Values(
        CrossCase{"TokenBucket5PerSecondBurst5", Script::kTokenBucket, kTokenBucketNow, {5, 1000 * kMsNs, 5}},
        CrossCase{"TokenBucket1000PerSecondBurst50", Script::kTokenBucket, kTokenBucketNow,
                  {1000, 1000 * kMsNs, 50}},
        CrossCase{"TokenBucket8PerSecondBurst3", Script::kTokenBucket, kTokenBucketNow, {8, 1000 * kMsNs, 3}},
        CrossCase{"TokenBucket250PerMsBurst20", Script::kTokenBucket, kTokenBucketNow, {250, kMsNs, 20}},
        CrossCase{"Gcra5PerSecondBurst5", Script::kGcra, kGcraNow, {5, 1000 * kMsNs, 5}},
        CrossCase{"Gcra3PerMinuteBurst10", Script::kGcra, kGcraNow, {3, 60'000 * kMsNs, 10}},
        CrossCase{"Gcra8PerSecondBurst1", Script::kGcra, kGcraNow, {8, 1000 * kMsNs, 1}},
        CrossCase{"FixedWindow5PerSecond", Script::kFixedWindow, kFixedWindow, {5, 1000 * kMsNs, 5}},
        CrossCase{"FixedWindow40Per7Ms", Script::kFixedWindow, kFixedWindow, {40, 7 * kMsNs, 40}},
        CrossCase{"SlidingWindow5PerSecond", Script::kSlidingWindow, kSlidingWindow, {5, 1000 * kMsNs, 5}},
        CrossCase{"SlidingWindow7Per3Seconds", Script::kSlidingWindow, kSlidingWindow, {7, 3000 * kMsNs, 7}},
        CrossCase{"SlidingWindow100Per10Ms", Script::kSlidingWindow, kSlidingWindow, {100, 10 * kMsNs, 100}},
        CrossCase{"SlidingLog5PerSecond", Script::kSlidingLog, sliding_log::acquire, {5, 1000 * kMsNs, 5}, false},
        CrossCase{"SlidingLog7Per3Seconds", Script::kSlidingLog, sliding_log::acquire, {7, 3000 * kMsNs, 7}, false},
        CrossCase{"SlidingLog100Per10Ms", Script::kSlidingLog, sliding_log::acquire, {100, 10 * kMsNs, 100}, false}),
    [](const ::testing::TestParamInfo<CrossCase>& info) { return std::string(info.param.name); });

// Verifies that a global calendar window decides as the local one does: a
// fixed_window of `window` in Berlin, leased step by step through a month
// with a DST change and the months' ends, on Redis's clock (now_us, Unix
// µs), with the boundaries handed over by the daemon (rateArgv). The C++
// side counts on the same wall clock (offset 0).
TEST_F(LuaTest, CalendarWindowsLeaseAsTheCppFixedWindowDecides) {
  for (calendar::Span span : {calendar::Span::kDay, calendar::Span::kWeek, calendar::Span::kMonth}) {
    Limit limit{7, calendar::longestNs(span), 7};
    limit.window = span;
    limit.time_zone = calendar::Zone::named("Europe/Berlin").value();
    std::mt19937_64 rng(20261126);
    auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
    // 2026-03-20T00:00Z, 9 days before Berlin springs forward.
    int64_t now_us = 1'773'964'800 * kSecondUs;
    const int64_t hour_us = 3600 * kSecondUs;
    const std::string key = "cal-" + std::string(calendar::spanName(span));
    uint64_t state = 0;
    int allowed = 0;
    int denied = 0;
    for (int step = 0; step < 600; ++step) {
      const int64_t action = uniform(0, 9);
      if (action < 4) {
        // The same instant again.
      } else if (action < 7) {
        now_us += uniform(1, 6 * hour_us);
      } else {
        // Next to the end of the current window.
        const calendar::Window w = calendar::windowAt(now_us * 1000, span, limit.time_zone);
        now_us = w.end_unix_ns / 1000 + uniform(-2, 1);
      }
      const int64_t cost = uniform(0, 4) < 4 ? 1 : uniform(2, 8);
      const Decision want = fixed_window::acquireOnWall(state, limit, now_us * 1000, cost, 0);
      const scripts::LeaseReply got =
          rate(Script::kFixedWindow, key, Op::kLease, cost, cost, limit, now_us, /*persist=*/true);
      const std::string where = std::string(calendar::spanName(span)) + " step " + std::to_string(step) +
                                " at " + std::to_string(now_us) + " us, cost " + std::to_string(cost);
      ASSERT_EQ(got.granted, want.allowed ? cost : 0) << where;
      ASSERT_EQ(got.remaining, want.remaining) << where;
      ASSERT_EQ(got.never, want.cost_exceeds_limit) << where;
      ASSERT_EQ(got.retry_after_ms, want.retry_after_ms) << where;
      ASSERT_EQ(got.reset_after_ms, want.reset_after_ms) << where;
      (want.allowed ? allowed : denied) += 1;
    }
    EXPECT_GT(allowed, 50) << calendar::spanName(span);
    EXPECT_GT(denied, 50) << calendar::spanName(span);
  }
}

// Verifies that a return reaches the calendar window the units were leased
// in (leaseWindow of the lease's now_ms), and that the slice's units of a
// lease may be spent until the calendar window ends (leaseWindowEndMs).
TEST_F(LuaTest, ACalendarReturnGoesBackIntoItsWindowAndALeaseLastsUntilItEnds) {
  Limit limit{5, calendar::longestNs(calendar::Span::kDay), 5};
  limit.window = calendar::Span::kDay;
  limit.time_zone = calendar::Zone::named("America/New_York").value();
  // 2026-11-01T12:00Z: the 25-hour day in New York (04:00Z to 05:00Z next day).
  const int64_t now_us = 1'793'534'400 * kSecondUs;
  const scripts::LeaseReply lease = rate(Script::kFixedWindow, "ny", Op::kLease, 5, 1, limit, now_us, true);
  ASSERT_EQ(lease.granted, 5);
  EXPECT_EQ(scripts::leaseWindowEndMs(lease.now_ms, limit), (int64_t{1'793'534'400} + 17 * 3600) * 1000);
  const int64_t window = scripts::leaseWindow(lease.now_ms, limit);
  EXPECT_EQ(rate(Script::kFixedWindow, "ny", Op::kPeek, 0, 1, limit, now_us, true).remaining, 0);
  EXPECT_EQ(giveBack(Script::kFixedWindow, "ny", 2, limit, window, now_us, true).remaining, 2);
  // A return for another window changes nothing.
  EXPECT_EQ(giveBack(Script::kFixedWindow, "ny", 2, limit, window - 1, now_us, true).remaining, 2);
}

// Verifies that the sliding window's exact 2-limb products agree with the
// C++ 128-bit maths where units * period_us passes 2^53: with limit L =
// 1000003 and a period P of 72333217 ms, P - 1 = L * e, so one unit fits at e
// into the window after a full one exactly when L * (P - e) <= (L - 1) * P,
// and the two sides differ by 1 near 2^56, where plain doubles round them
// equal and would grant a unit too early.
TEST_F(LuaTest, SlidingWindowStaysExactWhereProductsPass2To53) {
  const Limit limit{1'000'003, 72'333'217 * kMsNs, 1'000'003};
  const int64_t period_us = limit.period_ns / 1000;
  const int64_t fit_us = (period_us - 1) / limit.limit;
  const int64_t start_us = (kBaseUs / period_us + 1) * period_us;
  uint64_t state = 0;
  struct Step {
    int64_t at_us;
    int64_t cost;
  };
  const Step steps[] = {{start_us, limit.limit},
                        {start_us + period_us + fit_us - 1, 1},
                        {start_us + period_us + fit_us, 1},
                        {start_us + period_us + fit_us + 1, 1},
                        {start_us + period_us + fit_us + 2 * fit_us, 3}};
  for (const Step& step : steps) {
    const Decision want = sliding_window::acquire(state, limit, step.at_us * 1000, step.cost);
    const scripts::LeaseReply got =
        rate(Script::kSlidingWindow, "k", Op::kLease, step.cost, step.cost, limit, step.at_us, /*persist=*/true);
    const std::string where = "at +" + std::to_string(step.at_us - start_us) + " us";
    EXPECT_EQ(got.granted, want.allowed ? step.cost : 0) << where;
    EXPECT_EQ(got.remaining, want.remaining) << where;
    EXPECT_EQ(got.retry_after_ms, want.retry_after_ms) << where;
    EXPECT_EQ(got.reset_after_ms, want.reset_after_ms) << where;
  }
}

// ---------------------------------------------------------------------------
// Batch leases, returns, debts and peeks, on every rate script.

struct BatchCase {
  const char* name;
  Script script;
  // The wait after `debit 8` on a fresh 5-per-second key at a window start
  // until one unit may be leased again.
  int64_t debt_retry_ms;
};

class LuaBatchTest : public LuaTest, public ::testing::WithParamInterface<BatchCase> {};

const Limit kFivePerSecond{5, 1000 * kMsNs, 5};

// The algorithm whose lease script `script` is.
Algorithm algorithmOf(Script script) {
  for (const AlgorithmTraits& row : kAlgorithmTraits) {
    if (scripts::forAlgorithm(row.algorithm) == script) return row.algorithm;
  }
  throw std::logic_error("not a lease script");
}

// Verifies that `lease 10` grants what is there (5) and nothing more, and
// that a dry key then says how long until the next unit.
TEST_P(LuaBatchTest, LeaseGrantsAtMostWhatIsAvailable) {
  const Script script = GetParam().script;
  auto first = rate(script, "k", Op::kLease, 10, 1, kFivePerSecond, kBaseUs);
  EXPECT_EQ(first.granted, 5);
  EXPECT_EQ(first.remaining, 0);
  EXPECT_EQ(first.retry_after_ms, 0);
  auto second = rate(script, "k", Op::kLease, 10, 1, kFivePerSecond, kBaseUs);
  EXPECT_EQ(second.granted, 0);
  EXPECT_GT(second.retry_after_ms, 0);
  auto later = rate(script, "k", Op::kLease, 10, 1, kFivePerSecond, kBaseUs + second.retry_after_ms * kMsUs);
  EXPECT_GE(later.granted, 1);
}

// Verifies that a lease grants nothing when fewer than `need` units are there.
TEST_P(LuaBatchTest, LeaseGrantsNothingBelowNeed) {
  const Script script = GetParam().script;
  EXPECT_EQ(rate(script, "k", Op::kLease, 3, 3, kFivePerSecond, kBaseUs).granted, 3);
  auto short_lease = rate(script, "k", Op::kLease, 10, 3, kFivePerSecond, kBaseUs);
  EXPECT_EQ(short_lease.granted, 0);
  EXPECT_EQ(short_lease.remaining, 2);
  EXPECT_GT(short_lease.retry_after_ms, 0);
  auto impossible = rate(script, "k", Op::kPeek, 0, 6, kFivePerSecond, kBaseUs);
  EXPECT_TRUE(impossible.never);
}

// Verifies that returned units can be leased again and never lift the state
// above its limit, and that peeking spends nothing.
TEST_P(LuaBatchTest, ReturnGivesUnitsBackUpToTheLimit) {
  const Script script = GetParam().script;
  auto lease = rate(script, "k", Op::kLease, 5, 1, kFivePerSecond, kBaseUs);
  EXPECT_EQ(lease.granted, 5);
  const int64_t window = scripts::returnMark(lease.now_ms, algorithmOf(script), kFivePerSecond);
  giveBack(script, "k", 2, kFivePerSecond, window, kBaseUs);
  EXPECT_EQ(rate(script, "k", Op::kPeek, 0, 1, kFivePerSecond, kBaseUs).remaining, 2);
  EXPECT_EQ(rate(script, "k", Op::kPeek, 0, 1, kFivePerSecond, kBaseUs).remaining, 2);
  giveBack(script, "k", 100, kFivePerSecond, window, kBaseUs);
  EXPECT_EQ(rate(script, "k", Op::kPeek, 0, 1, kFivePerSecond, kBaseUs).remaining, 5);
  // Back to full is back to fresh: nothing left in Redis.
  EXPECT_EQ(redis_->integer({"EXISTS", "k"}), 0);
  EXPECT_EQ(rate(script, "k", Op::kLease, 10, 1, kFivePerSecond, kBaseUs).granted, 5);
}

// Verifies that peeking a fresh key reports a full limit and writes nothing.
TEST_P(LuaBatchTest, PeekSpendsNothingAndWritesNothing) {
  const Script script = GetParam().script;
  auto peek = rate(script, "k", Op::kPeek, 0, 1, kFivePerSecond, kBaseUs);
  EXPECT_EQ(peek.granted, 0);
  EXPECT_EQ(peek.remaining, 5);
  EXPECT_EQ(peek.retry_after_ms, 0);
  EXPECT_EQ(peek.reset_after_ms, 0);
  EXPECT_EQ(redis_->integer({"EXISTS", "k"}), 0);
}

// Verifies that a debit beyond the limit leaves debt: nothing can be leased
// until it has been paid off, exactly when the script said, not a ms sooner.
TEST_P(LuaBatchTest, DebitOverdrawsAndTheNextLeaseWaitsForTheDebt) {
  const BatchCase c = GetParam();
  auto debit = rate(c.script, "k", Op::kDebit, 8, 0, kFivePerSecond, kBaseUs);
  EXPECT_EQ(debit.granted, 0);
  EXPECT_EQ(debit.remaining, 0);
  auto denied = rate(c.script, "k", Op::kLease, 1, 1, kFivePerSecond, kBaseUs);
  EXPECT_EQ(denied.granted, 0);
  EXPECT_EQ(denied.retry_after_ms, c.debt_retry_ms);
  const int64_t ready_us = kBaseUs + c.debt_retry_ms * kMsUs;
  EXPECT_EQ(rate(c.script, "k", Op::kLease, 1, 1, kFivePerSecond, ready_us - kMsUs).granted, 0);
  EXPECT_EQ(rate(c.script, "k", Op::kLease, 1, 1, kFivePerSecond, ready_us).granted, 1);
}

// Verifies that a debit charged over its span (the fallback's) charges only
// what went beyond the rate: on a bucket of 5/s, 15 units over 3 s leave it
// full, 20 leave it empty (no debt), 25 leave one second of debt. The window
// scripts count only the span's share in the window that counts now.
TEST_P(LuaBatchTest, DebitOverItsSpanChargesOnlyBeyondTheRate) {
  const BatchCase c = GetParam();
  const int64_t span_ms = 3000;
  const bool bucket = c.script == Script::kTokenBucket || c.script == Script::kGcra;
  // Half a second into a window: a fixed window holds 1/6 of the span, a
  // sliding window of 1 s a third.
  const int64_t now_us = kBaseUs + 500 * kMsUs;
  rate(c.script, "a", Op::kDebit, 15, span_ms, kFivePerSecond, now_us);
  auto full = rate(c.script, "a", Op::kPeek, 0, 1, kFivePerSecond, now_us);
  EXPECT_EQ(full.remaining, bucket ? 5 : c.script == Script::kFixedWindow ? 2 : 0);
  rate(c.script, "b", Op::kDebit, 20, span_ms, kFivePerSecond, now_us);
  auto empty = rate(c.script, "b", Op::kPeek, 0, 1, kFivePerSecond, now_us);
  EXPECT_EQ(empty.remaining, c.script == Script::kFixedWindow ? 1 : 0);  // 4 of 20 counted
  if (bucket) {
    EXPECT_EQ(empty.retry_after_ms, 200);  // one refill, no debt
    rate(c.script, "c", Op::kDebit, 25, span_ms, kFivePerSecond, now_us);
    EXPECT_EQ(rate(c.script, "c", Op::kPeek, 0, 1, kFivePerSecond, now_us).retry_after_ms, 1200);
    // Emptied meanwhile by a node that was back sooner: the span's 10 units
    // ran beside those leases, so nothing is added to the empty bucket.
    EXPECT_EQ(rate(c.script, "e", Op::kLease, 5, 5, kFivePerSecond, now_us).granted, 5);
    rate(c.script, "e", Op::kDebit, 10, span_ms, kFivePerSecond, now_us);
    EXPECT_EQ(rate(c.script, "e", Op::kPeek, 0, 1, kFivePerSecond, now_us).retry_after_ms, 200);
  }
  // A day-long span on a rule of one unit an hour is a span, not units: no
  // "2^50 us" refusal (the check is for units times the interval).
  const Limit hourly{1, 3600 * kSecondUs * 1000, 1};
  EXPECT_EQ(rate(c.script, "day", Op::kDebit, 1, 24 * 3600 * 1000, hourly, now_us).granted, 0);
  // A span of 0 is the old debit: everything charged now.
  rate(c.script, "d", Op::kDebit, 8, 0, kFivePerSecond, kBaseUs);
  EXPECT_EQ(rate(c.script, "d", Op::kLease, 1, 1, kFivePerSecond, kBaseUs).retry_after_ms,
            c.debt_retry_ms);
}

// Verifies a lease's deadline: before it the lease grants, after it the
// script grants nothing and leaves the state as it was (a peek), and 0 is
// no deadline.
TEST_P(LuaBatchTest, LeaseAfterItsDeadlineGrantsNothing) {
  const BatchCase c = GetParam();
  auto lease = [&](const char* key, int64_t deadline_us) {
    std::vector<std::string> argv = scripts::leaseArgv(2, 1, kFivePerSecond, deadline_us);
    argv[6] = std::to_string(kBaseUs);  // now_us: the test's clock
    return *scripts::parseLeaseReply(eval(c.script, key, argv));
  };
  EXPECT_EQ(lease("in-time", kBaseUs + 1).granted, 2);
  auto late = lease("late", kBaseUs - 1);
  EXPECT_EQ(late.granted, 0);
  EXPECT_EQ(late.remaining, 5);
  EXPECT_EQ(redis_->integer({"EXISTS", "late"}), 0);
  EXPECT_EQ(lease("none", 0).granted, 2);
}

// Verifies that every key a lease or a debit writes expires, no later than
// the state stops mattering (TIME from Redis itself, no override).
TEST_P(LuaBatchTest, WrittenKeysExpireWithinTheirDocumentedBound) {
  const BatchCase c = GetParam();
  // Full after burst * interval (buckets), after one window (fixed) or two
  // (sliding): 1 s or 2 s for 5 per second; each 5 units of debt add 1 s.
  const int64_t bound_ms = c.script == Script::kSlidingWindow ? 2000 : 1000;
  rate(c.script, "k", Op::kLease, 1, 1, kFivePerSecond, 0);
  int64_t ttl_ms = redis_->integer({"PTTL", "k"});
  EXPECT_GT(ttl_ms, 0);
  EXPECT_LE(ttl_ms, bound_ms);
  rate(c.script, "k", Op::kDebit, 9, 0, kFivePerSecond, 0);
  ttl_ms = redis_->integer({"PTTL", "k"});
  EXPECT_GT(ttl_ms, bound_ms / 2);
  EXPECT_LE(ttl_ms, bound_ms + 1000);
}

// Verifies that keys are opaque bytes: NUL, braces and 1 KiB all work.
TEST_P(LuaBatchTest, BinaryKeysWork) {
  const Script script = GetParam().script;
  std::string key("a\0{tag}\xff", 8);
  for (int i = 0; key.size() < 1024; ++i) key.push_back(static_cast<char>(i));
  EXPECT_EQ(rate(script, key, Op::kLease, 2, 1, kFivePerSecond, kBaseUs).granted, 2);
  EXPECT_EQ(rate(script, key, Op::kPeek, 0, 1, kFivePerSecond, kBaseUs).remaining, 3);
  EXPECT_EQ(redis_->integer({"EXISTS", key}), 1);
  EXPECT_GT(redis_->integer({"PTTL", key}), 0);
  EXPECT_EQ(redis_->integer({"DBSIZE"}), 1);
}

INSTANTIATE_TEST_SUITE_P(AllRateScripts, LuaBatchTest,
                         ::testing::Values(
                             // 3 units of debt and 1 to lease, 200 ms each.
                             BatchCase{"TokenBucket", Script::kTokenBucket, 800},
                             BatchCase{"Gcra", Script::kGcra, 800},
                             // 8 counted: the next window carries 3, leaving 2.
                             BatchCase{"FixedWindow", Script::kFixedWindow, 1000},
                             // Next window: cur 3, prev 5; 1 more fits once
                             // prev's weight falls to 1 unit, 800 ms into it.
                             BatchCase{"SlidingWindow", Script::kSlidingWindow, 1800},
                             // 5 of the 8 units logged (the newest 5 decide):
                             // the first leaves the log a period later.
                             BatchCase{"SlidingLog", Script::kSlidingLog, 1000}),
                         [](const ::testing::TestParamInfo<BatchCase>& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------------------
// Returns after the window ended, and capped debt, on the window scripts.

// Verifies the review's case: limit 5 per second, node A leases 5 at 0.9 s,
// node B leases 3 at 1.1 s, A returns its 5 at 1.2 s. A's units were counted
// in a window that has ended, so the return changes nothing and B can lease
// only the 2 that are left; returns for B's (current) window still count.
TEST_F(LuaTest, FixedWindowIgnoresAReturnForAWindowThatHasEnded) {
  const Script fw = Script::kFixedWindow;
  auto a = rate(fw, "k", Op::kLease, 5, 1, kFivePerSecond, kBaseUs + 900 * kMsUs, /*persist=*/true);
  ASSERT_EQ(a.granted, 5);
  const int64_t a_window = scripts::leaseWindow(a.now_ms, kFivePerSecond);
  auto b = rate(fw, "k", Op::kLease, 3, 1, kFivePerSecond, kBaseUs + 1100 * kMsUs, /*persist=*/true);
  ASSERT_EQ(b.granted, 3);
  const int64_t b_window = scripts::leaseWindow(b.now_ms, kFivePerSecond);
  ASSERT_EQ(b_window, a_window + 1);

  auto late = giveBack(fw, "k", 5, kFivePerSecond, a_window, kBaseUs + 1200 * kMsUs, /*persist=*/true);
  EXPECT_EQ(late.granted, 0);
  EXPECT_EQ(late.remaining, 2);
  EXPECT_EQ(field("k", "n"), "3");
  // A return for a window that was never counted (a later one) is ignored too.
  EXPECT_EQ(giveBack(fw, "k", 5, kFivePerSecond, b_window + 1, kBaseUs + 1200 * kMsUs, true).remaining, 2);
  auto more = rate(fw, "k", Op::kLease, 5, 1, kFivePerSecond, kBaseUs + 1300 * kMsUs, /*persist=*/true);
  EXPECT_EQ(more.granted, 2);  // the bug let B lease 5 more: 8 in one window

  EXPECT_EQ(giveBack(fw, "k", 1, kFivePerSecond, b_window, kBaseUs + 1400 * kMsUs, true).remaining, 1);
  EXPECT_EQ(giveBack(fw, "k", 100, kFivePerSecond, b_window, kBaseUs + 1400 * kMsUs, true).remaining, 5);
  EXPECT_EQ(redis_->integer({"EXISTS", "k"}), 0);
  // Once B's window has ended, its return is ignored as well.
  EXPECT_EQ(rate(fw, "k", Op::kLease, 4, 1, kFivePerSecond, kBaseUs + 1500 * kMsUs, true).granted, 4);
  auto after = giveBack(fw, "k", 4, kFivePerSecond, b_window, kBaseUs + 2100 * kMsUs, true);
  EXPECT_EQ(after.remaining, 5);
  EXPECT_EQ(field("k", "w"), std::to_string(b_window));
  EXPECT_EQ(field("k", "n"), "4");
}

// Verifies that a sliding-window return takes units of the previous window
// off prev (where they are counted now), units of the current one off cur,
// ignores anything older and never goes below 0.
TEST_F(LuaTest, SlidingWindowReturnsTheUnitsToTheWindowTheyWereLeasedIn) {
  const Script sw = Script::kSlidingWindow;
  auto a = rate(sw, "k", Op::kLease, 5, 1, kFivePerSecond, kBaseUs + 900 * kMsUs, /*persist=*/true);
  ASSERT_EQ(a.granted, 5);
  const int64_t a_window = scripts::leaseWindow(a.now_ms, kFivePerSecond);
  // Half-way into the next window A's 5 weigh 2.5: 2 fit.
  auto b = rate(sw, "k", Op::kLease, 5, 1, kFivePerSecond, kBaseUs + 1500 * kMsUs, /*persist=*/true);
  ASSERT_EQ(b.granted, 2);
  const int64_t b_window = scripts::leaseWindow(b.now_ms, kFivePerSecond);
  ASSERT_EQ(b_window, a_window + 1);

  // A gives 2 back at 1.6 s: prev 5 -> 3, B's cur untouched. (The bug took
  // them off cur: cur 0, prev 5, remaining 3.)
  auto back = giveBack(sw, "k", 2, kFivePerSecond, a_window, kBaseUs + 1600 * kMsUs, /*persist=*/true);
  EXPECT_EQ(field("k", "c"), "2");
  EXPECT_EQ(field("k", "p"), "3");
  EXPECT_EQ(back.remaining, 1);  // 5 - 2 - ceil(3 * 0.4)

  // At 2.3 s A's window is two back: its return is ignored, nothing written.
  auto old = giveBack(sw, "k", 3, kFivePerSecond, a_window, kBaseUs + 2300 * kMsUs, /*persist=*/true);
  EXPECT_EQ(old.remaining, 3);  // prev 2 (B's), 5 - ceil(2 * 0.7)
  EXPECT_EQ(field("k", "w"), std::to_string(b_window));
  EXPECT_EQ(field("k", "c"), "2");
  EXPECT_EQ(field("k", "p"), "3");
  // A return for a window never counted (the current one, still empty) too.
  EXPECT_EQ(giveBack(sw, "k", 3, kFivePerSecond, b_window + 1, kBaseUs + 2300 * kMsUs, true).remaining, 3);

  // B's window is now the previous one: its units come off prev.
  auto b_back = giveBack(sw, "k", 1, kFivePerSecond, b_window, kBaseUs + 2300 * kMsUs, /*persist=*/true);
  EXPECT_EQ(b_back.remaining, 4);  // prev 1, 5 - ceil(0.7)
  EXPECT_EQ(field("k", "w"), std::to_string(b_window + 1));
  EXPECT_EQ(field("k", "c"), "0");
  EXPECT_EQ(field("k", "p"), "1");
  EXPECT_EQ(giveBack(sw, "k", 100, kFivePerSecond, b_window, kBaseUs + 2300 * kMsUs, true).remaining, 5);
  EXPECT_EQ(redis_->integer({"EXISTS", "k"}), 0);

  // And a return for the current window comes off cur, never below 0.
  auto c = rate(sw, "k", Op::kLease, 3, 1, kFivePerSecond, kBaseUs + 2400 * kMsUs, /*persist=*/true);
  ASSERT_EQ(c.granted, 3);
  const int64_t c_window = scripts::leaseWindow(c.now_ms, kFivePerSecond);
  EXPECT_EQ(giveBack(sw, "k", 1, kFivePerSecond, c_window, kBaseUs + 2500 * kMsUs, true).remaining, 3);
  EXPECT_EQ(giveBack(sw, "k", 9, kFivePerSecond, c_window, kBaseUs + 2500 * kMsUs, true).remaining, 5);
  EXPECT_EQ(redis_->integer({"EXISTS", "k"}), 0);
}

// Verifies that a window script refuses a return that does not say which
// window the units were leased in, rather than guessing.
TEST_F(LuaTest, WindowReturnWithoutTheLeaseWindowIsAnErrorReply) {
  for (Script script : {Script::kFixedWindow, Script::kSlidingWindow, Script::kSlidingLog}) {
    std::vector<std::string> args = {"EVALSHA", sha_[static_cast<size_t>(script)], "1", "k"};
    for (auto& arg : scripts::rateArgv(Op::kReturn, 1, 0, kFivePerSecond, kBaseUs)) args.push_back(arg);
    ReplyPtr reply = redis_->command(args);
    ASSERT_EQ(reply->type, REDIS_REPLY_ERROR) << scripts::get(script).name;
    EXPECT_NE(std::string(reply->str).find("ARGV[8]"), std::string::npos) << reply->str;
  }
}

// Verifies that a sliding log's return removes the units of the lease it
// names, not newer ones another node leased since: node A leases 3 of 5 at
// 0 s, node B 2 at 0.4 s, A returns 2 at 0.5 s. A's last unit leaves the log
// at 1 s and B's two at 1.4 s; had the return taken B's, the log would be
// empty at 1 s and let 2 units too many in until 1.4 s.
TEST_F(LuaTest, SlidingLogReturnRemovesTheUnitsOfItsOwnLease) {
  const Script log = Script::kSlidingLog;
  auto a = rate(log, "k", Op::kLease, 3, 1, kFivePerSecond, kBaseUs, /*persist=*/true);
  ASSERT_EQ(a.granted, 3);
  ASSERT_EQ(rate(log, "k", Op::kLease, 5, 1, kFivePerSecond, kBaseUs + 400 * kMsUs, true).granted, 2);
  const int64_t mark = scripts::returnMark(a.now_ms, Algorithm::kSlidingLog, kFivePerSecond);
  EXPECT_EQ(giveBack(log, "k", 2, kFivePerSecond, mark, kBaseUs + 500 * kMsUs, true).remaining, 2);
  EXPECT_EQ(rate(log, "k", Op::kPeek, 0, 1, kFivePerSecond, kBaseUs + 1000 * kMsUs - 1, true).remaining, 2);
  EXPECT_EQ(rate(log, "k", Op::kPeek, 0, 1, kFivePerSecond, kBaseUs + 1000 * kMsUs, true).remaining, 3);
  auto late = rate(log, "k", Op::kPeek, 0, 4, kFivePerSecond, kBaseUs + 1000 * kMsUs, true);
  EXPECT_EQ(late.retry_after_ms, 400);
  EXPECT_EQ(rate(log, "k", Op::kPeek, 0, 1, kFivePerSecond, kBaseUs + 1400 * kMsUs, true).remaining, 5);
  // A return names a ms: one from before every entry still logged removes nothing.
  rate(log, "k", Op::kLease, 5, 1, kFivePerSecond, kBaseUs + 2000 * kMsUs, true);
  EXPECT_EQ(giveBack(log, "k", 5, kFivePerSecond, mark, kBaseUs + 2100 * kMsUs, true).remaining, 0);
}

// Verifies a sliding log on a clock that stepped back, as the C++ log
// decides: units logged "in the future" count until their time + period.
// Node A leases 3 of 5 at 2 s; Redis's clock then reads 1.5 s: 2 are left, and
// once they are leased the next unit waits for A's, which leave at 3 s.
TEST_F(LuaTest, SlidingLogCountsUnitsFromTheFutureUntilTheyLeave) {
  const Script log = Script::kSlidingLog;
  std::vector<std::atomic<uint64_t>> slots(sliding_log::stateWords(kFivePerSecond));
  struct Step {
    int64_t at_ms;
    int64_t cost;
  };
  for (const Step step : {Step{2000, 3}, Step{1500, 2}, Step{1500, 1}, Step{2999, 1}, Step{3000, 1}}) {
    const int64_t now_us = kBaseUs + step.at_ms * kMsUs;
    const Decision want = sliding_log::acquire(slots, kFivePerSecond, now_us * 1000, step.cost);
    const auto got = rate(log, "k", Op::kLease, step.cost, step.cost, kFivePerSecond, now_us, true);
    const std::string where = "at " + std::to_string(step.at_ms) + " ms";
    EXPECT_EQ(got.granted, want.allowed ? step.cost : 0) << where;
    EXPECT_EQ(got.remaining, want.remaining) << where;
    EXPECT_EQ(got.retry_after_ms, want.retry_after_ms) << where;
    EXPECT_EQ(got.reset_after_ms, want.reset_after_ms) << where;
  }
  // Back at 1.5 s again: the units of 2999 ms and 3 s count, until 4 s.
  auto after = rate(log, "k", Op::kPeek, 0, 1, kFivePerSecond, kBaseUs + 1500 * kMsUs, true);
  EXPECT_EQ(after.remaining, 3);
  EXPECT_EQ(after.reset_after_ms, 2500);
}

// Verifies that a sliding log keeps at most `limit` entries whatever it is
// debited, and that the newest of them still decide exactly: 1000 units
// debited over 10 s on 5 per second log the last second's 100, of which the
// newest 5 are kept, the oldest of those 40 ms before now.
TEST_F(LuaTest, SlidingLogKeepsTheNewestLimitEntriesOfADebit) {
  const Script log = Script::kSlidingLog;
  rate(log, "k", Op::kDebit, 1000, 10'000, kFivePerSecond, kBaseUs, /*persist=*/true);
  EXPECT_EQ(redis_->integer({"ZCARD", "k"}), 5);
  auto denied = rate(log, "k", Op::kLease, 1, 1, kFivePerSecond, kBaseUs, true);
  EXPECT_EQ(denied.granted, 0);
  EXPECT_EQ(denied.retry_after_ms, 1000 - 40);
  EXPECT_EQ(denied.reset_after_ms, 1000);
}

// EVALSHA of `script` with KEYS = `keys`: the reply's integers (nullopt for
// anything but an array of integers).
std::optional<std::vector<int64_t>> evalKeys(LuaTest& test, Redis& redis, const std::string& sha,
                                             const std::vector<std::string>& keys,
                                             const std::vector<std::string>& argv) {
  std::vector<std::string> args = {"EVALSHA", sha, std::to_string(keys.size())};
  args.insert(args.end(), keys.begin(), keys.end());
  args.insert(args.end(), argv.begin(), argv.end());
  ReplyPtr reply = redis.command(args);
  if (reply->type != REDIS_REPLY_ARRAY) return std::nullopt;
  std::vector<int64_t> values;
  for (size_t i = 0; i < reply->elements; ++i) {
    if (reply->element[i]->type != REDIS_REPLY_INTEGER) return std::nullopt;
    values.push_back(reply->element[i]->integer);
  }
  (void)test;
  return values;
}

// Verifies the fleet's penalty block: penalty.lua blocks a key (a shorter
// block leaves a longer one in place), every rate script given the block
// key leases nothing while it stands and reports its time left sixth, a
// lease without the block key is unaffected, and "reset" lifts the block
// and forgets the state.
TEST_F(LuaTest, BlockedKeyIsLeasedNothingUntilReset) {
  const std::string penalty_sha = sha_[static_cast<size_t>(Script::kPenalty)];
  for (Script script : {Script::kTokenBucket, Script::kGcra, Script::kFixedWindow,
                        Script::kSlidingWindow}) {
    const char* name = scripts::get(script).name.data();
    const std::string sha = sha_[static_cast<size_t>(script)];
    const std::vector<std::string> keys = {"state", "block"};
    auto lease = [&](const std::vector<std::string>& with_keys) {
      auto values = evalKeys(*this, *redis_, sha, with_keys, scripts::leaseArgv(2, 1, kFivePerSecond, 0));
      EXPECT_TRUE(values) << name;
      auto reply = scripts::parseLeaseReply(values.value_or(std::vector<int64_t>{}));
      EXPECT_TRUE(reply) << name;
      return reply.value_or(scripts::LeaseReply{});
    };
    auto penalty = [&](scripts::PenaltyOp op, int64_t block_ms) {
      auto values = evalKeys(*this, *redis_, penalty_sha, keys, scripts::penaltyArgv(op, block_ms));
      auto left = scripts::parsePenaltyReply(values.value_or(std::vector<int64_t>{}));
      EXPECT_TRUE(left) << name;
      return left.value_or(-1);
    };
    redis_->command({"FLUSHALL"});
    EXPECT_EQ(lease(keys).granted, 2) << name;
    EXPECT_EQ(lease(keys).blocked_ms, 0) << name;
    EXPECT_EQ(penalty(scripts::PenaltyOp::kPeek, 0), 0) << name;
    int64_t left = penalty(scripts::PenaltyOp::kBlock, 60'000);
    EXPECT_GT(left, 59'000) << name;
    EXPECT_LE(left, 60'000) << name;
    EXPECT_GT(penalty(scripts::PenaltyOp::kBlock, 1'000), 59'000) << name;  // the longer stays
    scripts::LeaseReply blocked = lease(keys);
    EXPECT_EQ(blocked.granted, 0) << name;
    EXPECT_GT(blocked.blocked_ms, 59'000) << name;
    EXPECT_EQ(lease({"state"}).granted, 1) << name;  // no block key: the last unit
    EXPECT_EQ(penalty(scripts::PenaltyOp::kReset, 0), 0) << name;
    EXPECT_EQ(redis_->integer({"EXISTS", "state", "block"}), 0) << name;
    scripts::LeaseReply after = lease(keys);
    EXPECT_EQ(after.granted, 2) << name;
    EXPECT_EQ(after.blocked_ms, 0) << name;
    EXPECT_EQ(after.remaining, 3) << name;  // a fresh state: 5 - 2
  }
  ReplyPtr bad = redis_->command({"EVALSHA", penalty_sha, "2", "state", "block", "block", "0"});
  EXPECT_EQ(bad->type, REDIS_REPLY_ERROR);
}

// Verifies a rate script's sixth integer is the block's time left, and a
// concurrency reply needs its sixth (held).
TEST(Scripts, ParsesTheBlockOfARateReply) {
  const int64_t blocked[] = {0, 0, 3, 10, 1'790'000'000'000, 4'000};
  auto reply = scripts::parseLeaseReply(blocked);
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->blocked_ms, 4'000);
  EXPECT_EQ(reply->held, 0);
  auto held = scripts::parseLeaseReply(blocked, Script::kConcurrency);
  ASSERT_TRUE(held);
  EXPECT_EQ(held->held, 4'000);
  EXPECT_EQ(held->blocked_ms, 0);
  const int64_t five[] = {0, 0, 3, 10, 1'790'000'000'000};
  EXPECT_FALSE(scripts::parseLeaseReply(five, Script::kConcurrency));
  EXPECT_FALSE(scripts::parsePenaltyReply(five));
  const int64_t negative[] = {-1};
  EXPECT_FALSE(scripts::parsePenaltyReply(negative));
}

struct DebtCase {
  const char* name;
  Script script;
  const char* count_field;
  const char* extra_fields[2];  // the other state fields when seeding
  int64_t extra_periods;        // sliding: the window after the debt too
};

std::ostream& operator<<(std::ostream& os, const DebtCase& c) { return os << c.name; }

class LuaDebtTest : public LuaTest, public ::testing::WithParamInterface<DebtCase> {};

// 5 per second: debt is capped at 5 * floor(2^50 us / 1 s) units, paid off
// in floor(2^50 / 10^6) windows.
constexpr int64_t kWindowsIn2To50Us = (int64_t{1} << 50) / kSecondUs;
constexpr int64_t kMaxDebtUnits = 5 * kWindowsIn2To50Us;

// Verifies that repeated debits stop at the cap and the key's TTL stays
// within 2^50 us (plus sliding's extra window) of the window's start.
TEST_P(LuaDebtTest, RepeatedDebitsAreCappedAndTheKeyKeepsAValidTtl) {
  const DebtCase c = GetParam();
  const int64_t bound_ms = (kWindowsIn2To50Us + c.extra_periods) * 1000;
  scripts::LeaseReply debit;
  for (int i = 0; i < 10; ++i) {
    debit = rate(c.script, "k", Op::kDebit, int64_t{1} << 40, 0, kFivePerSecond, kBaseUs);
  }
  EXPECT_EQ(field("k", c.count_field), std::to_string(kMaxDebtUnits));
  EXPECT_EQ(debit.remaining, 0);
  EXPECT_EQ(debit.reset_after_ms, bound_ms);
  const int64_t ttl_ms = redis_->integer({"PTTL", "k"});
  EXPECT_GT(ttl_ms, bound_ms - 60'000);
  EXPECT_LE(ttl_ms, bound_ms);
  // The debt is paid off as documented: nothing until the cap has passed.
  auto denied = rate(c.script, "k", Op::kLease, 1, 1, kFivePerSecond, kBaseUs);
  EXPECT_EQ(denied.granted, 0);
  EXPECT_GE(denied.retry_after_ms, (kWindowsIn2To50Us - 1) * 1000);
  EXPECT_LE(denied.retry_after_ms, bound_ms);
}

// Verifies the overflow the cap prevents: a key already holding absurd debt
// (written by an older script, or by hand) gets a valid TTL on the next
// debit instead of an HSET that sticks after a failing PEXPIRE.
TEST_P(LuaDebtTest, AbsurdStoredDebtStillGetsAValidTtl) {
  const DebtCase c = GetParam();
  const int64_t bound_ms = (kWindowsIn2To50Us + c.extra_periods) * 1000;
  const std::string window = std::to_string(kBaseUs / kSecondUs);
  std::vector<std::string> seed = {"HSET", "k", "w", window, c.count_field, "1000000000000000000000"};
  if (c.extra_fields[0] != nullptr) {
    seed.push_back(c.extra_fields[0]);
    seed.push_back(c.extra_fields[1]);
  }
  redis_->command(seed);
  ASSERT_EQ(redis_->integer({"PTTL", "k"}), -1);
  auto debit = rate(c.script, "k", Op::kDebit, 1, 0, kFivePerSecond, kBaseUs);
  EXPECT_EQ(debit.reset_after_ms, bound_ms);
  EXPECT_EQ(field("k", c.count_field), std::to_string(kMaxDebtUnits));
  const int64_t ttl_ms = redis_->integer({"PTTL", "k"});
  EXPECT_GT(ttl_ms, 0);
  EXPECT_LE(ttl_ms, bound_ms);
}

// Verifies the cap where limit * windows passes 2^53: a 1 ms window of 2^40
// units caps at 2^52 (fixed_window; sliding_window's limit is below 2^26),
// still an exact integer with a TTL.
TEST_F(LuaTest, FixedWindowDebtCapStaysExactForHugeLimits) {
  const Limit huge{int64_t{1} << 40, kMsNs, int64_t{1} << 40};
  redis_->command({"HSET", "k", "w", std::to_string(kBaseUs / kMsUs), "n", "1e300"});
  auto debit = rate(Script::kFixedWindow, "k", Op::kDebit, int64_t{1} << 40, 0, huge, kBaseUs);
  EXPECT_EQ(field("k", "n"), std::to_string(int64_t{1} << 52));
  EXPECT_EQ(debit.reset_after_ms, (int64_t{1} << 12));  // 2^52 / 2^40 windows of 1 ms
  const int64_t ttl_ms = redis_->integer({"PTTL", "k"});
  EXPECT_GT(ttl_ms, 0);
  EXPECT_LE(ttl_ms, int64_t{1} << 12);
}

INSTANTIATE_TEST_SUITE_P(WindowScripts, LuaDebtTest,
                         ::testing::Values(DebtCase{"FixedWindow", Script::kFixedWindow, "n", {nullptr, nullptr}, 0},
                                           DebtCase{"SlidingWindow", Script::kSlidingWindow, "c", {"p", "0"}, 1}),
                         [](const ::testing::TestParamInfo<DebtCase>& info) { return std::string(info.param.name); });

// Verifies that a script flushed from Redis answers NOSCRIPT, the error text
// the link matches to reload it.
TEST_F(LuaTest, EvalshaAfterScriptFlushAnswersNoscript) {
  redis_->command({"SCRIPT", "FLUSH"});
  std::vector<std::string> args = {"EVALSHA", sha_[static_cast<size_t>(Script::kGcra)], "1", "k"};
  for (auto& arg : scripts::rateArgv(Op::kLease, 1, 1, kFivePerSecond)) args.push_back(arg);
  ReplyPtr reply = redis_->command(args);
  ASSERT_EQ(reply->type, REDIS_REPLY_ERROR);
  EXPECT_EQ(std::string(reply->str, reply->len).rfind("NOSCRIPT", 0), 0u) << reply->str;
}

// Verifies that bad arguments are an error reply naming the script, not a
// silent grant.
TEST_F(LuaTest, BadArgumentsAreAnErrorReply) {
  std::vector<std::string> args = {"EVALSHA", sha_[static_cast<size_t>(Script::kTokenBucket)], "1", "k",
                                   "lease", "5", "0", "5", "1000", "5", "0"};
  ReplyPtr reply = redis_->command(args);
  ASSERT_EQ(reply->type, REDIS_REPLY_ERROR);
  EXPECT_NE(std::string(reply->str).find("token_bucket.lua"), std::string::npos) << reply->str;
  EXPECT_EQ(redis_->integer({"EXISTS", "k"}), 0);
}

// Verifies that each script's error reply names its own file, though every
// script's fail() comes from lua/common.lua: an op and nothing else is bad
// ARGV to all of them.
TEST_F(LuaTest, EachScriptsErrorReplyNamesItsOwnFile) {
  for (const auto& script : scripts::all()) {
    ReplyPtr reply = redis_->command({"EVALSHA", sha_[static_cast<size_t>(script.script)], "2", "k", "b", "bogus"});
    ASSERT_EQ(reply->type, REDIS_REPLY_ERROR) << script.name;
    const std::string error(reply->str, reply->len);
    EXPECT_EQ(error.rfind("ERR sluice " + std::string(script.name) + ": ", 0), 0u) << error;
  }
  EXPECT_EQ(redis_->integer({"EXISTS", "k", "b"}), 0);
}

// ---------------------------------------------------------------------------
// Concurrency leases.

const Limit kFiveAtOnce{5, 0, 5};
constexpr int64_t kLeaseTtlMs = 1000;

// Verifies that two nodes together hold at most the limit, that a return
// frees units for the other, and that a dry node learns when units expire.
TEST_F(LuaTest, ConcurrencyLeasesUpToTheLimitAcrossNodes) {
  auto a = conc("c", Op::kLease, 3, 1, kFiveAtOnce, kLeaseTtlMs, "node-a", kBaseUs);
  EXPECT_EQ(a.granted, 3);
  EXPECT_EQ(a.held, 3);
  EXPECT_EQ(a.remaining, 2);
  auto b = conc("c", Op::kLease, 5, 1, kFiveAtOnce, kLeaseTtlMs, "node-b", kBaseUs + 100 * kMsUs);
  EXPECT_EQ(b.granted, 2);
  EXPECT_EQ(b.held, 2);
  EXPECT_EQ(b.remaining, 0);
  auto dry = conc("c", Op::kLease, 1, 1, kFiveAtOnce, kLeaseTtlMs, "node-b", kBaseUs + 200 * kMsUs);
  EXPECT_EQ(dry.granted, 0);
  EXPECT_EQ(dry.held, 2);
  EXPECT_EQ(dry.retry_after_ms, 800);  // node-a's holding expires at +1000 ms
  auto back = conc("c", Op::kReturn, 2, 0, kFiveAtOnce, kLeaseTtlMs, "node-a", kBaseUs + 300 * kMsUs);
  EXPECT_EQ(back.held, 1);
  EXPECT_EQ(back.remaining, 2);
  auto more = conc("c", Op::kLease, 3, 2, kFiveAtOnce, kLeaseTtlMs, "node-b", kBaseUs + 300 * kMsUs);
  EXPECT_EQ(more.granted, 2);
  EXPECT_EQ(more.held, 4);
  EXPECT_TRUE(conc("c", Op::kPeek, 0, 6, kFiveAtOnce, kLeaseTtlMs, "node-b", kBaseUs + 300 * kMsUs).never);
}

// Verifies that a crashed node's units come free when its lease TTL passes,
// while a node that renews keeps its own, and that the crashed node learns
// it holds nothing when it comes back.
TEST_F(LuaTest, ConcurrencyUnitsOfACrashedNodeExpire) {
  EXPECT_EQ(conc("c", Op::kLease, 3, 1, kFiveAtOnce, kLeaseTtlMs, "node-a", kBaseUs).granted, 3);
  EXPECT_EQ(conc("c", Op::kLease, 2, 1, kFiveAtOnce, kLeaseTtlMs, "node-b", kBaseUs).granted, 2);
  auto renewed = conc("c", Op::kRenew, 0, 0, kFiveAtOnce, kLeaseTtlMs, "node-b", kBaseUs + 600 * kMsUs);
  EXPECT_EQ(renewed.held, 2);
  auto before = conc("c", Op::kLease, 1, 1, kFiveAtOnce, kLeaseTtlMs, "node-b", kBaseUs + 999 * kMsUs);
  EXPECT_EQ(before.granted, 0);
  EXPECT_EQ(before.retry_after_ms, 1);
  auto after = conc("c", Op::kLease, 5, 1, kFiveAtOnce, kLeaseTtlMs, "node-b", kBaseUs + 1000 * kMsUs);
  EXPECT_EQ(after.granted, 3);
  EXPECT_EQ(after.held, 5);
  EXPECT_EQ(redis_->integer({"HEXISTS", "c", "node-a"}), 0);
  auto back = conc("c", Op::kRenew, 0, 0, kFiveAtOnce, kLeaseTtlMs, "node-a", kBaseUs + 1100 * kMsUs);
  EXPECT_EQ(back.held, 0);
  EXPECT_EQ(back.remaining, 0);
}

// Verifies that the concurrency key expires within one lease TTL and is gone
// once every unit is returned.
TEST_F(LuaTest, ConcurrencyKeyExpiresWithinTheLeaseTtl) {
  conc("c", Op::kLease, 2, 1, kFiveAtOnce, kLeaseTtlMs, "node-a", 0);
  const int64_t ttl_ms = redis_->integer({"PTTL", "c"});
  EXPECT_GT(ttl_ms, 0);
  EXPECT_LE(ttl_ms, kLeaseTtlMs);
  conc("c", Op::kReturn, 5, 0, kFiveAtOnce, kLeaseTtlMs, "node-a", 0);
  EXPECT_EQ(redis_->integer({"EXISTS", "c"}), 0);
}

// ---------------------------------------------------------------------------
// Heartbeats.

// Verifies that N counts the nodes that beat within their TTL, that expired
// ones drop out and that leaving counts at once.
TEST_F(LuaTest, HeartbeatCountsLiveNodesAndDropsExpiredOnes) {
  using scripts::HeartbeatOp;
  EXPECT_EQ(beat("m", HeartbeatOp::kBeat, "node-a", 3000, kBaseUs).live, 1);
  auto two = beat("m", HeartbeatOp::kBeat, "node-b", 3000, kBaseUs + 1000 * kMsUs);
  EXPECT_EQ(two.live, 2);
  EXPECT_EQ(two.now_ms, kBaseUs / 1000 + 1000);
  EXPECT_EQ(beat("m", HeartbeatOp::kPeek, "node-c", 3000, kBaseUs + 2999 * kMsUs).live, 2);
  EXPECT_EQ(beat("m", HeartbeatOp::kPeek, "node-c", 3000, kBaseUs + 3000 * kMsUs).live, 1);
  EXPECT_EQ(beat("m", HeartbeatOp::kBeat, "node-a", 3000, kBaseUs + 3500 * kMsUs).live, 2);
  EXPECT_EQ(beat("m", HeartbeatOp::kLeave, "node-b", 3000, kBaseUs + 3600 * kMsUs).live, 1);
  EXPECT_EQ(redis_->integer({"ZCARD", "m"}), 1);
}

// Verifies that the members key expires within one TTL of the last beat.
TEST_F(LuaTest, HeartbeatKeyExpiresWithinTheTtl) {
  auto reply = beat("m", scripts::HeartbeatOp::kBeat, "node-a", 3000, 0);
  EXPECT_EQ(reply.live, 1);
  EXPECT_GT(reply.now_ms, kBaseUs / 1000);
  const int64_t ttl_ms = redis_->integer({"PTTL", "m"});
  EXPECT_GT(ttl_ms, 0);
  EXPECT_LE(ttl_ms, 3000);
}

// ---------------------------------------------------------------------------
// The fleet marker (lua/fleet_version.lua).

// Verifies that a claim takes an absent marker for its version with the
// given TTL, refreshes its own, and leaves another version's alone,
// answering it; and that a peek changes nothing.
TEST_F(LuaTest, FleetMarkerIsClaimedWhenAbsentAndKeptByItsOwnVersionOnly) {
  using scripts::FleetVersionOp;
  auto fleet = [&](FleetVersionOp op, int64_t version, int64_t ttl_ms) {
    return scripts::parseFleetVersionReply(eval(Script::kFleetVersion, "fv", scripts::fleetVersionArgv(op, version, ttl_ms)));
  };
  EXPECT_EQ(fleet(FleetVersionOp::kPeek, 2, 3'000), 0);
  EXPECT_EQ(redis_->integer({"EXISTS", "fv"}), 0);
  EXPECT_EQ(fleet(FleetVersionOp::kClaim, 2, 3'000), 2);
  int64_t ttl_ms = redis_->integer({"PTTL", "fv"});
  EXPECT_GT(ttl_ms, 0);
  EXPECT_LE(ttl_ms, 3'000);
  // Another version is told the fleet's and changes neither value nor TTL.
  EXPECT_EQ(fleet(FleetVersionOp::kClaim, 3, 60'000), 2);
  EXPECT_EQ(fleet(FleetVersionOp::kPeek, 3, 60'000), 2);
  EXPECT_LE(redis_->integer({"PTTL", "fv"}), 3'000);
  // Its own version refreshes the TTL.
  EXPECT_EQ(fleet(FleetVersionOp::kClaim, 2, 60'000), 2);
  EXPECT_GT(redis_->integer({"PTTL", "fv"}), 3'000);
  // Gone (the last daemon of version 2 left a TTL ago): version 3 claims it.
  redis_->command({"DEL", "fv"});
  EXPECT_EQ(fleet(FleetVersionOp::kClaim, 3, 3'000), 3);
  EXPECT_EQ(fleet(FleetVersionOp::kClaim, 2, 3'000), 3);
}

// Verifies that a marker holding no version (written by hand) is claimed,
// so it cannot refuse the fleet forever, and that bad ARGV is an error reply.
TEST_F(LuaTest, FleetMarkerThatHoldsNoVersionIsClaimedAndBadArgvIsAnError) {
  redis_->command({"SET", "fv", "blue"});
  EXPECT_EQ(scripts::parseFleetVersionReply(eval(Script::kFleetVersion, "fv", scripts::fleetVersionArgv(scripts::FleetVersionOp::kPeek, 2, 3'000))), 0);
  EXPECT_EQ(scripts::parseFleetVersionReply(eval(Script::kFleetVersion, "fv", scripts::fleetVersionArgv(scripts::FleetVersionOp::kClaim, 2, 3'000))), 2);
  for (const std::vector<std::string>& argv : {std::vector<std::string>{"claim", "0", "3000"},
                                                std::vector<std::string>{"claim", "2", "0"},
                                                std::vector<std::string>{"grab", "2", "3000"},
                                                std::vector<std::string>{"claim", "2.5", "3000"}}) {
    std::vector<std::string> args = {"EVALSHA", sha_[static_cast<size_t>(Script::kFleetVersion)], "1", "fv"};
    args.insert(args.end(), argv.begin(), argv.end());
    ReplyPtr reply = redis_->command(args);
    ASSERT_EQ(reply->type, REDIS_REPLY_ERROR) << argv[0] << " " << argv[1] << " " << argv[2];
    EXPECT_NE(std::string(reply->str).find("fleet_version.lua"), std::string::npos);
  }
  EXPECT_EQ(scripts::parseFleetVersionReply(std::vector<int64_t>{2, 3}), std::nullopt);
  EXPECT_EQ(scripts::parseFleetVersionReply(std::vector<int64_t>{-1}), std::nullopt);
}

}  // namespace
}  // namespace sluice

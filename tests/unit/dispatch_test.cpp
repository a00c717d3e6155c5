// The dispatcher (dispatch.h) on a simulated clock: requests in, decoded
// answers out, against a real KeyTable, with an in-process LeaseBroker
// (no Redis: the test plays the control thread) where leasing is involved.
#include "dispatch.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "key_table.h"
#include "lease.h"
#include "metrics.h"
#include "msgpack.h"
#include "rpc.h"
#include "rules.h"
#include "status.h"

namespace sluice {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kS = 1000 * kMs;
constexpr int64_t kStart = 5 * kS;  // the simulated clock's first reading

// The server's side of admin methods, for one worker.
class TestStatus final : public DaemonStatus {
 public:
  explicit TestStatus(const Metrics& metrics) : metrics_(metrics) {}
  int64_t uptimeMs() const override { return 1000; }
  size_t workers() const override { return 1; }
  MetricsSnapshot metrics() const override { return metrics_.snapshot(); }
  size_t connections() const override { return 1; }
  size_t handles() const override { return 0; }
  RedisHealth redisHealth() const override { return {}; }
  LeaseStats leaseStats() const override { return {}; }
  std::vector<RuleSnapshot> ruleMetrics() const override { return metrics_.ruleSnapshots(); }
  HistogramSnapshot leaseLatency() const override { return {}; }
  bool reload(std::string* error) override {
    *error = "reload is not part of these tests";
    return false;
  }

 private:
  const Metrics& metrics_;
};

// One decoded answer: an error's code and message, or a result map's
// integers, booleans and strings by name.
struct Answer {
  uint32_t msgid = 0;
  std::string error;  // the error's code; "" for a result
  std::string message;
  std::map<std::string, int64_t> ints;
  std::map<std::string, bool> bools;
  std::map<std::string, std::string> strs;

  bool allowed() const { return bools.at("allowed"); }
  int64_t remaining() const { return ints.at("remaining"); }
  const std::string& mode() const { return strs.at("mode"); }
};

Answer decode(std::string_view bytes) {
  Answer answer;
  msgpack::Reader r(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), bytes.size());
  uint32_t count = 0;
  int64_t type = 0;
  int64_t msgid = 0;
  EXPECT_TRUE(r.readArrayHeader(&count) && count == 4);
  EXPECT_TRUE(r.readInt(&type) && type == 1);
  EXPECT_TRUE(r.readInt(&msgid));
  answer.msgid = static_cast<uint32_t>(msgid);
  bool is_error = r.peekType() == msgpack::Type::kMap;
  if (!is_error) {
    EXPECT_TRUE(r.readNil());
  }
  uint32_t entries = 0;
  EXPECT_TRUE(r.readMapHeader(&entries));
  for (uint32_t i = 0; i < entries; ++i) {
    std::string_view name;
    EXPECT_TRUE(r.readStr(&name));
    switch (r.peekType()) {
      case msgpack::Type::kBool: {
        bool value = false;
        r.readBool(&value);
        answer.bools[std::string(name)] = value;
        break;
      }
      case msgpack::Type::kInt: {
        int64_t value = 0;
        r.readInt(&value);
        answer.ints[std::string(name)] = value;
        break;
      }
      case msgpack::Type::kStr: {
        std::string_view value;
        r.readStr(&value);
        if (is_error && name == "code") answer.error = value;
        if (is_error && name == "message") answer.message = value;
        answer.strs[std::string(name)] = value;
        break;
      }
      default: r.skip(16, 1024);
    }
  }
  EXPECT_TRUE(r.ok());
  return answer;
}

Rule makeRule(uint32_t id, std::string name, Algorithm algorithm, Limit limit,
              Scope scope = Scope::kLocal) {
  Rule rule;
  rule.id = id;
  rule.name = std::move(name);
  rule.algorithm = algorithm;
  rule.limits = {limit};
  rule.scope = scope;
  rule.on_redis_down = RedisDownPolicy::kLocal;
  return rule;
}

std::vector<Rule> testRules() {
  return {
      makeRule(1, "jobs", Algorithm::kConcurrency, {2, 0, 2}),
      makeRule(2, "api", Algorithm::kTokenBucket, {3, 1 * kS, 3}),
      makeRule(3, "g_jobs", Algorithm::kConcurrency, {4, 0, 4}, Scope::kGlobal),
      makeRule(4, "g_api", Algorithm::kTokenBucket, {10, 1 * kS, 10}, Scope::kGlobal),
  };
}

// One worker's dispatcher over its own key table; `leasing` gives it a
// broker whose breaker is closed (Redis up), as the control thread sets it.
class DispatchTest : public ::testing::Test {
 protected:
  explicit DispatchTest(bool leasing = false) : keys_(options()), reader_(keys_.registerReader()) {
    if (leasing) {
      broker_ = std::make_unique<LeaseBroker>(100 * kMs);
      broker_->setBreaker(Breaker::kHalfOpen, kStart);
      broker_->setBreaker(Breaker::kClosed, kStart);
    }
    dispatcher_.emplace(keys_, metrics_.shard(0), status_, broker_.get());
    dispatcher_->setRules(std::make_shared<const RuleSet>(testRules(), 2));
  }

  static KeyTableOptions options() {
    KeyTableOptions options;
    options.max_keys = 64;
    options.max_readers = 1;
    return options;
  }

  Answer call(rpc::Method method, std::string_view rule, std::string_view key, int64_t cost = 1) {
    rpc::Request request;
    request.msgid = ++msgid_;
    request.method = method;
    request.items.push_back({rule, key, cost, -1});
    Peer peer;
    peer.allowed = true;
    peer.admin = true;
    std::string out;
    {
      KeyTable::ReadGuard guard(keys_, reader_);
      EXPECT_FALSE(dispatcher_->handle(request, peer, now_ns_, &out));
    }
    Answer answer = decode(out);
    EXPECT_EQ(answer.msgid, msgid_);
    return answer;
  }
  Answer acquire(std::string_view rule, std::string_view key, int64_t cost = 1) {
    return call(rpc::Method::kAcquire, rule, key, cost);
  }
  Answer peek(std::string_view rule, std::string_view key) {
    return call(rpc::Method::kPeek, rule, key, 0);
  }
  Answer release(std::string_view rule, std::string_view key, int64_t cost = 1) {
    return call(rpc::Method::kRelease, rule, key, cost);
  }
  Answer reset(std::string_view rule, std::string_view key) {
    return call(rpc::Method::kReset, rule, key, 0);
  }

  KeyTable keys_;
  KeyTable::ReaderId reader_;
  Metrics metrics_{1};
  TestStatus status_{metrics_};
  std::unique_ptr<LeaseBroker> broker_;
  std::optional<Dispatcher> dispatcher_;
  int64_t now_ns_ = kStart;
  uint32_t msgid_ = 0;
};

class LeasingDispatchTest : public DispatchTest {
 protected:
  LeasingDispatchTest() : DispatchTest(true) {}
};

// --- release -------------------------------------------------------------------

// Verifies a release on a key that holds nothing gives nothing back and
// answers the state as peek reports it, however many units it names.
TEST_F(DispatchTest, ReleaseOnAKeyThatHoldsNothingAnswersAsPeekDoes) {
  Answer peeked = peek("jobs", "idle");
  EXPECT_EQ(peeked.remaining(), 2);
  for (int64_t cost : {1, 2, 5}) {
    Answer released = release("jobs", "idle", cost);
    EXPECT_EQ(released.error, "") << cost;
    EXPECT_TRUE(released.allowed()) << cost;
    EXPECT_EQ(released.remaining(), peeked.remaining()) << cost;
    EXPECT_EQ(released.ints.count("reason") + released.strs.count("reason"), 0u) << cost;
  }
  EXPECT_EQ(acquire("jobs", "idle", 2).remaining(), 0);
}

// Verifies giving back more than is held gives back what was held.
TEST_F(DispatchTest, ReleasingMoreThanIsHeldGivesBackWhatWasHeld) {
  ASSERT_TRUE(acquire("jobs", "k").allowed());
  Answer released = release("jobs", "k", 5);
  EXPECT_TRUE(released.allowed());
  EXPECT_EQ(released.remaining(), 2);
  EXPECT_TRUE(acquire("jobs", "k", 2).allowed());
  EXPECT_FALSE(acquire("jobs", "k").allowed());
}

// Verifies a release on a rule that is not a concurrency rule is refused
// with an error naming the rule, and changes nothing.
TEST_F(DispatchTest, ReleaseOnARuleThatIsNotConcurrencyIsABadRequest) {
  ASSERT_TRUE(acquire("api", "k", 3).allowed());
  Answer released = release("api", "k", 3);
  EXPECT_EQ(released.error, "BAD_REQUEST");
  EXPECT_NE(released.message.find("\"api\""), std::string::npos) << released.message;
  EXPECT_NE(released.message.find("concurrency"), std::string::npos) << released.message;
  EXPECT_EQ(peek("api", "k").remaining(), 0);
  EXPECT_EQ(release("g_api", "k").error, "BAD_REQUEST");
}

// Verifies a global concurrency rule without Redis (deciding on its share)
// answers a release on an idle key as peek does.
TEST_F(DispatchTest, ReleaseOnAnIdleGlobalKeyWithoutRedisAnswersAsPeekDoes) {
  Answer peeked = peek("g_jobs", "idle");
  Answer released = release("g_jobs", "idle", 9);
  EXPECT_TRUE(released.allowed());
  EXPECT_EQ(released.remaining(), peeked.remaining());
  EXPECT_EQ(released.mode(), peeked.mode());
}

// Verifies a global concurrency rule that leases answers a release on a key
// it has never seen as peek does, and one over the limit is not denied.
TEST_F(LeasingDispatchTest, ReleaseOnAnIdleLeasedKeyAnswersAsPeekDoes) {
  Answer peeked = peek("g_jobs", "idle");
  Answer released = release("g_jobs", "idle", 9);
  EXPECT_TRUE(released.allowed());
  EXPECT_EQ(released.remaining(), peeked.remaining());
  EXPECT_EQ(released.mode(), "normal");
}

// --- reset ---------------------------------------------------------------------

// Verifies reset of a leasing global rule while Redis is up reports the mode
// the key is decided in (normal), and asks Redis to reset it too.
TEST_F(LeasingDispatchTest, ResetOfALeasingRuleAnswersTheModeItDecidesIn) {
  Answer reset_answer = reset("g_api", "k");
  EXPECT_EQ(reset_answer.error, "");
  EXPECT_EQ(reset_answer.mode(), "normal");
  EXPECT_EQ(reset_answer.remaining(), 10);
  std::vector<LeaseRequest> sent;
  broker_->takeRequests(&sent);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent.front().kind, LeaseRequest::Kind::kReset);
}

// Verifies reset of a global rule without Redis answers in fallback, the
// mode its share decides in.
TEST_F(DispatchTest, ResetOfAGlobalRuleWithoutRedisAnswersInFallback) {
  EXPECT_EQ(reset("g_jobs", "k").mode(), "fallback");
  EXPECT_EQ(reset("api", "k").mode(), "local");
}

}  // namespace
}  // namespace sluice

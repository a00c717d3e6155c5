// Rate leases (daemon/rate_lease.h): the maths of the held rates of
// lua/token_bucket.lua and lua/gcra.lua cross-tested against their C++ mirror
// on a real redis-server (every script test runs on both: GCRA's TAT is the
// bucket's empty time plus burst * interval), the max-min share, and the
// daemon's rule. Time comes from the script's now_us test seam, never from
// sleeping.
#include "rate_lease.h"

#include <atomic>
#include <cctype>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "redis_server.h"
#include "scripts.h"
#include "slice.h"

namespace sluice {
namespace {

using rate_lease::Held;

constexpr int64_t kBaseUs = 1'700'000'000'000'000;
constexpr int64_t kMsUs = 1'000;
constexpr int64_t kSecondUs = 1'000'000;
constexpr int64_t kSecondNs = 1'000'000'000;

using ReplyPtr = std::unique_ptr<redisReply, decltype(&freeReplyObject)>;

// What one call of the script answered.
struct Answer {
  int64_t granted = 0;
  int64_t remaining = 0;
  int64_t retry_after_ms = 0;
  int64_t rate = -1;  // a rate op's, else -1
  bool unmet = false;  // a rate op's: some recorded demand is below its share
};

class RateLeaseScript : public ::testing::TestWithParam<scripts::Script> {
 protected:
  static void SetUpTestSuite() { server_ = new test::RedisServer(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }

  void SetUp() override {
    ctx_ = redisConnect(server_->host().c_str(), server_->port());
    ASSERT_TRUE(ctx_ != nullptr && ctx_->err == 0);
    command({"FLUSHALL"});
    ReplyPtr reply = command(
        {"SCRIPT", "LOAD", std::string(kTimeless) + std::string(scripts::get(GetParam()).source)});
    ASSERT_EQ(reply->type, REDIS_REPLY_STRING);
    sha_.assign(reply->str, reply->len);
  }
  void TearDown() override { redisFree(ctx_); }

  // Prefixed to the script, makes it set no TTLs: they are relative to the
  // script's simulated clock but run out on Redis's real one, which could
  // drop state the simulated time still needs (tests/unit/lua_test.cpp).
  static constexpr std::string_view kTimeless =
      "local real_redis = redis "
      "local redis = setmetatable({call = function(command, ...) "
      "if command == 'PEXPIRE' then return 1 end "
      "if command == 'SET' then local key, value = ... return real_redis.call('SET', key, value) end "
      "return real_redis.call(command, ...) end}, {__index = real_redis}) ";

  ReplyPtr command(const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& arg : args) {
      argv.push_back(arg.data());
      lens.push_back(arg.size());
    }
    auto* reply = static_cast<redisReply*>(
        redisCommandArgv(ctx_, static_cast<int>(args.size()), argv.data(), lens.data()));
    if (reply == nullptr) throw std::runtime_error("redis connection lost");
    return ReplyPtr(reply, freeReplyObject);
  }

  // EVALSHA on the state key alone (it holds the rates too) with `argv`.
  Answer eval(const std::vector<std::string>& argv) {
    std::vector<std::string> args = {"EVALSHA", sha_, "1", key_};
    args.insert(args.end(), argv.begin(), argv.end());
    ReplyPtr reply = command(args);
    if (reply->type != REDIS_REPLY_ARRAY) {
      throw std::runtime_error(reply->str != nullptr ? reply->str : "not an array");
    }
    std::vector<int64_t> values;
    for (size_t i = 0; i < reply->elements; ++i) values.push_back(reply->element[i]->integer);
    Answer a{values.at(0), values.at(1), values.at(2)};
    if (values.size() == 8) {
      auto parsed = rate_lease::parseReply(values, 1'000'000);
      if (!parsed) throw std::runtime_error("malformed rate reply");
      a.rate = parsed->rate;
      a.unmet = parsed->unmet;
    }
    return a;
  }

  // The state key as the Model keeps it: the bucket's empty time T
  // (gcra.lua stores TAT = T + burst * interval); nullopt when absent, or
  // when the rates' array says full (0). Redis's cmsgpack reads the array.
  std::optional<int64_t> storedT(const Limit& limit) {
    ReplyPtr reply = command(
        {"EVAL",
         "local s = redis.call('GET', KEYS[1]) "
         "if not s then return false end "
         "if string.byte(s, 1) >= 0x80 then s = cmsgpack.unpack(s)[1] end "
         "if tonumber(s) == 0 then return false end "
         "return string.format('%d', tonumber(s))",
         "1", "q"});
    if (reply->type != REDIS_REPLY_STRING) return std::nullopt;
    int64_t value = std::stoll(std::string(reply->str, reply->len));
    if (GetParam() == scripts::Script::kGcra) {
      value -= limit.burst * ((limit.period_ns / 1'000'000 * 1000 + limit.limit - 1) / limit.limit);
    }
    return value;
  }

  Answer lease(const Limit& limit, int64_t n, int64_t need, int64_t now_us) {
    return eval(scripts::rateArgv(scripts::Op::kLease, n, need, limit, now_us));
  }
  Answer peek(const Limit& limit, int64_t need, int64_t now_us) {
    return eval(scripts::rateArgv(scripts::Op::kPeek, 0, need, limit, now_us));
  }
  Answer giveBack(const Limit& limit, int64_t n, int64_t now_us) {
    return eval(scripts::returnArgv(n, limit, 0, now_us));
  }
  Answer debit(const Limit& limit, int64_t n, int64_t span_ms, int64_t now_us) {
    return eval(scripts::rateArgv(scripts::Op::kDebit, n, span_ms, limit, now_us));
  }
  Answer rate(const Limit& limit, const std::string& node, int64_t asked, int64_t tokens, int64_t lease_ms,
              int64_t now_us) {
    return eval(rate_lease::rateArgv(asked, tokens, limit, 0, node, lease_ms, now_us));
  }

  // The next message on `channel` of `subscriber` (subscribed to it)
  // once the test's own "mark" is PUBLISHed after whatever the script
  // sent: the script's message when it sent one, else "mark".
  std::string nextMessage(redisContext* subscriber, const std::string& channel) {
    command({"PUBLISH", channel, "mark"});
    void* raw = nullptr;
    if (redisGetReply(subscriber, &raw) != REDIS_OK) throw std::runtime_error("subscription lost");
    ReplyPtr message(static_cast<redisReply*>(raw), freeReplyObject);
    if (message->type != REDIS_REPLY_ARRAY || message->elements != 3) throw std::runtime_error("not a message");
    std::string text(message->element[2]->str, message->element[2]->len);
    if (text != "mark") {
      // The mark follows: read it, so the next call starts clean.
      void* mark = nullptr;
      if (redisGetReply(subscriber, &mark) != REDIS_OK) throw std::runtime_error("subscription lost");
      freeReplyObject(mark);
    }
    return text;
  }

  static test::RedisServer* server_;
  redisContext* ctx_ = nullptr;
  std::string sha_;
  std::string key_ = "q";  // the state key (KEYS[1])
};

test::RedisServer* RateLeaseScript::server_ = nullptr;

// The script's state and answers, computed in C++ with rate_lease.h's maths
// on the token bucket's empty time.
class Model {
 public:
  explicit Model(const Limit& limit)
      : limit_(limit), interval_((limit.period_ns / 1'000'000 * 1000 + limit.limit - 1) / limit.limit) {}

  Answer lease(int64_t n, int64_t need, int64_t now) {
    int64_t empty = begin(now);
    Answer a;
    if (need <= limit_.burst && units(empty, now) >= need) {
      a.granted = std::min(n, units(empty, now));
      empty += a.granted * interval_;
    }
    end(empty, now);
    a.remaining = units(std::max(empty, full(now)), now);
    if (need > limit_.burst) {
      a.retry_after_ms = -1;
    } else if (a.granted == 0 && a.remaining < need) {
      a.retry_after_ms = waitMs(empty, need, now);
    }
    return a;
  }

  Answer peek(int64_t need, int64_t now) {
    int64_t empty = begin(now);
    end(empty, now);
    Answer a;
    a.remaining = units(empty, now);
    if (need > limit_.burst) {
      a.retry_after_ms = -1;
    } else if (a.remaining < need) {
      a.retry_after_ms = waitMs(empty, need, now);
    }
    return a;
  }

  // A return of n units: the stored T moves back (nothing when absent).
  Answer giveBack(int64_t n, int64_t now) {
    int64_t empty = begin(now);
    if (stored_) empty = std::max(*stored_ - n * interval_, full(now));
    end(empty, now);
    return Answer{0, units(empty, now), 0};
  }

  // A debit of n units spent over the last span_ms (0: just now), from a
  // bucket full to its cap at the span's start.
  Answer debit(int64_t n, int64_t span_ms, int64_t now) {
    int64_t empty = begin(now);
    if (span_ms == 0) {
      empty += n * interval_;
    } else {
      empty = std::max(empty, full(now) - span_ms * kMsUs + n * interval_);
    }
    end(empty, now);
    return Answer{0, units(empty, now), 0};
  }

  Answer rate(const std::string& node, int64_t asked, int64_t tokens, int64_t lease_ms, int64_t now) {
    int64_t empty = begin(now);
    Answer a;
    a.rate = 0;
    std::vector<Held> kept;
    for (const Held& h : live_) {
      if (h.node != node) kept.push_back(h);
    }
    if (asked > 0) {
      a.rate = rate_lease::grant(live_, node, asked, limit_.limit);
      kept.push_back({node, a.rate, now + lease_ms * kMsUs, asked});
    }
    a.unmet = rate_lease::unmet(kept, limit_.limit);
    if (tokens > 0 && limit_.burst >= 1 && units(empty, now) >= 1) {
      a.granted = std::min(tokens, units(empty, now));
      empty += a.granted * interval_;
    }
    live_ = kept;
    empty = std::max(empty, full(now));  // then the new rates' shares of the burst leave the bucket
    end(empty, now);
    a.remaining = units(empty, now);
    return a;
  }

  // The sum of the rates held after now.
  int64_t held(int64_t now) const {
    int64_t sum = 0;
    for (const Held& h : live_) sum += h.until_us > now ? h.rate : 0;
    return sum;
  }

  // The bucket's empty time as stored after the last call (nullopt: absent).
  std::optional<int64_t> stored() const { return stored_; }

  // A stored empty time as it applies at now: one older than full reads as
  // full (the scripts leave a stale one in place when they write nothing).
  int64_t emptyAt(std::optional<int64_t> stored, int64_t now) const {
    return std::max(stored.value_or(full(now)), full(now));
  }

  // The holders' shares of the burst (rate_lease::burstShare) after now.
  int64_t sharesHeld(int64_t now) const {
    int64_t sum = 0;
    for (const Held& h : live_) sum += h.until_us > now ? rate_lease::burstShare(limit_, h.rate) : 0;
    return sum;
  }

 private:
  int64_t units(int64_t empty, int64_t now) const { return empty >= now ? 0 : (now - empty) / interval_; }

  // When the bucket, capped while rates are held (rate_lease::bucketCapUnits),
  // is full at now.
  int64_t full(int64_t now) const {
    return now - rate_lease::bucketCapUnits(live_, limit_) * interval_;
  }

  // Charges the rates held since the last call; the empty time as it applies now.
  int64_t begin(int64_t now) {
    if (std::optional<int64_t> t = rate_lease::charge(stored_, at_, now, live_, limit_)) stored_ = t;
    std::vector<Held> live;
    for (const Held& h : live_) {
      if (h.until_us > now) live.push_back(h);
    }
    live_ = live;
    return std::max(stored_.value_or(full(now)), full(now));
  }

  void end(int64_t empty, int64_t now) {
    stored_ = empty <= full(now) ? std::nullopt : std::optional<int64_t>(empty);
    at_ = now;
  }

  int64_t waitMs(int64_t empty, int64_t need, int64_t now) const {
    int64_t us = rate_lease::retryWaitUs(empty, need, live_, limit_, now);
    return us <= 0 ? 0 : (us + 999) / 1000;
  }

  Limit limit_;
  int64_t interval_;
  std::optional<int64_t> stored_;
  int64_t at_ = 0;
  std::vector<Held> live_;
};

// Verifies that token leases, peeks, returns, debits and the rate leases of
// three nodes, at random sizes and times, answer in Lua exactly what the C++
// mirror computes and leave the state it computes (GCRA's TAT read as the
// bucket's T), that the rates held never sum past the limit, and that the
// bucket never holds more than the burst less the holders' shares of it.
TEST_P(RateLeaseScript, RandomLeasesAndRatesAnswerAsTheCppMirror) {
  for (const Limit& limit : {Limit{100, kSecondNs, 10}, Limit{1000, kSecondNs, 30}, Limit{7, 3 * kSecondNs, 5}}) {
    command({"FLUSHALL"});
    Model model(limit);
    std::mt19937_64 rng(limit.limit);
    const std::string nodes[] = {"node-a", "node-b", "node-c"};
    int64_t now = kBaseUs;
    int unmet_replies = 0;
    int capped_steps = 0;  // the bucket full to its cap, below the burst
    for (int step = 0; step < 600; ++step) {
      now += static_cast<int64_t>(rng() % 300) * kMsUs + static_cast<int64_t>(rng() % 1000);
      const int op = static_cast<int>(rng() % 6);
      Answer lua, cpp;
      if (op == 0) {
        int64_t n = 1 + static_cast<int64_t>(rng() % 20);
        int64_t need = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
        lua = lease(limit, n, need, now);
        cpp = model.lease(n, need, now);
        ASSERT_EQ(lua.retry_after_ms, cpp.retry_after_ms) << "step " << step;
      } else if (op == 3) {
        int64_t need = static_cast<int64_t>(rng() % static_cast<uint64_t>(limit.burst + 2));
        lua = peek(limit, need, now);
        cpp = model.peek(need, now);
        ASSERT_EQ(lua.retry_after_ms, cpp.retry_after_ms) << "step " << step;
      } else if (op == 4) {
        int64_t n = 1 + static_cast<int64_t>(rng() % 10);
        lua = giveBack(limit, n, now);
        cpp = model.giveBack(n, now);
      } else if (op == 5) {
        int64_t n = 1 + static_cast<int64_t>(rng() % 10);
        int64_t span_ms = rng() % 2 == 0 ? 0 : static_cast<int64_t>(rng() % 3000);
        lua = debit(limit, n, span_ms, now);
        cpp = model.debit(n, span_ms, now);
      } else {
        const std::string& node = nodes[rng() % 3];
        int64_t asked = static_cast<int64_t>(rng() % static_cast<uint64_t>(limit.limit * 3 / 2 + 1));
        asked = std::min(asked, limit.limit);
        int64_t tokens = static_cast<int64_t>(rng() % 10);
        int64_t lease_ms = 200 + static_cast<int64_t>(rng() % 2000);
        lua = rate(limit, node, asked, tokens, lease_ms, now);
        cpp = model.rate(node, asked, tokens, lease_ms, now);
        ASSERT_EQ(lua.rate, cpp.rate) << "step " << step;
        ASSERT_EQ(lua.unmet, cpp.unmet) << "step " << step;
        if (lua.unmet) ++unmet_replies;
      }
      ASSERT_EQ(lua.granted, cpp.granted) << "step " << step << " op " << op;
      ASSERT_EQ(lua.remaining, cpp.remaining) << "step " << step << " op " << op;
      ASSERT_EQ(model.emptyAt(storedT(limit), now), model.emptyAt(model.stored(), now))
          << "step " << step << " op " << op;
      ASSERT_LE(model.held(now), limit.limit);
      // The holders keep their shares of the burst; the bucket the rest.
      ASSERT_LE(lua.remaining + model.sharesHeld(now), limit.burst) << "step " << step;
      if (model.sharesHeld(now) > 0 && lua.remaining + model.sharesHeld(now) == limit.burst) ++capped_steps;
    }
    EXPECT_GT(unmet_replies, 0);  // both answers were seen
    EXPECT_GT(capped_steps, 0);   // and the cap at work
  }
}

// Verifies that a node that holds the whole rate and stops renewing gives
// it back at its lease's end: the bucket does not refill while the rate is
// held, and refills at the full rate from its end.
TEST_P(RateLeaseScript, ARateThatIsNotRenewedReturnsToTheBucketAtItsEnd) {
  const Limit limit{100, kSecondNs, 1000};
  ASSERT_EQ(lease(limit, 1000, 1000, kBaseUs).granted, 1000);  // the bucket empty
  Answer held = rate(limit, "node-a", 100, 0, 2000, kBaseUs);
  EXPECT_EQ(held.rate, 100);
  // Held: nothing refills for anyone else, and a lease waits for its end.
  Answer during = peek(limit, 1, kBaseUs + 1500 * kMsUs);
  EXPECT_EQ(during.remaining, 0);
  EXPECT_EQ(during.retry_after_ms, 510);  // 500 ms to the end, then 10 ms
  // Not renewed (the node crashed): from the end the bucket refills at 100/s.
  EXPECT_EQ(peek(limit, 1, kBaseUs + 2500 * kMsUs).remaining, 50);
  EXPECT_EQ(lease(limit, 1000, 1, kBaseUs + 3000 * kMsUs).granted, 100);
}

// Verifies the bucket's cap: while rates are held, Redis's bucket fills only
// to the burst less the holders' shares of it (which their slices refill
// to), so a pause does not save the burst twice; a rate's end gives its
// share back to the bucket.
TEST_P(RateLeaseScript, AHeldRateTakesItsShareOfTheBurstOutOfTheBucket) {
  const Limit limit{100, kSecondNs, 20};
  const int64_t interval_ns = 100'000'000;
  ASSERT_EQ(rate(limit, "node-a", 50, 0, 5000, kBaseUs).rate, 50);
  EXPECT_EQ(rate_lease::burstShare(limit, 50), 10);
  EXPECT_EQ(rate_lease::capUnits(limit, 50, interval_ns), 10);
  // Paused for 3 s: the bucket holds the other half of the burst.
  EXPECT_EQ(peek(limit, 1, kBaseUs + 3 * kSecondUs).remaining, 10);
  // A second holder of 30/s takes its 6 out too.
  ASSERT_EQ(rate(limit, "node-b", 30, 0, 1000, kBaseUs + 3 * kSecondUs).rate, 30);
  EXPECT_EQ(peek(limit, 1, kBaseUs + 3 * kSecondUs).remaining, 4);
  EXPECT_EQ(lease(limit, 20, 1, kBaseUs + 3 * kSecondUs + kMsUs).granted, 4);
  // b's rate ends at +4 s and its share refills at the rate a leaves (50/s:
  // 6 units in 120 ms); a's ends at +5 s, and the bucket is whole again.
  EXPECT_EQ(peek(limit, 1, kBaseUs + 4500 * kMsUs).remaining, 10);
  EXPECT_EQ(peek(limit, 1, kBaseUs + 6 * kSecondUs).remaining, 20);
}

// Verifies the retry hint under the bucket's cap: while two holders keep 9
// of a burst of 10, a lease that needs 5 is told to come back once the
// first rate has ended (the cap is 6 from then) and the 4 missing units
// have refilled at the 60/s the other holder leaves, not after 4 units at
// the 10/s both leave (400 ms), when the cap still holds 1; the hint is
// exact to the ms (the units are not there 1 ms before it, and are at it),
// and C++ gives the same.
TEST_P(RateLeaseScript, ADeniedLeaseIsNotToldToRetryBeforeTheCapLetsItsUnitsExist) {
  const Limit limit{100, kSecondNs, 10};
  ASSERT_EQ(rate(limit, "node-a", 50, 0, 500, kBaseUs).rate, 50);
  ASSERT_EQ(rate(limit, "node-b", 40, 0, 5000, kBaseUs).rate, 40);
  EXPECT_EQ(peek(limit, 1, kBaseUs).remaining, 1);  // 10 less shares of 5 and 4
  const Answer denied = lease(limit, 5, 5, kBaseUs + kMsUs);
  EXPECT_EQ(denied.granted, 0);
  // The bucket (1 unit) is at its cap until a's end 499 ms after the lease,
  // then refills 4 units at 60/s: 66.67 ms more, 566 ms rounded up.
  EXPECT_EQ(denied.retry_after_ms, 566);
  const std::vector<Held> live = {{"node-a", 50, kBaseUs + 500 * kMsUs, 50},
                                  {"node-b", 40, kBaseUs + 5 * kSecondUs, 40}};
  const int64_t empty_us = kBaseUs + kMsUs - 1 * 10'000;  // 1 unit of 10 ms in the bucket
  EXPECT_EQ((rate_lease::retryWaitUs(empty_us, 5, live, limit, kBaseUs + kMsUs) + 999) / 1000, 566);
  // Blind to the cap, the hint would be 4 units at the 10/s left: 400 ms.
  EXPECT_EQ(rate_lease::heldWaitUs(40'000, 90, 100, kBaseUs + 500 * kMsUs, kBaseUs + kMsUs), 400'000);
  EXPECT_LT(peek(limit, 5, kBaseUs + kMsUs + 565 * kMsUs).remaining, 5);
  EXPECT_GE(peek(limit, 5, kBaseUs + kMsUs + 566 * kMsUs).remaining, 5);
}

// Verifies that the tokens a rate op takes beside its rate come out of the
// bucket as the call found it, before the new rate's share of the burst
// leaves it: a key that switches to the whole rate keeps what it asked for
// of a full bucket, and the rest is its share, which its slice refills.
TEST_P(RateLeaseScript, ARateOpTakesItsTokensBeforeItsShareLeavesTheBucket) {
  const Limit limit{100, kSecondNs, 20};
  Answer switched = rate(limit, "node-a", 100, 12, 5000, kBaseUs);
  EXPECT_EQ(switched.rate, 100);
  EXPECT_EQ(switched.granted, 12);
  EXPECT_EQ(switched.remaining, 0);
}

// Verifies that the rates live in the bucket's own state key, so that every
// call names one key (a Cluster slot in migration serves a call of several
// only once all are on one node): while rates are held Redis has the state
// key alone, which reads back as T's digits once the last rate ended and
// is deleted once the bucket is full again.
TEST_P(RateLeaseScript, TheRatesLiveInTheStateKeyAlone) {
  const Limit limit{100, kSecondNs, 100};
  ASSERT_EQ(lease(limit, 100, 100, kBaseUs).granted, 100);
  EXPECT_EQ(rate(limit, "node-a", 60, 0, 1000, kBaseUs).rate, 60);
  EXPECT_EQ(rate(limit, "node-b", 60, 0, 1000, kBaseUs + 100 * kMsUs).rate, 40);
  ReplyPtr keys = command({"KEYS", "*"});
  ASSERT_EQ(keys->elements, 1u);
  EXPECT_EQ(std::string(keys->element[0]->str), "q");
  EXPECT_GE(static_cast<unsigned char>(command({"GET", "q"})->str[0]), 0x80);  // T and the rates
  // Both rates ended (at 1 s and 1.1 s): T alone. The rates took 60/s for
  // 0.1 s, 100/s for 0.9 s and 40/s for 0.1 s: 10 units had refilled at
  // 1.1 s, less the 4 that b's share of the burst took out of the bucket
  // (the bucket cap) when b got its rate at 0.1 s.
  EXPECT_EQ(peek(limit, 1, kBaseUs + 1200 * kMsUs).remaining, 16);
  ReplyPtr state = command({"GET", "q"});
  ASSERT_EQ(state->type, REDIS_REPLY_STRING);  // T's digits (gcra.lua: TAT's)
  EXPECT_TRUE(std::isdigit(static_cast<unsigned char>(state->str[0])));
  // Full again: no key at all.
  EXPECT_EQ(lease(limit, 1, 1, kBaseUs + 3000 * kMsUs).granted, 1);
  EXPECT_EQ(lease(limit, 1, 1, kBaseUs + 3000 * kMsUs).remaining, 98);
  EXPECT_EQ(command({"DBSIZE"})->integer, 1);
  EXPECT_EQ(eval(scripts::rateArgv(scripts::Op::kReturn, 2, 0, limit, kBaseUs + 3000 * kMsUs)).remaining, 100);
  EXPECT_EQ(command({"DBSIZE"})->integer, 0);
}

// Verifies that a rate held by one node slows the bucket for the others to
// the rest of the limit: over 10 s the token leases of another node get
// what refills at limit - rate, and the two never pass limit * W + burst.
TEST_P(RateLeaseScript, TheBucketAndTheRateHoldersNeverPassTheLimitTogether) {
  const Limit limit{100, kSecondNs, 20};
  int64_t now = kBaseUs;
  int64_t tokens = lease(limit, 20, 1, now).granted;  // the burst
  int64_t rate_units = 0;
  Answer held = rate(limit, "node-a", 60, 0, 1000, now);
  ASSERT_EQ(held.rate, 60);
  int64_t held_since = now;
  for (int step = 1; step <= 1000; ++step) {
    now = kBaseUs + step * 10 * kMsUs;
    tokens += lease(limit, 50, 1, now).granted;
    if (step % 50 == 0) {  // renewed every 500 ms
      rate_units += (now - held_since) * 60 / (100 * 10'000);  // its slice's refill
      held_since = now;
      ASSERT_EQ(rate(limit, "node-a", 60, 0, 1000, now).rate, 60);
    }
  }
  EXPECT_EQ(rate_units, 600);
  EXPECT_GE(tokens, 20 + 400 - 2);
  EXPECT_LE(tokens + rate_units, 100 * 10 + 20);
}

// Verifies max-min shares: a node that asks for less than an equal split
// gets what it asks for once the one holding everything renews, within two
// renewals; the rates never sum past the limit; and `unmet` says so while a
// recorded demand is below its share, and not once every share is held.
TEST_P(RateLeaseScript, ASmallDemandGetsItsRateWithinTwoRenewals) {
  const Limit limit{100, kSecondNs, 0};
  Answer alone = rate(limit, "node-a", 100, 0, 1000, kBaseUs);
  EXPECT_EQ(alone.rate, 100);
  EXPECT_FALSE(alone.unmet);
  Answer refused = rate(limit, "node-b", 20, 0, 1000, kBaseUs + 100 * kMsUs);
  EXPECT_EQ(refused.rate, 0);  // none free yet
  EXPECT_TRUE(refused.unmet);
  Answer shrunk = rate(limit, "node-a", 100, 0, 1000, kBaseUs + 200 * kMsUs);
  EXPECT_EQ(shrunk.rate, 80);
  EXPECT_TRUE(shrunk.unmet);  // b has not asked again yet
  Answer met = rate(limit, "node-b", 20, 0, 1000, kBaseUs + 300 * kMsUs);
  EXPECT_EQ(met.rate, 20);
  EXPECT_FALSE(met.unmet);
  EXPECT_FALSE(rate(limit, "node-a", 100, 0, 1000, kBaseUs + 500 * kMsUs).unmet);
  // A third that wants everything: a and c split what b leaves.
  EXPECT_EQ(rate(limit, "node-c", 100, 0, 1000, kBaseUs + 700 * kMsUs).rate, 0);
  EXPECT_EQ(rate(limit, "node-a", 100, 0, 1000, kBaseUs + 800 * kMsUs).rate, 40);
  EXPECT_EQ(rate(limit, "node-c", 100, 0, 1000, kBaseUs + 900 * kMsUs).rate, 40);
  // A rate given up (0) is free at once.
  EXPECT_EQ(rate(limit, "node-b", 0, 0, 1000, kBaseUs + 1200 * kMsUs).rate, 0);
  EXPECT_EQ(rate(limit, "node-c", 100, 0, 1000, kBaseUs + 1300 * kMsUs).rate, 50);
}

// Verifies that a rate or share moving within the noise of the demand
// measurements (rate_lease::pastNoise) tells no holder to renew, and one
// moving past it does, on a key the daemon would name (a `renew` word
// needs "q:{" in it): hot asks for the whole 2,000/s limit beside c at
// 100/s; c's ask falling to 97/s leaves hot 3/s short of its share (not
// unmet) and sends no word, though hot is short of its ask; falling to
// 30/s leaves hot 70/s short, past a 32nd of the limit (unmet), and frees
// more than an eighth of c's rate (the word).
TEST_P(RateLeaseScript, ARateMovingWithinItsNoiseTellsNoHolderToRenew) {
  key_ = "t:q:{k}";
  const Limit limit{2'000, kSecondNs, 0};
  EXPECT_EQ(rate(limit, "hot", 2'000, 0, 1000, kBaseUs).rate, 2'000);
  EXPECT_EQ(rate(limit, "c", 100, 0, 1000, kBaseUs + 10 * kMsUs).rate, 0);
  EXPECT_EQ(rate(limit, "hot", 2'000, 0, 1000, kBaseUs + 20 * kMsUs).rate, 1'900);
  Answer settled = rate(limit, "c", 100, 0, 1000, kBaseUs + 30 * kMsUs);
  EXPECT_EQ(settled.rate, 100);
  EXPECT_FALSE(settled.unmet);

  redisContext* subscriber = redisConnect(server_->host().c_str(), server_->port());
  ASSERT_TRUE(subscriber != nullptr && subscriber->err == 0);
  std::unique_ptr<redisContext, decltype(&redisFree)> owned(subscriber, redisFree);
  const timeval five_s{5, 0};
  redisSetTimeout(subscriber, five_s);
  freeReplyObject(redisCommand(subscriber, "SUBSCRIBE t:renew"));

  Answer noise = rate(limit, "c", 97, 0, 1000, kBaseUs + 40 * kMsUs);
  EXPECT_EQ(noise.rate, 97);
  EXPECT_FALSE(noise.unmet);
  EXPECT_EQ(nextMessage(subscriber, "t:renew"), "mark");
  Answer fall = rate(limit, "c", 30, 0, 1000, kBaseUs + 50 * kMsUs);
  EXPECT_EQ(fall.rate, 30);
  EXPECT_TRUE(fall.unmet);
  EXPECT_EQ(nextMessage(subscriber, "t:renew"), key_);
}

// Verifies that a rate op without a node id, with a rate past the limit or
// a lease past 60 s is an error reply.
TEST_P(RateLeaseScript, BadRateArgumentsAreAnErrorReply) {
  const Limit limit{100, kSecondNs, 10};
  EXPECT_THROW(rate(limit, "", 10, 0, 1000, kBaseUs), std::runtime_error);
  EXPECT_THROW(rate(limit, "n", 101, 0, 1000, kBaseUs), std::runtime_error);
  EXPECT_THROW(rate(limit, "n", 10, 0, 60'001, kBaseUs), std::runtime_error);
}

INSTANTIATE_TEST_SUITE_P(Scripts, RateLeaseScript,
                         ::testing::Values(scripts::Script::kTokenBucket, scripts::Script::kGcra),
                         [](const ::testing::TestParamInfo<scripts::Script>& info) {
                           return info.param == scripts::Script::kGcra ? std::string("Gcra")
                                                                       : std::string("TokenBucket");
                         });

// Verifies max-min fairness on its own: small demands are met, the rest
// split what is left.
TEST(RateLeaseShare, MaxMinMeetsSmallDemandsAndSplitsTheRest) {
  EXPECT_EQ(rate_lease::fairShare({10, 100, 100}, 100, 10), 10);
  EXPECT_EQ(rate_lease::fairShare({10, 100, 100}, 100, 100), 45);
  EXPECT_EQ(rate_lease::fairShare({30, 30, 30}, 100, 30), 30);
  EXPECT_EQ(rate_lease::fairShare({300}, 100, 300), 100);
  EXPECT_EQ(rate_lease::fairShare({50, 60, 1000}, 100, 60), 33);
}

// Verifies that the capability table says which rules lease rates: a global
// token bucket or gcra rule of one limit may; a window, a log, a local rule,
// one of several limits or a paced one (its units leave the fleet one
// interval apart, which shares paced on each node would not keep) may not.
TEST(RateLeaseRule, TheBucketsLeaseRatesAndTheWindowsDoNot) {
  Rule rule;
  rule.scope = Scope::kGlobal;
  rule.limits = {Limit{1000, kSecondNs, 30}};
  for (Algorithm algorithm : {Algorithm::kTokenBucket, Algorithm::kGcra}) {
    rule.algorithm = algorithm;
    EXPECT_TRUE(rate_lease::eligible(rule)) << algorithmTraits(algorithm).name;
  }
  for (Algorithm algorithm : {Algorithm::kFixedWindow, Algorithm::kSlidingWindow, Algorithm::kSlidingLog}) {
    rule.algorithm = algorithm;
    EXPECT_FALSE(rate_lease::eligible(rule)) << algorithmTraits(algorithm).name;
  }
  rule.algorithm = Algorithm::kGcra;
  rule.pace = true;
  EXPECT_FALSE(rate_lease::eligible(rule));
  rule.pace = false;
  rule.scope = Scope::kLocal;
  EXPECT_FALSE(rate_lease::eligible(rule));
  rule.scope = Scope::kGlobal;
  rule.limits.push_back(Limit{10'000, 60 * kSecondNs, 30});
  EXPECT_FALSE(rate_lease::eligible(rule));
}

// Verifies the daemon's rule: a key whose last lease found Redis's bucket
// drained asks for a rate, however light; one whose bucket still had what
// it asked for does not.
TEST(RateLeaseRule, AKeyWhoseBucketRanDryAsksForARate) {
  const Limit limit{1000, kSecondNs, 30};
  const int64_t interval_ns = 100'000'000;  // refills 100 per interval
  EXPECT_TRUE(rate_lease::wants(limit, 300, true, interval_ns));
  EXPECT_FALSE(rate_lease::wants(limit, 300, false, interval_ns));
  // A light key beside a hot one: its bucket ran dry too, so it asks, and
  // its demand is recorded for the max-min division.
  EXPECT_TRUE(rate_lease::wants(limit, 5, true, interval_ns));
  EXPECT_FALSE(rate_lease::wants(limit, 0, true, interval_ns));
  EXPECT_EQ(rate_lease::askedRate(limit, 300, interval_ns), 1000);  // capped at the limit
  EXPECT_EQ(rate_lease::askedRate(limit, 20, interval_ns), 200);
  // 1000/s: one unit per ms; the cap is one interval of the rate.
  EXPECT_EQ(rate_lease::nsPerUnit(limit, 1000), 1'000'000);
  EXPECT_EQ(rate_lease::capUnits(limit, 1000, interval_ns), 100);
  EXPECT_EQ(rate_lease::capUnits(limit, 1, interval_ns), 1);
}

// Verifies that a rate's slice refills to the rate's share of the burst when
// that is more than one lease interval of the rate: 10/s with a burst of 10
// refills one unit per interval, but its whole rate keeps all 10.
TEST(RateLeaseRule, ARateKeepsItsShareOfTheBurst) {
  const Limit limit{10, kSecondNs, 10};
  const int64_t interval_ns = 100'000'000;
  EXPECT_EQ(rate_lease::capUnits(limit, 10, interval_ns), 10);
  EXPECT_EQ(rate_lease::capUnits(limit, 5, interval_ns), 5);
  EXPECT_EQ(rate_lease::capUnits(Limit{1000, kSecondNs, 30}, 500, interval_ns), 50);  // the interval's
}

// Verifies that a rule refilling less than one unit per lease interval never
// leases a rate, however hot and drained the key: 10/s refills one unit per
// 100 ms interval and may; 8 an hour may not.
TEST(RateLeaseRule, ARuleRefillingLessThanAUnitPerIntervalNeverAsksForARate) {
  const int64_t interval_ns = 100'000'000;
  EXPECT_TRUE(rate_lease::wants(Limit{10, kSecondNs, 10}, 5, true, interval_ns));
  EXPECT_FALSE(rate_lease::wants(Limit{9, kSecondNs, 10}, 5, true, interval_ns));
  EXPECT_FALSE(rate_lease::wants(Limit{8, 3600 * kSecondNs, 8}, 1000, true, interval_ns));
}

// Verifies `unmet`: a node that asked and got 0 beside a holder of the whole
// limit is unmet; equal demands each holding their equal (floored) share are
// met; a node holding more than its share leaves the other unmet.
TEST(RateLeaseShare, UnmetSaysWhetherSomeRecordedDemandIsBelowItsShare) {
  const std::vector<Held> refused = {{"a", 100, 1, 100}, {"b", 0, 1, 20}};
  EXPECT_TRUE(rate_lease::unmet(refused, 100));
  const std::vector<Held> equal = {{"a", 33, 1, 300}, {"b", 33, 1, 300}, {"c", 33, 1, 300}};
  EXPECT_FALSE(rate_lease::unmet(equal, 100));
  const std::vector<Held> skewed = {{"a", 70, 1, 300}, {"b", 30, 1, 300}};
  EXPECT_TRUE(rate_lease::unmet(skewed, 100));
  const std::vector<Held> small = {{"a", 80, 1, 300}, {"b", 20, 1, 20}};
  EXPECT_FALSE(rate_lease::unmet(small, 100));
  EXPECT_FALSE(rate_lease::unmet({}, 100));
  // Short of a share within its noise: an eighth of it, under a 32nd of
  // the limit (rate_lease::pastNoise).
  const std::vector<Held> noise = {{"hot", 1'900, 1, 2'000}, {"c", 97, 1, 97}};  // share 1,903
  EXPECT_FALSE(rate_lease::unmet(noise, 2'000));
  const std::vector<Held> past = {{"hot", 1'900, 1, 2'000}, {"c", 37, 1, 37}};  // share 1,963
  EXPECT_TRUE(rate_lease::unmet(past, 2'000));
}

// Verifies the noise of a rate: a move by more than an eighth of the rate,
// or by a 32nd of the limit or more, is past it; a smaller one, or none,
// is not.
TEST(RateLeaseShare, ARateMovesPastItsNoiseByAnEighthOfItselfOrAThirtySecondOfTheLimit) {
  EXPECT_FALSE(rate_lease::pastNoise(86, 1, 2'000));   // 86/s, then 85/s
  EXPECT_FALSE(rate_lease::pastNoise(80, 10, 2'000));  // an eighth
  EXPECT_TRUE(rate_lease::pastNoise(80, 11, 2'000));
  EXPECT_FALSE(rate_lease::pastNoise(1'900, 62, 2'000));
  EXPECT_TRUE(rate_lease::pastNoise(1'900, 63, 2'000));  // 63 x 32 >= 2,000
  EXPECT_TRUE(rate_lease::pastNoise(86, 86, 2'000));     // given up
  EXPECT_TRUE(rate_lease::pastNoise(0, 1, 2'000));
  EXPECT_FALSE(rate_lease::pastNoise(0, 0, 2'000));
  EXPECT_FALSE(rate_lease::pastNoise(86, -5, 2'000));  // a rise
}

// Verifies the renewal schedule on a simulated clock (lease interval 100 ms,
// lease 5 s): a holder that heard some demand is unmet renews one lease
// interval after its call was sent, one that heard none after kMaxRenewNs,
// and never past halfway through a short lease.
TEST(RateLeaseRule, AHolderThatHearsOfUnmetDemandRenewsAtTheNextLeaseInterval) {
  const int64_t sent_ns = 7 * kSecondNs;
  const int64_t interval_ns = 100'000'000;
  EXPECT_EQ(rate_lease::renewAtNs(sent_ns, 5 * kSecondNs, true, interval_ns), sent_ns + interval_ns);
  EXPECT_EQ(rate_lease::renewAtNs(sent_ns, 5 * kSecondNs, false, interval_ns), sent_ns + rate_lease::kMaxRenewNs);
  EXPECT_EQ(rate_lease::renewAtNs(sent_ns, 120'000'000, true, interval_ns), sent_ns + 60'000'000);
  EXPECT_EQ(rate_lease::renewAtNs(sent_ns, 600'000'000, false, interval_ns), sent_ns + 300'000'000);
}

// Verifies the settling renewals on a simulated clock (lease interval
// 100 ms): a key's ask rests on its demand since its previous rate op, so
// a holder asked from a short measurement renews four times as long after
// its op (at least one interval), and only one whose previous op was a
// quarter of kMaxRenewNs or more before holds its rate kMaxRenewNs. From a
// first ask 7 ms after its previous op its renewals come 100 ms, 400 ms
// and 1.6 s apart, then every 2.5 s: three renewals more, whatever it asks.
TEST(RateLeaseRule, AnAskFromAShortMeasurementIsAskedAgainFromOneFourTimesAsLong) {
  const int64_t interval_ns = 100'000'000;
  EXPECT_EQ(rate_lease::settleNs(7'000'000, interval_ns), interval_ns);
  EXPECT_EQ(rate_lease::settleNs(105'000'000, interval_ns), 420'000'000);
  EXPECT_EQ(rate_lease::settleNs(rate_lease::kMaxRenewNs / 4 - 1, interval_ns), rate_lease::kMaxRenewNs - 4);
  EXPECT_EQ(rate_lease::settleNs(rate_lease::kMaxRenewNs / 4, interval_ns), rate_lease::kMaxRenewNs);
  EXPECT_EQ(rate_lease::settleNs(0, interval_ns), rate_lease::kMaxRenewNs);  // no previous op
  int64_t sent_ns = 10 * kSecondNs;
  int64_t gap_ns = 7'000'000;
  std::vector<int64_t> gaps;
  while (gaps.size() < 5) {
    const int64_t renew_ns = rate_lease::renewAtNs(sent_ns, 60 * kSecondNs, false, interval_ns, false,
                                                   rate_lease::settleNs(gap_ns, interval_ns));
    gap_ns = renew_ns - sent_ns;
    gaps.push_back(gap_ns);
    sent_ns = renew_ns;
  }
  EXPECT_EQ(gaps, (std::vector<int64_t>{interval_ns, 400'000'000, 1'600'000'000, rate_lease::kMaxRenewNs,
                                        rate_lease::kMaxRenewNs}));
  // A sooner reason to renew stands: unmet demand, one interval.
  EXPECT_EQ(rate_lease::renewAtNs(sent_ns, 60 * kSecondNs, true, interval_ns, false,
                                  rate_lease::settleNs(105'000'000, interval_ns)),
            sent_ns + interval_ns);
}

// Verifies which grants count as a rise of the key's rate (one unit per so
// many ns): a first rate, or a refill faster by more than an eighth of its
// ns per unit; not a little faster, the same rate, a slower one, nor none.
TEST(RateLeaseRule, ARateRisesWhenItIsNewOrRefillsFaster) {
  EXPECT_TRUE(rate_lease::rose(0, 1'000'000));
  EXPECT_TRUE(rate_lease::rose(2'000'000, 1'000'000));
  EXPECT_TRUE(rate_lease::rose(1'000'000, 874'999));
  EXPECT_FALSE(rate_lease::rose(1'000'000, 875'000));
  EXPECT_FALSE(rate_lease::rose(1'000'000, 988'000));  // 86/s, then 87/s
  EXPECT_FALSE(rate_lease::rose(1'000'000, 1'000'000));
  EXPECT_FALSE(rate_lease::rose(1'000'000, 2'000'000));
  EXPECT_FALSE(rate_lease::rose(1'000'000, 0));
}

// Verifies the start of a contended fleet on a simulated clock (2,000/s,
// three nodes, lease interval 100 ms): each node's first ask measured a
// few ms of its demand, so the first to ask with its whole demand gets
// what the others have not asked for (1,780), and hears no unmet demand.
// Its rate rose, so it renews one lease interval later, by when the others
// have asked with theirs: it drops to its max-min share, not 2.5 s later.
TEST(RateLeaseRule, TheFirstToAskItsWholeDemandHoldsMoreThanItsShareOneIntervalAtMost) {
  const int64_t limit = 2'000;
  const int64_t interval_ns = 100'000'000;
  std::vector<Held> live = {{"b", 120, 1, 120}, {"c", 100, 1, 100}};
  const int64_t big = rate_lease::grant(live, "a", 1'790, limit);
  EXPECT_EQ(big, 1'780);
  live.push_back({"a", big, 1, 1'790});
  EXPECT_FALSE(rate_lease::unmet(live, limit));
  const Limit rule{limit, kSecondNs, 20};
  const bool rose = rate_lease::rose(rate_lease::nsPerUnit(rule, 80), rate_lease::nsPerUnit(rule, big));
  EXPECT_TRUE(rose);
  const int64_t sent_ns = 16'000'000;
  EXPECT_EQ(rate_lease::renewAtNs(sent_ns, 5 * kSecondNs, false || rose, interval_ns), sent_ns + interval_ns);
  // The others ask with their whole demands meanwhile (and get little).
  live = {{"a", big, 1, 1'790}, {"b", 120, 1, 2'000}, {"c", 100, 1, 2'000}};
  EXPECT_TRUE(rate_lease::unmet(live, limit));
  EXPECT_EQ(rate_lease::grant(live, "a", 2'000, limit), 666);
}

// Verifies that a node granted nothing asks again within one lease interval
// however long Redis says the holders keep everything, and sooner when
// Redis's wait is shorter.
TEST(RateLeaseRule, ANodeGrantedNothingAsksAgainWithinOneLeaseInterval) {
  EXPECT_EQ(rate_lease::reaskAfterMs(4'500, 100), 100);
  EXPECT_EQ(rate_lease::reaskAfterMs(30, 100), 30);
  EXPECT_EQ(rate_lease::reaskAfterMs(0, 100), 1);
}

// Verifies the start of a contended fleet on a simulated clock against the
// script's maths (rate_lease::grant): eight nodes on one key of 2,000/s,
// each at 750/s from 0 and asking for its first rate 8 + i ms in (its
// bucket ran dry). Asks scaled from the measurement under way (600-900/s)
// (slice::demandPerInterval at now) hold the whole limit between them from
// the first asks on, so Redis's bucket, which no holder leases from, is
// left nothing to refill and lose; the counts alone (7 to 14 units a lease
// interval: 70-140/s) would hold a third of it until the nodes' demand is
// seen to move.
TEST(RateLeaseRule, EightNodesFirstAsksHoldTheWholeLimitFromTheStart) {
  const Rule rule = [] {
    Rule r;
    r.scope = Scope::kGlobal;
    r.algorithm = Algorithm::kTokenBucket;
    r.limits = {Limit{2'000, kSecondNs, 20}};
    return r;
  }();
  const Limit& limit = rule.limits.front();
  const int64_t interval_ns = 100'000'000;
  std::vector<Held> scaled_live, counted_live;
  int64_t scaled_sum = 0, counted_sum = 0;
  for (int i = 0; i < 8; ++i) {
    std::vector<std::atomic<uint64_t>> words(slice::kWords);
    slice::Words w{words.data(), words.size()};
    const int64_t t0 = kSecondNs;  // (a monotonic clock's 0 is no time: the measurement's "none yet")
    slice::nextBatch(w, t0, 1, rule, 8, interval_ns);
    const int64_t ask_ns = t0 + (8 + i) * 1'000'000;
    for (int64_t t = t0; t <= ask_ns; t += 4'000'000 / 3) slice::take(w, t, 1);
    const std::string node = "node" + std::to_string(i);
    const int64_t scaled = rate_lease::askedRate(limit, slice::demandPerInterval(w, ask_ns, interval_ns), interval_ns);
    // The count under way alone, unscaled (no full measurement yet).
    const auto count = static_cast<double>(words[slice::kDemand].load());
    const int64_t counted = rate_lease::askedRate(limit, count, interval_ns);
    EXPECT_GE(scaled, 600) << node;
    EXPECT_LE(scaled, 900) << node;  // 750/s, give or take the unit at 0
    EXPECT_LE(counted, 150) << node;
    const int64_t got = rate_lease::grant(scaled_live, node, scaled, limit.limit);
    scaled_live.push_back({node, got, 1, scaled});
    scaled_sum += got;
    const int64_t got_counted = rate_lease::grant(counted_live, node, counted, limit.limit);
    counted_live.push_back({node, got_counted, 1, counted});
    counted_sum += got_counted;
  }
  EXPECT_EQ(scaled_sum, limit.limit);
  EXPECT_LT(counted_sum, limit.limit / 2);
  // The nodes that got less than their share hear so, and the holders
  // give up the rest at their next renewal.
  EXPECT_TRUE(rate_lease::unmet(scaled_live, limit.limit));
}

// Verifies the quick schedule on a simulated clock (lease interval 100 ms,
// lease 5 s): a key short of its ask while demand is unmet renews, or asks
// again after being granted nothing, a quarter interval after its call,
// and never later than the schedule it would have had otherwise.
TEST(RateLeaseRule, AShortKeyAsksAgainAQuarterIntervalLater) {
  const int64_t sent_ns = 7 * kSecondNs;
  const int64_t interval_ns = 100'000'000;
  EXPECT_EQ(rate_lease::renewAtNs(sent_ns, 5 * kSecondNs, true, interval_ns, true), sent_ns + 25'000'000);
  EXPECT_EQ(rate_lease::renewAtNs(sent_ns, 5 * kSecondNs, true, interval_ns, false), sent_ns + interval_ns);
  EXPECT_EQ(rate_lease::renewAtNs(sent_ns, 40'000'000, true, interval_ns, true), sent_ns + 20'000'000);
  EXPECT_EQ(rate_lease::reaskAfterMs(4'500, 100, true), 25);
  EXPECT_EQ(rate_lease::reaskAfterMs(10, 100, true), 10);
  EXPECT_EQ(rate_lease::reaskAfterMs(4'500, 100, false), 100);
}

// Verifies the short holders' schedule (2,000/s, lease interval 100 ms,
// lease 5 s): a holder granted less than it asked renews once its ask has
// brought kShortRenewUnits units (500 ms at 2,000/s, 1.33 s at 750/s), never
// sooner than a lease interval nor later than kMaxRenewNs; one that holds
// all it asked, the whole limit, or nothing is not short.
TEST(RateLeaseRule, AHolderShortOfItsAskRenewsOnceItsDemandBroughtAThousandUnits) {
  const Limit limit{2'000, kSecondNs, 40};
  const int64_t interval_ns = 100'000'000;
  EXPECT_EQ(rate_lease::shortRenewNs(limit, 2'000, 666, interval_ns), 500'000'000);
  EXPECT_EQ(rate_lease::shortRenewNs(limit, 750, 250, interval_ns), 1'333'333'334);
  EXPECT_EQ(rate_lease::shortRenewNs({200'000, kSecondNs, 40}, 100'000, 1'000, interval_ns), interval_ns);
  EXPECT_EQ(rate_lease::shortRenewNs(limit, 300, 30, interval_ns), rate_lease::kMaxRenewNs);
  EXPECT_EQ(rate_lease::shortRenewNs(limit, 666, 666, interval_ns), 0);
  EXPECT_EQ(rate_lease::shortRenewNs(limit, 2'000, 2'000, interval_ns), 0);
  EXPECT_EQ(rate_lease::shortRenewNs(limit, 2'000, 0, interval_ns), 0);
  const int64_t sent_ns = 7 * kSecondNs;
  EXPECT_EQ(rate_lease::renewAtNs(sent_ns, 5 * kSecondNs, false, interval_ns, false, 1'333'333'334),
            sent_ns + 1'333'333'334);
  EXPECT_EQ(rate_lease::renewAtNs(sent_ns, 5 * kSecondNs, true, interval_ns, true, 1'333'333'334),
            sent_ns + 25'000'000);
  EXPECT_EQ(rate_lease::renewAtNs(sent_ns, 5 * kSecondNs, false, interval_ns, false, 0),
            sent_ns + rate_lease::kMaxRenewNs);
  EXPECT_EQ(rate_lease::renewAtNs(sent_ns, 2 * kSecondNs, false, interval_ns, false, 1'333'333'334),
            sent_ns + kSecondNs);
}

// Verifies a leave on a simulated clock (2,000/s, three nodes each asking
// 2,000/s, each holding its max-min share, lease interval 100 ms): node a
// gives its rate up at 10 s, and the word of it on the `renew` channel is
// lost. Nobody's demand was unmet, so nobody heard anything; b and c,
// short of their asks, renew on their schedules (sent at 9.93 s and
// 9.98 s, every 500 ms: 1,000 units of 2,000/s), and each takes its share
// of the freed rate at its first renewal after the leave: within 500 ms
// of it, not kMaxRenewNs later. The rates held never pass the limit.
TEST(RateLeaseRule, RateFreedByALeavingNodeReachesTheShortHoldersOnTheirScheduleWhenTheWordIsLost) {
  const Limit limit{2'000, kSecondNs, 40};
  const int64_t interval_ns = 100'000'000;
  const int64_t lease_ns = 5 * kSecondNs;
  const int64_t asked = 2'000;
  std::vector<Held> live = {{"a", 666, 1, asked}, {"b", 666, 1, asked}, {"c", 666, 1, asked}};
  EXPECT_FALSE(rate_lease::unmet(live, limit.limit));
  struct Holder {
    std::string node;
    int64_t renew_at_ns;
    int64_t rate = 666;
    int64_t rose_at_ns = 0;
  };
  const int64_t every_ns = rate_lease::shortRenewNs(limit, asked, 666, interval_ns);
  ASSERT_EQ(every_ns, 500'000'000);
  std::vector<Holder> holders = {{"b", 9'930'000'000 + every_ns}, {"c", 9'980'000'000 + every_ns}};
  const int64_t leave_ns = 10 * kSecondNs;
  std::erase_if(live, [](const Held& h) { return h.node == "a"; });  // the rate op of 0
  for (int64_t now_ns = leave_ns; now_ns < leave_ns + lease_ns; now_ns += 1'000'000) {
    for (Holder& h : holders) {
      if (now_ns < h.renew_at_ns) continue;
      std::erase_if(live, [&](const Held& e) { return e.node == h.node; });
      const int64_t got = rate_lease::grant(live, h.node, asked, limit.limit);
      live.push_back({h.node, got, 1, asked});
      int64_t sum = 0;
      for (const Held& e : live) sum += e.rate;
      EXPECT_LE(sum, limit.limit);
      if (got > h.rate && h.rose_at_ns == 0) h.rose_at_ns = now_ns;
      h.rate = got;
      const bool unmet = rate_lease::unmet(live, limit.limit);
      h.renew_at_ns = rate_lease::renewAtNs(now_ns, lease_ns, unmet, interval_ns, false,
                                            rate_lease::shortRenewNs(limit, asked, got, interval_ns));
    }
  }
  for (const Holder& h : holders) {
    EXPECT_EQ(h.rate, 1'000) << h.node;
    EXPECT_GT(h.rose_at_ns, leave_ns) << h.node;
    EXPECT_LE(h.rose_at_ns - leave_ns, every_ns) << h.node;
  }
}

}  // namespace
}  // namespace sluice

// The dispatcher (dispatch.h) on a simulated clock: requests in, decoded
// answers out, against a real KeyTable, with an in-process LeaseBroker
// (no Redis: the test plays the control thread) where leasing is involved.
#include "dispatch.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "response.h"
#include "key_table.h"
#include "lease.h"
#include "metrics.h"
#include "msgpack.h"
#include "rpc.h"
#include "rpc_front.h"
#include "rules.h"
#include "slice.h"
#include "status.h"
#include "test_status.h"
#include "worker.h"

namespace sluice {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kS = 1000 * kMs;
constexpr int64_t kStart = 5 * kS;  // the simulated clock's first reading

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
  std::vector<Rule> rules = {
      makeRule(1, "jobs", Algorithm::kConcurrency, {2, 0, 2}),
      makeRule(2, "api", Algorithm::kTokenBucket, {3, 1 * kS, 3}),
      makeRule(3, "g_jobs", Algorithm::kConcurrency, {4, 0, 4}, Scope::kGlobal),
      makeRule(4, "g_api", Algorithm::kTokenBucket, {10, 1 * kS, 10}, Scope::kGlobal),
      makeRule(6, "budget", Algorithm::kFixedWindow, {1'000'000, 60 * kS, 1'000'000}),
      makeRule(5, "wait", Algorithm::kTokenBucket, {2, 1 * kS, 2}),
  };
  rules.back().max_wait_ns = 1 * kS;
  return rules;
}

// A request's frame as a client sends it: [0, msgid, method, [rule, key, cost]].
std::string frameOf(uint32_t msgid, std::string_view method, std::string_view rule,
                    std::string_view key, int64_t cost) {
  std::string frame;
  msgpack::Writer w(&frame);
  w.writeArrayHeader(4);
  w.writeInt(0);
  w.writeUint(msgid);
  w.writeStr(method);
  w.writeArrayHeader(3);
  w.writeStr(rule);
  w.writeStr(key);
  w.writeInt(cost);
  return frame;
}

// One worker's dispatcher over its own key table; `leasing` gives it a
// broker whose breaker is closed (Redis up), as the control thread sets it.
class DispatchTest : public ::testing::Test, public Recipient {
 protected:
  explicit DispatchTest(bool leasing = false) : keys_(options()), reader_(keys_.registerReader()) {
    if (leasing) {
      broker_ = std::make_unique<LeaseBroker>(100 * kMs);
      broker_->setBreaker(Breaker::kHalfOpen, kStart);
      broker_->setBreaker(Breaker::kClosed, kStart);
    }
    dispatcher_.emplace(keys_, metrics_.shard(0), broker_.get());
    dispatcher_->setRules(std::make_shared<const RuleSet>(testRules(), 2));
    front_.emplace(*dispatcher_, keys_, metrics_.shard(0), status_, broker_.get());
  }

  // A waiting request's answer, as the connection that asked encodes it.
  void receive(MsgId tag, const Answer& answer) override {
    std::string out;
    rpc::writeAnswer(&out, tag, answer);
    delivered_.push_back(decode(out));
  }

  static KeyTableOptions options() {
    KeyTableOptions options;
    options.max_keys = 64;
    options.max_readers = 1;
    return options;
  }

  Response call(rpc::Method method, std::string_view rule, std::string_view key, int64_t cost = 1) {
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
      EXPECT_FALSE(front_->handle(request, peer, now_ns_, &out));
    }
    Response answer = decode(out);
    EXPECT_EQ(answer.msgid, msgid_);
    return answer;
  }
  // Sends an acquire as a connection does (its frame, this test as its
  // owner), so that it may wait: nullopt while it waits, its answer if it
  // is answered at once.
  std::optional<Response> send(std::string_view rule, std::string_view key, int64_t cost = 1) {
    std::string frame = frameOf(++msgid_, "acquire", rule, key, cost);
    auto bytes = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(frame.data()),
                                          frame.size());
    rpc::Request request;
    EXPECT_EQ(rpc::parseRequest(bytes, rpc::Limits{}, &request).status, rpc::ParseStatus::kOk);
    Peer peer;
    peer.allowed = true;
    std::string out;
    bool waits = false;
    {
      KeyTable::ReadGuard guard(keys_, reader_);
      waits = front_->handle(request, peer, now_ns_, &out, this);
    }
    EXPECT_EQ(waits, out.empty());
    if (waits) return std::nullopt;
    return decode(out);
  }
  // Sends an acquire_all as a connection does, so that it may wait: nullopt
  // while it waits, its answer if it is answered at once.
  std::optional<Response> sendAll(std::vector<rpc::Item> items) {
    rpc::Request request;
    request.msgid = ++msgid_;
    request.method = rpc::Method::kAcquireAll;
    request.items = std::move(items);
    Peer peer;
    peer.allowed = true;
    std::string out;
    bool waits = false;
    {
      KeyTable::ReadGuard guard(keys_, reader_);
      waits = front_->handle(request, peer, now_ns_, &out, this);
    }
    EXPECT_EQ(waits, out.empty());
    if (waits) return std::nullopt;
    return decode(out);
  }
  // What a lease reply does to a key's slice (lease_manager.cpp): `units`
  // granted, the in-flight bit cleared.
  void grant(uint32_t rule_id, std::string_view key, int64_t units) {
    KeyTable::Entry* entry = keys_.find(rule_id, key);
    ASSERT_NE(entry, nullptr);
    auto words = entry->state();
    words[slice::kUnits].fetch_add(static_cast<uint64_t>(units));
    words[slice::kFlags].fetch_or(slice::kWarm);
    words[slice::kFlags].fetch_and(~slice::kInFlight);
  }
  std::vector<LeaseRequest> sent() {
    std::vector<LeaseRequest> requests;
    broker_->takeRequests(&requests);
    return requests;
  }
  // What the worker's timer does at now_ns_ (every waiter with `all`).
  void retry(bool all = false) {
    KeyTable::ReadGuard guard(keys_, reader_);
    dispatcher_->retryDeferred(now_ns_, all);
  }
  size_t waiting(WaitKind kind) const { return dispatcher_->waiting().count(kind); }

  // acquire_all of (rule, key, cost) items, answered at once.
  Response acquireAll(std::vector<rpc::Item> items) {
    rpc::Request request;
    request.msgid = ++msgid_;
    request.method = rpc::Method::kAcquireAll;
    request.items = std::move(items);
    Peer peer;
    peer.allowed = true;
    std::string out;
    {
      KeyTable::ReadGuard guard(keys_, reader_);
      EXPECT_FALSE(front_->handle(request, peer, now_ns_, &out));
    }
    return decode(out);
  }

  Response acquire(std::string_view rule, std::string_view key, int64_t cost = 1) {
    return call(rpc::Method::kAcquire, rule, key, cost);
  }
  // reserve, settle and cancel (reservations.h), answered at once.
  Response ask(rpc::Method method, rpc::Item item) {
    rpc::Request request;
    request.msgid = ++msgid_;
    request.method = method;
    request.items.push_back(item);
    Peer peer;
    peer.allowed = true;
    std::string out;
    {
      KeyTable::ReadGuard guard(keys_, reader_);
      EXPECT_FALSE(front_->handle(request, peer, now_ns_, &out, this));
    }
    return decode(out);
  }
  Response reserve(std::string_view rule, std::string_view key, int64_t estimate,
                   int64_t ttl_ms = -1) {
    return ask(rpc::Method::kReserve, {.rule = rule, .key = key, .cost = estimate,
                                       .max_wait_ms = 0, .ttl_ms = ttl_ms});
  }
  Response settle(int64_t id, int64_t actual) {
    return ask(rpc::Method::kSettle, {.rule = {}, .key = {}, .cost = actual, .reservation = static_cast<uint64_t>(id)});
  }
  Response cancel(int64_t id) {
    return ask(rpc::Method::kCancel, {.rule = {}, .key = {}, .cost = 0, .reservation = static_cast<uint64_t>(id)});
  }
  Response peek(std::string_view rule, std::string_view key) {
    return call(rpc::Method::kPeek, rule, key, 0);
  }
  Response release(std::string_view rule, std::string_view key, int64_t cost = 1) {
    return call(rpc::Method::kRelease, rule, key, cost);
  }
  Response reset(std::string_view rule, std::string_view key) {
    return call(rpc::Method::kReset, rule, key, 0);
  }

  KeyTable keys_;
  KeyTable::ReaderId reader_;
  Metrics metrics_{1};
  TestStatus status_{metrics_};
  std::unique_ptr<LeaseBroker> broker_;
  std::optional<Dispatcher> dispatcher_;
  std::optional<RpcFront> front_;
  int64_t now_ns_ = kStart;
  uint32_t msgid_ = 0;
  std::vector<Response> delivered_;
};

class LeasingDispatchTest : public DispatchTest {
 protected:
  LeasingDispatchTest() : DispatchTest(true) {}
};

// --- release -------------------------------------------------------------------

// Verifies a release on a key that holds nothing gives nothing back and
// answers the state as peek reports it, however many units it names.
TEST_F(DispatchTest, ReleaseOnAKeyThatHoldsNothingAnswersAsPeekDoes) {
  Response peeked = peek("jobs", "idle");
  EXPECT_EQ(peeked.remaining(), 2);
  for (int64_t cost : {1, 2, 5}) {
    Response released = release("jobs", "idle", cost);
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
  Response released = release("jobs", "k", 5);
  EXPECT_TRUE(released.allowed());
  EXPECT_EQ(released.remaining(), 2);
  EXPECT_TRUE(acquire("jobs", "k", 2).allowed());
  EXPECT_FALSE(acquire("jobs", "k").allowed());
}

// Verifies a release on a rule that is not a concurrency rule is refused
// with an error naming the rule, and changes nothing.
TEST_F(DispatchTest, ReleaseOnARuleThatIsNotConcurrencyIsABadRequest) {
  ASSERT_TRUE(acquire("api", "k", 3).allowed());
  Response released = release("api", "k", 3);
  EXPECT_EQ(released.error, "BAD_REQUEST");
  EXPECT_NE(released.message.find("\"api\""), std::string::npos) << released.message;
  EXPECT_NE(released.message.find("concurrency"), std::string::npos) << released.message;
  EXPECT_EQ(peek("api", "k").remaining(), 0);
  EXPECT_EQ(release("g_api", "k").error, "BAD_REQUEST");
}

// Verifies a global concurrency rule without Redis (deciding on its share)
// answers a release on an idle key as peek does.
TEST_F(DispatchTest, ReleaseOnAnIdleGlobalKeyWithoutRedisAnswersAsPeekDoes) {
  Response peeked = peek("g_jobs", "idle");
  Response released = release("g_jobs", "idle", 9);
  EXPECT_TRUE(released.allowed());
  EXPECT_EQ(released.remaining(), peeked.remaining());
  EXPECT_EQ(released.mode(), peeked.mode());
}

// Verifies a global concurrency rule that leases answers a release on a key
// it has never seen as peek does, and one over the limit is not denied.
TEST_F(LeasingDispatchTest, ReleaseOnAnIdleLeasedKeyAnswersAsPeekDoes) {
  Response peeked = peek("g_jobs", "idle");
  Response released = release("g_jobs", "idle", 9);
  EXPECT_TRUE(released.allowed());
  EXPECT_EQ(released.remaining(), peeked.remaining());
  EXPECT_EQ(released.mode(), "normal");
}

// --- reset ---------------------------------------------------------------------

// Verifies reset of a leasing global rule while Redis is up reports the mode
// the key is decided in (normal), and asks Redis to reset it too.
TEST_F(LeasingDispatchTest, ResetOfALeasingRuleAnswersTheModeItDecidesIn) {
  Response reset_answer = reset("g_api", "k");
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

// --- acquire_all -----------------------------------------------------------------

// Verifies acquire_all spends on every item or on none: a denial of one
// item leaves the others' units where they were.
TEST_F(DispatchTest, AcquireAllSpendsOnEveryItemOrOnNone) {
  ASSERT_TRUE(acquire("api", "b", 3).allowed());
  Response denied = acquireAll({{"api", "a", 2, -1}, {"jobs", "j", 1, -1}, {"api", "b", 1, -1}});
  EXPECT_FALSE(denied.allowed());
  EXPECT_EQ(peek("api", "a").remaining(), 3);
  EXPECT_EQ(peek("jobs", "j").remaining(), 2);
  Response allowed = acquireAll({{"api", "a", 2, -1}, {"jobs", "j", 1, -1}});
  EXPECT_TRUE(allowed.allowed());
  EXPECT_EQ(peek("api", "a").remaining(), 1);
  EXPECT_EQ(peek("jobs", "j").remaining(), 1);
}

// Verifies acquire_all over a leasing rule and a local one, without a lease
// yet and unable to wait, decides the leased item by its policy and spends
// on both.
TEST_F(LeasingDispatchTest, AcquireAllWithoutALeaseDecidesByThePolicy) {
  Response answer = acquireAll({{"g_api", "k", 2, -1}, {"api", "k", 1, -1}});
  EXPECT_TRUE(answer.allowed());
  EXPECT_EQ(peek("api", "k").remaining(), 2);
  std::vector<LeaseRequest> sent;
  broker_->takeRequests(&sent);
  ASSERT_FALSE(sent.empty());
  EXPECT_EQ(sent[0].kind, LeaseRequest::Kind::kLease);
}

// Verifies an acquire_all that one item denies gives back the units its
// other item took from a leased slice, and that kept units count as spent.
TEST_F(LeasingDispatchTest, AnAcquireAllDenialGivesBackWhatItsSliceEntryTook) {
  ASSERT_FALSE(send("g_api", "k").has_value());  // a cold key waits for its lease
  grant(4, "k", 5);
  Response denied = acquireAll({{"g_api", "k", 2, -1}, {"api", "k", 4, -1}});
  EXPECT_FALSE(denied.allowed());
  EXPECT_EQ(peek("g_api", "k").remaining(), 5);
  EXPECT_EQ(metrics_.snapshot().lease_units_spent, 0u);
  Response allowed = acquireAll({{"g_api", "k", 2, -1}, {"api", "k", 1, -1}});
  EXPECT_TRUE(allowed.allowed());
  EXPECT_EQ(peek("g_api", "k").remaining(), 3);
  EXPECT_EQ(metrics_.snapshot().lease_units_spent, 2u);
}

// Verifies what a share admits in a group that another item denies is
// given back and never debited, and that a kept one is debited at once
// while Redis is up.
TEST_F(LeasingDispatchTest, AFallbackSpendIsDebitedOnlyWhenItsGroupIsAllowed) {
  Response denied = acquireAll({{"g_api", "k", 2, -1}, {"api", "k", 4, -1}});
  EXPECT_FALSE(denied.allowed());
  for (const LeaseRequest& request : sent()) EXPECT_NE(request.kind, LeaseRequest::Kind::kDebit);
  Response allowed = acquire("g_api", "k", 5);  // the whole share of 10 over 2 nodes
  EXPECT_TRUE(allowed.allowed());
  EXPECT_EQ(allowed.mode(), "fallback");
  std::vector<LeaseRequest> requests = sent();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].kind, LeaseRequest::Kind::kDebit);
  EXPECT_EQ(requests[0].n, 5);
}

// Verifies an acquire_all whose cold key waits for its lease gives back
// what its other items took meanwhile, and spends on all of them once the
// lease has come.
TEST_F(LeasingDispatchTest, AGroupWaitingForALeaseHoldsNoneOfItsUnits) {
  EXPECT_FALSE(sendAll({{"api", "k", 1, -1}, {"g_api", "cold", 2, -1}}).has_value());
  EXPECT_EQ(waiting(WaitKind::kLease), 1u);
  EXPECT_EQ(peek("api", "k").remaining(), 3);
  grant(4, "cold", 4);
  retry();
  ASSERT_EQ(delivered_.size(), 1u);
  EXPECT_TRUE(delivered_[0].allowed());
  EXPECT_EQ(peek("api", "k").remaining(), 2);
  EXPECT_EQ(peek("g_api", "cold").remaining(), 2);
}

// Verifies a group of several items never waits for units: an item of a
// rule with max_wait that has none denies the group at once, where alone
// it would wait on a reservation.
TEST_F(DispatchTest, AGroupOfSeveralItemsDoesNotWaitForUnits) {
  ASSERT_TRUE(send("wait", "k", 2)->allowed());
  std::optional<Response> group = sendAll({{"wait", "k", 1, -1}, {"api", "k", 1, -1}});
  ASSERT_TRUE(group.has_value());
  EXPECT_FALSE(group->allowed());
  EXPECT_EQ(waiting(WaitKind::kReserved), 0u);
  EXPECT_EQ(peek("api", "k").remaining(), 3);
  EXPECT_FALSE(send("wait", "k").has_value());  // alone, it waits
  EXPECT_EQ(waiting(WaitKind::kReserved), 1u);
}

// Verifies acquire_all reports a leased item's remaining as acquire does:
// the fleet's as the node can tell, its slice plus what Redis had left at
// the key's last lease answer.
TEST_F(LeasingDispatchTest, AcquireAllReportsTheFleetsRemainingOfALeasedItem) {
  ASSERT_TRUE(acquire("g_api", "k", 1).allowed());  // on the share; asks for a lease
  {
    // The lease's answer, as the control thread applies it: 4 units, 5
    // left in Redis.
    KeyTable::ReadGuard guard(keys_, reader_);
    KeyTable::Entry* entry = keys_.find(4, "k");
    ASSERT_NE(entry, nullptr);
    slice::Words words = slice::of(entry->state());
    slice::noteRedisLeft(words, testRules()[3], 5, now_ns_);
    slice::applyGrant(words, 4, 0, 0, false);
    slice::unclaim(words);
  }
  Item items[] = {{"g_api", "k", 2, -1}, {"api", "k", 1, -1}};
  Answer answer;
  KeyTable::ReadGuard guard(keys_, reader_);
  Asker asker = dispatcher_->askerFor(nullptr, 1, now_ns_);
  ASSERT_EQ(dispatcher_->ask({Method::kAcquireAll, items}, now_ns_, asker, &answer),
            Outcome::kAnswered);
  ASSERT_TRUE(answer.allowed);
  ASSERT_EQ(answer.decisions.size(), 2u);
  EXPECT_EQ(answer.modes[0], Mode::kNormal);
  EXPECT_EQ(answer.decisions[0].remaining, 2 + 5);
  EXPECT_EQ(answer.decisions[1].remaining, 2);
}

// --- waiting -------------------------------------------------------------------

// Verifies a request allowed on a reservation waits until its units are due
// and is answered then, with how long it waited.
TEST_F(DispatchTest, ARequestOnAReservationIsAnsweredWhenItsUnitsAreDue) {
  ASSERT_TRUE(send("wait", "k", 2)->allowed());
  EXPECT_FALSE(send("wait", "k").has_value());
  EXPECT_EQ(waiting(WaitKind::kReserved), 1u);
  EXPECT_EQ(dispatcher_->nextDeadlineNs(), kStart + 500 * kMs);
  now_ns_ = kStart + 499 * kMs;
  retry();
  EXPECT_TRUE(delivered_.empty());
  now_ns_ = kStart + 500 * kMs;
  retry();
  ASSERT_EQ(delivered_.size(), 1u);
  EXPECT_EQ(delivered_[0].msgid, 2u);
  EXPECT_TRUE(delivered_[0].allowed());
  EXPECT_EQ(delivered_[0].ints.at("waited_ms"), 500);
  EXPECT_FALSE(dispatcher_->hasDeferred());
}

// Verifies a worker that stops answers a reservation not yet due with the
// denial it would have had, saying when its units would have been due.
TEST_F(DispatchTest, StoppingAnswersAReservationNotYetDueWithADenial) {
  ASSERT_TRUE(send("wait", "k", 2)->allowed());
  ASSERT_FALSE(send("wait", "k").has_value());
  now_ns_ = kStart + 100 * kMs;
  retry(true);
  ASSERT_EQ(delivered_.size(), 1u);
  EXPECT_FALSE(delivered_[0].allowed());
  EXPECT_EQ(delivered_[0].ints.at("retry_after_ms"), 400);
  EXPECT_FALSE(dispatcher_->hasDeferred());
}

// Verifies the waiters of a connection that has gone are dropped unanswered.
TEST_F(DispatchTest, ForgetDropsTheWaitersOfAnOwnerThatHasGone) {
  ASSERT_TRUE(send("wait", "k", 2)->allowed());
  ASSERT_FALSE(send("wait", "k").has_value());
  dispatcher_->forget(this);
  EXPECT_FALSE(dispatcher_->hasDeferred());
  now_ns_ = kStart + 1 * kS;
  retry();
  EXPECT_TRUE(delivered_.empty());
}

// Verifies a request on a cold key of a leasing rule waits for the key's
// lease (one lease asked for), and that when none comes within
// lease_timeout its rule's on_redis_down policy answers it.
TEST_F(LeasingDispatchTest, AColdKeyWaitsForItsLeaseThenItsPolicyAnswers) {
  EXPECT_FALSE(send("g_api", "cold").has_value());
  EXPECT_EQ(waiting(WaitKind::kLease), 1u);
  std::vector<LeaseRequest> sent;
  broker_->takeRequests(&sent);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].kind, LeaseRequest::Kind::kLease);
  EXPECT_EQ(sent[0].key, "cold");
  now_ns_ = kStart + 49 * kMs;
  retry();
  EXPECT_TRUE(delivered_.empty());
  now_ns_ = kStart + 50 * kMs;  // the default lease_timeout
  retry();
  ASSERT_EQ(delivered_.size(), 1u);
  EXPECT_TRUE(delivered_[0].allowed());
  EXPECT_EQ(delivered_[0].mode(), "fallback");
  EXPECT_FALSE(dispatcher_->hasDeferred());
}

// Verifies an acquire_all naming an unknown rule after a cold global key is
// refused at once: nothing is taken, no lease is asked for, nothing waits.
TEST_F(LeasingDispatchTest, AnAcquireAllWithAnUnknownRuleIsRefusedBeforeItWaits) {
  Response answer = acquireAll({{"g_api", "cold", 1, -1}, {"nope", "cold", 1, -1}});
  EXPECT_EQ(answer.error, "UNKNOWN_RULE");
  EXPECT_FALSE(dispatcher_->hasDeferred());
  std::vector<LeaseRequest> sent;
  broker_->takeRequests(&sent);
  EXPECT_TRUE(sent.empty());
}

// --- The seam, as any front uses it ------------------------------------------

// A recipient that keeps what it receives, and on which thread.
class Kept final : public Recipient {
 public:
  void receive(MsgId tag, const Answer& answer) override {
    std::lock_guard<std::mutex> lock(mutex_);
    tags_.push_back(tag.bits);
    answers_.push_back(answer);
    threads_.push_back(std::this_thread::get_id());
    received_.notify_all();
  }
  // Waits (on a real thread: no clock to simulate) for `count` answers.
  bool waitFor(size_t count) {
    std::unique_lock<std::mutex> lock(mutex_);
    return received_.wait_for(lock, std::chrono::seconds(10),
                              [&] { return answers_.size() >= count; });
  }
  std::mutex mutex_;
  std::condition_variable received_;
  std::vector<uint64_t> tags_;
  std::vector<Answer> answers_;
  std::vector<std::thread::id> threads_;
};

// Verifies a question asked without any wire decides like the RPC front's
// request: one decision and mode per item, all or nothing, and an error is
// an answer with its code, counted.
TEST_F(DispatchTest, TheSeamAnswersAQuestionWithoutAnyWire) {
  Item items[] = {{"api", "u1", 2, -1}, {"jobs", "u1", 1, -1}};
  Answer answer;
  KeyTable::ReadGuard guard(keys_, reader_);
  Asker asker = dispatcher_->askerFor(nullptr, 1, now_ns_);
  ASSERT_EQ(dispatcher_->ask({Method::kAcquireAll, items}, now_ns_, asker, &answer),
            Outcome::kAnswered);
  EXPECT_FALSE(answer.failed);
  EXPECT_TRUE(answer.allowed);
  ASSERT_EQ(answer.decisions.size(), 2u);
  EXPECT_EQ(answer.decisions[0].remaining, 1);
  EXPECT_EQ(answer.decisions[1].remaining, 1);
  EXPECT_EQ(answer.modes[0], Mode::kLocal);

  items[0].cost = 2;  // 1 left: the pair is denied and "jobs" keeps its unit
  ASSERT_EQ(dispatcher_->ask({Method::kAcquireAll, items}, now_ns_, asker, &answer),
            Outcome::kAnswered);
  EXPECT_FALSE(answer.allowed);
  EXPECT_FALSE(answer.decisions[0].allowed);
  Item jobs = items[1];
  jobs.cost = 0;
  ASSERT_EQ(dispatcher_->ask({Method::kPeek, {&jobs, 1}}, now_ns_, asker, &answer),
            Outcome::kAnswered);
  EXPECT_EQ(answer.decisions[0].remaining, 1);

  Item unknown{"nope", "u1", 1, -1};
  ASSERT_EQ(dispatcher_->ask({Method::kAcquire, {&unknown, 1}}, now_ns_, asker, &answer),
            Outcome::kAnswered);
  EXPECT_TRUE(answer.failed);
  EXPECT_EQ(answer.error, ErrorCode::kUnknownRule);
  EXPECT_EQ(metrics_.snapshot().errors[static_cast<size_t>(ErrorCode::kUnknownRule)], 1u);
  ASSERT_EQ(dispatcher_->ask({Method::kStats, {&unknown, 1}}, now_ns_, asker, &answer),
            Outcome::kAnswered);
  EXPECT_EQ(answer.error, ErrorCode::kBadRequest) << "admin methods are not questions";
}

// Verifies a question that waits is answered later to its own recipient,
// with its tag, whichever front asked.
TEST_F(DispatchTest, AWaitingQuestionIsAnsweredToItsRecipient) {
  Kept kept;
  Item item{"wait", "u1", 2, -1};
  Answer answer;
  KeyTable::ReadGuard guard(keys_, reader_);
  Asker asker = dispatcher_->askerFor(&kept, 41, now_ns_);
  ASSERT_EQ(dispatcher_->ask({Method::kAcquire, {&item, 1}}, now_ns_, asker, &answer),
            Outcome::kAnswered);
  ASSERT_EQ(dispatcher_->ask({Method::kAcquire, {&item, 1}}, now_ns_, asker, &answer),
            Outcome::kWaitsReserved);
  now_ns_ += 1 * kS;
  dispatcher_->retryDeferred(now_ns_, false);
  ASSERT_EQ(kept.answers_.size(), 1u);
  EXPECT_EQ(kept.tags_[0], 41u);
  EXPECT_TRUE(kept.answers_[0].allowed);
  EXPECT_EQ(kept.answers_[0].waited_ms, 1000);
  EXPECT_TRUE(delivered_.empty()) << "nothing goes to another recipient";
}

// Verifies a front on a thread of its own gets its answer from the worker,
// on the worker's thread, and a stopped worker refuses at once.
TEST(WorkerTest, ASubmittedQuestionIsAnsweredOnTheWorkersThread) {
  KeyTableOptions key_options;
  key_options.max_readers = 1;
  KeyTable keys(key_options);
  Metrics metrics{1};
  TestStatus status{metrics};
  Worker worker(0, WorkerOptions{}, keys, metrics.shard(0), status,
                std::make_shared<const RuleSet>(testRules(), 2));
  worker.start();
  Kept kept;
  Item item{"api", "u1", 1, -1};
  worker.submit(HeldQuestion({Method::kAcquire, {&item, 1}}), &kept, 7);
  worker.submit(HeldQuestion({Method::kAcquire, {&item, 1}}), &kept, 8);
  ASSERT_TRUE(kept.waitFor(2));
  EXPECT_EQ(kept.tags_, (std::vector<uint64_t>{7, 8}));
  EXPECT_EQ(kept.answers_[1].decisions.at(0).remaining, 1);
  EXPECT_NE(kept.threads_[0], std::this_thread::get_id());
  worker.stop();
  worker.join();

  worker.submit(HeldQuestion({Method::kAcquire, {&item, 1}}), &kept, 9);
  ASSERT_EQ(kept.answers_.size(), 3u);
  EXPECT_EQ(kept.answers_[2].error, ErrorCode::kOverloaded);
  EXPECT_EQ(kept.threads_[2], std::this_thread::get_id());
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// --- reserve, settle, cancel -----------------------------------------------------

// Verifies that a reserve spends its estimate and answers an id, and that
// settling at a smaller actual gives back the difference.
TEST_F(DispatchTest, ASettleBelowTheEstimateRefundsTheDifference) {
  Response reserved = reserve("budget", "tenant", 800'000);
  ASSERT_EQ(reserved.error, "");
  EXPECT_TRUE(reserved.allowed());
  EXPECT_EQ(reserved.remaining(), 200'000);
  const int64_t id = reserved.ints.at("id");
  EXPECT_GT(id, 0);
  EXPECT_EQ(dispatcher_->reservations().size(), 1u);

  now_ns_ += kS;
  Response settled = settle(id, 300'000);
  ASSERT_EQ(settled.error, "");
  EXPECT_EQ(settled.ints.at("id"), id);
  EXPECT_EQ(settled.ints.at("refunded"), 500'000);
  EXPECT_EQ(settled.ints.at("debt"), 0);
  EXPECT_EQ(settled.remaining(), 700'000);
  EXPECT_EQ(peek("budget", "tenant").remaining(), 700'000);
  EXPECT_EQ(dispatcher_->reservations().size(), 0u);
}

// Verifies that an actual above the estimate is charged past the limit,
// answered as negative remaining, and denies the key until it is paid back
// (for a fixed window: until the window ends).
TEST_F(DispatchTest, ASettleAboveTheEstimateIsDebtThatDeniesUntilTheWindowEnds) {
  const int64_t id = reserve("budget", "tenant", 1'000'000).ints.at("id");
  Response settled = settle(id, 1'200'000);
  EXPECT_EQ(settled.ints.at("debt"), 200'000);
  EXPECT_EQ(settled.ints.at("refunded"), 0);
  EXPECT_EQ(settled.remaining(), -200'000);
  EXPECT_FALSE(settled.allowed());
  EXPECT_FALSE(acquire("budget", "tenant").allowed());
  EXPECT_FALSE(reserve("budget", "tenant", 1).allowed());
  now_ns_ += 60 * kS;
  EXPECT_TRUE(acquire("budget", "tenant").allowed());
}

// Verifies that a settle past the key's debt bound (by default the limit)
// charges up to it, answers the rest as unpaid, and counts both; and that
// the rule's open reservations are counted while open.
TEST_F(DispatchTest, ADebtPastTheKeysBoundIsChargedUpToItAndTheRestIsUnpaid) {
  const int64_t id = reserve("budget", "tenant", 1'000'000).ints.at("id");
  auto open = [this] {
    for (const RuleSnapshot& rule : metrics_.ruleSnapshots()) {
      if (rule.name == "budget") return rule.reservations_open;
    }
    return uint64_t{999};
  };
  EXPECT_EQ(open(), 1u);
  Response settled = settle(id, 2'500'000);
  ASSERT_EQ(settled.error, "");
  EXPECT_EQ(settled.ints.at("debt"), 1'000'000);
  EXPECT_EQ(settled.ints.at("unpaid"), 500'000);
  EXPECT_EQ(settled.remaining(), -1'000'000);
  EXPECT_EQ(open(), 0u);
  const MetricsSnapshot s = metrics_.snapshot();
  EXPECT_EQ(s.reservation_debt_units, 1'000'000u);
  EXPECT_EQ(s.reservation_unpaid_units, 500'000u);
  EXPECT_EQ(s.reservations_unpaid, 1u);
  // The next window starts afresh: the debt was owed to the last one.
  now_ns_ += 60 * kS;
  EXPECT_TRUE(acquire("budget", "tenant").allowed());
}

TEST_F(DispatchTest, ACancelGivesTheWholeEstimateBack) {
  const int64_t id = reserve("api", "k", 3).ints.at("id");
  EXPECT_FALSE(acquire("api", "k").allowed());
  Response cancelled = cancel(id);
  EXPECT_EQ(cancelled.ints.at("refunded"), 3);
  EXPECT_EQ(cancelled.remaining(), 3);
  EXPECT_TRUE(acquire("api", "k").allowed());
}

TEST_F(DispatchTest, AReservationSettlesOnceAndThenIsUnknown) {
  const int64_t id = reserve("budget", "tenant", 10).ints.at("id");
  EXPECT_EQ(settle(id, 10).error, "");
  Response again = settle(id, 10);
  EXPECT_EQ(again.error, "UNKNOWN_RESERVATION");
  EXPECT_NE(again.message.find("settled or cancelled already"), std::string::npos);
  EXPECT_EQ(cancel(id + 1000).error, "UNKNOWN_RESERVATION");
}

// Verifies that a reservation left open past its TTL settles at its
// estimate: the units stay spent and a late settle finds nothing.
TEST_F(DispatchTest, AnExpiredReservationSettlesAtItsEstimate) {
  const int64_t id = reserve("budget", "tenant", 400'000, 1000).ints.at("id");
  now_ns_ += 999 * kMs;
  EXPECT_EQ(dispatcher_->expireReservations(now_ns_), 0u);
  now_ns_ += kMs;
  EXPECT_EQ(dispatcher_->expireReservations(now_ns_), 1u);
  EXPECT_EQ(settle(id, 0).error, "UNKNOWN_RESERVATION");
  EXPECT_EQ(peek("budget", "tenant").remaining(), 600'000);
}

TEST_F(DispatchTest, ADeniedReserveOpensNoReservation) {
  Response denied = reserve("api", "k", 4);  // burst 3
  EXPECT_FALSE(denied.allowed());
  EXPECT_EQ(denied.ints.count("id"), 0u);
  EXPECT_EQ(dispatcher_->reservations().size(), 0u);
}

TEST_F(DispatchTest, ReserveOnARuleThatCannotSettleIsABadRequest) {
  Response answer = reserve("jobs", "k", 1);
  EXPECT_EQ(answer.error, "BAD_REQUEST");
  EXPECT_NE(answer.message.find("rule \"jobs\" is local concurrency"), std::string::npos);
  EXPECT_EQ(reserve("nope", "k", 1).error, "UNKNOWN_RULE");
}

// Verifies the per-key bound: beyond it a reserve is OVERLOADED and spends
// nothing, while another key still reserves.
TEST_F(DispatchTest, ReservesBeyondThePerKeyBoundAreOverloadedAndSpendNothing) {
  const size_t bound = Reservations::Bounds{}.max_per_key;
  for (size_t i = 0; i < bound; ++i) ASSERT_TRUE(reserve("budget", "hot", 1).allowed());
  Response refused = reserve("budget", "hot", 1);
  EXPECT_EQ(refused.error, "OVERLOADED");
  EXPECT_NE(refused.message.find("this key holds the most open reservations"), std::string::npos);
  EXPECT_EQ(peek("budget", "hot").remaining(), 1'000'000 - static_cast<int64_t>(bound));
  EXPECT_TRUE(reserve("budget", "cold", 1).allowed());
}

// Verifies that a settle naming a worker the dispatcher cannot reach is
// refused clearly rather than settled on the wrong table.
TEST_F(DispatchTest, ASettleOfAnUnreachableWorkersReservationSaysWhere) {
  const uint64_t elsewhere = (uint64_t{3} << 48) | 1;
  Response answer = settle(static_cast<int64_t>(elsewhere), 1);
  EXPECT_EQ(answer.error, "UNKNOWN_RESERVATION");
  EXPECT_NE(answer.message.find("settle it on the daemon that reserved it"), std::string::npos);
}

}  // namespace
}  // namespace sluice

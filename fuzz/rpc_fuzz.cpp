// rpc_fuzz: one client's byte stream through the daemon's request path, as
// daemon/connection.cpp's consume() runs it: rpc::parseRequest over whole
// frames, Dispatcher::handleParseError on a bad frame, Dispatcher::handle on
// a request (with the connection as owner, so that an acquire may wait for
// its units), and Dispatcher::retryDeferred after each frame as the worker's
// timer would run it. It runs against a real KeyTable and two small rule
// sets: local rules of every algorithm, the policies (overrides, a penalty,
// bounded waiting, pacing), and global rules of each on_redis_down policy,
// which lease from an in-process Redis (a LeaseBroker and the real
// LeaseManager on a FakeRedis that the harness answers after each frame, as
// the control thread would: grants while the key's units last, "nothing for
// 50 ms" after, and now and then a reply that is not a lease, which sends
// the key to its on_redis_down policy for a while).
// Stops where the connection would: at an unfinished frame or after a fatal
// one (the connection then closes and the dispatcher forgets its waiters).
//
// Properties checked on every frame:
//  - a request (and a bad frame with a msgid) gets exactly one well-formed
//    response [1, msgid, error, result] carrying its msgid, at once or, for
//    an acquire that waits, delivered later by retryDeferred; a
//    notification and a bad frame without a msgid get nothing, but a fatal
//    one (after which the connection closes) gets one error notification;
//  - an error is {"code": <a known code>, "message": str} with a nil result;
//  - a decision has remaining, limit, reset_after_ms and retry_after_ms in
//    range, no retry hint when allowed, and a mode its rule can have: local
//    or shadow for a local rule, normal (leased), fallback, open, closed or
//    shadow for a global one, blocked (denied, with the block's time left) for a rule
//    with a penalty; open allows and closed denies;
//  - waited_ms, when present, is within 0 and the longest wait (kMaxWaitNs),
//    and every delivered answer to a local rule's request has it (a global
//    rule's request may have waited for a lease, which its answer does not
//    tell);
//  - when the stream ends, every waiting request is answered once (or, after
//    a fatal frame, forgotten), and nothing is left deferred;
//  - msgpack::Reader::skipResumable, fed one byte at a time as a frame
//    trickles in (Connection::partialFrameReady), ends each frame exactly
//    where parseRequest did, and reports an unfinished frame as unfinished.
//
// Time: the harness's monotonic clock starts 5 s after boot, and each request
// arrives `msgid` microseconds after the frame before it, so the fuzzer moves
// time (refills, window ends, waits, blocks) through a field the daemon only
// echoes. Every input starts from a fresh daemon, so an input replays alone.
#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <spdlog/spdlog.h>

#include "config.h"
#include "dispatch.h"
#include "fake_redis.h"
#include "fuzz_check.h"
#include "key_table.h"
#include "lease.h"
#include "lease_manager.h"
#include "metrics.h"
#include "msgpack.h"
#include "rpc.h"
#include "rpc_front.h"
#include "rules.h"

namespace sluice {
namespace {

// The server's side of health, stats and reload, for one worker. reload
// answers in turn: installs the next rule set, refuses, installs, ... The new
// rules reach the worker as the server's message would, between two frames:
// takeReloaded() hands them over after the request that asked.
class FuzzStatus final : public DaemonStatus {
 public:
  FuzzStatus(const Metrics& metrics, std::vector<RuleSetPtr> rule_sets)
      : metrics_(metrics), rule_sets_(std::move(rule_sets)) {}

  int64_t uptimeMs() const override { return 1000; }
  size_t workers() const override { return 1; }
  MetricsSnapshot metrics() const override { return metrics_.snapshot(); }
  size_t connections() const override { return 1; }
  size_t handles() const override { return 0; }  // no loop here
  RedisHealth redisHealth() const override { return {}; }  // local-only
  LeaseStats leaseStats() const override { return {}; }
  std::vector<RuleSnapshot> ruleMetrics() const override { return metrics_.ruleSnapshots(); }
  HistogramSnapshot leaseLatency() const override { return {}; }
  bool reload(std::string* error) override {
    if (reloads_++ % 2 == 1) {
      *error = "fuzz.toml:1:1: refused by the fuzz harness";
      return false;
    }
    current_ = (current_ + 1) % rule_sets_.size();
    reloaded_ = true;
    return true;
  }

  RuleSetPtr current() const { return rule_sets_[current_]; }
  RuleSetPtr takeReloaded() {
    if (!reloaded_) return nullptr;
    reloaded_ = false;
    return current();
  }

 private:
  const Metrics& metrics_;
  std::vector<RuleSetPtr> rule_sets_;
  size_t current_ = 0;
  uint64_t reloads_ = 0;
  bool reloaded_ = false;
};

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kS = 1000 * kMs;
constexpr int64_t kDay = 24 * 3600 * kS;
constexpr int64_t kStartNs = 5 * kS;

// The global state of the in-process Redis: per Redis key, the units left
// (starting at the limit the call names, at most 2^20) and, for a
// concurrency rule, the units this node holds. It does not refill: a key
// that has leased everything is told "nothing for 50 ms" from then on, so
// both the grant and the negative cache are reached. A rate op gets the rate
// it asks for. Every 11th script call gets a reply that is not a lease.
class FuzzRedis {
 public:
  void answer(test::FakeRedis& link, int64_t now_ns) {
    const test::FakeRedis::Call& call = link.calls.front();
    if (!call.script) {
      link.answerString("# Server\r\nrun_id:fuzz\r\n# Replication\r\nmaster_replid:fuzz\r\n");
      return;
    }
    if (!call.argv.empty() && call.argv[0] == "claim") {
      // fleet_version.lua: the fleet runs this node's state version.
      link.answerIntegers({std::strtoll(call.argv[1].c_str(), nullptr, 10)});
      return;
    }
    if (++calls_ % 11 == 5) {
      link.answerString("not a lease");
      return;
    }
    const std::vector<std::string>& a = call.argv;
    auto num = [&](size_t i) -> int64_t {
      return i < a.size() ? std::clamp<int64_t>(std::strtoll(a[i].c_str(), nullptr, 10), 0, 1 << 20)
                          : 0;
    };
    // concurrency.lua's ARGV: {op, n, need, limit, ttl, node_id, now}; the
    // rate scripts': {op, n, need, limit, period_ms, burst, ...}.
    bool concurrency =
        a.size() == 7 && !a[5].empty() && std::isdigit(static_cast<unsigned char>(a[5][0])) == 0;
    std::string op = a.empty() ? "" : a[0];
    int64_t capacity = concurrency ? num(3) : num(5);
    auto [it, fresh] = state_.try_emplace(call.keys.empty() ? "" : call.keys.front());
    State& state = it->second;
    if (fresh) state.units = capacity;
    long long granted = 0;
    long long retry_ms = 0;
    long long rate = 0;
    if (op == "rate") {
      // token_bucket.lua's rate op: {"rate", rate, tokens, limit, ...}. The
      // rate asked is granted (at most the limit), and up to `tokens` beside
      // it as a lease of need 1 would take them.
      rate = std::min(num(1), num(3));
      if (state.units >= 1) {
        granted = std::min(num(2), state.units);
        state.units -= granted;
      } else if (rate == 0) {
        retry_ms = 50;
      }
    } else if (op == "lease") {
      if (state.units >= num(2)) {
        granted = std::min(num(1), state.units);
        state.units -= granted;
        state.held += granted;
      } else {
        retry_ms = 50;
      }
    } else if (op == "return") {
      int64_t back = concurrency ? std::min(num(1), state.held) : num(1);
      state.units = std::min(state.units + back, std::max(capacity, state.units));
      state.held -= concurrency ? back : 0;
    }
    std::vector<long long> reply = {granted, state.units, retry_ms, 0,
                                    1'700'000'000'000LL + now_ns / kMs};
    reply.push_back(concurrency ? state.held : 0);  // held, or no block
    if (op == "rate") reply.push_back(rate);
    link.answerIntegers(reply);
  }

 private:
  struct State {
    int64_t units = 0;
    int64_t held = 0;
  };
  std::map<std::string, State> state_;
  uint64_t calls_ = 0;
};

// What a worker holds; see makeDaemon(). `delivered` collects the answers
// the dispatcher delivers to requests that waited, in the order it sends
// them, until the harness checks them.
struct FuzzDaemon final : Recipient {
  explicit FuzzDaemon(const KeyTableOptions& options)
      : keys(options), reader(keys.registerReader()) {}

  // The connection's side: a waiting request's answer, encoded as it would.
  void receive(MsgId tag, const Answer& answer) override {
    std::string response;
    rpc::writeAnswer(&response, tag, answer);
    delivered.push_back(std::move(response));
  }

  // The control thread's turn: serves the broker's requests and answers
  // every call, until none is left. Called with no ReadGuard held (the lease
  // manager takes its own). True when a reply woke the worker.
  bool pump() {
    manager->onWakeup();
    while (!link.calls.empty()) {
      redis.answer(link, now_ns);
      manager->onWakeup();
    }
    bool woken = lease_news;
    lease_news = false;
    return woken;
  }

  KeyTable keys;
  KeyTable::ReaderId reader;
  Metrics metrics{1};
  int64_t now_ns = kStartNs;
  LeaseBroker broker{100 * kMs};
  test::FakeRedis link;
  FuzzRedis redis;
  std::optional<LeaseManager> manager;
  bool lease_news = false;  // the broker woke the worker
  std::optional<FuzzStatus> status;
  std::optional<Dispatcher> dispatcher;
  std::optional<RpcFront> front;
  std::vector<std::string> delivered;
};

std::vector<RuleSetPtr> makeRuleSets();

// The one place that builds the daemon under test: a key table small enough
// that eviction and the byte cap are reached, one worker's Dispatcher, the
// lease path on the in-process Redis (its breaker closed before the first
// frame), and the first of the rule sets that `reload` cycles through.
std::unique_ptr<FuzzDaemon> makeDaemon() {
  // The lease manager logs breaker changes and bad replies; millions of
  // inputs would spend their time writing them.
  static const bool quiet = (spdlog::set_level(spdlog::level::off), true);
  (void)quiet;
  KeyTableOptions options;
  options.max_keys = 32;
  options.max_bytes = 32 * 1024;  // about three keys of sl_big
  options.max_readers = 2;        // the worker's and the lease manager's
  auto daemon = std::make_unique<FuzzDaemon>(options);
  FuzzDaemon* d = daemon.get();
  daemon->status.emplace(daemon->metrics, makeRuleSets());
  LeaseContext context;
  context.keys = &daemon->keys;
  context.broker = &daemon->broker;
  context.rules = [d] { return d->status->current(); };
  context.node_id = "fuzz";
  context.now_ns = [d] { return d->now_ns; };
  daemon->manager.emplace(daemon->link, RedisConfig{}, context);
  daemon->broker.onReplies([d] { d->lease_news = true; });
  daemon->manager->onUp();
  daemon->pump();
  FUZZ_CHECK(daemon->broker.leasing(), "the in-process Redis closes the breaker");
  daemon->dispatcher.emplace(daemon->keys, daemon->metrics.shard(0), &daemon->broker);
  daemon->dispatcher->setRules(daemon->status->current());
  daemon->front.emplace(*daemon->dispatcher, daemon->keys, daemon->metrics.shard(0),
                        *daemon->status, nullptr);
  return daemon;
}

// Frame bounds within what the config allows, small enough that the fuzzer
// meets every one of them with short inputs.
rpc::Limits fuzzLimits() {
  rpc::Limits limits;
  limits.max_frame_bytes = 2048;
  limits.max_key_bytes = 128;
  limits.max_depth = 8;
  limits.max_items = 32;
  return limits;
}

Rule makeRule(uint32_t id, std::string name, Algorithm algorithm, std::vector<Limit> limits,
              bool shadow = false) {
  Rule rule;
  rule.id = id;
  rule.name = std::move(name);
  rule.algorithm = algorithm;
  rule.limits = std::move(limits);
  rule.shadow = shadow;
  return rule;
}

Rule globalRule(uint32_t id, std::string name, Algorithm algorithm, std::vector<Limit> limits,
                RedisDownPolicy on_redis_down) {
  Rule rule = makeRule(id, std::move(name), algorithm, std::move(limits));
  rule.scope = Scope::kGlobal;
  rule.on_redis_down = on_redis_down;
  return rule;
}

// Two rule sets within the config loader's bounds (rules.h, config_rules.cpp):
// local rules of every algorithm, multi-limit rules, the largest limits and
// longest periods, a shadow rule; the policies: overrides of every match,
// a penalty, bounded waiting and pacing; and global rules, shared by two
// nodes, of each on_redis_down policy, with overrides and a penalty on the
// fallback share, several limits (parts) and concurrency. The second is what
// a reload installs: one rule changed (new id), one dropped, one added, two
// ids reused with another meaning, as the loader's collision bumping may do:
// "sl" with fewer state words (the dispatcher's shape check) and "gcra_new"
// on the id of the token bucket "tb" with as many words (its state read by
// another algorithm), and "ovr" with other overrides (a new id, as the
// loader gives a rule whose overrides changed).
std::vector<RuleSetPtr> makeRuleSets() {
  using A = Algorithm;
  const Limit tb{10, 1 * kS, 20};
  const Limit gcra{5, 100 * kMs, 5};
  const Limit sw{10, 1 * kS, 10};
  const Limit sl_fast{5, 200 * kMs, 5};
  const Limit fw_max{0xFFFFFFFFLL, 366 * kDay, 0xFFFFFFFFLL};
  const Limit sw_max{(1 << 20) - 1, 1 * kMs, (1 << 20) - 1};
  auto common = [&](std::vector<Rule>* rules) {
    rules->push_back(makeRule(2, "tb_edge", A::kTokenBucket, {{1'000'000'000, 366 * kDay, 1'000'000'000}}));
    rules->push_back(makeRule(3, "gcra", A::kGcra, {gcra}));
    rules->push_back(makeRule(4, "gcra_multi", A::kGcra, {{100, 1 * kS, 100}, {1000, 60 * kS, 1000}}));
    rules->push_back(makeRule(6, "fw_edge", A::kFixedWindow, {fw_max}));
    rules->push_back(makeRule(7, "sw", A::kSlidingWindow, {sw}));
    rules->push_back(makeRule(8, "sw_edge", A::kSlidingWindow, {sw_max}));
    rules->push_back(makeRule(10, "sl_big", A::kSlidingLog, {{1000, 1 * kS, 1000}}));
    rules->push_back(makeRule(11, "conc", A::kConcurrency, {{3, 0, 3}}));
    rules->push_back(makeRule(12, "conc_timed", A::kConcurrency, {{2, 500 * kMs, 2}}));
    rules->push_back(makeRule(13, "shadow", A::kTokenBucket, {{1, 3600 * kS, 1}}, true));

    Rule wait = makeRule(16, "wait", A::kTokenBucket, {{2, 1 * kS, 2}});
    wait.max_wait_ns = 1 * kS;
    rules->push_back(std::move(wait));
    Rule paced = makeRule(17, "paced", A::kGcra, {{10, 1 * kS, 1}});
    paced.pace = true;
    paced.max_wait_ns = 500 * kMs;
    rules->push_back(std::move(paced));
    Rule pen = makeRule(18, "pen", A::kFixedWindow, {{3, 1 * kS, 3}});
    pen.penalty = Penalty{.denials = 3, .window_ns = 1 * kS, .block_ns = 2 * kS};
    rules->push_back(std::move(pen));

    Rule g_local = globalRule(20, "g_local", A::kTokenBucket, {{10, 1 * kS, 10}}, RedisDownPolicy::kLocal);
    g_local.penalty = Penalty{.denials = 2, .window_ns = 500 * kMs, .block_ns = 1 * kS};
    g_local.overrides = {{Override::Match::kPrefix, "pro:", {{40, 1 * kS, 40}}}};
    rules->push_back(std::move(g_local));
    rules->push_back(globalRule(21, "g_open", A::kFixedWindow, {{4, 1 * kS, 4}}, RedisDownPolicy::kOpen));
    rules->push_back(globalRule(22, "g_closed", A::kGcra, {{4, 1 * kS, 4}}, RedisDownPolicy::kClosed));
    rules->push_back(globalRule(23, "g_multi", A::kSlidingWindow, {{6, 1 * kS, 6}, {20, 60 * kS, 20}},
                                RedisDownPolicy::kLocal));
    rules->push_back(globalRule(24, "g_conc", A::kConcurrency, {{4, 0, 4}}, RedisDownPolicy::kLocal));
  };
  using M = Override::Match;
  std::vector<Rule> first;
  common(&first);
  first.push_back(makeRule(1, "tb", A::kTokenBucket, {tb}));
  first.push_back(makeRule(5, "fw", A::kFixedWindow, {{3, 50 * kMs, 3}}));
  first.push_back(makeRule(9, "sl", A::kSlidingLog, {sl_fast, {20, 10 * kS, 20}}));
  Rule ovr = makeRule(19, "ovr", A::kTokenBucket, {tb});
  ovr.overrides = {{M::kKey, "vip", {{50, 1 * kS, 50}}},
                   {M::kPrefix, "pro:", {{20, 1 * kS, 20}}},
                   {M::kGlob, "*:free", {{1, 1 * kS, 1}}}};
  first.push_back(std::move(ovr));
  std::vector<Rule> second;
  common(&second);
  second.push_back(makeRule(14, "tb", A::kTokenBucket, {{20, 1 * kS, 20}}));
  second.push_back(makeRule(1, "gcra_new", A::kGcra, {{7, 1 * kS, 7}}));
  second.push_back(makeRule(9, "sl", A::kSlidingLog, {sl_fast}));
  second.push_back(makeRule(15, "fw2", A::kFixedWindow, {{1, 1 * kS, 1}}));
  Rule ovr2 = makeRule(25, "ovr", A::kTokenBucket, {tb});
  ovr2.overrides = {{M::kKey, "vip", {{5, 1 * kS, 5}}}, {M::kGlob, "a?c*", {{30, 1 * kS, 30}}}};
  second.push_back(std::move(ovr2));
  constexpr uint32_t kNodes = 2;
  return {std::make_shared<const RuleSet>(std::move(first), kNodes),
          std::make_shared<const RuleSet>(std::move(second), kNodes)};
}

// --- properties ----------------------------------------------------------------

bool isKnownErrorCode(std::string_view name) {
  for (size_t i = 0; i < kErrorCodes; ++i) {
    if (name == rpc::errorCodeName(static_cast<rpc::ErrorCode>(i))) return true;
  }
  return false;
}

bool readKey(msgpack::Reader& r, std::string_view expected) {
  std::string_view key;
  return r.readStr(&key) && key == expected;
}

int64_t readIntField(msgpack::Reader& r, std::string_view name) {
  int64_t value = 0;
  FUZZ_CHECK(readKey(r, name) && r.readInt(&value), "a decision field is missing or not an int");
  return value;
}

// Whether a decision on `rule` (the rule its item named) may have `mode`;
// a null rule stands for a request that waited (bounded waiting, or a
// global rule's wait for a lease), whose rule the answer does not name.
bool modeFits(std::string_view mode, const Rule* rule) {
  if (rule == nullptr) {  // an answer delivered after a wait: for a local or a global rule
    return mode == "local" || mode == "shadow" || mode == "normal" || mode == "fallback" ||
           mode == "open" || mode == "closed" || mode == "blocked";
  }
  if (mode == "blocked") return rule->penalty.has_value() && !rule->shadow;
  if (rule->shadow) return mode == "shadow";
  if (rule->scope == Scope::kGlobal) {
    return mode == "normal" || mode == "fallback" || mode == "open" || mode == "closed";
  }
  return mode == "local";
}

// One decision map as rpc::writeDecision documents it, on `rule` (see
// modeFits); returns `allowed`. `waited` says the answer must have
// waited_ms (it was delivered after a wait).
bool checkDecision(msgpack::Reader& r, const Rule* rule, bool waited = false) {
  uint32_t entries = 0;
  FUZZ_CHECK(r.readMapHeader(&entries) && entries >= 6 && entries <= 8,
             "a decision is a map of 6 to 8 entries");
  bool allowed = false;
  FUZZ_CHECK(readKey(r, "allowed") && r.readBool(&allowed), "a decision starts with allowed");
  int64_t remaining = readIntField(r, "remaining");
  int64_t limit = readIntField(r, "limit");
  int64_t reset_after_ms = readIntField(r, "reset_after_ms");
  int64_t retry_after_ms = readIntField(r, "retry_after_ms");
  std::string_view mode;
  FUZZ_CHECK(readKey(r, "mode") && r.readStr(&mode), "a decision has a mode");
  FUZZ_CHECK(modeFits(mode, rule), "a decision's mode is one its rule can have");
  FUZZ_CHECK(remaining >= 0, "remaining is never negative");
  FUZZ_CHECK(limit >= 1, "the reported limit is a configured one");
  FUZZ_CHECK(reset_after_ms >= 0 && retry_after_ms >= 0, "durations are never negative");
  FUZZ_CHECK(!allowed || retry_after_ms == 0, "an allowed decision has no retry hint");
  FUZZ_CHECK(mode != "open" || allowed, "policy open allows");
  FUZZ_CHECK(mode != "closed" || !allowed, "policy closed denies");
  FUZZ_CHECK(mode != "blocked" || (!allowed && retry_after_ms > 0),
             "a blocked key is denied until its block ends");
  std::string_view name;
  bool has_reason = false;
  bool has_waited = false;
  for (uint32_t i = 6; i < entries; ++i) {
    FUZZ_CHECK(r.readStr(&name), "a decision's entries are named");
    if (name == "reason" && !has_reason && !has_waited) {
      std::string_view reason;
      FUZZ_CHECK(r.readStr(&reason) && reason == "cost exceeds limit", "the reason is the cost");
      FUZZ_CHECK(retry_after_ms == 0, "a cost that can never pass has no retry hint");
      has_reason = true;
    } else {
      int64_t waited_ms = -1;
      FUZZ_CHECK(name == "waited_ms" && !has_waited && r.readInt(&waited_ms) && waited_ms >= 0 &&
                     waited_ms <= kMaxWaitNs / kMs,
                 "after the reason, only waited_ms, within the longest wait");
      has_waited = true;
    }
  }
  FUZZ_CHECK(!waited || has_waited, "an answer after a wait says how long it waited");
  return allowed;
}

// The rule an item names in `rules`, if any.
const Rule* itemRule(const RuleSet& rules, const rpc::Request* request, size_t index) {
  if (request == nullptr || index >= request->items.size()) return nullptr;
  return rules.find(request->items[index].rule);
}

// A msgid as a map key: its bits and its sign.
using MsgIdKey = std::pair<uint64_t, bool>;
MsgIdKey keyOf(rpc::MsgId id) { return {id.bits, id.negative}; }

// Reads a response's [1, msgid, and returns the msgid.
MsgIdKey readResponseStart(msgpack::Reader& r) {
  uint32_t count = 0;
  int64_t type = 0;
  rpc::MsgId id;
  FUZZ_CHECK(r.readArrayHeader(&count) && count == 4, "a response is an array of 4");
  FUZZ_CHECK(r.readInt(&type) && type == 1, "a response starts with 1");
  FUZZ_CHECK(r.readAnyInt(&id.bits, &id.negative), "a response carries a msgid");
  return keyOf(id);
}

// `out` is what a fatal frame without a msgid appended: one error
// notification, [2, "error", [{"code", "message"}]].
void checkErrorNotification(std::string_view out) {
  msgpack::Reader r(reinterpret_cast<const uint8_t*>(out.data()), out.size(), out.size());
  uint32_t count = 0;
  int64_t type = 0;
  std::string_view method;
  std::string_view code;
  std::string_view message;
  FUZZ_CHECK(r.readArrayHeader(&count) && count == 3 && r.readInt(&type) && type == 2 &&
                 r.readStr(&method) && method == "error",
             "a fatal frame without a msgid is told by an error notification");
  FUZZ_CHECK(r.readArrayHeader(&count) && count == 1 && r.readMapHeader(&count) && count == 2,
             "the error notification carries one error map");
  FUZZ_CHECK(readKey(r, "code") && r.readStr(&code) && isKnownErrorCode(code),
             "the notified error has a known code");
  FUZZ_CHECK(readKey(r, "message") && r.readStr(&message) && !message.empty(),
             "the notified error has a message");
  FUZZ_CHECK(r.offset() == out.size(), "nothing follows the error notification");
}

// `out` is what one frame appended: nothing when `msgid` is unset, else one
// whole response to it. `request` is the parsed request, when there was
// one, and `rules` the rule set it was decided on.
void checkResponse(std::string_view out, std::optional<rpc::MsgId> msgid, const rpc::Request* request,
                   const RuleSet& rules) {
  if (!msgid) {
    FUZZ_CHECK(out.empty(), "no response without a msgid");
    return;
  }
  msgpack::Reader r(reinterpret_cast<const uint8_t*>(out.data()), out.size(), out.size());
  FUZZ_CHECK(readResponseStart(r) == keyOf(*msgid), "a response carries its request's msgid");
  if (r.peekType() == msgpack::Type::kMap) {
    uint32_t entries = 0;
    std::string_view code;
    std::string_view message;
    FUZZ_CHECK(r.readMapHeader(&entries) && entries == 2, "an error is a map of 2");
    FUZZ_CHECK(readKey(r, "code") && r.readStr(&code) && isKnownErrorCode(code),
               "an error has a known code");
    FUZZ_CHECK(readKey(r, "message") && r.readStr(&message), "an error has a message");
    FUZZ_CHECK(r.readNil(), "an error's result is nil");
  } else {
    FUZZ_CHECK(r.readNil(), "a response's error is nil or a map");
    rpc::Method method = request != nullptr ? request->method : rpc::Method::kUnknown;
    if (method == rpc::Method::kAcquire || method == rpc::Method::kPeek ||
        method == rpc::Method::kRelease || method == rpc::Method::kReset) {
      checkDecision(r, itemRule(rules, request, 0));
    } else if (method == rpc::Method::kAcquireAll) {
      uint32_t entries = 0;
      uint32_t results = 0;
      bool all_allowed = false;
      FUZZ_CHECK(r.readMapHeader(&entries) && entries == 2, "acquire_all answers a map of 2");
      FUZZ_CHECK(readKey(r, "allowed") && r.readBool(&all_allowed), "acquire_all has allowed");
      FUZZ_CHECK(readKey(r, "results") && r.readArrayHeader(&results), "acquire_all has results");
      FUZZ_CHECK(results == request->items.size(), "one result per item");
      for (uint32_t i = 0; i < results; ++i) {
        bool allowed = checkDecision(r, itemRule(rules, request, i));
        FUZZ_CHECK(allowed || !all_allowed, "a group allowed has every item allowed");
      }
    } else {
      FUZZ_CHECK(r.skip(msgpack::Reader::kMaxSkipDepth, UINT32_MAX), "a result is msgpack");
    }
  }
  FUZZ_CHECK(r.ok() && r.offset() == out.size(), "a frame's output is exactly one response");
}

// Requests waiting under one msgid (a client may reuse one): how many, and
// whether each was on a local rule, which waits only when bounded waiting
// lets it (so its answer says waited_ms); a global rule's request may also
// have waited for a lease, which its answer does not tell.
struct Waiters {
  uint32_t count = 0;
  bool says_waited = true;
  // An acquire_all may be refused after its wait: a reload while it waited
  // for a lease may have taken one of its rules away.
  bool may_fail = false;
};

// The answers delivered since the last call: each a decision, after a wait,
// to a request still waiting, which it takes off.
void checkDelivered(FuzzDaemon& daemon, std::map<MsgIdKey, Waiters>* waiting) {
  for (const std::string& response : daemon.delivered) {
    msgpack::Reader r(reinterpret_cast<const uint8_t*>(response.data()), response.size(),
                      response.size());
    auto it = waiting->find(readResponseStart(r));
    FUZZ_CHECK(it != waiting->end(), "a delivered answer is to a request that waits");
    bool says_waited = it->second.says_waited;
    bool may_fail = it->second.may_fail;
    if (--it->second.count == 0) waiting->erase(it);
    if (may_fail && r.peekType() == msgpack::Type::kMap) {
      uint32_t entries = 0;
      std::string_view code;
      std::string_view message;
      FUZZ_CHECK(r.readMapHeader(&entries) && entries == 2 && readKey(r, "code") &&
                     r.readStr(&code) && isKnownErrorCode(code) && readKey(r, "message") &&
                     r.readStr(&message) && r.readNil(),
                 "a delivered error is a known error with a nil result");
      FUZZ_CHECK(r.ok() && r.offset() == response.size(), "a delivery is exactly one response");
      continue;
    }
    FUZZ_CHECK(r.readNil(), "a delivered answer is no error");
    msgpack::Reader probe = r;
    uint32_t entries = 0;
    FUZZ_CHECK(probe.readMapHeader(&entries), "a delivered answer is a map");
    if (entries == 2) {
      // An acquire_all that waited for its items' leases.
      uint32_t results = 0;
      bool all_allowed = false;
      FUZZ_CHECK(r.readMapHeader(&entries) && readKey(r, "allowed") && r.readBool(&all_allowed),
                 "a delivered acquire_all has allowed");
      FUZZ_CHECK(readKey(r, "results") && r.readArrayHeader(&results) && results >= 1,
                 "a delivered acquire_all has results");
      for (uint32_t i = 0; i < results; ++i) {
        bool allowed = checkDecision(r, nullptr, false);
        FUZZ_CHECK(allowed || !all_allowed, "a group allowed has every item allowed");
      }
    } else {
      checkDecision(r, nullptr, says_waited);
    }
    FUZZ_CHECK(r.ok() && r.offset() == response.size(), "a delivery is exactly one response");
  }
  daemon.delivered.clear();
}

// Connection::partialFrameReady's walk over a frame that arrives one byte
// per read. Returns the frame's length once skipResumable says it is
// complete (or broken), or nothing when `bytes` ran out first.
std::optional<size_t> trickle(std::span<const uint8_t> bytes, const rpc::Limits& limits) {
  msgpack::SkipState state;
  for (size_t have = 1; have <= bytes.size(); ++have) {
    msgpack::Reader reader(bytes.data(), have, limits.max_frame_bytes);
    bool complete = reader.skipResumable(&state, limits.max_depth, UINT32_MAX);
    if (complete || reader.status() != msgpack::Status::kIncomplete) {
      return complete ? std::optional<size_t>(reader.offset()) : std::nullopt;
    }
  }
  return std::nullopt;
}

}  // namespace
}  // namespace sluice

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sluice;
  static const rpc::Limits limits = fuzzLimits();
  std::unique_ptr<FuzzDaemon> daemon = makeDaemon();
  Dispatcher& dispatcher = *daemon->dispatcher;
  RpcFront& front = *daemon->front;
  Recipient* connection = daemon.get();  // the recipient of every request
  const Peer peer{.pid = 1, .uid = 0, .gid = 0, .allowed = true, .admin = true};
  rpc::Request request;
  request.items.reserve(limits.max_items);
  std::string out;
  std::map<MsgIdKey, Waiters> waiting;  // msgid: requests waiting for units

  std::span<const uint8_t> bytes(data, size);
  // The worker's guard, let go while the control thread's turn runs.
  std::optional<KeyTable::ReadGuard> guard;
  guard.emplace(daemon->keys, daemon->reader);
  int64_t& now_ns = daemon->now_ns;
  size_t offset = 0;
  bool fatal = false;
  while (offset < bytes.size()) {
    std::span<const uint8_t> rest = bytes.subspan(offset);
    rpc::ParseResult result = rpc::parseRequest(rest, limits, &request);
    size_t before = out.size();
    if (result.status == rpc::ParseStatus::kIncomplete) {
      FUZZ_CHECK(!trickle(rest, limits), "an unfinished frame is not taken as complete");
      break;
    }
    if (result.status == rpc::ParseStatus::kOk) {
      now_ns += static_cast<int64_t>(request.msgid.bits & UINT32_MAX) * 1000;
      RuleSetPtr rules = daemon->status->current();
      bool waits = front.handle(request, peer, now_ns, &out, connection);
      if (waits) {
        FUZZ_CHECK((request.method == rpc::Method::kAcquire ||
                    request.method == rpc::Method::kAcquireAll) &&
                       !request.notification && out.size() == before,
                   "only an acquire (or acquire_all) that gets an answer waits, and it is not "
                   "answered yet");
        Waiters& by_msgid = waiting[keyOf(request.msgid)];
        ++by_msgid.count;
        const Rule* rule = itemRule(*rules, &request, 0);
        by_msgid.says_waited = by_msgid.says_waited && request.method == rpc::Method::kAcquire &&
                               rule != nullptr && rule->scope == Scope::kLocal;
        by_msgid.may_fail = by_msgid.may_fail || request.method == rpc::Method::kAcquireAll;
      } else {
        std::optional<rpc::MsgId> msgid;
        if (!request.notification) msgid = request.msgid;
        checkResponse(std::string_view(out).substr(before), msgid, &request, *rules);
      }
      if (RuleSetPtr reloaded = daemon->status->takeReloaded()) dispatcher.setRules(reloaded);
    } else {
      front.handleParseError(result, &out);
      std::optional<rpc::MsgId> msgid;
      if (result.has_msgid) {
        msgid = result.msgid;
        now_ns += static_cast<int64_t>(result.msgid.bits & UINT32_MAX) * 1000;
      }
      if (!msgid && result.status == rpc::ParseStatus::kFatal) {
        checkErrorNotification(std::string_view(out).substr(before));
      } else {
        checkResponse(std::string_view(out).substr(before), msgid, nullptr, *daemon->status->current());
      }
      if (result.status == rpc::ParseStatus::kFatal) {
        fatal = true;
        break;
      }
    }
    FUZZ_CHECK(result.consumed > 0 && result.consumed <= rest.size(), "a frame has a length");
    std::optional<size_t> trickled = trickle(rest.first(result.consumed), limits);
    FUZZ_CHECK(trickled == result.consumed, "a trickled frame ends where parseRequest ends it");
    offset += result.consumed;
    // The control thread serves the leases asked for; a reply wakes the
    // worker, which asks its waiters again. Then the worker's timer answers
    // the waiters whose units are due by now.
    guard.reset();
    bool woken = daemon->pump();
    guard.emplace(daemon->keys, daemon->reader);
    if (woken && dispatcher.hasDeferred()) dispatcher.retryDeferred(now_ns, /*all=*/false);
    if (dispatcher.hasDeferred() && dispatcher.nextDeadlineNs() <= now_ns) {
      dispatcher.retryDeferred(now_ns, /*all=*/false);
    }
    checkDelivered(*daemon, &waiting);
    // The connection hands its output to the socket after each read; keep
    // the buffer small so long inputs stay fast.
    if (out.size() > 64 * 1024) out.clear();
  }
  if (fatal) {
    // The connection closes after a fatal frame: its waiters are dropped.
    dispatcher.forget(connection);
  } else {
    // The worker stops: every waiter is answered at once.
    dispatcher.retryDeferred(now_ns, /*all=*/true);
    checkDelivered(*daemon, &waiting);
    FUZZ_CHECK(waiting.empty(), "every request that waited is answered");
  }
  FUZZ_CHECK(daemon->delivered.empty() && !dispatcher.hasDeferred(), "nothing is left waiting");
  return 0;
}

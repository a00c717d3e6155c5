// rpc_fuzz: one client's byte stream through the daemon's request path, as
// daemon/connection.cpp's consume() runs it: rpc::parseRequest over whole
// frames, Dispatcher::handleParseError on a bad frame, Dispatcher::handle on
// a request, against a real KeyTable and a small set of local rules of every
// algorithm. Stops where the connection would: at an unfinished frame or
// after a fatal one.
//
// Properties checked on every frame:
//  - a request (and a bad frame with a msgid) gets exactly one well-formed
//    response [1, msgid, error, result] carrying its msgid; a notification
//    and a bad frame without a msgid get nothing;
//  - an error is {"code": <a known code>, "message": str} with a nil result;
//  - a decision has remaining, limit, reset_after_ms and retry_after_ms in
//    range, no retry hint when allowed, and the mode of a local rule;
//  - msgpack::Reader::skipResumable, fed one byte at a time as a frame
//    trickles in (Connection::partialFrameReady), ends each frame exactly
//    where parseRequest did, and reports an unfinished frame as unfinished.
//
// Time: the harness's monotonic clock starts 5 s after boot, and each request
// arrives `msgid` microseconds after the frame before it, so the fuzzer moves
// time (refills, window ends) through a field the daemon only echoes.
// Every input starts from a fresh daemon, so an input replays alone.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dispatch.h"
#include "fuzz_check.h"
#include "key_table.h"
#include "metrics.h"
#include "msgpack.h"
#include "rpc.h"
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

// What a worker holds; see makeDaemon().
struct FuzzDaemon {
  explicit FuzzDaemon(const KeyTableOptions& options)
      : keys(options), reader(keys.registerReader()) {}

  KeyTable keys;
  KeyTable::ReaderId reader;
  Metrics metrics{1};
  std::optional<FuzzStatus> status;
  std::optional<Dispatcher> dispatcher;
};

std::vector<RuleSetPtr> makeRuleSets();

// The one place that builds the daemon under test: a key table small enough
// that eviction and the byte cap are reached, one worker's Dispatcher, and
// the first of the rule sets that `reload` cycles through.
std::unique_ptr<FuzzDaemon> makeDaemon() {
  KeyTableOptions options;
  options.max_keys = 32;
  options.max_bytes = 32 * 1024;  // about three keys of sl_big
  options.max_readers = 1;
  auto daemon = std::make_unique<FuzzDaemon>(options);
  daemon->status.emplace(daemon->metrics, makeRuleSets());
  daemon->dispatcher.emplace(daemon->keys, daemon->metrics.shard(0), *daemon->status);
  daemon->dispatcher->setRules(daemon->status->current());
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

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kS = 1000 * kMs;
constexpr int64_t kDay = 24 * 3600 * kS;
constexpr int64_t kStartNs = 5 * kS;

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

// Two rule sets, all local, within the config loader's bounds (rules.h,
// config.cpp): every algorithm, multi-limit rules, the largest limits and
// longest periods, a shadow rule. The second is what a reload installs: one
// rule changed (new id), one dropped, one added, and two ids reused with
// another meaning, as the loader's collision bumping may do: "sl" with fewer
// state words (the dispatcher's shape check) and "gcra_new" on the id of the
// token bucket "tb" with as many words (its state read by another algorithm).
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
  };
  std::vector<Rule> first;
  common(&first);
  first.push_back(makeRule(1, "tb", A::kTokenBucket, {tb}));
  first.push_back(makeRule(5, "fw", A::kFixedWindow, {{3, 50 * kMs, 3}}));
  first.push_back(makeRule(9, "sl", A::kSlidingLog, {sl_fast, {20, 10 * kS, 20}}));
  std::vector<Rule> second;
  common(&second);
  second.push_back(makeRule(14, "tb", A::kTokenBucket, {{20, 1 * kS, 20}}));
  second.push_back(makeRule(1, "gcra_new", A::kGcra, {{7, 1 * kS, 7}}));
  second.push_back(makeRule(9, "sl", A::kSlidingLog, {sl_fast}));
  second.push_back(makeRule(15, "fw2", A::kFixedWindow, {{1, 1 * kS, 1}}));
  return {std::make_shared<const RuleSet>(std::move(first)),
          std::make_shared<const RuleSet>(std::move(second))};
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

// One decision map as rpc::writeDecision documents it; returns `allowed`.
bool checkDecision(msgpack::Reader& r) {
  uint32_t entries = 0;
  FUZZ_CHECK(r.readMapHeader(&entries) && (entries == 6 || entries == 7),
             "a decision is a map of 6 or 7 entries");
  bool allowed = false;
  FUZZ_CHECK(readKey(r, "allowed") && r.readBool(&allowed), "a decision starts with allowed");
  int64_t remaining = readIntField(r, "remaining");
  int64_t limit = readIntField(r, "limit");
  int64_t reset_after_ms = readIntField(r, "reset_after_ms");
  int64_t retry_after_ms = readIntField(r, "retry_after_ms");
  std::string_view mode;
  FUZZ_CHECK(readKey(r, "mode") && r.readStr(&mode), "a decision has a mode");
  FUZZ_CHECK(mode == "local" || mode == "shadow", "a local rule decides in mode local or shadow");
  FUZZ_CHECK(remaining >= 0, "remaining is never negative");
  FUZZ_CHECK(limit >= 1, "the reported limit is a configured one");
  FUZZ_CHECK(reset_after_ms >= 0 && retry_after_ms >= 0, "durations are never negative");
  FUZZ_CHECK(!allowed || retry_after_ms == 0, "an allowed decision has no retry hint");
  if (entries == 7) {
    std::string_view reason;
    FUZZ_CHECK(readKey(r, "reason") && r.readStr(&reason) && reason == "cost exceeds limit",
               "the 7th entry is the reason");
    FUZZ_CHECK(retry_after_ms == 0, "a cost that can never pass has no retry hint");
  }
  return allowed;
}

// `out` is what one frame appended: nothing when `msgid` is unset, else one
// whole response to it. `request` is the parsed request, when there was one.
void checkResponse(std::string_view out, std::optional<uint32_t> msgid, const rpc::Request* request) {
  if (!msgid) {
    FUZZ_CHECK(out.empty(), "no response without a msgid");
    return;
  }
  msgpack::Reader r(reinterpret_cast<const uint8_t*>(out.data()), out.size(), out.size());
  uint32_t count = 0;
  int64_t type = 0;
  int64_t id = 0;
  FUZZ_CHECK(r.readArrayHeader(&count) && count == 4, "a response is an array of 4");
  FUZZ_CHECK(r.readInt(&type) && type == 1, "a response starts with 1");
  FUZZ_CHECK(r.readInt(&id) && id == *msgid, "a response carries its request's msgid");
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
        method == rpc::Method::kRelease) {
      checkDecision(r);
    } else if (method == rpc::Method::kAcquireAll) {
      uint32_t entries = 0;
      uint32_t results = 0;
      bool all_allowed = false;
      FUZZ_CHECK(r.readMapHeader(&entries) && entries == 2, "acquire_all answers a map of 2");
      FUZZ_CHECK(readKey(r, "allowed") && r.readBool(&all_allowed), "acquire_all has allowed");
      FUZZ_CHECK(readKey(r, "results") && r.readArrayHeader(&results), "acquire_all has results");
      FUZZ_CHECK(results == request->items.size(), "one result per item");
      for (uint32_t i = 0; i < results; ++i) {
        bool allowed = checkDecision(r);
        FUZZ_CHECK(allowed || !all_allowed, "a group allowed has every item allowed");
      }
    } else {
      FUZZ_CHECK(r.skip(msgpack::Reader::kMaxSkipDepth, UINT32_MAX), "a result is msgpack");
    }
  }
  FUZZ_CHECK(r.ok() && r.offset() == out.size(), "a frame's output is exactly one response");
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
  const Peer peer{.pid = 1, .uid = 0, .gid = 0, .allowed = true, .admin = true};
  rpc::Request request;
  request.items.reserve(limits.max_items);
  std::string out;

  std::span<const uint8_t> bytes(data, size);
  KeyTable::ReadGuard guard(daemon->keys, daemon->reader);
  int64_t now_ns = kStartNs;
  size_t offset = 0;
  while (offset < bytes.size()) {
    std::span<const uint8_t> rest = bytes.subspan(offset);
    rpc::ParseResult result = rpc::parseRequest(rest, limits, &request);
    size_t before = out.size();
    if (result.status == rpc::ParseStatus::kIncomplete) {
      FUZZ_CHECK(!trickle(rest, limits), "an unfinished frame is not taken as complete");
      break;
    }
    if (result.status == rpc::ParseStatus::kOk) {
      now_ns += int64_t{request.msgid} * 1000;
      daemon->dispatcher->handle(request, peer, now_ns, &out);
      std::optional<uint32_t> msgid;
      if (!request.notification) msgid = request.msgid;
      checkResponse(std::string_view(out).substr(before), msgid, &request);
      if (RuleSetPtr rules = daemon->status->takeReloaded()) daemon->dispatcher->setRules(rules);
    } else {
      daemon->dispatcher->handleParseError(result, &out);
      std::optional<uint32_t> msgid;
      if (result.has_msgid) {
        msgid = result.msgid;
        now_ns += int64_t{result.msgid} * 1000;
      }
      checkResponse(std::string_view(out).substr(before), msgid, nullptr);
      if (result.status == rpc::ParseStatus::kFatal) break;
    }
    FUZZ_CHECK(result.consumed > 0 && result.consumed <= rest.size(), "a frame has a length");
    std::optional<size_t> trickled = trickle(rest.first(result.consumed), limits);
    FUZZ_CHECK(trickled == result.consumed, "a trickled frame ends where parseRequest ends it");
    offset += result.consumed;
    // The connection hands its output to the socket after each read; keep
    // the buffer small so long inputs stay fast.
    if (out.size() > 64 * 1024) out.clear();
  }
  return 0;
}

// Tests for rpc::parseRequest and the response encoders. Request frames are
// built with msgpack-c's packer and responses decoded with its unpacker, so
// both directions are checked against an independent implementation.
#include "rpc.h"

#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#define MSGPACK_NO_BOOST
#include <msgpack.hpp>

namespace sluice::rpc {
namespace {

using Bytes = std::vector<uint8_t>;

// Builds a frame value by value with msgpack-c's packer.
class Frame {
 public:
  Frame() : packer_(&buffer_) {}
  Frame(const Frame& other) : packer_(&buffer_) { buffer_.write(other.buffer_.data(), other.buffer_.size()); }

  Frame& array(uint32_t count) { return packer_.pack_array(count), *this; }
  Frame& map(uint32_t count) { return packer_.pack_map(count), *this; }
  Frame& i(int64_t value) { return packer_.pack_int64(value), *this; }
  Frame& u(uint64_t value) { return packer_.pack_uint64(value), *this; }
  Frame& d(double value) { return packer_.pack_double(value), *this; }
  Frame& nil() { return packer_.pack_nil(), *this; }
  Frame& t(bool value) { return (value ? packer_.pack_true() : packer_.pack_false()), *this; }
  Frame& s(std::string_view text) {
    packer_.pack_str(static_cast<uint32_t>(text.size()));
    packer_.pack_str_body(text.data(), static_cast<uint32_t>(text.size()));
    return *this;
  }
  Frame& b(std::string_view data) {
    packer_.pack_bin(static_cast<uint32_t>(data.size()));
    packer_.pack_bin_body(data.data(), static_cast<uint32_t>(data.size()));
    return *this;
  }
  Frame& raw(std::initializer_list<uint8_t> bytes) {
    for (uint8_t byte : bytes) buffer_.write(reinterpret_cast<const char*>(&byte), 1);
    return *this;
  }
  // [0, msgid, method, <params follow>] with `params` params.
  Frame& request(uint32_t msgid, std::string_view method, uint32_t params) {
    return array(4).i(0).u(msgid).s(method).array(params);
  }

  Bytes bytes() const {
    const auto* data = reinterpret_cast<const uint8_t*>(buffer_.data());
    return Bytes(data, data + buffer_.size());
  }

 private:
  ::msgpack::sbuffer buffer_;
  ::msgpack::packer<::msgpack::sbuffer> packer_;
};

Frame f() { return Frame(); }

struct ExpectedItem {
  std::string rule;
  std::string key;
  int64_t cost;
  int64_t max_wait_ms = -1;  // -1: not given
};

struct ParseCase {
  std::string name;
  Bytes frame;
  ParseStatus status;
  Method method = Method::kUnknown;
  std::vector<ExpectedItem> items = {};
  std::optional<MsgId> msgid = std::nullopt;  // has_msgid iff set
  ErrorCode error = ErrorCode::kBadRequest;       // for kError and kFatal
  std::string message = "";                       // a substring of the message
  Limits limits = {};
  bool notification = false;
};

Limits smallLimits() {
  Limits limits;
  limits.max_items = 3;
  limits.max_key_bytes = 8;
  limits.max_depth = 6;
  limits.max_frame_bytes = 256;
  return limits;
}

// Valid requests and notifications.
std::vector<ParseCase> validCases() {
  const std::string nul_key("a\0{b}}\0", 7);  // 7 bytes: NULs and braces
  return {
      {"AcquireWithRuleAndKey", f().request(7, "acquire", 2).s("api").s("user:1").bytes(), ParseStatus::kOk,
       Method::kAcquire, {{"api", "user:1", 1}}, 7},
      {"AcquireWithCost", f().request(7, "acquire", 3).s("api").s("k").i(5).bytes(), ParseStatus::kOk,
       Method::kAcquire, {{"api", "k", 5}}, 7},
      {"AcquireWithCostZero", f().request(1, "acquire", 3).s("api").s("k").i(0).bytes(), ParseStatus::kOk,
       Method::kAcquire, {{"api", "k", 0}}, 1},
      {"AcquireWithLargestCost", f().request(1, "acquire", 3).s("api").s("k").i(1'000'000'000).bytes(),
       ParseStatus::kOk, Method::kAcquire, {{"api", "k", 1'000'000'000}}, 1},
      {"AcquireWithCostAsUint64", f().request(1, "acquire", 3).s("api").s("k").raw({0xcf, 0, 0, 0, 0, 0, 0, 0, 9}).bytes(),
       ParseStatus::kOk, Method::kAcquire, {{"api", "k", 9}}, 1},
      {"AcquireWithBinKeyHoldingNulAndBraces", f().request(2, "acquire", 2).s("api").b(nul_key).bytes(),
       ParseStatus::kOk, Method::kAcquire, {{"api", nul_key, 1}}, 2},
      {"AcquireWithStrKeyHoldingNulAndBraces", f().request(2, "acquire", 2).s("api").s(nul_key).bytes(),
       ParseStatus::kOk, Method::kAcquire, {{"api", nul_key, 1}}, 2},
      {"AcquireWithEmptyKey", f().request(2, "acquire", 2).s("api").s("").bytes(), ParseStatus::kOk,
       Method::kAcquire, {{"api", "", 1}}, 2},
      {"AcquireWithKeyOfExactlyMaxKeyBytes",
       f().request(2, "acquire", 2).s("api").s(std::string(8, 'k')).bytes(), ParseStatus::kOk, Method::kAcquire,
       {{"api", std::string(8, 'k'), 1}}, 2, ErrorCode::kBadRequest, "", smallLimits()},
      {"AcquireMapForm", f().request(3, "acquire", 1).map(3).s("rule").s("api").s("key").s("k").s("cost").i(4).bytes(),
       ParseStatus::kOk, Method::kAcquire, {{"api", "k", 4}}, 3},
      {"AcquireWithMaxWait", f().request(3, "acquire", 4).s("api").s("k").i(1).i(250).bytes(), ParseStatus::kOk,
       Method::kAcquire, {{"api", "k", 1, 250}}, 3},
      {"AcquireMapFormWithMaxWait",
       f().request(3, "acquire", 1).map(3).s("rule").s("api").s("key").s("k").s("max_wait_ms").i(60'000).bytes(),
       ParseStatus::kOk, Method::kAcquire, {{"api", "k", 1, 60'000}}, 3},
      {"AcquireMapFormWithoutCostCostsOne", f().request(3, "acquire", 1).map(2).s("key").b("k").s("rule").s("api").bytes(),
       ParseStatus::kOk, Method::kAcquire, {{"api", "k", 1}}, 3},
      {"AcquireMapFormSkipsUnknownAndNonStrNames",
       f().request(3, "acquire", 1).map(5).s("trace").array(2).map(1).s("x").d(1.5).nil()
           .s("rule").s("api").i(9).s("nine").s("key").s("k").b("hint").raw({0xd6, 1, 0, 0, 0, 0}).bytes(),
       ParseStatus::kOk, Method::kAcquire, {{"api", "k", 1}}, 3},
      {"AcquireMapFormLastRepeatWins",
       f().request(3, "acquire", 1).map(3).s("rule").s("a").s("key").s("k").s("rule").s("b").bytes(), ParseStatus::kOk,
       Method::kAcquire, {{"b", "k", 1}}, 3},
      {"MsgidZero", f().request(0, "acquire", 2).s("api").s("k").bytes(), ParseStatus::kOk, Method::kAcquire,
       {{"api", "k", 1}}, 0},
      {"MsgidLargestUint32", f().request(UINT32_MAX, "acquire", 2).s("api").s("k").bytes(), ParseStatus::kOk,
       Method::kAcquire, {{"api", "k", 1}}, UINT32_MAX},
      // Any integer is a msgid: clients that count past 2^32 without
      // wrapping, and negative ids, are answered too.
      {"MsgidAboveUint32", f().array(4).i(0).u(uint64_t{UINT32_MAX} + 1).s("acquire").array(2).s("api").s("k").bytes(),
       ParseStatus::kOk, Method::kAcquire, {{"api", "k", 1}}, uint64_t{UINT32_MAX} + 1},
      {"MsgidLargestUint64", f().array(4).i(0).u(UINT64_MAX).s("acquire").array(2).s("api").s("k").bytes(),
       ParseStatus::kOk, Method::kAcquire, {{"api", "k", 1}}, UINT64_MAX},
      {"MsgidNegative", f().array(4).i(0).i(-1).s("acquire").array(2).s("api").s("k").bytes(), ParseStatus::kOk,
       Method::kAcquire, {{"api", "k", 1}}, MsgId::ofSigned(-1)},
      {"MsgidSmallestInt64", f().array(4).i(0).i(INT64_MIN).s("acquire").array(2).s("api").s("k").bytes(),
       ParseStatus::kOk, Method::kAcquire, {{"api", "k", 1}}, MsgId::ofSigned(INT64_MIN)},
      {"PeekCostsZero", f().request(4, "peek", 2).s("api").s("k").bytes(), ParseStatus::kOk, Method::kPeek,
       {{"api", "k", 0}}, 4},
      {"PeekMapFormIgnoresCost",
       f().request(4, "peek", 1).map(3).s("rule").s("api").s("key").s("k").s("cost").i(5).bytes(), ParseStatus::kOk,
       Method::kPeek, {{"api", "k", 0}}, 4},
      {"ReleaseWithCost", f().request(5, "release", 3).s("conc").s("k").i(2).bytes(), ParseStatus::kOk,
       Method::kRelease, {{"conc", "k", 2}}, 5},
      {"ReleaseWithoutCostReleasesOne", f().request(5, "release", 2).s("conc").s("k").bytes(), ParseStatus::kOk,
       Method::kRelease, {{"conc", "k", 1}}, 5},
      {"AcquireAllMixedItemForms",
       f().request(6, "acquire_all", 1).array(3).array(3).s("a").s("k1").i(2).map(2).s("rule").s("b").s("key").b("k2")
           .array(2).s("c").s("k3").bytes(),
       ParseStatus::kOk, Method::kAcquireAll, {{"a", "k1", 2}, {"b", "k2", 1}, {"c", "k3", 1}}, 6},
      {"AcquireAllWithMaxItems",
       f().request(6, "acquire_all", 1).array(3).array(2).s("a").s("1").array(2).s("a").s("2").array(2).s("a").s("3")
           .bytes(),
       ParseStatus::kOk, Method::kAcquireAll, {{"a", "1", 1}, {"a", "2", 1}, {"a", "3", 1}}, 6,
       ErrorCode::kBadRequest, "", smallLimits()},
      {"Health", f().request(8, "health", 0).bytes(), ParseStatus::kOk, Method::kHealth, {}, 8},
      {"HealthIgnoresExtraParams", f().request(8, "health", 3).i(1).map(1).s("x").array(0).s("y").bytes(),
       ParseStatus::kOk, Method::kHealth, {}, 8},
      {"Stats", f().request(8, "stats", 0).bytes(), ParseStatus::kOk, Method::kStats, {}, 8},
      {"Rules", f().request(8, "rules", 0).bytes(), ParseStatus::kOk, Method::kRules, {}, 8},
      {"Reload", f().request(8, "reload", 0).bytes(), ParseStatus::kOk, Method::kReload, {}, 8},
      {"Reset", f().request(8, "reset", 2).s("api").s("k").bytes(), ParseStatus::kOk, Method::kReset,
       {{"api", "k", 0}}, 8},
      {"UnknownMethodParsesWithParamsSkipped",
       f().request(9, "frobnicate", 2).map(1).s("a").array(2).i(1).i(2).raw({0xc7, 2, 5, 0, 0}).bytes(),
       ParseStatus::kOk, Method::kUnknown, {}, 9},
      {"NotificationAcquire", f().array(3).i(2).s("acquire").array(2).s("api").s("k").bytes(), ParseStatus::kOk,
       Method::kAcquire, {{"api", "k", 1}}, std::nullopt, ErrorCode::kBadRequest, "", {}, true},
  };
}

// Well-formed frames of the wrong shape.
std::vector<ParseCase> frameShapeCases() {
  return {
      {"RequestOfThreeElements", f().array(3).i(0).i(7).s("acquire").bytes(), ParseStatus::kError, Method::kUnknown,
       {}, 7, ErrorCode::kBadRequest, "[0, msgid, method, params]"},
      {"RequestOfFiveElements", f().array(5).i(0).i(7).s("health").array(0).nil().bytes(), ParseStatus::kError,
       Method::kUnknown, {}, 7, ErrorCode::kBadRequest, "[0, msgid, method, params]"},
      {"RequestOfOneElement", f().array(1).i(0).bytes(), ParseStatus::kFatal, Method::kUnknown, {}, std::nullopt,
       ErrorCode::kBadRequest, "integer msgid"},
      {"EmptyArray", f().array(0).bytes(), ParseStatus::kError, Method::kUnknown, {}, std::nullopt},
      {"ResponseFrame", f().array(4).i(1).i(7).nil().nil().bytes(), ParseStatus::kError, Method::kUnknown, {},
       std::nullopt, ErrorCode::kBadRequest, "frame type"},
      {"FrameTypeThree", f().array(4).i(3).i(7).s("health").array(0).bytes(), ParseStatus::kError,
       Method::kUnknown, {}, std::nullopt, ErrorCode::kBadRequest, "frame type"},
      {"FrameTypeNegative", f().array(4).i(-1).i(7).s("health").array(0).bytes(), ParseStatus::kError,
       Method::kUnknown, {}, std::nullopt},
      {"FrameTypeStr", f().array(4).s("0").i(7).s("health").array(0).bytes(), ParseStatus::kError, Method::kUnknown,
       {}, std::nullopt},
      {"MsgidStr", f().array(4).i(0).s("7").s("health").array(0).bytes(), ParseStatus::kFatal, Method::kUnknown, {},
       std::nullopt, ErrorCode::kBadRequest, "integer msgid"},
      {"MsgidFloat", f().array(4).i(0).d(7.5).s("health").array(0).bytes(), ParseStatus::kFatal, Method::kUnknown,
       {}, std::nullopt, ErrorCode::kBadRequest, "integer msgid"},
      {"MsgidNil", f().array(4).i(0).nil().s("health").array(0).bytes(), ParseStatus::kFatal, Method::kUnknown,
       {}, std::nullopt, ErrorCode::kBadRequest, "integer msgid"},
      {"MethodInt", f().array(4).i(0).i(7).i(1).array(0).bytes(), ParseStatus::kError, Method::kUnknown, {}, 7,
       ErrorCode::kBadRequest, "method"},
      {"MethodBin", f().array(4).i(0).i(7).b("health").array(0).bytes(), ParseStatus::kError, Method::kUnknown, {}, 7,
       ErrorCode::kBadRequest, "method"},
      {"ParamsMap", f().array(4).i(0).i(7).s("health").map(0).bytes(), ParseStatus::kError, Method::kUnknown, {}, 7,
       ErrorCode::kBadRequest, "params"},
      {"ParamsNil", f().array(4).i(0).i(7).s("acquire").nil().bytes(), ParseStatus::kError, Method::kUnknown, {}, 7,
       ErrorCode::kBadRequest, "params"},
      {"TopLevelInt", f().i(5).bytes(), ParseStatus::kError, Method::kUnknown, {}, std::nullopt,
       ErrorCode::kBadRequest, "array"},
      {"TopLevelMap", f().map(1).s("a").array(1).i(1).bytes(), ParseStatus::kError, Method::kUnknown, {},
       std::nullopt, ErrorCode::kBadRequest, "array"},
      {"NotificationWithMsgid", f().array(4).i(2).i(7).s("acquire").array(0).bytes(), ParseStatus::kError,
       Method::kUnknown, {}, std::nullopt},
      {"NotificationMethodInt", f().array(3).i(2).i(5).array(0).bytes(), ParseStatus::kError, Method::kUnknown, {},
       std::nullopt, ErrorCode::kBadRequest, "method"},
      {"NotificationBadParams", f().array(3).i(2).s("acquire").array(1).i(1).bytes(), ParseStatus::kError,
       Method::kAcquire, {}, std::nullopt, ErrorCode::kBadRequest, "acquire params"},
  };
}

// Bad params of acquire, peek, release (and health).
std::vector<ParseCase> singleItemCases() {
  const std::string long_key(9, 'k');  // smallLimits().max_key_bytes + 1
  return {
      {"AcquireNoParams", f().request(7, "acquire", 0).bytes(), ParseStatus::kError, Method::kAcquire, {}, 7,
       ErrorCode::kBadRequest, "acquire params must be [rule, key, cost, max_wait_ms]"},
      {"AcquireRuleOnly", f().request(7, "acquire", 1).s("api").bytes(), ParseStatus::kError, Method::kAcquire, {}, 7,
       ErrorCode::kBadRequest, "acquire params"},
      {"AcquireFiveParams", f().request(7, "acquire", 5).s("api").s("k").i(1).i(2).i(3).bytes(), ParseStatus::kError,
       Method::kAcquire, {}, 7, ErrorCode::kBadRequest, "acquire params"},
      {"AcquireMaxWaitTooLong", f().request(7, "acquire", 4).s("api").s("k").i(1).i(60'001).bytes(),
       ParseStatus::kError, Method::kAcquire, {}, 7, ErrorCode::kBadRequest, "max_wait_ms must be an integer 0..60000"},
      {"AcquireMaxWaitNegative",
       f().request(7, "acquire", 1).map(3).s("rule").s("api").s("key").s("k").s("max_wait_ms").i(-1).bytes(),
       ParseStatus::kError, Method::kAcquire, {}, 7, ErrorCode::kBadRequest, "max_wait_ms"},
      {"AcquireRuleInt", f().request(7, "acquire", 2).i(1).s("k").bytes(), ParseStatus::kError, Method::kAcquire, {},
       7, ErrorCode::kBadRequest, "rule"},
      {"AcquireRuleBin", f().request(7, "acquire", 2).b("api").s("k").bytes(), ParseStatus::kError, Method::kAcquire,
       {}, 7, ErrorCode::kBadRequest, "rule"},
      {"AcquireKeyInt", f().request(7, "acquire", 2).s("api").i(1).bytes(), ParseStatus::kError, Method::kAcquire, {},
       7, ErrorCode::kBadRequest, "key"},
      {"AcquireKeyNil", f().request(7, "acquire", 2).s("api").nil().bytes(), ParseStatus::kError, Method::kAcquire,
       {}, 7, ErrorCode::kBadRequest, "key"},
      {"AcquireKeyTooLong", f().request(7, "acquire", 2).s("api").s(long_key).bytes(), ParseStatus::kError,
       Method::kAcquire, {}, 7, ErrorCode::kTooLarge, "max_key_bytes", smallLimits()},
      {"AcquireBinKeyTooLong", f().request(7, "acquire", 2).s("api").b(long_key).bytes(), ParseStatus::kError,
       Method::kAcquire, {}, 7, ErrorCode::kTooLarge, "max_key_bytes", smallLimits()},
      {"AcquireCostNegative", f().request(7, "acquire", 3).s("api").s("k").i(-1).bytes(), ParseStatus::kError,
       Method::kAcquire, {}, 7, ErrorCode::kBadRequest, "cost"},
      {"AcquireCostAboveBillion", f().request(7, "acquire", 3).s("api").s("k").i(1'000'000'001).bytes(),
       ParseStatus::kError, Method::kAcquire, {}, 7, ErrorCode::kBadRequest, "cost"},
      {"AcquireCostAboveInt64", f().request(7, "acquire", 3).s("api").s("k").u(UINT64_MAX).bytes(),
       ParseStatus::kError, Method::kAcquire, {}, 7, ErrorCode::kBadRequest, "cost"},
      {"AcquireCostInt64Min", f().request(7, "acquire", 3).s("api").s("k").i(INT64_MIN).bytes(), ParseStatus::kError,
       Method::kAcquire, {}, 7, ErrorCode::kBadRequest, "cost"},
      {"AcquireCostFloat",  // 1.0 as float64 (msgpack-c would pack it as an int)
       f().request(7, "acquire", 3).s("api").s("k").raw({0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0}).bytes(), ParseStatus::kError,
       Method::kAcquire, {}, 7, ErrorCode::kBadRequest, "cost"},
      {"AcquireCostStr", f().request(7, "acquire", 3).s("api").s("k").s("1").bytes(), ParseStatus::kError,
       Method::kAcquire, {}, 7, ErrorCode::kBadRequest, "cost"},
      {"AcquireCostNil", f().request(7, "acquire", 3).s("api").s("k").nil().bytes(), ParseStatus::kError,
       Method::kAcquire, {}, 7, ErrorCode::kBadRequest, "cost"},
      {"AcquireOneParamNotAMap", f().request(7, "acquire", 1).array(2).s("api").s("k").bytes(), ParseStatus::kError,
       Method::kAcquire, {}, 7, ErrorCode::kBadRequest, "acquire params"},
      {"AcquireMapWithoutKey", f().request(7, "acquire", 1).map(1).s("rule").s("api").bytes(), ParseStatus::kError,
       Method::kAcquire, {}, 7, ErrorCode::kBadRequest, "\"rule\" and \"key\""},
      {"AcquireMapWithoutRule", f().request(7, "acquire", 1).map(1).s("key").s("k").bytes(), ParseStatus::kError,
       Method::kAcquire, {}, 7, ErrorCode::kBadRequest, "\"rule\" and \"key\""},
      {"AcquireMapWithBadCost", f().request(7, "acquire", 1).map(3).s("rule").s("a").s("key").s("k").s("cost").i(-5)
                                    .bytes(),
       ParseStatus::kError, Method::kAcquire, {}, 7, ErrorCode::kBadRequest, "cost"},
      {"AcquireMapWithKeyTooLong", f().request(7, "acquire", 1).map(2).s("rule").s("a").s("key").s(long_key).bytes(),
       ParseStatus::kError, Method::kAcquire, {}, 7, ErrorCode::kTooLarge, "max_key_bytes", smallLimits()},
      {"AcquireMapOverMaxItems",
       f().request(7, "acquire", 1).map(4).s("rule").s("a").s("key").s("k").s("x").i(1).s("y").i(2).bytes(),
       ParseStatus::kError, Method::kAcquire, {}, 7, ErrorCode::kTooLarge, "max_items", smallLimits()},
      {"AcquireMapUnknownValueOverMaxItems",
       f().request(7, "acquire", 1).map(3).s("rule").s("a").s("key").s("k").s("x").array(4).i(1).i(2).i(3).i(4).bytes(),
       ParseStatus::kError, Method::kAcquire, {}, 7, ErrorCode::kTooLarge, "max_items", smallLimits()},
      {"PeekWithCost", f().request(7, "peek", 3).s("api").s("k").i(1).bytes(), ParseStatus::kError, Method::kPeek, {},
       7, ErrorCode::kBadRequest, "peek params must be [rule, key]"},
      {"ResetWithCost", f().request(7, "reset", 3).s("api").s("k").i(1).bytes(), ParseStatus::kError,
       Method::kReset, {}, 7, ErrorCode::kBadRequest, "reset params must be [rule, key]"},
      {"ReleaseFourParams", f().request(7, "release", 4).s("c").s("k").i(1).i(1).bytes(), ParseStatus::kError,
       Method::kRelease, {}, 7, ErrorCode::kBadRequest, "release params"},
      {"HealthParamsOverMaxItems", f().request(7, "health", 4).i(1).i(2).i(3).i(4).bytes(), ParseStatus::kError,
       Method::kHealth, {}, 7, ErrorCode::kTooLarge, "max_items", smallLimits()},
  };
}

// Bad params of acquire_all.
std::vector<ParseCase> acquireAllCases() {
  const std::string long_key(9, 'k');
  return {
      {"AcquireAllNoParams", f().request(7, "acquire_all", 0).bytes(), ParseStatus::kError, Method::kAcquireAll, {},
       7, ErrorCode::kBadRequest, "acquire_all params"},
      {"AcquireAllFlatItem", f().request(7, "acquire_all", 3).s("a").s("k").i(1).bytes(), ParseStatus::kError,
       Method::kAcquireAll, {}, 7, ErrorCode::kBadRequest, "acquire_all params"},
      {"AcquireAllItemListNotArray", f().request(7, "acquire_all", 1).map(0).bytes(), ParseStatus::kError,
       Method::kAcquireAll, {}, 7, ErrorCode::kBadRequest, "acquire_all params"},
      {"AcquireAllEmpty", f().request(7, "acquire_all", 1).array(0).bytes(), ParseStatus::kError, Method::kAcquireAll,
       {}, 7, ErrorCode::kBadRequest, "at least one item"},
      {"AcquireAllTooManyItems",
       f().request(7, "acquire_all", 1).array(4).array(2).s("a").s("1").array(2).s("a").s("2").array(2).s("a").s("3")
           .array(2).s("a").s("4").bytes(),
       ParseStatus::kError, Method::kAcquireAll, {}, 7, ErrorCode::kTooLarge, "max_items", smallLimits()},
      {"AcquireAllItemInt", f().request(7, "acquire_all", 1).array(2).array(2).s("a").s("k").i(5).bytes(),
       ParseStatus::kError, Method::kAcquireAll, {}, 7, ErrorCode::kBadRequest, "acquire_all items"},
      {"AcquireAllItemRuleOnly", f().request(7, "acquire_all", 1).array(1).array(1).s("a").bytes(),
       ParseStatus::kError, Method::kAcquireAll, {}, 7, ErrorCode::kBadRequest, "acquire_all items"},
      {"AcquireAllItemBadCost", f().request(7, "acquire_all", 1).array(1).array(3).s("a").s("k").i(-1).bytes(),
       ParseStatus::kError, Method::kAcquireAll, {}, 7, ErrorCode::kBadRequest, "cost"},
      {"AcquireAllItemMapWithoutKey", f().request(7, "acquire_all", 1).array(1).map(1).s("rule").s("a").bytes(),
       ParseStatus::kError, Method::kAcquireAll, {}, 7, ErrorCode::kBadRequest, "\"rule\" and \"key\""},
      {"AcquireAllItemKeyTooLong", f().request(7, "acquire_all", 1).array(1).array(2).s("a").s(long_key).bytes(),
       ParseStatus::kError, Method::kAcquireAll, {}, 7, ErrorCode::kTooLarge, "max_key_bytes", smallLimits()},
  };
}

// Frames the stream cannot get past.
std::vector<ParseCase> fatalCases() {
  std::vector<ParseCase> cases = {
      {"ByteC1AtTopLevel", f().raw({0xc1}).bytes(), ParseStatus::kFatal, Method::kUnknown, {}, std::nullopt,
       ErrorCode::kBadRequest, "not MessagePack"},
      {"ByteC1InParams", f().request(7, "health", 1).raw({0xc1}).bytes(), ParseStatus::kFatal, Method::kHealth, {}, 7,
       ErrorCode::kBadRequest, "not MessagePack"},
      {"ByteC1AsCost", f().request(7, "acquire", 3).s("a").s("k").raw({0xc1}).bytes(), ParseStatus::kFatal,
       Method::kAcquire, {}, 7, ErrorCode::kBadRequest, "not MessagePack"},
      {"ByteC1InsideAResponseFrame", f().array(4).i(1).i(7).raw({0xc1}).nil().bytes(), ParseStatus::kFatal,
       Method::kUnknown, {}, std::nullopt, ErrorCode::kBadRequest, "not MessagePack"},
      {"DeclaredKeyOfFourGib", f().request(7, "acquire", 2).s("a").raw({0xdb, 0xff, 0xff, 0xff, 0xff}).bytes(),
       ParseStatus::kFatal, Method::kAcquire, {}, 7, ErrorCode::kTooLarge, "max_frame_bytes"},
      {"DeclaredFrameOfFourGiElements", f().raw({0xdd, 0xff, 0xff, 0xff, 0xff}).bytes(), ParseStatus::kFatal,
       Method::kUnknown, {}, std::nullopt, ErrorCode::kTooLarge, "max_frame_bytes"},
      {"DeclaredParamsOfFourGiElements", f().array(4).i(0).i(7).s("health").raw({0xdd, 0xff, 0xff, 0xff, 0xff}).bytes(),
       ParseStatus::kFatal, Method::kHealth, {}, 7, ErrorCode::kTooLarge, "max_frame_bytes"},
      {"FrameLargerThanMaxFrameBytes", f().request(7, "health", 1).s(std::string(300, 'x')).bytes(),
       ParseStatus::kFatal, Method::kHealth, {}, 7, ErrorCode::kTooLarge, "max_frame_bytes", smallLimits()},
      {"NestingDeeperThanMaxDepthInParams",
       f().request(7, "health", 1).array(1).array(1).array(1).array(1).array(1).nil().bytes(), ParseStatus::kFatal,
       Method::kHealth, {}, 7, ErrorCode::kBadRequest, "max_depth", smallLimits()},
      {"NestingDeeperThanMaxDepthInAnItemMap",
       f().request(7, "acquire", 1).map(3).s("rule").s("a").s("key").s("k").s("x").array(1).array(1).array(1).array(1)
           .i(1).bytes(),
       ParseStatus::kFatal, Method::kAcquire, {}, 7, ErrorCode::kBadRequest, "max_depth", smallLimits()},
  };
  // Nesting of exactly max_depth is fine: frame 1, params 2, then 4 more.
  cases.push_back({"NestingOfExactlyMaxDepth",
                   f().request(7, "health", 1).array(1).array(1).array(1).array(0).bytes(), ParseStatus::kOk,
                   Method::kHealth, {}, 7, ErrorCode::kBadRequest, "", smallLimits()});
  // 100,000-deep nesting: refused after a few bytes, no recursion.
  Frame deep = f().request(7, "health", 1);
  for (int i = 0; i < 100'000; ++i) deep.array(1);
  deep.nil();
  cases.push_back({"HundredThousandDeepNesting", deep.bytes(), ParseStatus::kFatal, Method::kHealth, {}, 7,
                   ErrorCode::kBadRequest, "max_depth"});
  return cases;
}

std::vector<ParseCase> parseCases() {
  std::vector<ParseCase> cases;
  for (auto* group : {validCases, frameShapeCases, singleItemCases, acquireAllCases, fatalCases}) {
    for (ParseCase& c : group()) cases.push_back(std::move(c));
  }
  return cases;
}

void PrintTo(const ParseCase& c, std::ostream* os) { *os << c.name; }

class ParseRequestTest : public testing::TestWithParam<ParseCase> {};

// Verifies one parse case: status, method, items, msgid, error code and
// message, and that kOk and kError consume exactly the frame.
TEST_P(ParseRequestTest, ParsesAsExpected) {
  const ParseCase& c = GetParam();
  Request request;
  const ParseResult result = parseRequest(c.frame, c.limits, &request);
  ASSERT_EQ(result.status, c.status) << result.message;
  EXPECT_EQ(result.has_msgid, c.msgid.has_value());
  if (c.msgid) {
    EXPECT_EQ(result.msgid, *c.msgid);
  }
  if (c.status == ParseStatus::kOk) {
    EXPECT_EQ(result.consumed, c.frame.size());
    EXPECT_EQ(request.method, c.method);
    EXPECT_EQ(request.notification, c.notification);
    EXPECT_EQ(request.msgid, c.msgid.value_or(MsgId()));
    ASSERT_EQ(request.items.size(), c.items.size());
    for (size_t i = 0; i < c.items.size(); ++i) {
      EXPECT_EQ(request.items[i].rule, c.items[i].rule) << i;
      EXPECT_EQ(request.items[i].key, c.items[i].key) << i;
      EXPECT_EQ(request.items[i].cost, c.items[i].cost) << i;
      EXPECT_EQ(request.items[i].max_wait_ms, c.items[i].max_wait_ms) << i;
    }
  } else {
    if (c.status == ParseStatus::kError) {
      EXPECT_EQ(result.consumed, c.frame.size());
    }
    EXPECT_EQ(result.error, c.error) << result.message;
    EXPECT_NE(result.message, "");
    EXPECT_NE(result.message.find(c.message), std::string_view::npos) << result.message;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, ParseRequestTest, testing::ValuesIn(parseCases()),
                         [](const testing::TestParamInfo<ParseCase>& info) { return info.param.name; });

// Verifies that every split of a frame that parses kOk or kError is
// kIncomplete, consuming nothing, until its last byte arrives (each prefix is
// its own allocation so ASan sees any over-read).
TEST(ParseRequestSplitTest, EveryPrefixOfACompleteFrameIsIncomplete) {
  for (const ParseCase& c : parseCases()) {
    if (c.status == ParseStatus::kFatal || c.frame.size() > 1000) continue;
    for (size_t length = 0; length < c.frame.size(); ++length) {
      const Bytes prefix(c.frame.begin(), c.frame.begin() + static_cast<std::ptrdiff_t>(length));
      Request request;
      const ParseResult result = parseRequest(prefix, c.limits, &request);
      EXPECT_EQ(result.status, ParseStatus::kIncomplete) << c.name << " cut at " << length;
      EXPECT_EQ(result.consumed, 0u);
    }
  }
}

// Verifies that corrupting any one byte of any valid frame, with values that
// change lengths, types and nesting, never crashes or over-reads (ASan) and
// always gives a coherent result: kOk and kError consume within the buffer.
TEST(ParseRequestSplitTest, EveryOneByteCorruptionGivesACoherentResult) {
  const uint8_t replacements[] = {0x00, 0x7f, 0x80, 0x8f, 0x91, 0x9f, 0xbf, 0xc0, 0xc1, 0xc4,
                                  0xc9, 0xcf, 0xd3, 0xd8, 0xdb, 0xdd, 0xdf, 0xe0, 0xff};
  Request request;
  for (const ParseCase& c : validCases()) {
    for (size_t at = 0; at < c.frame.size(); ++at) {
      for (uint8_t byte : replacements) {
        Bytes corrupt = c.frame;
        corrupt[at] = byte;
        const ParseResult result = parseRequest(corrupt, c.limits, &request);
        if (result.status == ParseStatus::kOk || result.status == ParseStatus::kError) {
          EXPECT_GT(result.consumed, 0u) << c.name << " at " << at;
          EXPECT_LE(result.consumed, corrupt.size()) << c.name << " at " << at;
        } else {
          EXPECT_EQ(result.consumed, 0u) << c.name << " at " << at;
        }
        if (result.status == ParseStatus::kOk) {
          for (const Item& item : request.items) EXPECT_LE(item.key.size(), c.limits.max_key_bytes);
        }
      }
    }
  }
}

// Verifies that a buffer holding max_frame_bytes without a complete frame is
// fatal even though each value so far is within bounds.
TEST(ParseRequestSplitTest, MaxFrameBytesWithoutACompleteFrameIsFatal) {
  Limits limits = smallLimits();
  limits.max_items = 100;
  Frame frame = f().request(3, "health", 50);
  for (int i = 0; i < 50; ++i) frame.s("0123456789");
  const Bytes bytes = frame.bytes();
  ASSERT_GT(bytes.size(), limits.max_frame_bytes);
  for (size_t length : {limits.max_frame_bytes, bytes.size()}) {
    const Bytes prefix(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(length));
    Request request;
    const ParseResult result = parseRequest(prefix, limits, &request);
    EXPECT_EQ(result.status, ParseStatus::kFatal) << length;
    EXPECT_EQ(result.error, ErrorCode::kTooLarge);
    EXPECT_TRUE(result.has_msgid);
    EXPECT_EQ(result.msgid, 3u);
  }
  const Bytes short_prefix(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(limits.max_frame_bytes - 1));
  Request request;
  EXPECT_EQ(parseRequest(short_prefix, limits, &request).status, ParseStatus::kIncomplete);
}

// Verifies that frames back to back in one buffer parse one at a time, each
// consuming exactly its own bytes, a bad frame included.
TEST(ParseRequestStreamTest, BackToBackFramesConsumeExactly) {
  const Bytes first = f().request(1, "acquire", 3).s("api").s("a").i(2).bytes();
  const Bytes bad = f().request(2, "acquire", 0).bytes();
  const Bytes third = f().array(3).i(2).s("peek").array(2).s("api").s("c").bytes();
  Bytes stream = first;
  stream.insert(stream.end(), bad.begin(), bad.end());
  stream.insert(stream.end(), third.begin(), third.end());

  Request request;
  std::span<const uint8_t> rest(stream);
  ParseResult result = parseRequest(rest, Limits{}, &request);
  ASSERT_EQ(result.status, ParseStatus::kOk);
  EXPECT_EQ(result.consumed, first.size());
  EXPECT_EQ(request.items.at(0).key, "a");
  rest = rest.subspan(result.consumed);

  result = parseRequest(rest, Limits{}, &request);
  ASSERT_EQ(result.status, ParseStatus::kError);
  EXPECT_EQ(result.consumed, bad.size());
  EXPECT_EQ(result.msgid, 2u);
  rest = rest.subspan(result.consumed);

  result = parseRequest(rest, Limits{}, &request);
  ASSERT_EQ(result.status, ParseStatus::kOk);
  EXPECT_EQ(result.consumed, third.size());
  EXPECT_TRUE(request.notification);
  EXPECT_EQ(request.method, Method::kPeek);
  EXPECT_EQ(request.items.at(0).key, "c");
  EXPECT_EQ(request.items.at(0).cost, 0);
  EXPECT_EQ(rest.size(), third.size());
}

// Verifies that bytes after a bad frame are not its business: the frame is
// answered, and the 0xc1 that follows is fatal on the next parse.
TEST(ParseRequestStreamTest, ByteC1AfterABadFrameIsFatalOnlyForTheNextParse) {
  Bytes stream = f().request(7, "acquire", 0).bytes();
  const size_t frame_size = stream.size();
  stream.push_back(0xc1);
  Request request;
  const ParseResult bad = parseRequest(stream, Limits{}, &request);
  ASSERT_EQ(bad.status, ParseStatus::kError);
  EXPECT_EQ(bad.consumed, frame_size);
  EXPECT_EQ(bad.msgid, 7u);
  const ParseResult fatal = parseRequest(std::span(stream).subspan(frame_size), Limits{}, &request);
  EXPECT_EQ(fatal.status, ParseStatus::kFatal);
  EXPECT_FALSE(fatal.has_msgid);
}

// Verifies that a Request is reused: no leftovers from the previous frame and
// no reallocation of items once it has capacity.
TEST(ParseRequestStreamTest, ARequestIsReusedWithoutReallocating) {
  Limits limits;
  Request request;
  request.items.reserve(limits.max_items);
  const Item* storage = request.items.data();
  const Bytes all = f().request(1, "acquire_all", 1).array(2).array(2).s("a").s("1").array(2).s("a").s("2").bytes();
  ASSERT_EQ(parseRequest(all, limits, &request).status, ParseStatus::kOk);
  EXPECT_EQ(request.items.size(), 2u);
  const Bytes notification = f().array(3).i(2).s("health").array(0).bytes();
  ASSERT_EQ(parseRequest(notification, limits, &request).status, ParseStatus::kOk);
  EXPECT_TRUE(request.items.empty());
  EXPECT_TRUE(request.notification);
  const Bytes acquire = f().request(9, "acquire", 2).s("a").s("k").bytes();
  ASSERT_EQ(parseRequest(acquire, limits, &request).status, ParseStatus::kOk);
  EXPECT_FALSE(request.notification);
  EXPECT_EQ(request.msgid, 9u);
  EXPECT_EQ(request.items.size(), 1u);
  EXPECT_EQ(request.items.data(), storage);
}

// Verifies that an acquire_all of max_items items (the default, 1024) parses;
// the item bound is not a bound on the frame's total element count.
TEST(ParseRequestStreamTest, AcquireAllOfDefaultMaxItemsParses) {
  Limits limits;
  Frame frame = f().request(1, "acquire_all", 1).array(static_cast<uint32_t>(limits.max_items));
  for (uint32_t i = 0; i < limits.max_items; ++i) frame.array(3).s("r").s("k").i(1);
  Request request;
  const ParseResult result = parseRequest(frame.bytes(), limits, &request);
  ASSERT_EQ(result.status, ParseStatus::kOk) << result.message;
  EXPECT_EQ(request.items.size(), limits.max_items);
}

// Verifies the empty buffer.
TEST(ParseRequestStreamTest, AnEmptyBufferIsIncomplete) {
  Request request;
  const ParseResult result = parseRequest({}, Limits{}, &request);
  EXPECT_EQ(result.status, ParseStatus::kIncomplete);
  EXPECT_EQ(result.consumed, 0u);
}

// Verifies every method name, and that names are matched exactly.
TEST(MethodFromNameTest, NamesEveryMethodExactly) {
  const std::pair<std::string_view, Method> cases[] = {
      {"acquire", Method::kAcquire}, {"acquire_all", Method::kAcquireAll}, {"peek", Method::kPeek},
      {"release", Method::kRelease}, {"health", Method::kHealth},          {"stats", Method::kStats},
      {"rules", Method::kRules},     {"reload", Method::kReload},          {"reset", Method::kReset},
      {"Acquire", Method::kUnknown},
      {"acquire ", Method::kUnknown}, {"", Method::kUnknown},
  };
  for (const auto& [name, method] : cases) EXPECT_EQ(methodFromName(name), method) << name;
}

// Verifies the stable error code strings of the wire contract.
TEST(ErrorCodeNameTest, NamesAreTheStableWireCodes) {
  const std::pair<ErrorCode, std::string_view> cases[] = {
      {ErrorCode::kBadRequest, "BAD_REQUEST"},       {ErrorCode::kUnknownRule, "UNKNOWN_RULE"},
      {ErrorCode::kUnknownMethod, "UNKNOWN_METHOD"}, {ErrorCode::kOverloaded, "OVERLOADED"},
      {ErrorCode::kForbidden, "FORBIDDEN"},          {ErrorCode::kTooLarge, "TOO_LARGE"},
      {ErrorCode::kInternal, "INTERNAL"},
  };
  for (const auto& [code, name] : cases) EXPECT_EQ(errorCodeName(code), name);
}

// --- encoders, decoded by msgpack-c ----------------------------------------

// Decodes one response frame at *offset and checks its envelope
// [1, msgid, error, result].
::msgpack::object_handle unpackResponse(const std::string& out, size_t* offset, uint32_t msgid) {
  ::msgpack::object_handle handle = ::msgpack::unpack(out.data(), out.size(), *offset);
  const ::msgpack::object& frame = handle.get();
  EXPECT_EQ(frame.type, ::msgpack::type::ARRAY);
  EXPECT_EQ(frame.via.array.size, 4u);
  EXPECT_EQ(frame.via.array.ptr[0].as<int>(), 1);
  EXPECT_EQ(frame.via.array.ptr[1].as<uint32_t>(), msgid);
  return handle;
}

std::map<std::string, ::msgpack::object> asMap(const ::msgpack::object& object) {
  EXPECT_EQ(object.type, ::msgpack::type::MAP);
  std::map<std::string, ::msgpack::object> map;
  for (uint32_t i = 0; i < object.via.map.size; ++i) {
    const auto [it, inserted] = map.emplace(object.via.map.ptr[i].key.as<std::string>(), object.via.map.ptr[i].val);
    EXPECT_TRUE(inserted) << it->first;
  }
  return map;
}

void expectDecisionMap(const ::msgpack::object& object, const Decision& decision, Mode mode) {
  const auto map = asMap(object);
  EXPECT_EQ(map.size(), decision.cost_exceeds_limit ? 7u : 6u);
  EXPECT_EQ(map.at("allowed").as<bool>(), decision.allowed);
  EXPECT_EQ(map.at("remaining").as<int64_t>(), decision.remaining);
  EXPECT_EQ(map.at("limit").as<int64_t>(), decision.limit);
  EXPECT_EQ(map.at("reset_after_ms").as<int64_t>(), decision.reset_after_ms);
  EXPECT_EQ(map.at("retry_after_ms").as<int64_t>(), decision.retry_after_ms);
  EXPECT_EQ(map.at("mode").as<std::string>(), modeName(mode));
  if (decision.cost_exceeds_limit) {
    EXPECT_EQ(map.at("reason").as<std::string>(), "cost exceeds limit");
  }
}

// Verifies that writeDecision's frame decodes, for every mode and with
// values at encoding boundaries, to exactly the contract's keys and values.
TEST(WriteDecisionTest, DecodesToTheContractMapForEveryMode) {
  const Decision decisions[] = {
      {true, 4, 5, 1000, 0, false, false},
      {false, 0, 100, 60'000, 1'234, false, false},
      {true, int64_t{UINT32_MAX} + 1, INT64_MAX, 128, 0, true, false},
      {false, -1, 0, 0, 0, false, true},
  };
  for (Mode mode : {Mode::kNormal, Mode::kFallback, Mode::kOpen, Mode::kClosed, Mode::kShadow, Mode::kLocal}) {
    for (const Decision& decision : decisions) {
      std::string out;
      writeDecision(&out, 77, decision, mode);
      size_t offset = 0;
      const auto handle = unpackResponse(out, &offset, 77);
      EXPECT_EQ(offset, out.size());
      const auto& frame = handle.get().via.array;
      EXPECT_TRUE(frame.ptr[2].is_nil());
      expectDecisionMap(frame.ptr[3], decision, mode);
    }
  }
}

// Verifies that "reason" is present only when the cost exceeds the limit.
TEST(WriteDecisionTest, ReasonOnlyWhenTheCostExceedsTheLimit) {
  for (bool exceeds : {false, true}) {
    Decision decision;
    decision.cost_exceeds_limit = exceeds;
    std::string out;
    writeDecision(&out, 1, decision, Mode::kLocal);
    size_t offset = 0;
    const auto handle = unpackResponse(out, &offset, 1);
    const auto map = asMap(handle.get().via.array.ptr[3]);
    EXPECT_EQ(map.count("reason"), exceeds ? 1u : 0u);
    if (exceeds) {
      EXPECT_EQ(map.at("reason").as<std::string>(), "cost exceeds limit");
    }
  }
}

// Verifies writeError for every code, with the largest msgid.
TEST(WriteErrorTest, DecodesToCodeAndMessage) {
  for (ErrorCode code : {ErrorCode::kBadRequest, ErrorCode::kUnknownRule, ErrorCode::kUnknownMethod,
                         ErrorCode::kOverloaded, ErrorCode::kForbidden, ErrorCode::kTooLarge, ErrorCode::kInternal}) {
    std::string out;
    writeError(&out, UINT32_MAX, code, "something is wrong");
    size_t offset = 0;
    const auto handle = unpackResponse(out, &offset, UINT32_MAX);
    EXPECT_EQ(offset, out.size());
    const auto& frame = handle.get().via.array;
    const auto error = asMap(frame.ptr[2]);
    EXPECT_EQ(error.size(), 2u);
    EXPECT_EQ(error.at("code").as<std::string>(), errorCodeName(code));
    EXPECT_EQ(error.at("message").as<std::string>(), "something is wrong");
    EXPECT_TRUE(frame.ptr[3].is_nil());
  }
}

// Verifies the map form counts the entries its method does not know, and
// names the first: a misspelt "cots", a non-str name, max_wait_ms on
// release; peek's "cost" is documented as ignored and not counted.
TEST(ParseRequestStreamTest, UnknownMapFieldsAreCountedWithTheFirstName) {
  struct Case {
    Bytes frame;
    uint32_t unknown;
    std::string_view first;
  };
  const Case cases[] = {
      {f().request(1, "acquire", 1).map(3).s("rule").s("api").s("key").s("k").s("cots").i(2).bytes(), 1, "cots"},
      {f().request(2, "acquire", 1).map(4).s("rule").s("api").i(7).i(1).s("key").s("k").s("x").nil().bytes(), 2, ""},
      {f().request(3, "release", 1).map(3).s("rule").s("api").s("key").s("k").s("max_wait_ms").i(5).bytes(), 1,
       "max_wait_ms"},
      {f().request(4, "peek", 1).map(3).s("rule").s("api").s("key").s("k").s("cost").i(5).bytes(), 0, ""},
      {f().request(5, "acquire", 1).map(3).s("rule").s("api").s("key").s("k").s("cost").i(5).bytes(), 0, ""},
  };
  Request request;
  for (const Case& c : cases) {
    const ParseResult result = parseRequest(c.frame, Limits{}, &request);
    ASSERT_EQ(result.status, ParseStatus::kOk) << result.message;
    EXPECT_EQ(request.unknown_fields, c.unknown) << result.msgid.bits;
    EXPECT_EQ(request.first_unknown_field, c.first) << result.msgid.bits;
  }
}

// Verifies a msgid outside 0..2^32-1 comes back as the same integer: above
// 2^32, the largest uint64, and negative ids down to the smallest int64.
TEST(WriteErrorTest, EchoesAnyIntegerMsgid) {
  const MsgId ids[] = {uint64_t{UINT32_MAX} + 1, UINT64_MAX, MsgId::ofSigned(-1),
                       MsgId::ofSigned(INT64_MIN)};
  for (MsgId id : ids) {
    std::string out;
    writeError(&out, id, ErrorCode::kBadRequest, "bad");
    const auto handle = ::msgpack::unpack(out.data(), out.size());
    const auto& frame = handle.get().via.array;
    ASSERT_EQ(frame.size, 4u);
    if (id.negative) {
      EXPECT_EQ(frame.ptr[1].as<int64_t>(), static_cast<int64_t>(id.bits));
    } else {
      EXPECT_EQ(frame.ptr[1].as<uint64_t>(), id.bits);
    }
  }
}

// Verifies the error notification: [2, "error", [{"code", "message"}]].
TEST(WriteErrorNotificationTest, DecodesToANotificationWithTheErrorMap) {
  std::string out;
  writeErrorNotification(&out, ErrorCode::kBadRequest, "msgid must be an integer");
  size_t offset = 0;
  const auto handle = ::msgpack::unpack(out.data(), out.size(), offset);
  EXPECT_EQ(offset, out.size());
  const auto& frame = handle.get().via.array;
  ASSERT_EQ(frame.size, 3u);
  EXPECT_EQ(frame.ptr[0].as<int>(), 2);
  EXPECT_EQ(frame.ptr[1].as<std::string>(), "error");
  ASSERT_EQ(frame.ptr[2].via.array.size, 1u);
  const auto error = asMap(frame.ptr[2].via.array.ptr[0]);
  EXPECT_EQ(error.at("code").as<std::string>(), "BAD_REQUEST");
  EXPECT_EQ(error.at("message").as<std::string>(), "msgid must be an integer");
}

// Verifies writeDecisions: allowed plus one result map per item, in order.
TEST(WriteDecisionsTest, DecodesToAllowedAndResultsInOrder) {
  const Decision decisions[] = {{true, 3, 5, 100, 0, false, false}, {false, 0, 2, 900, 450, false, false}};
  const Mode modes[] = {Mode::kNormal, Mode::kFallback};
  std::string out;
  writeDecisions(&out, 12, false, decisions, modes);
  size_t offset = 0;
  const auto handle = unpackResponse(out, &offset, 12);
  EXPECT_EQ(offset, out.size());
  const auto& frame = handle.get().via.array;
  EXPECT_TRUE(frame.ptr[2].is_nil());
  const auto result = asMap(frame.ptr[3]);
  EXPECT_EQ(result.size(), 2u);
  EXPECT_FALSE(result.at("allowed").as<bool>());
  const auto& results = result.at("results");
  ASSERT_EQ(results.type, ::msgpack::type::ARRAY);
  ASSERT_EQ(results.via.array.size, 2u);
  for (size_t i = 0; i < 2; ++i) expectDecisionMap(results.via.array.ptr[i], decisions[i], modes[i]);
}

// msgpack-c's bytes of the decision map writeAnswer encodes: the keys in
// the contract's order, every integer in its smallest form.
Frame& packDecisionMap(Frame& frame, const Decision& decision, Mode mode, int64_t waited_ms,
                       const Answer* settled) {
  const bool reserved = settled != nullptr && settled->method == Method::kReserve;
  const bool settles = settled != nullptr && !reserved;
  frame.map(6 + (decision.cost_exceeds_limit ? 1 : 0) + (waited_ms >= 0 ? 1 : 0) +
            (reserved ? 1 : 0) + (settles ? 4 : 0));
  frame.s("allowed").t(decision.allowed).s("remaining").i(decision.remaining);
  frame.s("limit").i(decision.limit).s("reset_after_ms").i(decision.reset_after_ms);
  frame.s("retry_after_ms").i(decision.retry_after_ms).s("mode").s(modeName(mode));
  if (decision.cost_exceeds_limit) frame.s("reason").s("cost exceeds limit");
  if (waited_ms >= 0) frame.s("waited_ms").i(waited_ms);
  if (reserved || settles) frame.s("id").u(settled->reservation);
  if (settles) {
    frame.s("refunded").i(settled->refunded).s("debt").i(settled->debt);
    frame.s("unpaid").i(settled->unpaid);
  }
  return frame;
}

Bytes bytesOf(const std::string& out) { return Bytes(out.begin(), out.end()); }

// Verifies that writeAnswer's bytes are msgpack-c's, byte for byte, for an
// answer of one decision with every integer at an encoding boundary (each
// width, both signs), every mode, a wait, a reason, a reservation and a
// settle, under msgids of every width and a negative one: the smallest
// encoding of each value, as the wire contract has it.
TEST(WriteAnswerTest, OneDecisionIsMsgpackCsBytesAtEveryBoundary) {
  const int64_t values[] = {0,      1,          127,        128,        255,       256,
                            65535,  65536,      UINT32_MAX, int64_t{UINT32_MAX} + 1, INT64_MAX,
                            -1,     -32,        -33,        -128,       -129,      -32768,
                            -32769, INT32_MIN,  int64_t{INT32_MIN} - 1, INT64_MIN};
  const MsgId msgids[] = {0, 127, 128, 65536, UINT64_MAX, MsgId::ofSigned(-1),
                          MsgId::ofSigned(INT64_MIN)};
  for (int64_t value : values) {
    for (Mode mode : {Mode::kNormal, Mode::kFallback, Mode::kOpen, Mode::kClosed, Mode::kShadow,
                      Mode::kLocal, Mode::kBlocked}) {
      Decision decision{value >= 0, value, value, value, value, false, value < 0};
      for (Method method : {Method::kAcquire, Method::kPeek, Method::kReserve, Method::kSettle}) {
        Answer answer;
        answer.method = method;
        answer.decide(decision, mode, value >= 0 && method == Method::kAcquire ? value : -1);
        answer.reservation = static_cast<uint64_t>(value);
        answer.refunded = value;
        answer.debt = -(value / 2);
        answer.unpaid = value / 3;
        for (MsgId msgid : msgids) {
          std::string out = "before";
          writeAnswer(&out, msgid, answer);
          Frame expected;
          expected.raw({'b', 'e', 'f', 'o', 'r', 'e'}).array(4).i(1);
          if (msgid.negative) {
            expected.i(static_cast<int64_t>(msgid.bits));
          } else {
            expected.u(msgid.bits);
          }
          expected.nil();
          const bool reserves = method == Method::kReserve && answer.reservation != 0;
          packDecisionMap(expected, decision, mode, answer.waited_ms,
                          reserves || settles(method) ? &answer : nullptr);
          ASSERT_EQ(bytesOf(out), expected.bytes())
              << "value " << value << " mode " << modeName(mode) << " method "
              << static_cast<int>(method) << " msgid " << msgid.bits;
        }
      }
    }
  }
}

// Verifies that writeDecisions' bytes are msgpack-c's, byte for byte.
TEST(WriteAnswerTest, AcquireAllIsMsgpackCsBytes) {
  Answer answer;
  answer.method = Method::kAcquireAll;
  answer.decide({true, 300, 70000, 5, 0, false, false}, Mode::kNormal);
  answer.decide({false, -40, 1, 0, 90000, false, true}, Mode::kShadow);
  answer.allowed = false;
  std::string out;
  writeAnswer(&out, 70000, answer);
  Frame expected;
  expected.array(4).i(1).u(70000).nil().map(2).s("allowed").t(false).s("results").array(2);
  packDecisionMap(expected, answer.decisions[0], Mode::kNormal, -1, nullptr);
  packDecisionMap(expected, answer.decisions[1], Mode::kShadow, -1, nullptr);
  EXPECT_EQ(bytesOf(out), expected.bytes());
}

// Verifies that writeResultHeader plus a Writer-encoded value is one frame,
// and that responses appended to one buffer decode one after another.
TEST(WriteResultHeaderTest, FramesWhatTheCallerWritesAndAppends) {
  std::string out;
  writeResultHeader(&out, 3);
  msgpack::Writer writer(&out);
  writer.writeMapHeader(2);
  writer.writeStr("status");
  writer.writeStr("ok");
  writer.writeStr("redis");
  writer.writeStr("none");
  writeError(&out, 4, ErrorCode::kUnknownMethod, "no such method");

  size_t offset = 0;
  const auto first = unpackResponse(out, &offset, 3);
  const auto health = asMap(first.get().via.array.ptr[3]);
  EXPECT_EQ(health.at("status").as<std::string>(), "ok");
  EXPECT_EQ(health.at("redis").as<std::string>(), "none");
  const auto second = unpackResponse(out, &offset, 4);
  EXPECT_EQ(asMap(second.get().via.array.ptr[2]).at("code").as<std::string>(), "UNKNOWN_METHOD");
  EXPECT_EQ(offset, out.size());
}

// --- reserve, settle, cancel -----------------------------------------------------

ParseResult parseBytes(const Bytes& bytes, Request* request) {
  return parseRequest(std::span<const uint8_t>(bytes.data(), bytes.size()), Limits{}, request);
}

TEST(ParseReservations, ReserveTakesRuleKeyEstimateAndAnOptionalTtl) {
  Request request;
  // The request's views point into the frame: it outlives them.
  const Bytes positional = f().request(1, "reserve", 4).s("llm").s("tenant").i(4096).i(30'000).bytes();
  ASSERT_EQ(parseBytes(positional, &request).status, ParseStatus::kOk);
  EXPECT_EQ(request.method, Method::kReserve);
  ASSERT_EQ(request.items.size(), 1u);
  EXPECT_EQ(request.items[0].rule, "llm");
  EXPECT_EQ(request.items[0].key, "tenant");
  EXPECT_EQ(request.items[0].cost, 4096);
  EXPECT_EQ(request.items[0].ttl_ms, 30'000);

  const Bytes map = f().request(2, "reserve", 1).map(3).s("rule").s("llm").s("key").s("t")
                        .s("estimate").i(7).bytes();
  ASSERT_EQ(parseBytes(map, &request).status, ParseStatus::kOk);
  EXPECT_EQ(request.items[0].key, "t");
  EXPECT_EQ(request.items[0].cost, 7);
  EXPECT_EQ(request.items[0].ttl_ms, -1);
}

TEST(ParseReservations, SettleTakesAnIdAndTheActualAndCancelTheIdAlone) {
  Request request;
  ASSERT_EQ(parseBytes(f().request(1, "settle", 2).u(uint64_t{5} << 48 | 9).i(1200).bytes(), &request)
                .status,
            ParseStatus::kOk);
  EXPECT_EQ(request.method, Method::kSettle);
  EXPECT_EQ(request.items[0].reservation, uint64_t{5} << 48 | 9);
  EXPECT_EQ(request.items[0].cost, 1200);

  ASSERT_EQ(parseBytes(f().request(2, "settle", 1).map(2).s("actual").i(0).s("id").u(3).bytes(),
                       &request).status,
            ParseStatus::kOk);
  EXPECT_EQ(request.items[0].reservation, 3u);
  EXPECT_EQ(request.items[0].cost, 0);

  ASSERT_EQ(parseBytes(f().request(3, "cancel", 1).u(3).bytes(), &request).status, ParseStatus::kOk);
  EXPECT_EQ(request.method, Method::kCancel);
  EXPECT_EQ(request.items[0].reservation, 3u);
}

TEST(ParseReservations, BadShapesAndValuesSayWhatIsExpected) {
  struct Case {
    Bytes frame;
    std::string_view message;
  };
  const Case cases[] = {
      {f().request(1, "reserve", 2).s("llm").s("t").bytes(), "reserve params must be"},
      {f().request(1, "reserve", 3).s("llm").s("t").i(0).bytes(), "estimate must be an integer 1.."},
      {f().request(1, "reserve", 4).s("llm").s("t").i(5).i(0).bytes(), "ttl_ms must be"},
      {f().request(1, "reserve", 1).map(2).s("rule").s("llm").s("key").s("t").bytes(),
       "reserve params must be"},
      {f().request(1, "settle", 1).u(3).bytes(), "settle params must be [id, actual]"},
      {f().request(1, "settle", 2).i(-3).i(1).bytes(), "id must be the positive integer"},
      {f().request(1, "settle", 2).u(0).i(1).bytes(), "id must be the positive integer"},
      {f().request(1, "settle", 2).u(3).i(-1).bytes(), "actual must be an integer 0.."},
      {f().request(1, "cancel", 2).u(3).i(1).bytes(), "cancel params must be [id]"},
  };
  for (const Case& c : cases) {
    Request request;
    const ParseResult result = parseBytes(c.frame, &request);
    EXPECT_EQ(result.status, ParseStatus::kError) << c.message;
    EXPECT_EQ(result.error, ErrorCode::kBadRequest) << c.message;
    EXPECT_NE(std::string(result.message).find(c.message), std::string::npos) << result.message;
  }
}

}  // namespace
}  // namespace sluice::rpc

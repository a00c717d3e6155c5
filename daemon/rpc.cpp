// RPC: parsing MessagePack-RPC request frames and encoding responses, as
// specified in rpc.h.
//
// parseRequest walks a frame once, reading the fields it expects and
// skipping the rest with bounded skip() calls; on the happy path that single
// pass also finds the end of the frame. When the frame turns out not to be a
// valid request it is walked a second time, from its start, with skip() only:
// that pass decides whether the bytes are well-formed MessagePack within the
// limits (kError, the connection goes on after the frame) or not (kFatal).
#include "rpc.h"

#include "rules.h"

#include <algorithm>
#include <array>
#include <cassert>

namespace sluice::rpc {

namespace {

using msgpack::Reader;
using msgpack::Status;
using msgpack::Type;

constexpr int64_t kMaxCost = 1'000'000'000;

// Static messages, so that ParseResult::message never dangles.
constexpr std::string_view kNotArray = "a frame must be an array";
constexpr std::string_view kBadFrame = "a frame must be [0, msgid, method, params] or [2, method, params]";
constexpr std::string_view kBadType = "frame type must be 0 (request) or 2 (notification)";
constexpr std::string_view kBadMsgid = "a request must be [0, msgid, method, params] with an integer msgid";
constexpr std::string_view kBadMethod = "method must be a str";
constexpr std::string_view kBadParams = "params must be an array";
constexpr std::string_view kBadAcquire =
    "acquire params must be [rule, key, cost, max_wait_ms] (cost and max_wait_ms optional) or "
    "[{\"rule\", \"key\", \"cost\", \"max_wait_ms\"}]";
constexpr std::string_view kBadRelease = "release params must be [rule, key, cost] or [{\"rule\", \"key\", \"cost\"}]";
constexpr std::string_view kBadPeek = "peek params must be [rule, key] or [{\"rule\", \"key\"}]";
constexpr std::string_view kBadReset = "reset params must be [rule, key] or [{\"rule\", \"key\"}]";
constexpr std::string_view kBadAcquireAll = "acquire_all params must be [[[rule, key, cost], ...]]";
constexpr std::string_view kBadItem = "acquire_all items must be [rule, key, cost] or {\"rule\", \"key\", \"cost\"}";
constexpr std::string_view kNoItems = "acquire_all needs at least one item";
constexpr std::string_view kTooManyItems = "acquire_all has more than max_items items";
constexpr std::string_view kBadRule = "rule must be a str";
constexpr std::string_view kBadKey = "key must be a str or bin";
constexpr std::string_view kKeyTooLong = "key is longer than max_key_bytes";
constexpr std::string_view kBadCost = "cost must be an integer 0..1000000000";
constexpr std::string_view kBadMaxWait = "max_wait_ms must be an integer 0..60000";
constexpr std::string_view kBadReserve =
    "reserve params must be [rule, key, estimate, ttl_ms] (ttl_ms optional) or "
    "[{\"rule\", \"key\", \"estimate\", \"ttl_ms\"}]";
constexpr std::string_view kBadSettle = "settle params must be [id, actual] or [{\"id\", \"actual\"}]";
constexpr std::string_view kBadCancel = "cancel params must be [id] or [{\"id\"}]";
constexpr std::string_view kBadEstimate = "estimate must be an integer 1..1000000000";
constexpr std::string_view kBadActual = "actual must be an integer 0..1000000000";
constexpr std::string_view kBadTtl = "ttl_ms must be an integer 1..86400000";
constexpr std::string_view kBadId = "id must be the positive integer reserve answered";
constexpr std::string_view kMapNeedsRuleKey = "an item map needs \"rule\" and \"key\"";
constexpr std::string_view kContainerTooLarge = "an array or map has more than max_items elements";
constexpr std::string_view kTooDeep = "nesting deeper than max_depth";
constexpr std::string_view kNotMsgpack = "not MessagePack";
constexpr std::string_view kFrameTooLarge = "frame larger than max_frame_bytes";

// Whether the positional form may carry a cost, and what an absent one means.
// Whether the request may also say how long it waits (acquire only), as a
// fourth positional element or a "max_wait_ms" entry.
struct CostRule {
  bool accepted;
  int64_t absent;
  bool waits = false;
};
constexpr CostRule kCostDefaultOne{true, 1};
constexpr CostRule kCostZero{false, 0};
constexpr CostRule kAcquireCost{true, 1, true};

// The first pass. Each step returns false on failure, always through bad(),
// which records the first error; the reader may have failed too (a wrong
// type, or kIncomplete, which parseRequest checks first).
class Parser {
 public:
  Parser(std::span<const uint8_t> buffer, const Limits& limits, Request* request, ParseResult* result)
      : reader_(buffer.data(), buffer.size(), limits.max_frame_bytes),
        limits_(limits),
        request_(request),
        result_(result) {}

  bool parseFrame();

  const Reader& reader() const { return reader_; }
  // The frame is a request ([0, ...]) whose msgid cannot be read.
  bool unanswerable() const { return unanswerable_; }

 private:
  bool bad(std::string_view message, ErrorCode code = ErrorCode::kBadRequest) {
    if (!failed_) {
      failed_ = true;
      result_->error = code;
      result_->message = message;
    }
    return false;
  }
  // Maps a reader failure that is not kIncomplete to a request error; the
  // second pass decides whether it is fatal.
  bool readerBad(std::string_view message) {
    switch (reader_.status()) {
      case Status::kTooLarge: return bad(kContainerTooLarge, ErrorCode::kTooLarge);
      case Status::kTooDeep: return bad(kTooDeep);
      default: return bad(message);
    }
  }
  bool badMsgid() {
    unanswerable_ = true;
    return bad(kBadMsgid);
  }
  // A container read at `depth` (the frame array is depth 1).
  bool enter(uint32_t depth) { return depth <= limits_.max_depth || bad(kTooDeep); }
  bool count(uint32_t n) { return n <= limits_.max_items || bad(kContainerTooLarge, ErrorCode::kTooLarge); }
  // Skips a value held by a container at `depth`.
  bool skipIn(uint32_t depth) {
    return reader_.skip(limits_.max_depth - depth, limits_.max_items) || readerBad(kNotMsgpack);
  }

  bool parseParams(uint32_t n);
  bool parseSingle(uint32_t n, CostRule cost, std::string_view message);
  bool parseAcquireAll(uint32_t n);
  bool parsePositional(uint32_t n, CostRule cost, std::string_view message, Item* item);
  bool parseMap(uint32_t depth, CostRule cost, Item* item);
  // What a map entry's reader made of its name (parseFields).
  enum class Field { kRead, kFailed, kUnknown, kIgnored };
  template <typename ReadField>
  bool parseFields(uint32_t depth, std::string_view message, ReadField read_field);
  template <size_t N, typename ReadField>
  bool parseRecord(uint32_t n, const std::array<std::string_view, N>& names, size_t required,
                   std::string_view message, ReadField read_field);
  bool parseKey(std::string_view* key);
  bool parseCost(int64_t* cost);
  bool parseMaxWait(int64_t* max_wait_ms);
  bool parseReserve(uint32_t n);
  bool parseSettle(uint32_t n, bool cancel);
  bool parseBounded(int64_t* value, int64_t low, int64_t high, std::string_view message);
  bool parseId(uint64_t* id);

  Reader reader_;
  const Limits& limits_;
  Request* request_;
  ParseResult* result_;
  bool failed_ = false;
  bool unanswerable_ = false;
};

bool Parser::parseFrame() {
  uint32_t n = 0;
  if (!reader_.readArrayHeader(&n)) return readerBad(kNotArray);
  if (!enter(1)) return false;
  if (n == 0) return bad(kBadFrame);
  int64_t type = 0;
  if (!reader_.readInt(&type)) return readerBad(kBadType);
  if (type == 0) {
    if (n < 2) return badMsgid();
    MsgId msgid;
    if (!reader_.readAnyInt(&msgid.bits, &msgid.negative)) {
      if (reader_.status() == Status::kIncomplete) return false;
      return badMsgid();
    }
    result_->has_msgid = true;
    result_->msgid = msgid;
    request_->msgid = msgid;
    if (n != 4) return bad(kBadFrame);
  } else if (type == 2) {
    if (n != 3) return bad(kBadFrame);
    request_->notification = true;
  } else {
    return bad(kBadType);
  }
  if (!reader_.readStr(&request_->method_name)) return readerBad(kBadMethod);
  request_->method = methodFromName(request_->method_name);
  uint32_t params = 0;
  if (!reader_.readArrayHeader(&params)) return readerBad(kBadParams);
  return enter(2) && count(params) && parseParams(params);
}

bool Parser::parseParams(uint32_t n) {
  switch (request_->method) {
    case Method::kAcquire: return parseSingle(n, kAcquireCost, kBadAcquire);
    case Method::kRelease: return parseSingle(n, kCostDefaultOne, kBadRelease);
    case Method::kPeek: return parseSingle(n, kCostZero, kBadPeek);
    case Method::kReset: return parseSingle(n, kCostZero, kBadReset);
    case Method::kAcquireAll: return parseAcquireAll(n);
    case Method::kReserve: return parseReserve(n);
    case Method::kSettle: return parseSettle(n, false);
    case Method::kCancel: return parseSettle(n, true);
    case Method::kHealth:
    case Method::kStats:
    case Method::kRules:
    case Method::kReload:
    case Method::kUnknown: break;
  }
  for (uint32_t i = 0; i < n; ++i) {
    if (!skipIn(2)) return false;
  }
  return true;
}

// acquire, release, peek: the params array is the positional item, or holds
// one map.
bool Parser::parseSingle(uint32_t n, CostRule cost, std::string_view message) {
  Item& item = request_->items.emplace_back();
  if (n == 1) {
    if (reader_.peekType() != Type::kMap) return bad(message);
    return parseMap(3, cost, &item);
  }
  return parsePositional(n, cost, message, &item);
}

bool Parser::parseAcquireAll(uint32_t n) {
  uint32_t items = 0;
  if (n != 1) return bad(kBadAcquireAll);
  if (!reader_.readArrayHeader(&items)) return readerBad(kBadAcquireAll);
  if (!enter(3)) return false;
  if (items == 0) return bad(kNoItems);
  if (items > limits_.max_items) return bad(kTooManyItems, ErrorCode::kTooLarge);
  for (uint32_t i = 0; i < items; ++i) {
    Item& item = request_->items.emplace_back();
    const Type type = reader_.peekType();
    if (type == Type::kArray) {
      uint32_t fields = 0;
      if (!reader_.readArrayHeader(&fields) || !enter(4)) return readerBad(kBadItem);
      if (!parsePositional(fields, kCostDefaultOne, kBadItem, &item)) return false;
    } else if (type == Type::kMap) {
      if (!parseMap(4, kCostDefaultOne, &item)) return false;
    } else {
      return bad(kBadItem);
    }
  }
  return true;
}

// [rule, key] or, when the cost is accepted, [rule, key, cost], and for
// acquire [rule, key, cost, max_wait_ms]; the array header (n fields) has
// been read.
bool Parser::parsePositional(uint32_t n, CostRule cost, std::string_view message, Item* item) {
  if (n != 2 && !(n == 3 && cost.accepted) && !(n == 4 && cost.waits)) return bad(message);
  if (!reader_.readStr(&item->rule)) return readerBad(kBadRule);
  if (!parseKey(&item->key)) return false;
  item->cost = cost.absent;
  item->max_wait_ms = -1;
  if (n >= 3 && !parseCost(&item->cost)) return false;
  return n < 4 || parseMaxWait(&item->max_wait_ms);
}

// {"rule": ..., "key": ..., "cost": ...} held at `depth`.
bool Parser::parseMap(uint32_t depth, CostRule cost, Item* item) {
  bool has_rule = false;
  bool has_key = false;
  item->cost = cost.absent;
  item->max_wait_ms = -1;
  auto read = [&](std::string_view name) {
    bool read_it = true;
    if (name == "rule") {
      read_it = reader_.readStr(&item->rule) || readerBad(kBadRule);
      has_rule = true;
    } else if (name == "key") {
      read_it = parseKey(&item->key);
      has_key = true;
    } else if (name == "cost") {
      // A method without a cost passes over one: it is no unknown field.
      if (!cost.accepted) return Field::kIgnored;
      read_it = parseCost(&item->cost);
    } else if (name == "max_wait_ms" && cost.waits) {
      read_it = parseMaxWait(&item->max_wait_ms);
    } else {
      return Field::kUnknown;
    }
    return read_it ? Field::kRead : Field::kFailed;
  };
  if (!parseFields(depth, kBadItem, read)) return false;
  return (has_rule && has_key) || bad(kMapNeedsRuleKey);
}

// The entries of a map held at `depth`, its header next: read_field(name)
// reads each value, or says to pass over it (kUnknown counts it as an
// unknown field, kIgnored does not). An entry whose name is not a string
// is an unknown field with an empty name. A header or name that cannot be
// read is `message`.
template <typename ReadField>
bool Parser::parseFields(uint32_t depth, std::string_view message, ReadField read_field) {
  uint32_t n = 0;
  if (!reader_.readMapHeader(&n)) return readerBad(message);
  if (!enter(depth) || !count(n)) return false;
  for (uint32_t i = 0; i < n; ++i) {
    std::string_view name;
    const Type type = reader_.peekType();
    if (type == Type::kStr || type == Type::kBin) {
      if (!reader_.readStrOrBin(&name)) return readerBad(message);
    } else if (!skipIn(depth)) {
      return false;
    }
    switch (read_field(name)) {
      case Field::kRead:
        break;
      case Field::kFailed:
        return false;
      case Field::kUnknown:
        if (request_->unknown_fields++ == 0) request_->first_unknown_field = name;
        if (!skipIn(depth)) return false;
        break;
      case Field::kIgnored:
        if (!skipIn(depth)) return false;
        break;
    }
  }
  return true;
}

// A record of the fields `names`, the first `required` of them required:
// positional, [f0, f1, ...] with at least `required` and at most N fields
// (n of them), or one map [{"name": value, ...}] (at depth 3, past the
// frame and params arrays). read_field(i) reads field i. A record of the
// wrong shape, or a map without a required field, is `message`.
template <size_t N, typename ReadField>
bool Parser::parseRecord(uint32_t n, const std::array<std::string_view, N>& names, size_t required,
                         std::string_view message, ReadField read_field) {
  if (n == 1 && reader_.peekType() == Type::kMap) {
    std::array<bool, N> has{};
    auto read = [&](std::string_view name) {
      const auto found = std::find(names.begin(), names.end(), name);
      if (found == names.end()) return Field::kUnknown;
      const auto i = static_cast<size_t>(found - names.begin());
      has[i] = true;
      return read_field(i) ? Field::kRead : Field::kFailed;
    };
    if (!parseFields(3, message, read)) return false;
    return std::all_of(has.begin(), has.begin() + static_cast<std::ptrdiff_t>(required),
                       [](bool h) { return h; }) ||
           bad(message);
  }
  if (n < required || n > N) return bad(message);
  for (size_t i = 0; i < n; ++i) {
    if (!read_field(i)) return false;
  }
  return true;
}

bool Parser::parseKey(std::string_view* key) {
  if (!reader_.readStrOrBin(key)) return readerBad(kBadKey);
  return key->size() <= limits_.max_key_bytes || bad(kKeyTooLong, ErrorCode::kTooLarge);
}

bool Parser::parseCost(int64_t* cost) {
  if (!reader_.readInt(cost)) return readerBad(kBadCost);
  return (*cost >= 0 && *cost <= kMaxCost) || bad(kBadCost);
}

bool Parser::parseMaxWait(int64_t* max_wait_ms) {
  if (!reader_.readInt(max_wait_ms)) return readerBad(kBadMaxWait);
  return (*max_wait_ms >= 0 && *max_wait_ms <= kMaxWaitNs / 1'000'000) || bad(kBadMaxWait);
}

// [rule, key, estimate], [rule, key, estimate, ttl_ms] or
// [{"rule", "key", "estimate", "ttl_ms"}]; the estimate is the item's cost.
bool Parser::parseReserve(uint32_t n) {
  Item& item = request_->items.emplace_back();
  item.max_wait_ms = 0;  // a reserve answers at once
  static constexpr std::array<std::string_view, 4> kFields = {"rule", "key", "estimate", "ttl_ms"};
  return parseRecord(n, kFields, 3, kBadReserve, [&](size_t field) {
    switch (field) {
      case 0:
        return reader_.readStr(&item.rule) || readerBad(kBadRule);
      case 1:
        return parseKey(&item.key);
      case 2:
        return parseBounded(&item.cost, 1, kMaxCost, kBadEstimate);
      default:
        return parseBounded(&item.ttl_ms, 1, kMaxReservationTtlMs, kBadTtl);
    }
  });
}

// settle: [id, actual] or [{"id", "actual"}]; cancel: [id] or [{"id"}]. The
// item has no rule or key; its cost is the actual cost (cancel: 0).
bool Parser::parseSettle(uint32_t n, bool cancel) {
  Item& item = request_->items.emplace_back();
  item.cost = 0;
  static constexpr std::array<std::string_view, 2> kFields = {"id", "actual"};
  auto read = [&](size_t field) {
    return field == 0 ? parseId(&item.reservation)
                      : parseBounded(&item.cost, 0, kMaxCost, kBadActual);
  };
  // A cancel's record is the id alone: an actual is an unknown field.
  if (cancel) return parseRecord(n, std::array{kFields[0]}, 1, kBadCancel, read);
  return parseRecord(n, kFields, 2, kBadSettle, read);
}

bool Parser::parseBounded(int64_t* value, int64_t low, int64_t high, std::string_view message) {
  if (!reader_.readInt(value)) return readerBad(message);
  return (*value >= low && *value <= high) || bad(message);
}

bool Parser::parseId(uint64_t* id) {
  bool negative = false;
  if (!reader_.readAnyInt(id, &negative)) return readerBad(kBadId);
  return (!negative && *id != 0) || bad(kBadId);
}

}  // namespace

ParseResult parseRequest(std::span<const uint8_t> buffer, const Limits& limits, Request* request) {
  request->notification = false;
  request->msgid = 0;
  request->method = Method::kUnknown;
  request->method_name = {};
  request->items.clear();
  request->unknown_fields = 0;
  request->first_unknown_field = {};

  ParseResult result;
  Parser parser(buffer, limits, request, &result);
  if (parser.parseFrame()) {
    result.status = ParseStatus::kOk;
    result.consumed = parser.reader().offset();
    return result;
  }
  if (parser.reader().status() == Status::kIncomplete) return ParseResult{};

  // The frame is not a valid request (or a peek found the end of the bytes,
  // or a bound was hit). Find where it ends, walking it again with the
  // absolute limits only: max_items no longer applies (the frame is already
  // rejected and max_frame_bytes bounds the walk). This pass also tells a cut
  // off frame (kIncomplete) from one that can never be read (kFatal).
  Reader frame(buffer.data(), buffer.size(), limits.max_frame_bytes);
  if (frame.skip(limits.max_depth, UINT32_MAX)) {
    if (parser.unanswerable()) {
      result.status = ParseStatus::kFatal;
      return result;
    }
    result.status = ParseStatus::kError;
    result.consumed = frame.offset();
    return result;
  }
  switch (frame.status()) {
    case Status::kIncomplete: return ParseResult{};
    case Status::kTooLarge:
      result.error = ErrorCode::kTooLarge;
      result.message = kFrameTooLarge;
      break;
    case Status::kTooDeep:
      result.error = ErrorCode::kBadRequest;
      result.message = kTooDeep;
      break;
    case Status::kOk:
    case Status::kInvalid:
      result.error = ErrorCode::kBadRequest;
      result.message = kNotMsgpack;
      break;
  }
  result.status = ParseStatus::kFatal;
  return result;
}

// Encoders. A decision's answer is staged on the stack with the put*
// encodings (msgpack.h) and appended to `out` once; map keys are
// pre-encoded fixstr literals, the bytes msgpack::Writer::writeStr would
// produce.
namespace {

using msgpack::kMaxScalarBytes;

void appendLiteral(std::string* out, std::string_view encoded) { out->append(encoded); }

// Copies the pre-encoded `literal` (a string literal's bytes, without its
// terminating NUL) to `at`; returns the end.
template <size_t N>
char* putLiteral(char* at, const char (&literal)[N]) {
  for (size_t i = 0; i + 1 < N; ++i) at[i] = literal[i];
  return at + N - 1;
}

// The most bytes a response's start takes: [1, msgid, then nil.
constexpr size_t kMaxResponseStartBytes = 2 + kMaxScalarBytes + 1;

// [1, msgid, at `at`; the caller writes error and result.
char* putResponseStart(char* at, MsgId msgid) {
  at[0] = static_cast<char>(0x94);
  at[1] = static_cast<char>(0x01);
  return msgid.negative ? msgpack::putInt(at + 2, static_cast<int64_t>(msgid.bits))
                        : msgpack::putUint(at + 2, msgid.bits);
}

void writeResponseStart(std::string* out, MsgId msgid) {
  char buffer[kMaxResponseStartBytes];
  out->append(buffer, static_cast<size_t>(putResponseStart(buffer, msgid) - buffer));
}

// {"code": ..., "message": ...}
void writeErrorMap(msgpack::Writer& writer, std::string* out, ErrorCode code,
                   std::string_view message) {
  writer.writeMapHeader(2);
  appendLiteral(out, "\xa4" "code");
  writer.writeStr(errorCodeName(code));
  appendLiteral(out, "\xa7" "message");
  writer.writeStr(message);
}

// What a reservation's answer adds to its decision map.
struct Settled {
  bool reserved = false;  // "id"
  bool settled = false;   // "id", "refunded", "debt", "unpaid"
  uint64_t id = 0;
  int64_t refunded = 0;
  int64_t debt = 0;
  int64_t unpaid = 0;
};

// The most bytes a decision map takes: its header, and each key (at most
// 15 bytes as a fixstr) with its value (an integer, a bool, or a str of
// at most 18 bytes: a mode's name, or the reason).
constexpr size_t kMaxDecisionKeys = 12;
constexpr size_t kMaxDecisionMapBytes =
    kMaxScalarBytes + kMaxDecisionKeys * (15 + kMaxScalarBytes + 18);

// The decision map at `at` (room for kMaxDecisionMapBytes); returns the end.
char* putDecisionMap(char* at, const Decision& decision, Mode mode, int64_t waited_ms,
                     const Settled* settled) {
  const bool reserved = settled != nullptr && settled->reserved;
  const bool settles = settled != nullptr && settled->settled;
  at = msgpack::putMapHeader(at, 6 + (decision.cost_exceeds_limit ? 1 : 0) +
                                     (waited_ms >= 0 ? 1 : 0) + (reserved ? 1 : 0) +
                                     (settles ? 4 : 0));
  at = putLiteral(at, "\xa7" "allowed");
  at = msgpack::putBool(at, decision.allowed);
  at = putLiteral(at, "\xa9" "remaining");
  at = msgpack::putInt(at, decision.remaining);
  at = putLiteral(at, "\xa5" "limit");
  at = msgpack::putInt(at, decision.limit);
  at = putLiteral(at, "\xae" "reset_after_ms");
  at = msgpack::putInt(at, decision.reset_after_ms);
  at = putLiteral(at, "\xae" "retry_after_ms");
  at = msgpack::putInt(at, decision.retry_after_ms);
  at = putLiteral(at, "\xa4" "mode");
  at = msgpack::putStr(at, modeName(mode));
  if (decision.cost_exceeds_limit) {
    at = putLiteral(at, "\xa6" "reason");
    at = msgpack::putStr(at, "cost exceeds limit");
  }
  if (waited_ms >= 0) {
    at = putLiteral(at, "\xa9" "waited_ms");
    at = msgpack::putInt(at, waited_ms);
  }
  if (reserved || settles) {
    at = putLiteral(at, "\xa2" "id");
    at = msgpack::putUint(at, settled->id);
  }
  if (settles) {
    at = putLiteral(at, "\xa8" "refunded");
    at = msgpack::putInt(at, settled->refunded);
    at = putLiteral(at, "\xa4" "debt");
    at = msgpack::putInt(at, settled->debt);
    at = putLiteral(at, "\xa6" "unpaid");
    at = msgpack::putInt(at, settled->unpaid);
  }
  return at;
}

// A whole answer of one decision: [1, msgid, nil, {decision}], appended once.
void writeDecisionResponse(std::string* out, MsgId msgid, const Decision& decision, Mode mode,
                           int64_t waited_ms, const Settled* settled) {
  char buffer[kMaxResponseStartBytes + kMaxDecisionMapBytes];
  char* at = msgpack::putNil(putResponseStart(buffer, msgid));
  at = putDecisionMap(at, decision, mode, waited_ms, settled);
  out->append(buffer, static_cast<size_t>(at - buffer));
}

}  // namespace

void writeError(std::string* out, MsgId msgid, ErrorCode code, std::string_view message) {
  msgpack::Writer writer(out);
  writeResponseStart(out, msgid);
  writeErrorMap(writer, out, code, message);
  writer.writeNil();
}

void writeErrorNotification(std::string* out, ErrorCode code, std::string_view message) {
  msgpack::Writer writer(out);
  writer.writeArrayHeader(3);
  writer.writeUint(2);
  appendLiteral(out, "\xa5" "error");
  writer.writeArrayHeader(1);
  writeErrorMap(writer, out, code, message);
}

void writeDecision(std::string* out, MsgId msgid, const Decision& decision, Mode mode,
                   int64_t waited_ms) {
  writeDecisionResponse(out, msgid, decision, mode, waited_ms, nullptr);
}

void writeDecisions(std::string* out, MsgId msgid, bool all_allowed, std::span<const Decision> decisions,
                    std::span<const Mode> modes) {
  assert(decisions.size() == modes.size());
  msgpack::Writer writer(out);
  writeResultHeader(out, msgid);
  writer.writeMapHeader(2);
  appendLiteral(out, "\xa7" "allowed");
  writer.writeBool(all_allowed);
  appendLiteral(out, "\xa7" "results");
  writer.writeArrayHeader(static_cast<uint32_t>(decisions.size()));
  for (size_t i = 0; i < decisions.size(); ++i) {
    char buffer[kMaxDecisionMapBytes];
    char* at = putDecisionMap(buffer, decisions[i], modes[i], -1, nullptr);
    out->append(buffer, static_cast<size_t>(at - buffer));
  }
}

void writeAnswer(std::string* out, MsgId msgid, const Answer& answer) {
  if (answer.failed) {
    writeError(out, msgid, answer.error, answer.message);
    return;
  }
  if (answer.method == Method::kAcquireAll) {
    writeDecisions(out, msgid, answer.allowed, answer.decisions, answer.modes);
    return;
  }
  // The dispatcher answers every other question with one decision.
  assert(answer.decisions.size() == 1);
  if (answer.decisions.empty()) {
    writeError(out, msgid, ErrorCode::kInternal, "internal error: an answer without a decision");
    return;
  }
  if (answer.method != Method::kReserve && !settles(answer.method)) {
    writeDecisionResponse(out, msgid, answer.decisions.front(), answer.modes.front(),
                          answer.waited_ms, nullptr);
    return;
  }
  Settled settled;
  settled.reserved = answer.method == Method::kReserve && answer.reservation != 0;
  settled.settled = settles(answer.method);
  settled.id = answer.reservation;
  settled.refunded = answer.refunded;
  settled.debt = answer.debt;
  settled.unpaid = answer.unpaid;
  writeDecisionResponse(out, msgid, answer.decisions.front(), answer.modes.front(),
                        answer.waited_ms, &settled);
}

void writeResultHeader(std::string* out, MsgId msgid) {
  char buffer[kMaxResponseStartBytes];
  char* at = msgpack::putNil(putResponseStart(buffer, msgid));
  out->append(buffer, static_cast<size_t>(at - buffer));
}

}  // namespace sluice::rpc

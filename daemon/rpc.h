// RPC: MessagePack-RPC framing, request decoding and response encoding for
// the wire contract in docs/design.md ("Protocol"). Pure functions over bytes: no
// I/O, no clock, no allocation on the request path once a Request has grown
// to its working size (parseRequest reuses its vectors).
//
// A request is [0, msgid, method, params]; a notification [2, method,
// params]; a response [1, msgid, error, result]. The stream has no length
// prefix, so a frame ends where its MessagePack value ends; parseRequest
// reports kIncomplete until the whole value is in the buffer.
//
// Thread-safety: stateless functions; a Request belongs to one connection.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "decision.h"
#include "msgpack.h"
#include "question.h"

namespace sluice::rpc {

// The seam's words (question.h), as the wire contract spells them.
using sluice::ErrorCode;
using sluice::errorCodeName;
using sluice::Item;
using sluice::Method;
using sluice::methodFromName;
using sluice::MsgId;

// Bounds on what one frame may contain; from the [limits] config section.
struct Limits {
  size_t max_frame_bytes = 64 * 1024;
  size_t max_key_bytes = 4096;
  uint32_t max_depth = 16;      // nesting of arrays and maps: the frame array
                                // is depth 1, params 2; capped at
                                // msgpack::Reader::kMaxSkipDepth
  uint32_t max_items = 1024;    // the most elements of any array or entries of
                                // any map parseRequest reads, and of array
                                // elements plus map entries in any one value it
                                // skips; also the most items of one acquire_all.
                                // (The whole frame is bounded by max_frame_bytes.)
};

struct Request {
  bool notification = false;
  MsgId msgid;
  Method method = Method::kUnknown;
  std::string_view method_name;
  // acquire, peek, release: exactly one item; acquire_all: one or more;
  // other methods: none.
  std::vector<Item> items;
  // Entries of the map form whose names this method does not know (a
  // misspelt "cots" would otherwise spend the default cost unnoticed), and
  // the first such name (empty when it was not a str); skipped for forward
  // compatibility, counted and logged by the caller.
  uint32_t unknown_fields = 0;
  std::string_view first_unknown_field;
};

enum class ParseStatus {
  kOk,          // `request` holds a complete request or notification
  kIncomplete,  // need more bytes; nothing consumed
  kError,       // a well-formed frame with a bad request: answer the error
                // (when has_msgid) and go on after `consumed` bytes
  kFatal,       // the stream cannot be read on: answer the error when
                // has_msgid, then close the connection
};

struct ParseResult {
  ParseStatus status = ParseStatus::kIncomplete;
  size_t consumed = 0;  // bytes of the frame, for kOk and kError
  bool has_msgid = false;
  MsgId msgid;
  ErrorCode error = ErrorCode::kBadRequest;
  std::string_view message;  // static text saying what was wrong
};

// Decodes the first frame of `buffer` into `request` (reusing its storage:
// items.clear(), never a shrink; reserve limits.max_items up front and it
// never allocates). Never recurses, never throws, never reads past `buffer`.
//
// Frames:
// - [0, msgid, method, params] is a request, [2, method, params] a
//   notification. msgid is any integer (MsgId), method a str, params an
//   array. A notification's request->msgid is 0 and no error is ever
//   answered to it.
// - Methods and their params (a key is a str or bin of any bytes, at most
//   max_key_bytes; a rule is a str; a cost an int 0..1,000,000,000):
//     acquire      [rule, key] | [rule, key, cost] | [{"rule", "key", "cost"}]
//                  cost defaults to 1
//     release      as acquire
//     peek         [rule, key] | [{"rule", "key"}]; cost is 0 (a "cost"
//                  entry in the map is ignored)
//     acquire_all  [[item, ...]] with 1..max_items items, each item
//                  [rule, key], [rule, key, cost] or {"rule", "key", "cost"}
//     reserve      [rule, key, estimate] | [rule, key, estimate, ttl_ms] |
//                  [{"rule", "key", "estimate", "ttl_ms"}]: the item's cost
//                  is the estimate (1..1,000,000,000), ttl_ms 1..86,400,000
//                  (-1 when absent), max_wait_ms 0
//     settle       [id, actual] | [{"id", "actual"}]; cancel [id] | [{"id"}]:
//                  one item with no rule or key, `reservation` the id (a
//                  positive integer), cost the actual (cancel: 0)
//     health, stats, rules, reload, and any unknown method name: params are
//                  skipped (any array), no items; an unknown name gives
//                  Method::kUnknown so the caller answers UNKNOWN_METHOD.
//   In a map form, entries with other names (or non-str names) are skipped
//   for forward compatibility and counted in request->unknown_fields (peek's
//   "cost" is not: it is documented as ignored); a repeated name keeps the
//   last value.
//
// Results:
// - kOk: `consumed` is the frame's length; the next frame starts there.
// - kIncomplete: the frame continues past `buffer` (an empty buffer too).
//   Re-run on the same frame start when more bytes arrive; a run costs at
//   most two passes over the bytes so far, and a container header whose
//   count exceeds the bytes left stops it at once.
// - kError: the frame is well-formed MessagePack of at most max_frame_bytes
//   and max_depth, but not a valid request. `consumed` is the whole frame;
//   `message` says what is wrong; `error` is TOO_LARGE for a key over
//   max_key_bytes, an acquire_all over max_items items, or an array or map
//   over max_items, BAD_REQUEST otherwise. has_msgid is set when the frame
//   is a request ([0, ...]) whose msgid is an integer, and only then
//   should the caller answer; otherwise (a notification, a response
//   [1, ...] or another type, a top-level value that is not an array) it
//   skips the frame silently. A request ([0, ...]) without an integer msgid
//   is kFatal instead: no answer could ever reach its caller, so the caller
//   notifies the error (writeErrorNotification) and closes the connection,
//   which fails the client's calls at once instead of leaving one hanging.
// - kFatal: the stream cannot be framed any further: bytes that are not
//   MessagePack (0xc1) anywhere in the frame (BAD_REQUEST), a frame that is
//   or declares more than max_frame_bytes (TOO_LARGE; also when `buffer`
//   holds max_frame_bytes without a complete frame), or nesting deeper than
//   max_depth (BAD_REQUEST), or a request without an integer msgid
//   (BAD_REQUEST). has_msgid as for kError when the msgid was read before
//   the failure; answer it, or without one write an error notification,
//   then close the connection.
ParseResult parseRequest(std::span<const uint8_t> buffer, const Limits& limits, Request* request);

// Response encoders; each appends one whole response frame to `out`.
// [1, msgid, {"code": ..., "message": ...}, nil]
void writeError(std::string* out, MsgId msgid, ErrorCode code, std::string_view message);
// [1, msgid, nil, <decision map>]; the map has, in this order, allowed,
// remaining, limit, reset_after_ms, retry_after_ms, mode (modeName()), plus
// "reason": "cost exceeds limit" when decision.cost_exceeds_limit, and
// "waited_ms" when waited_ms >= 0 (a request that was allowed to wait).
void writeDecision(std::string* out, MsgId msgid, const Decision& decision, Mode mode,
                   int64_t waited_ms = -1);
// [1, msgid, nil, {"allowed": all_allowed, "results": [<decision map>...]}];
// modes[i] is the mode of decisions[i] (the spans have the same size).
void writeDecisions(std::string* out, MsgId msgid, bool all_allowed,
                    std::span<const Decision> decisions, std::span<const Mode> modes);
// The seam's Answer to a question of `answer.method`: writeError when it
// failed; writeDecisions for acquire_all; else writeDecision of its one
// decision (with its waited_ms), plus "id" for an allowed reserve, and
// "id", "refunded", "debt" and "unpaid" for a settle or cancel.
void writeAnswer(std::string* out, MsgId msgid, const Answer& answer);
// [1, msgid, nil, then the caller writes the result value with the Writer.
void writeResultHeader(std::string* out, MsgId msgid);
// [2, "error", [{"code": ..., "message": ...}]]: the error of a frame that
// has no msgid to answer, written before the connection is closed.
void writeErrorNotification(std::string* out, ErrorCode code, std::string_view message);

}  // namespace sluice::rpc

// RPC: MessagePack-RPC framing, request decoding and response encoding for
// the wire contract in DESIGN.md ("Protocol"). Pure functions over bytes: no
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

namespace sluice::rpc {

// Stable error codes, sent as the `code` of an error map. Extend, never rename.
enum class ErrorCode {
  kBadRequest,     // BAD_REQUEST: the request's shape or a value is wrong
  kUnknownRule,    // UNKNOWN_RULE: no rule has that name
  kUnknownMethod,  // UNKNOWN_METHOD
  kOverloaded,     // OVERLOADED: a bound was reached (keys, waiters, ...)
  kForbidden,      // FORBIDDEN: the caller may not use this method
  kTooLarge,       // TOO_LARGE: frame, key or item count over its limit
  kInternal,       // INTERNAL: a bug; logged
};
std::string_view errorCodeName(ErrorCode code);

enum class Method {
  kAcquire,
  kAcquireAll,
  kPeek,
  kRelease,
  kHealth,
  kStats,
  kRules,
  kReload,
  kUnknown,
};
Method methodFromName(std::string_view name);

// Bounds on what one frame may contain; from the [limits] config section.
struct Limits {
  size_t max_frame_bytes = 64 * 1024;
  size_t max_key_bytes = 4096;
  uint32_t max_depth = 16;      // nesting of arrays and maps
  uint32_t max_items = 1024;    // array elements plus map entries in a frame;
                                // also the most items of one acquire_all
};

// One (rule, key, cost) of acquire, peek, release or acquire_all. The views
// point into the parsed buffer and live as long as it does.
struct Item {
  std::string_view rule;
  std::string_view key;
  int64_t cost = 1;  // peek: 0
};

struct Request {
  bool notification = false;
  uint32_t msgid = 0;
  Method method = Method::kUnknown;
  std::string_view method_name;
  // acquire, peek, release: exactly one item; acquire_all: one or more;
  // other methods: none.
  std::vector<Item> items;
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
  uint32_t msgid = 0;
  ErrorCode error = ErrorCode::kBadRequest;
  std::string_view message;  // static text saying what was wrong
};

// Decodes the first frame of `buffer` into `request` (reusing its storage).
// Checks every bound in `limits`. A method name that is not known still
// parses (kOk with Method::kUnknown) so the caller answers UNKNOWN_METHOD.
ParseResult parseRequest(std::span<const uint8_t> buffer, const Limits& limits, Request* request);

// Response encoders; each appends one whole response frame to `out`.
// [1, msgid, {"code": ..., "message": ...}, nil]
void writeError(std::string* out, uint32_t msgid, ErrorCode code, std::string_view message);
// [1, msgid, nil, <decision map>]; the map has allowed, remaining, limit,
// reset_after_ms, retry_after_ms, mode, plus "reason" when the cost can never
// pass.
void writeDecision(std::string* out, uint32_t msgid, const Decision& decision, Mode mode);
// [1, msgid, nil, {"allowed": all_allowed, "results": [<decision map>...]}]
void writeDecisions(std::string* out, uint32_t msgid, bool all_allowed,
                    std::span<const Decision> decisions, std::span<const Mode> modes);
// [1, msgid, nil, then the caller writes the result value with the Writer.
void writeResultHeader(std::string* out, uint32_t msgid);

}  // namespace sluice::rpc

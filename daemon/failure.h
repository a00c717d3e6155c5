// Failure: the daemon's error policy for the request path, written once.
//
// Expected failures (bad input, an unknown rule, a full key table, Redis
// down) are values: the client gets an error answer with a stable code
// (rpc.h), counted by code in stats (`errors`) and /metrics; the daemon goes
// on. Nothing is logged per request: a flood of bad requests must not become
// a flood of log lines.
//
// An impossible state (one the code's own invariants rule out: a held frame
// that no longer parses) is a bug. It is logged, and it stops debug and
// sanitizer builds at once (abort), where tests and fuzzing run, so that it
// is found; a release build answers the client INTERNAL (counted like any
// error) and goes on. It never silently drops a client's answer.
//
// Any worker thread; answerError() appends to the caller's buffer.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "metrics.h"
#include "rpc.h"

namespace sluice {

// Answers an error into `out` and counts it by code.
void answerError(MetricsShard& metrics, rpc::MsgId msgid, rpc::ErrorCode code,
                 std::string_view message, std::string* out);

// Whether impossible() aborts: in debug and sanitizer builds.
#if !defined(NDEBUG) || defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
inline constexpr bool kImpossibleAborts = true;
#else
inline constexpr bool kImpossibleAborts = false;
#endif

// Reports an impossible state (see above): logs `what`, then aborts in debug
// and sanitizer builds; returns in release builds, where the caller answers
// INTERNAL.
void impossible(std::string_view what);

// The message of UNKNOWN_RULE for a request naming `name`.
std::string unknownRule(std::string_view name);

}  // namespace sluice

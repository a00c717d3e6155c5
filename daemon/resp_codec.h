// resp_codec: the Redis protocol's words, pure functions with no sockets;
// RespCodec (resp_front.h) speaks them on a connection.
//
// In: RESP2 commands, as arrays of bulk strings (what every client library
// sends) or inline (a line of words, what telnet and redis-cli's inline
// mode send), bounded like frames on the main socket. Each command becomes
// a Command: a reply the front writes at once (PING, ECHO, HELLO, ...,
// errors), or a Question for the dispatcher and how to write its Answer.
//
// Out: RESP2 replies. CL.THROTTLE key max_burst count period [quantity]
// answers as redis-cell does, [limited, max_burst + 1, remaining,
// retry_after_s or -1, reset_after_s]; SLUICE.ACQUIRE and SLUICE.PEEK
// answer [allowed, remaining, limit, reset_after_ms, retry_after_ms, mode].
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "question.h"

namespace sluice::resp {

struct Limits {
  size_t max_command_bytes = 64 * 1024;  // one command, framing included
  size_t max_arguments = 1024;
  size_t max_key_bytes = 4096;
};

enum class Parse {
  kCommand,     // one command in `args`; `consumed` bytes of the input were it
  kIncomplete,  // more bytes are needed (none consumed)
  kError,       // malformed or over a limit: reply `error` and close
};

// Parses the first command in `input`. The views in `args` point into
// `input`. An empty inline line is skipped (consumed, no arguments).
Parse parseCommand(std::string_view input, const Limits& limits, size_t* consumed,
                   std::vector<std::string_view>* args, std::string* error);

// Reply encoders; each appends one reply to `out`.
void writeSimple(std::string* out, std::string_view text);  // +text
void writeError(std::string* out, std::string_view text);   // -text
void writeInteger(std::string* out, int64_t value);         // :value
void writeBulk(std::string* out, std::string_view text);    // $len text
void writeNull(std::string* out);                           // $-1
void writeArrayHeader(std::string* out, size_t count);      // *count

// How a question's answer is written.
enum class Shape {
  kThrottle,  // CL.THROTTLE: redis-cell's five integers
  kDecision,  // SLUICE.ACQUIRE, SLUICE.PEEK
};

// The parameters of a CL.THROTTLE, which name its parametric rule.
struct Throttle {
  int64_t max_burst = 0;
  int64_t count = 0;
  int64_t period_s = 0;
  int64_t quantity = 1;
};
// The name of the parametric rule of (max_burst, count, period):
// "cl.throttle/B/C/P"; it appears in Redis key names of a global one.
std::string throttleRuleName(const Throttle& throttle);

// What the front does with a command.
struct Command {
  enum class Kind {
    kReply,     // write `reply`
    kQuit,      // write `reply`, then close
    kAsk,       // ask `item` of `method`, write its answer as `shape`
  };
  Kind kind = Kind::kReply;
  std::string reply;
  Method method = Method::kAcquire;
  Item item;  // rule and key view the arguments, or `rule_name`
  Shape shape = Shape::kDecision;
  bool throttle = false;  // a CL.THROTTLE: `parameters` name the rule
  Throttle parameters;
};

// Turns parsed arguments into a Command. For a CL.THROTTLE, item.rule is
// left empty: the front names it (throttleRuleName) once it has the rule.
Command interpret(const std::vector<std::string_view>& args, const Limits& limits);

// Writes the answer to a question of `shape` (for kThrottle, `max_burst`
// gives the reply's limit).
void writeAnswer(std::string* out, Shape shape, int64_t max_burst, const Answer& answer);

}  // namespace sluice::resp

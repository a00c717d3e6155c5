// resp_fuzz: one client's byte stream through the Redis protocol front's
// codec, as RespCodec::read (daemon/resp_front.cpp) runs it: resp::parseCommand
// over the buffered bytes, resp::interpret on each command, until an
// unfinished command or an error (after which the front closes).
//
// Properties checked on every command:
//  - a command consumes at least one byte and no more than it was given;
//    an error says "ERR Protocol error" on one line;
//  - every prefix of the bytes a command took parses as unfinished, or as
//    the same command (a trickled command is read as the whole one);
//  - a reply the front writes at once is one well-formed RESP2 value
//    (+, -, :, $ or * first, CRLF last, no CR or LF inside an error);
//  - a question has a key within max_key_bytes, a cost within 0..10^9, a
//    rule named unless it is a CL.THROTTLE, whose parameters are in range;
//  - an answer to it, allowed, denied or failed, is written well-formed.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.h"
#include "resp_codec.h"

namespace {

using namespace sluice;

const resp::Limits kLimits{.max_command_bytes = 4096, .max_arguments = 64, .max_key_bytes = 256};

bool wellFormed(std::string_view reply) {
  if (reply.size() < 3 || reply.substr(reply.size() - 2) != "\r\n") return false;
  char kind = reply.front();
  if (kind == '-') {
    return reply.substr(0, reply.size() - 2).find_first_of("\r\n") == std::string_view::npos;
  }
  return kind == '+' || kind == ':' || kind == '$' || kind == '*';
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> args;
  std::vector<std::string_view> again;
  size_t offset = 0;
  while (offset < input.size()) {
    std::string_view rest = input.substr(offset);
    size_t consumed = 0;
    std::string error;
    resp::Parse parse = resp::parseCommand(rest, kLimits, &consumed, &args, &error);
    if (parse == resp::Parse::kIncomplete) break;
    if (parse == resp::Parse::kError) {
      FUZZ_CHECK(error.rfind("ERR Protocol error", 0) == 0, "a protocol error says so");
      std::string reply;
      resp::writeError(&reply, error);
      FUZZ_CHECK(wellFormed(reply), "a protocol error is one RESP error");
      break;
    }
    FUZZ_CHECK(consumed > 0 && consumed <= rest.size(), "a command takes what it was given");
    for (size_t cut = 0; cut < consumed; cut += 1 + cut / 8) {
      size_t partial = 0;
      std::string ignored;
      resp::Parse early = resp::parseCommand(rest.substr(0, cut), kLimits, &partial, &again, &ignored);
      FUZZ_CHECK(early != resp::Parse::kCommand || (partial == consumed && again == args) ||
                     (rest.front() != '*' && partial <= cut),
                 "a prefix is unfinished or the same command");
    }
    offset += consumed;
    if (args.empty()) continue;
    resp::Command command = resp::interpret(args, kLimits);
    if (command.kind != resp::Command::Kind::kAsk) {
      FUZZ_CHECK(command.reply.empty() || wellFormed(command.reply), "a reply is well-formed");
      if (command.kind == resp::Command::Kind::kQuit) break;
      continue;
    }
    FUZZ_CHECK(command.item.key.size() <= kLimits.max_key_bytes, "a key within max_key_bytes");
    FUZZ_CHECK(command.item.cost >= 0 && command.item.cost <= 1'000'000'000, "a cost in range");
    if (command.throttle) {
      const resp::Throttle& p = command.parameters;
      FUZZ_CHECK(p.max_burst >= 0 && p.count >= 1 && p.period_s >= 1 && p.quantity >= 0,
                 "throttle parameters in range");
    } else {
      FUZZ_CHECK(!command.item.rule.empty() || args.size() > 1, "a rule is named");
    }
    for (int outcome = 0; outcome < 3; ++outcome) {
      Answer answer;
      if (outcome == 2) {
        answer.fail(ErrorCode::kUnknownRule, std::string(command.item.key));
      } else {
        Decision decision;
        decision.allowed = outcome == 0;
        decision.remaining = static_cast<int64_t>(command.item.cost);
        decision.retry_after_ms = outcome == 0 ? 0 : 1500;
        answer.decide(decision, Mode::kLocal);
      }
      std::string reply;
      resp::writeAnswer(&reply, command.shape, command.parameters.max_burst, answer);
      FUZZ_CHECK(wellFormed(reply), "an answer is well-formed");
    }
  }
  return 0;
}

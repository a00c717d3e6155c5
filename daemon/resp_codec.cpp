// RespCodec; see resp_codec.h.
#include "resp_codec.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>

#include "config.h"

namespace sluice::resp {

namespace {

// The largest quantity a call may ask, as a cost on the MessagePack socket.
constexpr int64_t kMaxQuantity = 1'000'000'000;
// CL.THROTTLE's parameters: a burst and count a rule can hold, a period of
// at most a year.
constexpr int64_t kMaxBurst = 1'000'000'000;
constexpr int64_t kMaxCount = 1'000'000'000;
constexpr int64_t kMaxPeriodS = 366LL * 24 * 3600;

std::optional<int64_t> parseInteger(std::string_view text) {
  int64_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
    return std::nullopt;
  }
  return value;
}

std::string upper(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

// A command name of at most this many bytes is upper-cased in place;
// a longer one names no command.
constexpr size_t kLongestName = 16;

// Reads "<digits>\r\n" (an optional '-' first) at `at`; false when
// incomplete (`incomplete` set) or malformed. One pass over the bytes: every
// command has a length per argument, so this is the parser's inner loop.
bool readLength(std::string_view input, size_t* at, int64_t* value, bool* incomplete) {
  size_t i = *at;
  const bool negative = i < input.size() && input[i] == '-';
  if (negative) ++i;
  const size_t first_digit = i;
  uint64_t magnitude = 0;
  while (i < input.size() && input[i] >= '0' && input[i] <= '9') {
    // 18 digits always fit; a longer number is no length.
    if (i - first_digit == 18) return false;
    magnitude = magnitude * 10 + static_cast<uint64_t>(input[i] - '0');
    ++i;
  }
  if (i + 1 >= input.size()) {
    // Digits up to the end, or a CR without its LF yet: more may come. Any
    // other byte is malformed whatever follows.
    if (i == input.size() || input[i] == '\r') {
      *incomplete = true;
    }
    return false;
  }
  if (i == first_digit || input[i] != '\r' || input[i + 1] != '\n') return false;
  *value = negative ? -static_cast<int64_t>(magnitude) : static_cast<int64_t>(magnitude);
  *at = i + 2;
  return true;
}

Command reply(std::string text) {
  Command command;
  command.reply = std::move(text);
  return command;
}

Command error(std::string_view text) {
  Command command;
  writeError(&command.reply, text);
  return command;
}

Command wrongArguments(std::string_view name) {
  return error("ERR wrong number of arguments for '" + std::string(name) + "' command");
}

}  // namespace

void writeSimple(std::string* out, std::string_view text) {
  *out += '+';
  *out += text;
  *out += "\r\n";
}

void writeError(std::string* out, std::string_view text) {
  *out += '-';
  // An error is one line: a newline in it would end the reply early.
  for (char c : text) *out += (c == '\r' || c == '\n') ? ' ' : c;
  *out += "\r\n";
}

void writeInteger(std::string* out, int64_t value) {
  char text[24];
  text[0] = ':';
  char* end = std::to_chars(text + 1, text + sizeof(text) - 2, value).ptr;
  *end++ = '\r';
  *end++ = '\n';
  out->append(text, static_cast<size_t>(end - text));
}

void writeBulk(std::string* out, std::string_view text) {
  *out += '$';
  *out += std::to_string(text.size());
  *out += "\r\n";
  *out += text;
  *out += "\r\n";
}

void writeNull(std::string* out) { *out += "$-1\r\n"; }

void writeArrayHeader(std::string* out, size_t count) {
  *out += '*';
  *out += std::to_string(count);
  *out += "\r\n";
}

Parse parseCommand(std::string_view input, const Limits& limits, size_t* consumed,
                   std::vector<std::string_view>* args, std::string* error) {
  args->clear();
  *consumed = 0;
  if (input.empty()) return Parse::kIncomplete;
  if (input.front() != '*') {
    // Inline: one line of words separated by blanks.
    size_t end = input.find('\n');
    if (end == std::string_view::npos) {
      if (input.size() > limits.max_command_bytes) {
        *error = "ERR Protocol error: too big inline request";
        return Parse::kError;
      }
      return Parse::kIncomplete;
    }
    if (end + 1 > limits.max_command_bytes) {
      *error = "ERR Protocol error: too big inline request";
      return Parse::kError;
    }
    std::string_view line = input.substr(0, end);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    size_t at = 0;
    while (at < line.size()) {
      while (at < line.size() && (line[at] == ' ' || line[at] == '\t')) ++at;
      size_t start = at;
      while (at < line.size() && line[at] != ' ' && line[at] != '\t') ++at;
      if (at > start) {
        if (args->size() == limits.max_arguments) {
          *error = "ERR Protocol error: too many arguments";
          return Parse::kError;
        }
        args->push_back(line.substr(start, at - start));
      }
    }
    *consumed = end + 1;
    return Parse::kCommand;
  }
  size_t at = 1;
  int64_t count = 0;
  bool incomplete = false;
  if (!readLength(input, &at, &count, &incomplete)) {
    if (incomplete && input.size() <= limits.max_command_bytes) return Parse::kIncomplete;
    *error = "ERR Protocol error: invalid multibulk length";
    return Parse::kError;
  }
  if (count < 0 || static_cast<uint64_t>(count) > limits.max_arguments) {
    *error = count < 0 ? "ERR Protocol error: invalid multibulk length"
                       : "ERR Protocol error: too many arguments (at most " +
                             std::to_string(limits.max_arguments) + ")";
    return Parse::kError;
  }
  for (int64_t i = 0; i < count; ++i) {
    if (at >= input.size()) return Parse::kIncomplete;
    if (input[at] != '$') {
      *error = "ERR Protocol error: expected '$', got '" +
               std::string(1, std::isprint(static_cast<unsigned char>(input[at])) ? input[at] : '?') +
               "'";
      return Parse::kError;
    }
    ++at;
    int64_t length = 0;
    incomplete = false;
    if (!readLength(input, &at, &length, &incomplete)) {
      if (incomplete && input.size() <= limits.max_command_bytes) return Parse::kIncomplete;
      *error = "ERR Protocol error: invalid bulk length";
      return Parse::kError;
    }
    if (length < 0 || static_cast<uint64_t>(length) > limits.max_command_bytes ||
        at + static_cast<size_t>(length) > limits.max_command_bytes) {
      *error = "ERR Protocol error: invalid bulk length (a command is at most " +
               std::to_string(limits.max_command_bytes) + " bytes)";
      return Parse::kError;
    }
    size_t size = static_cast<size_t>(length);
    if (input.size() < at + size + 2) return Parse::kIncomplete;
    if (input.substr(at + size, 2) != "\r\n") {
      *error = "ERR Protocol error: bulk string not ended by CRLF";
      return Parse::kError;
    }
    args->push_back(input.substr(at, size));
    at += size + 2;
  }
  *consumed = at;
  return Parse::kCommand;
}

std::string throttleRuleName(const Throttle& throttle) {
  return std::string(kThrottleRulePrefix) + std::to_string(throttle.max_burst) + "/" +
         std::to_string(throttle.count) + "/" + std::to_string(throttle.period_s);
}

Command interpret(const std::vector<std::string_view>& args, const Limits& limits) {
  if (args.empty()) return reply("");
  char buffer[kLongestName];
  std::string_view name;
  if (args[0].size() <= kLongestName) {
    for (size_t i = 0; i < args[0].size(); ++i) {
      const char c = args[0][i];
      buffer[i] = c >= 'a' && c <= 'z' ? static_cast<char>(c - 'a' + 'A') : c;
    }
    name = std::string_view(buffer, args[0].size());
  }
  const size_t n = args.size();
  if (name == "PING") {
    if (n > 2) return wrongArguments("ping");
    Command command;
    if (n == 2) {
      writeBulk(&command.reply, args[1]);
    } else {
      writeSimple(&command.reply, "PONG");
    }
    return command;
  }
  if (name == "ECHO") {
    if (n != 2) return wrongArguments("echo");
    Command command;
    writeBulk(&command.reply, args[1]);
    return command;
  }
  if (name == "QUIT") {
    Command command;
    command.kind = Command::Kind::kQuit;
    writeSimple(&command.reply, "OK");
    return command;
  }
  if (name == "SELECT") {
    if (n != 2) return wrongArguments("select");
    if (args[1] != "0") return error("ERR DB index is out of range (sluiced has database 0 only)");
    Command command;
    writeSimple(&command.reply, "OK");
    return command;
  }
  if (name == "CLIENT") {
    std::string sub = n > 1 ? upper(args[1]) : "";
    Command command;
    if (sub == "SETNAME" || sub == "SETINFO") {
      writeSimple(&command.reply, "OK");
    } else if (sub == "GETNAME") {
      writeNull(&command.reply);
    } else {
      return error("ERR unknown subcommand '" + std::string(n > 1 ? args[1] : "") +
                   "' of CLIENT: sluiced knows SETNAME, SETINFO and GETNAME");
    }
    return command;
  }
  if (name == "HELLO") {
    // RESP3 is not spoken: a client asking for it falls back to RESP2.
    if (n > 1 && args[1] != "2") {
      return error("NOPROTO sluiced speaks RESP2 only; connect with protocol 2");
    }
    Command command;
    writeArrayHeader(&command.reply, 6);
    writeBulk(&command.reply, "server");
    writeBulk(&command.reply, "sluiced");
    writeBulk(&command.reply, "proto");
    writeInteger(&command.reply, 2);
    writeBulk(&command.reply, "mode");
    writeBulk(&command.reply, "standalone");
    return command;
  }
  if (name == "INFO") {
    // What clients read at connect (ioredis' ready check waits for loading:0).
    Command command;
    writeBulk(&command.reply,
              "# Server\r\nredis_version:7.0.0\r\nsluiced:1\r\nredis_mode:standalone\r\n"
              "# Persistence\r\nloading:0\r\n");
    return command;
  }
  if (name == "COMMAND") {
    // Clients ask it for metadata they can do without: an empty list.
    Command command;
    writeArrayHeader(&command.reply, 0);
    return command;
  }
  if (name == "CL.THROTTLE") {
    if (n != 5 && n != 6) return wrongArguments("cl.throttle");
    if (args[1].size() > limits.max_key_bytes) {
      return error("ERR key is longer than " + std::to_string(limits.max_key_bytes) +
                   " bytes ([limits] max_key_bytes)");
    }
    std::optional<int64_t> burst = parseInteger(args[2]);
    std::optional<int64_t> count = parseInteger(args[3]);
    std::optional<int64_t> period = parseInteger(args[4]);
    std::optional<int64_t> quantity = n == 6 ? parseInteger(args[5]) : std::optional<int64_t>(1);
    if (!burst || *burst < 0 || *burst > kMaxBurst) {
      return error("ERR max_burst must be an integer 0.." + std::to_string(kMaxBurst));
    }
    if (!count || *count < 1 || *count > kMaxCount) {
      return error("ERR count must be an integer 1.." + std::to_string(kMaxCount));
    }
    if (!period || *period < 1 || *period > kMaxPeriodS) {
      return error("ERR period must be an integer 1.." + std::to_string(kMaxPeriodS) +
                   " (seconds)");
    }
    if (!quantity || *quantity < 0 || *quantity > kMaxQuantity) {
      return error("ERR quantity must be an integer 0.." + std::to_string(kMaxQuantity));
    }
    Command command;
    command.kind = Command::Kind::kAsk;
    command.method = Method::kAcquire;
    command.shape = Shape::kThrottle;
    command.throttle = true;
    command.parameters = Throttle{*burst, *count, *period, *quantity};
    command.item.key = args[1];
    command.item.cost = *quantity;
    return command;
  }
  if (name == "SLUICE.ACQUIRE" || name == "SLUICE.PEEK") {
    const bool peek = name == "SLUICE.PEEK";
    if (n < 3 || n > 4) return wrongArguments(peek ? "sluice.peek" : "sluice.acquire");
    if (args[2].size() > limits.max_key_bytes) {
      return error("ERR key is longer than " + std::to_string(limits.max_key_bytes) +
                   " bytes ([limits] max_key_bytes)");
    }
    Command command;
    command.kind = Command::Kind::kAsk;
    command.method = peek ? Method::kPeek : Method::kAcquire;
    command.shape = Shape::kDecision;
    command.item.rule = args[1];
    command.item.key = args[2];
    command.item.cost = peek ? 0 : 1;
    if (n == 4) {
      std::optional<int64_t> cost = parseInteger(args[3]);
      if (!cost || *cost < 0 || *cost > kMaxQuantity) {
        return error("ERR cost must be an integer 0.." + std::to_string(kMaxQuantity));
      }
      command.item.cost = *cost;
    }
    return command;
  }
  std::string shown(args[0].substr(0, 64));
  for (char& c : shown) {
    if (!std::isprint(static_cast<unsigned char>(c))) c = '?';
  }
  return error("ERR unknown command '" + shown +
               "': sluiced answers CL.THROTTLE, SLUICE.ACQUIRE, SLUICE.PEEK, PING, ECHO, "
               "QUIT, SELECT, CLIENT, HELLO, INFO and COMMAND");
}

void writeAnswer(std::string* out, Shape shape, int64_t max_burst, const Answer& answer) {
  if (answer.failed) {
    writeError(out, std::string(errorCodeName(answer.error)) + " " + answer.message);
    return;
  }
  if (answer.decisions.empty()) {
    writeError(out, "INTERNAL the daemon answered no decision");
    return;
  }
  const Decision& d = answer.decisions.front();
  if (shape == Shape::kThrottle) {
    // redis-cell's seconds are whole, truncated; retry -1 when allowed, or
    // when the quantity is more than the burst could ever hold.
    writeArrayHeader(out, 5);
    writeInteger(out, d.allowed ? 0 : 1);
    writeInteger(out, max_burst + 1);
    writeInteger(out, std::max<int64_t>(0, d.remaining));
    writeInteger(out, d.allowed || d.cost_exceeds_limit ? -1 : d.retry_after_ms / 1000);
    writeInteger(out, std::max<int64_t>(0, d.reset_after_ms) / 1000);
    return;
  }
  writeArrayHeader(out, 6);
  writeInteger(out, d.allowed ? 1 : 0);
  writeInteger(out, d.remaining);
  writeInteger(out, d.limit);
  writeInteger(out, d.reset_after_ms);
  writeInteger(out, d.retry_after_ms);
  writeBulk(out, modeName(answer.modes.empty() ? Mode::kLocal : answer.modes.front()));
}

}  // namespace sluice::resp

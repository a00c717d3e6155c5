// RespFront and RespCodec; see resp_front.h.
#include "resp_front.h"

namespace sluice {

std::unique_ptr<Codec> RespFront::makeCodec() { return std::make_unique<RespCodec>(*this); }

bool RespFront::throttleRule(const resp::Throttle& throttle, std::string_view* name,
                             std::string* error) {
  auto key = std::make_tuple(throttle.max_burst, throttle.count, throttle.period_s);
  auto known = throttle_rules_.find(key);
  if (known == throttle_rules_.end()) {
    RuleSetPtr rules = ensure_rule_ ? ensure_rule_(throttle, error) : nullptr;
    if (rules == nullptr) {
      if (!ensure_rule_) *error = "CL.THROTTLE is not served here";
      return false;
    }
    // This worker decides on it now; its queue brings the same set later.
    dispatcher_.setRules(std::move(rules));
    known = throttle_rules_.emplace(key, resp::throttleRuleName(throttle)).first;
  }
  *name = known->second;
  return true;
}

Frame RespCodec::read(std::span<const uint8_t> bytes, int64_t /*now_ns*/, std::string* out) {
  Frame frame;
  std::string_view input(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  std::string error;
  resp::Parse parse = resp::parseCommand(input, front_.limits(), &frame.consumed, &args_, &error);
  if (parse == resp::Parse::kIncomplete) return frame;
  if (parse == resp::Parse::kError) {
    // Nothing after a malformed command can be framed: say why and close.
    resp::writeError(out, error);
    frame.kind = Frame::Kind::kLast;
    frame.consumed = bytes.size();
    frame.close_reason = CloseReason::kUnreadable;
    return frame;
  }
  frame.kind = Frame::Kind::kReplied;
  if (args_.empty()) return frame;  // an empty inline line
  command_ = resp::interpret(args_, front_.limits());
  if (command_.kind != resp::Command::Kind::kAsk) {
    *out += command_.reply;
    if (command_.kind == resp::Command::Kind::kQuit) {
      frame.kind = Frame::Kind::kLast;
      frame.close_reason = CloseReason::kPeerClosed;
    }
    return frame;
  }
  item_ = command_.item;
  int64_t max_burst = 0;
  if (command_.throttle) {
    std::string refusal;
    if (!front_.throttleRule(command_.parameters, &item_.rule, &refusal)) {
      resp::writeError(out, "ERR " + refusal);
      return frame;
    }
    max_burst = command_.parameters.max_burst;
  }
  frame.kind = Frame::Kind::kQuestion;
  frame.question = Question{command_.method, {&item_, 1}};
  frame.tag = MsgId(static_cast<uint64_t>(max_burst) << 1 |
                    (command_.shape == resp::Shape::kThrottle ? 1u : 0u));
  return frame;
}

void RespCodec::writeAnswer(std::string* out, MsgId tag, const Answer& answer) {
  const resp::Shape shape = (tag.bits & 1) != 0 ? resp::Shape::kThrottle : resp::Shape::kDecision;
  resp::writeAnswer(out, shape, static_cast<int64_t>(tag.bits >> 1), answer);
}

}  // namespace sluice

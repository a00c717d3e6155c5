// HttpFront and HttpCodec; see http_front.h.
#include "http_front.h"

#include <ctime>
#include <optional>
#include <utility>

namespace sluice {

HttpFront::HttpFront(Dispatcher& dispatcher, const Options& options, WallClock wall_clock_s)
    : dispatcher_(dispatcher), options_(options), wall_clock_s_(std::move(wall_clock_s)) {}

std::unique_ptr<Codec> HttpFront::makeCodec(const Peer& peer) {
  return std::make_unique<HttpCodec>(*this, peer);
}

std::string_view HttpFront::date() {
  const int64_t now_s = wall_clock_s_ ? wall_clock_s_() : static_cast<int64_t>(std::time(nullptr));
  if (now_s != date_s_) {
    date_s_ = now_s;
    date_ = http::imfDate(now_s);
  }
  return date_;
}

bool HttpCodec::frameReady(std::span<const uint8_t> bytes) {
  std::string_view input(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  const http::Limits& limits = front_.options().limits;
  if (needed_ == 0) {
    const size_t end = http::headEnd(input, &scanned_);
    // Past the bound read() refuses it.
    if (end == 0) return input.size() > limits.max_request_bytes;
    http::Refusal refusal;
    if (http::parseRequest(input.substr(0, end), limits, &request_, &refusal) !=
            http::Parse::kIncomplete ||
        request_.consumed == 0) {
      return true;  // whole without a body, or refused: read() says which
    }
    needed_ = request_.consumed;
    // The head is whole and the body is not: read() answers a client that
    // waits for "100 Continue" before it sends the body.
    if (input.size() < needed_ && expectsContinue()) return true;
  }
  return input.size() >= needed_;
}

Frame HttpCodec::read(std::span<const uint8_t> bytes, int64_t /*now_ns*/, std::string* out) {
  Frame frame;
  std::string_view input(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  http::Refusal refusal;
  const http::Parse parse =
      http::parseRequest(input, front_.options().limits, &request_, &refusal);
  if (parse == http::Parse::kIncomplete) {
    // A client that waits for "100 Continue" before it sends its body
    // (curl does, for a large one) gets it once its head is whole, as
    // libmicrohttpd answered it.
    if (request_.consumed > 0 && expectsContinue()) {
      *out += "HTTP/1.1 100 Continue\r\n\r\n";
      continued_ = true;
    }
    return frame;
  }
  continued_ = false;
  if (parse == http::Parse::kError) {
    // Nothing after a malformed request can be framed: say why and close.
    keep_alive_ = false;
    keep_alive_1_0_ = false;
    head_ = false;
    reply(out, http::problem(refusal.status, refusal.detail));
    frame.kind = Frame::Kind::kLast;
    frame.consumed = bytes.size();
    frame.close_reason = CloseReason::kUnreadable;
    return frame;
  }
  frame.consumed = request_.consumed;
  keep_alive_ = request_.keep_alive;
  keep_alive_1_0_ = keep_alive_ && request_.minor_version == 0;
  head_ = request_.method == "HEAD";
  // The client asked to close after this answer.
  frame.close_reason = CloseReason::kPeerClosed;
  frame.kind = keep_alive_ ? Frame::Kind::kReplied : Frame::Kind::kLast;
  if (!peer_.allowed) {
    reply(out, http::problem(403, "this user may not use sluiced ([access])"));
    return frame;
  }

  // The path and the parameters, percent-decoded into decoded_: each is a
  // distinct part of the target and decodes to no more bytes than it has,
  // so the buffer never grows while views into it are handed out.
  const std::string_view query = request_.query;
  if (decoded_.size() < request_.target.size()) decoded_.resize(request_.target.size());
  size_t used = 0;
  auto decode = [&](std::string_view raw, bool plus_is_space) {
    const size_t size = http::percentDecode(raw, plus_is_space, decoded_.data() + used);
    std::string_view value(decoded_.data() + used, size);
    used += size;
    return value;
  };
  auto parameter = [&](std::string_view name) -> std::optional<std::string_view> {
    std::optional<std::string_view> raw = http::queryValue(query, name);
    if (!raw) return std::nullopt;
    return decode(*raw, true);
  };
  const std::string_view path = decode(request_.path, false);
  http::Parameters parameters;
  parameters.query_rule = parameter("rule");
  parameters.query_key = parameter("key");
  parameters.query_cost = parameter("cost");
  parameters.query_key_header = parameter("key_header");
  if (parameters.query_key_header) {
    parameters.named_header = request_.header(*parameters.query_key_header);
  }
  parameters.header_rule = request_.header("Sluice-Rule");
  parameters.header_key = request_.header("Sluice-Key");
  parameters.header_cost = request_.header("Sluice-Cost");
  parameters.query_estimate = parameter("estimate");
  parameters.query_ttl_ms = parameter("ttl_ms");
  parameters.query_id = parameter("id");
  parameters.query_actual = parameter("actual");
  http::Parsed parsed =
      http::parseCheck(path, request_.method, parameters, front_.options().max_key_bytes);
  if (!parsed.ok) {
    reply(out, parsed.refusal);
    return frame;
  }
  rule_name_.assign(parsed.item.rule);
  item_ = parsed.item;
  frame.kind = Frame::Kind::kQuestion;
  frame.question = Question{parsed.method, {&item_, 1}};
  frame.close_after = !keep_alive_;
  return frame;
}

bool HttpCodec::expectsContinue() const {
  if (continued_ || request_.minor_version != 1) return false;
  std::optional<std::string_view> expect = request_.header("Expect");
  return expect && http::equalsIgnoringCase(*expect, "100-continue");
}

void HttpCodec::writeAnswer(std::string* out, MsgId /*tag*/, const Answer& answer) {
  const Rule* rule = answer.failed ? nullptr : front_.dispatcher().rules().find(rule_name_);
  reply(out, http::encodeAnswer(answer, rule, rule_name_, front_.options().deny_status));
}

void HttpCodec::reply(std::string* out, const http::Reply& response) {
  const std::string_view connection = !keep_alive_      ? "close"
                                      : keep_alive_1_0_ ? "Keep-Alive"
                                                        : "";
  http::writeResponse(out, response, connection, front_.date(), !head_);
}

}  // namespace sluice

// RpcFront: MessagePack-RPC over the decision seam; see rpc_front.h.
#include "rpc_front.h"

#include "failure.h"

namespace sluice {

void RpcFront::handleParseError(const rpc::ParseResult& result, std::string* out) {
  if (result.has_msgid) {
    error(result.msgid, result.error, result.message, out);
    return;
  }
  metrics_.errors[static_cast<size_t>(result.error)].add();
  // The connection closes after a fatal frame: say why first.
  if (result.status == rpc::ParseStatus::kFatal) {
    rpc::writeErrorNotification(out, result.error, result.message);
  }
}

bool RpcFront::handle(const rpc::Request& request, const Peer& peer, int64_t now_ns,
                      std::string* out, Recipient* recipient) {
  metrics_.requests.add();
  // A notification gets no answer: answer into a scratch buffer and drop it,
  // so a notified acquire or release still takes effect. It never waits.
  std::string* target = out;
  if (request.notification) {
    dropped_.clear();
    target = &dropped_;
    recipient = nullptr;
  }
  if (!peer.allowed) {
    error(request.msgid, ErrorCode::kForbidden,
          "uid " + std::to_string(peer.uid) + " may not use this daemon: it is neither root nor " +
              "the daemon's user, not in [access] users and in none of [access] groups",
          target);
    return false;
  }
  bool waits = false;
  if (decides(request.method)) {
    Question question{request.method, request.items};
    Asker asker = dispatcher_.askerFor(question, recipient, request.msgid, now_ns);
    waits = dispatcher_.ask(question, now_ns, asker, &answer_) != Outcome::kAnswered;
    if (!waits) rpc::writeAnswer(target, request.msgid, answer_);
  } else if (request.method == Method::kUnknown) {
    error(request.msgid, ErrorCode::kUnknownMethod, "no such method", target);
  } else {
    admin_.handle(dispatcher_.rules(), request, peer, now_ns, target);
  }
  return waits;
}

}  // namespace sluice

namespace sluice {

Frame RpcCodec::read(std::span<const uint8_t> bytes, int64_t now_ns, std::string* out) {
  Frame frame;
  rpc::ParseResult result = rpc::parseRequest(bytes, limits_, &request_);
  if (result.status == rpc::ParseStatus::kIncomplete) return frame;
  frame.consumed = result.consumed;
  if (result.status != rpc::ParseStatus::kOk) {
    front_.handleParseError(result, out);
    bad_input_(&result, nullptr);
    frame.kind = result.status == rpc::ParseStatus::kFatal ? Frame::Kind::kLast
                                                            : Frame::Kind::kRefused;
    frame.close_reason = CloseReason::kUnreadable;
    return frame;
  }
  if (request_.unknown_fields > 0) bad_input_(nullptr, &request_);
  if (decides(request_.method) && peer_.allowed) {
    metrics_.requests.add();
    frame.kind = Frame::Kind::kQuestion;
    frame.question = Question{request_.method, request_.items};
    frame.tag = request_.msgid;
    frame.unanswered = request_.notification;
    return frame;
  }
  front_.handle(request_, peer_, now_ns, out);
  frame.kind = Frame::Kind::kReplied;
  return frame;
}

bool RpcCodec::frameReady(std::span<const uint8_t> bytes) {
  if (!scan_) scan_ = std::make_unique<msgpack::SkipState>();
  msgpack::Reader reader(bytes.data(), bytes.size(), limits_.max_frame_bytes);
  // Items are bounded by the frame size here; parseRequest checks max_items.
  bool complete = reader.skipResumable(scan_.get(), limits_.max_depth, UINT32_MAX);
  if (!complete && reader.status() == msgpack::Status::kIncomplete) return false;
  scan_->started = false;
  return true;
}

}  // namespace sluice

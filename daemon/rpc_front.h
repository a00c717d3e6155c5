// RpcFront: the MessagePack-RPC front of one worker, an adapter over the
// decision seam (dispatch.h): a parsed request (rpc.h) in, its encoded
// response out.
//
// It checks the peer (access.h), sends the admin methods to Admin
// (admin.h), asks the dispatcher the decision methods as a Question and
// encodes the Answer (rpc::writeAnswer). A question left waiting is answered
// later to the Recipient handle() was given (the connection), which encodes
// it the same way. A notification is decided as a request is, never waits,
// and its answer is dropped.
//
// RpcCodec is MessagePack-RPC as a connection's codec (codec.h): it reads
// frames, hands the decision methods to the connection as Questions and
// the rest to RpcFront.
//
// An RpcFront belongs to one worker thread and is called only from that
// worker's loop, inside its KeyTable::ReadGuard; so is an RpcCodec.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "access.h"
#include "admin.h"
#include "codec.h"
#include "dispatch.h"
#include "metrics.h"
#include "question.h"
#include "rpc.h"
#include "status.h"

namespace sluice {

class RpcFront {
 public:
  // `broker` is null without Redis.
  RpcFront(Dispatcher& dispatcher, KeyTable& keys, MetricsShard& metrics, DaemonStatus& status,
           LeaseBroker* broker)
      : dispatcher_(dispatcher), metrics_(metrics), admin_(keys, metrics, status, broker) {}

  // Answers `request` into `out` (nothing for a notification). now_ns is the
  // monotonic time of the read that carried the request. With a recipient,
  // a decision may wait: handle() then writes nothing and returns true.
  bool handle(const rpc::Request& request, const Peer& peer, int64_t now_ns, std::string* out,
              Recipient* recipient = nullptr);

  // Answers a request that could not be parsed: the error to its msgid, or
  // before a close (kFatal) without one, an error notification.
  void handleParseError(const rpc::ParseResult& result, std::string* out);

 private:
  void error(MsgId msgid, ErrorCode code, std::string_view message, std::string* out) {
    answerError(metrics_, msgid, code, message, out);
  }

  Dispatcher& dispatcher_;
  MetricsShard& metrics_;
  Admin admin_;
  Answer answer_;        // reused between requests
  std::string dropped_;  // a notification's answer
};

class RpcCodec final : public Codec {
 public:
  // Logs a frame that could not be parsed, or one with unknown fields (the
  // worker's, rate-limited).
  using BadInput = std::function<void(const rpc::ParseResult*, const rpc::Request*)>;
  RpcCodec(RpcFront& front, MetricsShard& metrics, const rpc::Limits& limits, const Peer& peer,
           BadInput bad_input)
      : front_(front), metrics_(metrics), limits_(limits), peer_(peer),
        bad_input_(std::move(bad_input)) {}

  Frame read(std::span<const uint8_t> bytes, int64_t now_ns, std::string* out) override;
  bool frameReady(std::span<const uint8_t> bytes) override;
  void restartFrame() override {
    if (scan_) scan_->started = false;
  }
  void writeAnswer(std::string* out, MsgId tag, const Answer& answer) override {
    rpc::writeAnswer(out, tag, answer);
  }
  bool inOrder() const override { return false; }

 private:
  RpcFront& front_;
  MetricsShard& metrics_;
  const rpc::Limits& limits_;
  const Peer& peer_;
  BadInput bad_input_;
  rpc::Request request_;  // reused for every frame
  // How far the unfinished frame has been walked; allocated the first time
  // a frame arrives in pieces.
  std::unique_ptr<msgpack::SkipState> scan_;
};

}  // namespace sluice

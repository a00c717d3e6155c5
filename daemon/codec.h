// Codec: one wire protocol as a Connection (connection.h) speaks it.
//
// A connection reads bytes; its codec turns the first whole frame of them
// into a Frame: a Question for the decision seam (dispatch.h), or a reply
// the codec wrote itself (an admin method, PING, a malformed frame's
// error). The connection asks the dispatcher each Question and has the
// codec encode the Answer into the write buffer, at once or, for a
// question that waited, when its answer comes. The codec makes no
// decision and touches no socket.
//
// Three codecs: MessagePack-RPC (RpcCodec, rpc_front.h), whose answers
// carry the client's msgid and may go out in any order, the Redis protocol
// (RespCodec, resp_front.h) and HTTP/1.1 (HttpCodec, http_front.h), whose
// replies go out in request order: while one of their questions waits, the
// connection reads no further frame.
//
// One codec per connection, called on that connection's worker thread
// only, inside the worker's KeyTable::ReadGuard.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "metrics.h"
#include "question.h"

namespace sluice {

// The protocol a listener speaks, and so its connections' codec.
enum class Protocol : uint8_t {
  kMsgpackRpc,  // the Unix socket ([daemon] socket)
  kResp,        // [resp] listen
  kHttp,        // [http] listen
};

struct Frame {
  enum class Kind {
    kIncomplete,  // more bytes are needed; nothing was consumed
    kReplied,     // the codec wrote the reply (if any) into `out`
    kRefused,     // not a request (malformed): the codec wrote its error
    kQuestion,    // ask `question`; its answer is encoded with `tag`
    kLast,        // the codec wrote the last reply: read nothing more, close
                  // for `close_reason` once the replies are written
  };
  Kind kind = Kind::kIncomplete;
  size_t consumed = 0;  // bytes of the input the frame took
  Question question;    // kQuestion: views into the input and the codec
  MsgId tag;
  // kQuestion: a MessagePack-RPC notification. It is decided, never waits,
  // and its answer is dropped.
  bool unanswered = false;
  // kQuestion: its answer is the last reply (HTTP's Connection: close):
  // read nothing more, close for `close_reason` once it is written.
  bool close_after = false;
  CloseReason close_reason = CloseReason::kUnreadable;
};

class Codec {
 public:
  virtual ~Codec() = default;

  // Reads the first frame of `bytes` (now_ns: the read's monotonic time).
  virtual Frame read(std::span<const uint8_t> bytes, int64_t now_ns, std::string* out) = 0;

  // Whether the unfinished frame that starts `bytes` is now whole (or
  // broken, which read() will say). Resumes where the last call stopped,
  // so a frame that trickles in is walked once in all; restartFrame()
  // forgets, for a new frame.
  virtual bool frameReady(std::span<const uint8_t> bytes) = 0;
  virtual void restartFrame() = 0;

  // Encodes the answer to the question read() tagged `tag`.
  virtual void writeAnswer(std::string* out, MsgId tag, const Answer& answer) = 0;

  // Whether replies must go out in request order (no ids on the wire).
  virtual bool inOrder() const = 0;
};

}  // namespace sluice

// Connection: one client of a listener, owned by one worker's loop; its
// codec (codec.h) is the protocol it speaks: MessagePack-RPC on the Unix
// socket, the Redis protocol on [resp] listen, HTTP/1.1 on [http] listen.
//
// Reads land in a growable input buffer; every complete frame in it is
// parsed and answered at once, and the answers of one read are written
// together (one write for the batch). At most one write is in flight: while
// it is, new answers gather in a second buffer and go out when it ends.
// A codec whose replies go in request order (RESP, HTTP) stops at a question
// that waits: the frames after it stay in the input buffer, reading stops,
// and both go on once its answer is written (the worker resumes the
// connection from its loop, never from inside the dispatcher).
//
// Bounds (from [limits]): a frame larger than max_frame_bytes, or bytes the
// codec cannot read, close the connection; more than max_output_bytes
// not yet taken by the client (it does not read) closes it; so do
// idle_timeout_ms without traffic and a frame left half-sent for
// partial_frame_timeout_ms (checked by the worker's sweep timer).
//
// Lingering close (nginx's lingering_close). When the codec ends the
// conversation (a refused request or command, Connection: close, QUIT)
// while the client may still be sending, closing at once would make the
// kernel answer its unread bytes with a reset, and a client that is still
// writing, or has not read the answer yet, loses the answer. So once the
// last answer is written the connection shuts its sending side (the client
// reads the answer, then end of stream), then reads and discards what the
// client still sends until it closes, for at most linger_ms and
// linger_max_bytes (WorkerOptions; the sweep timer checks the time), and
// closes only then. Never while the worker stops: drain() closes a
// lingering connection at once.
//
// Lifetime (libuv's rule): close() starts uv_close; the worker deletes the
// Connection in the close callback, never before, whichever path closed it
// (open() failing included). Loop thread only.
#pragma once

#include <uv.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "access.h"
#include "codec.h"
#include "dispatch.h"
#include "metrics.h"
#include "question.h"

namespace sluice {

class Worker;

class Connection final : public Recipient {
 public:
  Connection(Worker& worker, const Peer& peer, Protocol protocol);
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Adopts the accepted socket `fd` and starts reading. On failure it closes
  // itself (and the fd); the close callback deletes it as always.
  int open(int fd, int64_t now_ms);

  // Goes on with a codec's frames held behind a question that waited, then
  // reads again. Called by the worker's loop (Worker::resumeLater).
  void resume();

  // Closes the connection for `reason` (once; later calls do nothing).
  void close(CloseReason reason);

  // Stops reading and closes once the pending responses are written.
  void drain();

  // Closes the connection when it has been idle or has held a partial frame
  // for too long. Called by the worker's sweep timer.
  void checkTimeouts(int64_t now_ms);

  bool closing() const { return closing_; }
  const Peer& peer() const { return peer_; }

  // The answer to a request that waited (Recipient; the worker's thread).
  void receive(MsgId tag, const Answer& answer) override;

  // Index in the worker's connection list (kept by the worker).
  size_t index = 0;

 private:
  static void onAlloc(uv_handle_t* handle, size_t suggested, uv_buf_t* buf);
  static void onRead(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf);
  static void onWrite(uv_write_t* req, int status);
  static void onClose(uv_handle_t* handle);

  // Parses and answers every whole frame of `bytes`, keeping the unfinished
  // rest in input_. `bytes` is the worker's scratch buffer (from_scratch) or
  // input_ itself.
  void consume(std::span<const uint8_t> bytes, bool from_scratch);
  // Asks the dispatcher `frame`'s question and writes its answer; true when
  // it waits (its answer comes to receive()).
  bool ask(const Frame& frame, int64_t now_ns);
  void startReading();
  // Whether the client closed its socket (not only its sending side).
  bool peerGone();
  void releaseWriting();
  void flush();
  // Closes a draining connection once nothing is left to answer or write
  // (after lingering, when the codec ended the conversation).
  void closeIfDrained();
  // Shuts the sending side and reads what the client still sends, to close
  // when it has finished or at the linger bounds.
  void startLingering();
  size_t unsentBytes() const;

  Worker& worker_;
  Peer peer_;
  std::unique_ptr<Codec> codec_;
  // A Unix socket (MessagePack-RPC, a Unix [resp] listen) or a TCP one.
  union {
    uv_handle_t handle;
    uv_stream_t stream;
    uv_pipe_t pipe;
    uv_tcp_t tcp;
  } socket_;
  uv_write_t write_req_;

  // An unfinished frame, or the frames held behind a waiting question;
  // [0, input_used_) are valid. Empty (no memory) while nothing is pending:
  // whole frames are parsed in the worker's scratch buffer.
  std::vector<uint8_t> input_;
  size_t input_used_ = 0;
  bool reading_into_scratch_ = false;  // where the read in progress lands
  std::string output_;          // responses not yet handed to a write
  std::string writing_;         // responses of the write in flight
  bool write_in_flight_ = false;

  int64_t last_active_ms_ = 0;
  int64_t partial_since_ms_ = 0;  // when the unfinished frame's first byte came
  size_t deferred_ = 0;  // requests deferred and not answered yet
  // An in-order codec's question waits: the frames after it stay in input_
  // and nothing is read until its answer is written.
  bool held_ = false;
  bool draining_ = false;
  // The codec ended the conversation: linger before closing (unless the
  // client has finished sending, or the worker stops).
  bool linger_on_close_ = false;
  bool lingering_ = false;
  int64_t lingering_since_ms_ = 0;
  size_t lingered_bytes_ = 0;  // read and discarded while lingering
  CloseReason drain_reason_ = CloseReason::kShutdown;  // counted when draining ends
  bool closing_ = false;
};

}  // namespace sluice

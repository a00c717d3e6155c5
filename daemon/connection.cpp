// Connection: reading, framing, dispatching and writing for one client.
#include "connection.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "worker.h"

namespace sluice {

namespace {

// Bytes offered to each read. Large enough that a pipelining client's burst
// of requests is taken in one read (and answered in one write).
constexpr size_t kReadChunkBytes = 64 * 1024;

}  // namespace

Connection::Connection(Worker& worker, const Peer& peer, Protocol protocol)
    : worker_(worker), peer_(peer), codec_(worker.makeCodec(protocol, peer_)), socket_{} {
  write_req_.data = this;
}

int Connection::open(int fd, int64_t now_ms) {
  last_active_ms_ = now_ms;
  sockaddr_storage address{};
  socklen_t size = sizeof(address);
  const bool tcp = getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) == 0 &&
                   address.ss_family != AF_UNIX;
  int rc = 0;
  if (tcp) {
    uv_tcp_init(worker_.loop(), &socket_.tcp);
    rc = uv_tcp_open(&socket_.tcp, fd);
    // Each batch of answers is one write: send it now, not after an ACK.
    if (rc == 0) uv_tcp_nodelay(&socket_.tcp, 1);
  } else {
    uv_pipe_init(worker_.loop(), &socket_.pipe, 0);
    rc = uv_pipe_open(&socket_.pipe, fd);
  }
  socket_.handle.data = this;
  if (rc != 0) {
    ::close(fd);  // the handle did not take the descriptor
  } else {
    rc = uv_read_start(&socket_.stream, onAlloc, onRead);
  }
  if (rc != 0) {
    close(CloseReason::kError);
  }
  return rc;
}

void Connection::startReading() {
  if (uv_read_start(&socket_.stream, onAlloc, onRead) != 0) close(CloseReason::kError);
}

void Connection::close(CloseReason reason) {
  if (closing_) {
    return;
  }
  closing_ = true;
  worker_.metrics().connections_closed[static_cast<size_t>(reason)].add();
  uv_close(&socket_.handle, onClose);
}

void Connection::drain() {
  if (closing_) {
    return;
  }
  if (lingering_) {
    // The worker stops: the answers are written, and nobody waits on it.
    close(drain_reason_);
    return;
  }
  draining_ = true;
  uv_read_stop(&socket_.stream);
  flush();
  closeIfDrained();
}

void Connection::closeIfDrained() {
  if (!draining_ || closing_ || lingering_ || held_ || write_in_flight_ || !output_.empty() ||
      deferred_ != 0) {
    return;
  }
  if (linger_on_close_ && !worker_.stopping()) {
    startLingering();
  } else {
    close(drain_reason_);
  }
}

void Connection::startLingering() {
  lingering_ = true;
  lingering_since_ms_ = static_cast<int64_t>(uv_now(worker_.loop()));
  // Every answer is written (closeIfDrained): the client reads them, then
  // the end of the stream.
  uv_os_fd_t fd;
  if (uv_fileno(&socket_.handle, &fd) != 0 || ::shutdown(fd, SHUT_WR) != 0 ||
      uv_read_start(&socket_.stream, onAlloc, onRead) != 0) {
    close(drain_reason_);
  }
}

void Connection::receive(MsgId tag, const Answer& answer) {
  --deferred_;
  if (closing_) {
    return;
  }
  codec_->writeAnswer(&output_, tag, answer);
  if (unsentBytes() > worker_.options().max_output_bytes) {
    close(CloseReason::kOutputCap);
    return;
  }
  flush();
  if (held_) {
    // Not from here: receive() runs inside the dispatcher, which the held
    // frames would ask again.
    worker_.resumeLater(this);
    return;
  }
  closeIfDrained();
}

void Connection::resume() {
  if (closing_ || !held_) return;
  held_ = false;
  last_active_ms_ = static_cast<int64_t>(uv_now(worker_.loop()));
  if (input_used_ > 0) {
    codec_->restartFrame();
    consume({input_.data(), input_used_}, false);
  }
  if (closing_) return;
  if (!held_ && !draining_) startReading();
  closeIfDrained();
}

void Connection::checkTimeouts(int64_t now_ms) {
  if (closing_) {
    return;
  }
  const WorkerOptions& options = worker_.options();
  if (lingering_) {
    if (now_ms - lingering_since_ms_ >= options.linger_ms) close(drain_reason_);
    return;
  }
  // Held frames wait for the daemon, not for the client.
  if (input_used_ > 0 && !held_ &&
      now_ms - partial_since_ms_ >= options.partial_frame_timeout_ms) {
    close(CloseReason::kPartialFrame);
  } else if (now_ms - last_active_ms_ >= options.idle_timeout_ms) {
    close(CloseReason::kIdle);
  }
}

void Connection::onAlloc(uv_handle_t* handle, size_t /*suggested*/, uv_buf_t* buf) {
  auto* self = static_cast<Connection*>(handle->data);
  if (self->input_used_ == 0) {
    // Nothing pending: read into the worker's scratch buffer, so an idle
    // connection holds no input buffer of its own.
    std::span<uint8_t> scratch = self->worker_.readScratch();
    self->reading_into_scratch_ = true;
    *buf = uv_buf_init(reinterpret_cast<char*>(scratch.data()),
                       static_cast<unsigned int>(scratch.size()));
    return;
  }
  // A frame is unfinished: append to it. The codec bounds the frame size,
  // so the buffer never exceeds max_frame_bytes + kReadChunkBytes.
  self->reading_into_scratch_ = false;
  if (self->input_.size() - self->input_used_ < kReadChunkBytes) {
    self->input_.resize(self->input_used_ + kReadChunkBytes);
  }
  *buf = uv_buf_init(reinterpret_cast<char*>(self->input_.data() + self->input_used_),
                     static_cast<unsigned int>(self->input_.size() - self->input_used_));
}

void Connection::onRead(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
  auto* self = static_cast<Connection*>(stream->data);
  if (self->lingering_) {
    // Read and dropped; the end of the stream (or an error, or too much)
    // ends the lingering.
    if (nread > 0) self->lingered_bytes_ += static_cast<size_t>(nread);
    if (nread < 0 || self->lingered_bytes_ > self->worker_.options().linger_max_bytes) {
      self->close(self->drain_reason_);
    }
    return;
  }
  if (nread > 0) {
    self->last_active_ms_ = static_cast<int64_t>(uv_now(self->worker_.loop()));
    if (self->reading_into_scratch_) {
      self->consume({reinterpret_cast<const uint8_t*>(buf->base), static_cast<size_t>(nread)},
                    true);
    } else {
      self->input_used_ += static_cast<size_t>(nread);
      // Walk on through the unfinished frame; parse only once it is whole.
      if (self->codec_->frameReady({self->input_.data(), self->input_used_})) {
        self->consume({self->input_.data(), self->input_used_}, false);
      }
    }
  } else if (nread == UV_EOF) {
    // The client has finished sending. One that only shut its sending side
    // down gets the answers to what it sent, then the connection closes. One
    // that closed its socket can read nothing more (a Unix socket then polls
    // POLLHUP): its requests still waiting for units or leases are dropped
    // at once, so they take no units nobody will see and hold no place in a
    // line.
    self->drain_reason_ = CloseReason::kPeerClosed;
    if (self->peerGone()) {
      self->close(CloseReason::kPeerClosed);
    } else {
      self->drain();
    }
  } else if (nread < 0) {
    self->close(CloseReason::kError);
  }
}

bool Connection::peerGone() {
  uv_os_fd_t fd;
  if (uv_fileno(&socket_.handle, &fd) != 0) return false;
  pollfd hangup{fd, POLLOUT, 0};
  return ::poll(&hangup, 1, 0) == 1 && (hangup.revents & POLLHUP) != 0;
}

void Connection::consume(std::span<const uint8_t> bytes, bool from_scratch) {
  const WorkerOptions& options = worker_.options();
  KeyTable::ReadGuard guard(worker_.keys(), worker_.readerSlot());
  int64_t now_ns = monotonicNowNs();
  size_t offset = 0;
  bool last = false;
  size_t deferred_before = deferred_;
  uint64_t answered = 0;  // requests answered in this read (not deferred)
  while (offset < bytes.size() && !last && !held_) {
    Frame frame = codec_->read(bytes.subspan(offset), now_ns, &output_);
    if (frame.kind == Frame::Kind::kIncomplete) {
      break;
    }
    offset += frame.consumed;
    if (frame.kind == Frame::Kind::kQuestion) {
      if (ask(frame, now_ns)) {
        ++deferred_;
        held_ = codec_->inOrder();
      } else {
        ++answered;
      }
      if (frame.close_after) {
        last = true;
        drain_reason_ = frame.close_reason;
      }
    } else if (frame.kind == Frame::Kind::kReplied) {
      ++answered;
    } else if (frame.kind == Frame::Kind::kLast) {
      last = true;
      drain_reason_ = frame.close_reason;
    }
    // Checked per frame: one read of small requests for large answers
    // (stats, rules) must not build megabytes before the check.
    if (unsentBytes() > options.max_output_bytes) {
      close(CloseReason::kOutputCap);
      return;
    }
  }
  if (answered > 0) {
    // One clock read per read of the socket: each request of the batch
    // counts the batch's time.
    auto elapsed_ns = static_cast<uint64_t>(monotonicNowNs() - now_ns);
    worker_.metrics().decision_latency.observe(elapsed_ns / 1000, answered);
  }
  if (deferred_ != deferred_before) {
    worker_.armLeaseTimer();
  }
  if (last) {
    // What follows the last request is never read, but the client may
    // still be sending it: linger before closing.
    linger_on_close_ = true;
    input_used_ = 0;
    partial_since_ms_ = 0;
    drain();
    return;
  }

  // Keep the unfinished frame, or the frames held behind a waiting
  // question, in input_ for later.
  size_t left = bytes.size() - offset;
  if (left == 0) {
    input_used_ = 0;
    partial_since_ms_ = 0;
    if (input_.capacity() > kReadChunkBytes) {
      std::vector<uint8_t>().swap(input_);  // give back a large frame's buffer
    }
  } else {
    if (from_scratch) {
      input_.assign(bytes.begin() + static_cast<std::ptrdiff_t>(offset), bytes.end());
    } else if (offset > 0) {
      std::memmove(input_.data(), input_.data() + offset, left);
    }
    input_used_ = left;
    if (from_scratch || offset > 0) {
      partial_since_ms_ = last_active_ms_;  // a new frame starts with what is left
      codec_->restartFrame();
      if (!held_) {
        // Remember how far the unfinished frame got.
        codec_->frameReady({input_.data(), input_used_});
      }
    }
  }
  if (held_) {
    uv_read_stop(&socket_.stream);
  }
  flush();
}

bool Connection::ask(const Frame& frame, int64_t now_ns) {
  Recipient* recipient = frame.unanswered ? nullptr : this;
  Asker asker = worker_.dispatcher().askerFor(frame.question, recipient, frame.tag, now_ns);
  // A stopping worker has answered its waiters: a question now may not wait.
  asker.may_wait = asker.may_wait && !worker_.stopping();
  Answer& answer = worker_.answerScratch();
  if (worker_.dispatcher().ask(frame.question, now_ns, asker, &answer) != Outcome::kAnswered) {
    return true;
  }
  if (!frame.unanswered) codec_->writeAnswer(&output_, frame.tag, answer);
  return false;
}

size_t Connection::unsentBytes() const {
  return output_.size() + (write_in_flight_ ? writing_.size() : 0);
}

void Connection::flush() {
  if (closing_ || write_in_flight_ || output_.empty()) {
    return;
  }
  writing_.swap(output_);
  output_.clear();
  auto* stream = &socket_.stream;
  uv_buf_t buf = uv_buf_init(writing_.data(), static_cast<unsigned int>(writing_.size()));
  // Most batches fit in the socket buffer: write them now, without a request.
  int written = uv_try_write(stream, &buf, 1);
  if (written == static_cast<int>(writing_.size())) {
    releaseWriting();
    return;
  }
  if (written < 0 && written != UV_EAGAIN) {
    close(CloseReason::kError);
    return;
  }
  size_t offset = written > 0 ? static_cast<size_t>(written) : 0;
  buf = uv_buf_init(writing_.data() + offset, static_cast<unsigned int>(writing_.size() - offset));
  if (uv_write(&write_req_, stream, &buf, 1, onWrite) != 0) {
    close(CloseReason::kError);
    return;
  }
  write_in_flight_ = true;
}

void Connection::onWrite(uv_write_t* req, int status) {
  auto* self = static_cast<Connection*>(req->data);
  self->write_in_flight_ = false;
  self->releaseWriting();
  if (self->closing_) {
    return;  // cancelled by close()
  }
  if (status < 0) {
    self->close(CloseReason::kError);
    return;
  }
  self->flush();
  self->closeIfDrained();
}

void Connection::releaseWriting() {
  // A burst of answers may have grown the buffer to max_output_bytes; do not
  // keep that much per connection once it is written.
  if (writing_.capacity() > kReadChunkBytes) {
    std::string().swap(writing_);
  } else {
    writing_.clear();
  }
}

void Connection::onClose(uv_handle_t* handle) {
  auto* self = static_cast<Connection*>(handle->data);
  self->worker_.onConnectionClosed(self);
}

}  // namespace sluice

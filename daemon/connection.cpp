// Connection: reading, framing, dispatching and writing for one client.
#include "connection.h"

#include <unistd.h>

#include <cstring>

#include "worker.h"

namespace sluice {

namespace {

// Bytes offered to each read. Large enough that a pipelining client's burst
// of requests is taken in one read (and answered in one write).
constexpr size_t kReadChunkBytes = 64 * 1024;

}  // namespace

Connection::Connection(Worker& worker, const Peer& peer) : worker_(worker), peer_(peer) {
  pipe_.data = this;
  write_req_.data = this;
}

int Connection::open(int fd, int64_t now_ms) {
  last_active_ms_ = now_ms;
  uv_pipe_init(worker_.loop(), &pipe_, 0);
  pipe_.data = this;
  int rc = uv_pipe_open(&pipe_, fd);
  if (rc == 0) {
    rc = uv_read_start(reinterpret_cast<uv_stream_t*>(&pipe_), onAlloc, onRead);
  } else {
    ::close(fd);  // the handle did not take the descriptor
  }
  if (rc != 0) {
    close(CloseReason::kError);
  }
  return rc;
}

void Connection::close(CloseReason reason) {
  if (closing_) {
    return;
  }
  closing_ = true;
  worker_.metrics().connections_closed[static_cast<size_t>(reason)].add();
  uv_close(reinterpret_cast<uv_handle_t*>(&pipe_), onClose);
}

void Connection::drain() {
  if (closing_) {
    return;
  }
  draining_ = true;
  uv_read_stop(reinterpret_cast<uv_stream_t*>(&pipe_));
  flush();
  if (!closing_ && !write_in_flight_ && output_.empty()) {
    close(drain_reason_);
  }
}

void Connection::checkTimeouts(int64_t now_ms) {
  if (closing_) {
    return;
  }
  const WorkerOptions& options = worker_.options();
  if (input_used_ > 0 && now_ms - partial_since_ms_ >= options.partial_frame_timeout_ms) {
    close(CloseReason::kPartialFrame);
  } else if (now_ms - last_active_ms_ >= options.idle_timeout_ms) {
    close(CloseReason::kIdle);
  }
}

void Connection::onAlloc(uv_handle_t* handle, size_t /*suggested*/, uv_buf_t* buf) {
  auto* self = static_cast<Connection*>(handle->data);
  if (self->input_.size() - self->input_used_ < kReadChunkBytes) {
    // Grows only while a frame is unfinished; parse() bounds the frame size,
    // so the buffer never exceeds max_frame_bytes + kReadChunkBytes.
    self->input_.resize(self->input_used_ + kReadChunkBytes);
  }
  *buf = uv_buf_init(reinterpret_cast<char*>(self->input_.data() + self->input_used_),
                     static_cast<unsigned int>(self->input_.size() - self->input_used_));
}

void Connection::onRead(uv_stream_t* stream, ssize_t nread, const uv_buf_t* /*buf*/) {
  auto* self = static_cast<Connection*>(stream->data);
  if (nread > 0) {
    self->input_used_ += static_cast<size_t>(nread);
    self->new_bytes_ = static_cast<size_t>(nread);
    self->last_active_ms_ = static_cast<int64_t>(uv_now(self->worker_.loop()));
    self->consume();
  } else if (nread == UV_EOF) {
    // The client has finished sending; answer what it sent, then close.
    self->drain_reason_ = CloseReason::kPeerClosed;
    self->drain();
  } else if (nread < 0) {
    self->close(CloseReason::kError);
  }
}

// Whether the unfinished frame at the start of the buffer is now complete
// (or broken, which parseRequest will say). A frame that trickles in is walked
// once in all, resuming where the last read stopped, instead of re-parsed from
// its first byte on every read.
bool Connection::partialFrameReady() {
  const rpc::Limits& limits = worker_.options().protocol;
  if (!scan_) {
    scan_ = std::make_unique<msgpack::SkipState>();
  }
  msgpack::Reader reader(input_.data(), input_used_, limits.max_frame_bytes);
  // Items are bounded by the frame size here; parseRequest checks max_items.
  bool complete = reader.skipResumable(scan_.get(), limits.max_depth, UINT32_MAX);
  if (!complete && reader.status() == msgpack::Status::kIncomplete) {
    return false;
  }
  scan_->started = false;
  return true;
}

void Connection::consume() {
  const WorkerOptions& options = worker_.options();
  if (input_used_ > new_bytes_ && scan_ && scan_->started && !partialFrameReady()) {
    return;  // still waiting for the rest of the first frame
  }
  KeyTable::ReadGuard guard(worker_.keys(), worker_.readerSlot());
  int64_t now_ns = monotonicNowNs();
  size_t offset = 0;
  bool fatal = false;
  while (offset < input_used_ && !fatal) {
    std::span<const uint8_t> frame(input_.data() + offset, input_used_ - offset);
    rpc::ParseResult result = rpc::parseRequest(frame, options.protocol, &request_);
    if (result.status == rpc::ParseStatus::kIncomplete) {
      break;
    }
    if (result.status == rpc::ParseStatus::kOk) {
      worker_.dispatcher().handle(request_, peer_, now_ns, &output_);
    } else {
      worker_.dispatcher().handleParseError(result, &output_);
      worker_.logBadInput(result);
      fatal = result.status == rpc::ParseStatus::kFatal;
    }
    offset += result.consumed;
    // Checked per request: one read of small requests for large answers
    // (stats, rules) must not build megabytes before the check.
    if (unsentBytes() > options.max_output_bytes) {
      close(CloseReason::kOutputCap);
      return;
    }
  }

  int64_t now_ms = last_active_ms_;
  if (offset > 0) {
    std::memmove(input_.data(), input_.data() + offset, input_used_ - offset);
    input_used_ -= offset;
    partial_since_ms_ = now_ms;  // a new frame starts with what is left
  } else if (input_used_ > 0 && partial_since_ms_ == 0) {
    partial_since_ms_ = now_ms;
  }
  if (input_used_ == 0) {
    partial_since_ms_ = 0;
    if (input_.size() > 4 * kReadChunkBytes) {
      std::vector<uint8_t>().swap(input_);  // give back a large frame's buffer
    }
  } else if (!fatal) {
    // Remember how far the unfinished frame got, for the next read.
    if (scan_) {
      scan_->started = false;
    }
    partialFrameReady();
  }

  if (fatal) {
    drain_reason_ = CloseReason::kUnreadable;
    drain();
    return;
  }
  flush();
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
  auto* stream = reinterpret_cast<uv_stream_t*>(&pipe_);
  uv_buf_t buf = uv_buf_init(writing_.data(), static_cast<unsigned int>(writing_.size()));
  // Most batches fit in the socket buffer: write them now, without a request.
  int written = uv_try_write(stream, &buf, 1);
  if (written == static_cast<int>(writing_.size())) {
    writing_.clear();
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
  self->writing_.clear();
  if (self->closing_) {
    return;  // cancelled by close()
  }
  if (status < 0) {
    self->close(CloseReason::kError);
    return;
  }
  self->flush();
  if (self->draining_ && !self->write_in_flight_ && self->output_.empty()) {
    self->close(self->drain_reason_);
  }
}

void Connection::onClose(uv_handle_t* handle) {
  auto* self = static_cast<Connection*>(handle->data);
  self->worker_.onConnectionClosed(self);
}

}  // namespace sluice

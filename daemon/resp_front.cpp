// RespFront; see resp_front.h.
#include "resp_front.h"

#include <sys/stat.h>
#include <unistd.h>

#include <deque>
#include <string_view>

#include "config.h"

namespace sluice {

namespace {

constexpr uint64_t kSeqBits = 24;
constexpr uint64_t kSeqMask = (uint64_t{1} << kSeqBits) - 1;
constexpr size_t kReadBytes = 64 * 1024;

struct WriteRequest {
  uv_write_t request;
  std::string data;
  RespFront::Connection* connection;
};

}  // namespace

struct RespFront::Connection {
  RespFront* front = nullptr;
  union {
    uv_handle_t handle;
    uv_stream_t stream;
    uv_tcp_t tcp;
    uv_pipe_t pipe;
  } h{};
  uint64_t id = 0;
  size_t worker = 0;
  std::string input;
  struct Slot {
    bool ready = false;
    resp::Shape shape = resp::Shape::kDecision;
    int64_t max_burst = 0;
    std::string bytes;
  };
  std::deque<Slot> slots;
  uint64_t base_seq = 0;  // the sequence number of slots.front()
  size_t in_flight = 0;   // questions asked and not yet answered
  size_t unsent = 0;      // bytes handed to uv_write and not yet written
  bool reading = true;
  bool quit = false;      // QUIT or a protocol error: close once the replies are out
  bool closing = false;
  char scratch[kReadBytes];
};

RespFront::~RespFront() { stop(); }

bool RespFront::start(const Options& options, size_t workers, Submit submit,
                      EnsureRule ensure_rule, Admit admit, std::string* error) {
  options_ = options;
  workers_ = workers == 0 ? 1 : workers;
  submit_ = std::move(submit);
  ensure_rule_ = std::move(ensure_rule);
  std::string host;
  uint16_t port = 0;
  std::string unix_path;
  std::string problem;
  if (!parseFrontAddress(options.listen, &host, &port, &unix_path, &problem)) {
    *error = "[resp] listen " + options.listen + ": " + problem;
    return false;
  }
  uv_loop_init(&loop_);
  int rc = 0;
  if (!unix_path.empty()) {
    admit_ = std::move(admit);
    struct stat info{};
    if (lstat(unix_path.c_str(), &info) == 0 && S_ISSOCK(info.st_mode)) unlink(unix_path.c_str());
    uv_pipe_init(&loop_, &listener_.pipe, 0);
    rc = uv_pipe_bind(&listener_.pipe, unix_path.c_str());
    if (rc == 0) {
      unix_path_ = unix_path;
      chmod(unix_path.c_str(), 0660);
    }
  } else {
    uv_tcp_init(&loop_, &listener_.tcp);
    sockaddr_storage address{};
    if (host.find(':') != std::string::npos) {
      uv_ip6_addr(host.c_str(), port, reinterpret_cast<sockaddr_in6*>(&address));
    } else {
      uv_ip4_addr(host.c_str(), port, reinterpret_cast<sockaddr_in*>(&address));
    }
    rc = uv_tcp_bind(&listener_.tcp, reinterpret_cast<sockaddr*>(&address), 0);
  }
  listener_.tcp.data = this;
  if (rc == 0) {
    rc = uv_listen(reinterpret_cast<uv_stream_t*>(&listener_), SOMAXCONN,
                   [](uv_stream_t* server, int status) {
                     if (status == 0) static_cast<RespFront*>(server->data)->onConnection();
                   });
  }
  if (rc != 0) {
    *error = "cannot serve the Redis protocol on " + options.listen + ": " + uv_strerror(rc) +
             "; choose another [resp] listen";
    uv_close(reinterpret_cast<uv_handle_t*>(&listener_), nullptr);
    uv_run(&loop_, UV_RUN_DEFAULT);
    uv_loop_close(&loop_);
    if (!unix_path_.empty()) unlink(unix_path_.c_str());
    unix_path_.clear();
    return false;
  }
  uv_async_init(&loop_, &wakeup_, [](uv_async_t* async) {
    static_cast<RespFront*>(async->data)->onArrived();
  });
  wakeup_.data = this;
  started_ = true;
  thread_ = std::thread([this] { run(); });
  return true;
}

void RespFront::stop() {
  if (!started_) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    uv_async_send(&wakeup_);
  }
  thread_.join();
  uv_loop_close(&loop_);
  started_ = false;
  if (!unix_path_.empty()) unlink(unix_path_.c_str());
  unix_path_.clear();
}

void RespFront::run() { uv_run(&loop_, UV_RUN_DEFAULT); }

void RespFront::receive(MsgId tag, const Answer& answer) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_) return;
  Arrived& arrived = arrived_.emplace_back();
  arrived.tag = tag;
  arrived.failed = answer.failed;
  arrived.error = answer.error;
  if (answer.failed) arrived.message = answer.message;
  if (!answer.decisions.empty()) arrived.decision = answer.decisions.front();
  if (!answer.modes.empty()) arrived.mode = answer.modes.front();
  uv_async_send(&wakeup_);
}

void RespFront::onConnection() {
  auto* connection = new Connection();
  connection->front = this;
  connection->id = next_connection_++;
  connection->worker = next_worker_++ % workers_;
  if (unix_path_.empty()) {
    uv_tcp_init(&loop_, &connection->h.tcp);
  } else {
    uv_pipe_init(&loop_, &connection->h.pipe, 0);
  }
  connection->h.handle.data = connection;
  connections_[connection->id] = connection;
  if (uv_accept(reinterpret_cast<uv_stream_t*>(&listener_), &connection->h.stream) != 0) {
    close(connection);
    return;
  }
  auto refuse = [&](std::string_view text) {
    Connection::Slot slot;
    slot.ready = true;
    resp::writeError(&slot.bytes, text);
    connection->slots.push_back(std::move(slot));
    connection->quit = true;
    flush(connection);
  };
  if (connections_.size() > options_.max_connections) {
    refuse("ERR max number of clients reached ([limits] max_connections)");
    return;
  }
  if (admit_) {
    uv_os_fd_t fd = -1;
    if (uv_fileno(&connection->h.handle, &fd) != 0 || !admit_(fd)) {
      refuse("FORBIDDEN this user may not use sluiced ([access])");
      return;
    }
  }
  startReading(connection);
}

void RespFront::startReading(Connection* connection) {
  uv_read_start(
      &connection->h.stream,
      [](uv_handle_t* handle, size_t, uv_buf_t* buf) {
        auto* c = static_cast<Connection*>(handle->data);
        *buf = uv_buf_init(c->scratch, sizeof(c->scratch));
      },
      [](uv_stream_t* stream, ssize_t size, const uv_buf_t*) {
        auto* c = static_cast<Connection*>(stream->data);
        c->front->onRead(c, size);
      });
}

void RespFront::onRead(Connection* connection, ssize_t size) {
  if (size < 0) {
    close(connection);
    return;
  }
  connection->input.append(connection->scratch, static_cast<size_t>(size));
  serve(connection);
}

void RespFront::serve(Connection* connection) {
  std::string_view input = connection->input;
  size_t offset = 0;
  while (!connection->quit && connection->in_flight < options_.max_in_flight) {
    size_t consumed = 0;
    std::string error;
    resp::Parse parse =
        resp::parseCommand(input.substr(offset), options_.limits, &consumed, &args_, &error);
    if (parse == resp::Parse::kIncomplete) break;
    Connection::Slot slot;
    if (parse == resp::Parse::kError) {
      slot.ready = true;
      resp::writeError(&slot.bytes, error);
      connection->slots.push_back(std::move(slot));
      connection->quit = true;
      break;
    }
    offset += consumed;
    if (args_.empty()) continue;
    resp::Command command = resp::interpret(args_, options_.limits);
    if (command.kind != resp::Command::Kind::kAsk) {
      slot.ready = true;
      slot.bytes = std::move(command.reply);
      connection->slots.push_back(std::move(slot));
      if (command.kind == resp::Command::Kind::kQuit) connection->quit = true;
      continue;
    }
    std::string_view rule = command.item.rule;
    if (command.throttle) {
      const resp::Throttle& p = command.parameters;
      auto key = std::make_tuple(p.max_burst, p.count, p.period_s);
      auto known = throttle_rules_.find(key);
      if (known == throttle_rules_.end()) {
        std::string refusal;
        if (!ensure_rule_ || !ensure_rule_(p, &refusal)) {
          slot.ready = true;
          resp::writeError(&slot.bytes, "ERR " + refusal);
          connection->slots.push_back(std::move(slot));
          continue;
        }
        known = throttle_rules_.emplace(key, resp::throttleRuleName(p)).first;
      }
      rule = known->second;
      slot.max_burst = p.max_burst;
    }
    command.item.rule = rule;
    slot.shape = command.shape;
    const uint64_t seq = (connection->base_seq + connection->slots.size()) & kSeqMask;
    connection->slots.push_back(std::move(slot));
    ++connection->in_flight;
    submit_(connection->worker,
            HeldQuestion(Question{command.method, {&command.item, 1}}), this,
            MsgId(connection->id << kSeqBits | seq));
  }
  connection->input.erase(0, offset);
  // After QUIT or a protocol error nothing more is read: the connection
  // closes once its replies are out.
  if ((connection->quit || connection->in_flight >= options_.max_in_flight) &&
      connection->reading) {
    uv_read_stop(&connection->h.stream);
    connection->reading = false;
  }
  flush(connection);
}

void RespFront::onArrived() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    taken_.swap(arrived_);
    if (stopping_) {
      for (auto& [id, connection] : connections_) {
        connection->closing = true;
        uv_close(&connection->h.handle,
                 [](uv_handle_t* handle) { delete static_cast<Connection*>(handle->data); });
      }
      connections_.clear();
      uv_close(reinterpret_cast<uv_handle_t*>(&listener_), nullptr);
      uv_close(reinterpret_cast<uv_handle_t*>(&wakeup_), nullptr);
      taken_.clear();
      return;
    }
  }
  std::vector<Connection*> touched;
  for (Arrived& arrived : taken_) {
    auto found = connections_.find(arrived.tag.bits >> kSeqBits);
    if (found == connections_.end()) continue;  // closed while it was asked
    Connection* connection = found->second;
    const uint64_t index = ((arrived.tag.bits & kSeqMask) - connection->base_seq) & kSeqMask;
    if (index >= connection->slots.size()) continue;
    Connection::Slot& slot = connection->slots[index];
    answer_.clear();
    if (arrived.failed) {
      answer_.fail(arrived.error, arrived.message);
    } else {
      answer_.decide(arrived.decision, arrived.mode);
    }
    resp::writeAnswer(&slot.bytes, slot.shape, slot.max_burst, answer_);
    slot.ready = true;
    --connection->in_flight;
    if (touched.empty() || touched.back() != connection) touched.push_back(connection);
  }
  taken_.clear();
  for (Connection* connection : touched) {
    if (connection->closing) continue;
    if (!connection->reading && !connection->quit &&
        connection->in_flight < options_.max_in_flight) {
      connection->reading = true;
      startReading(connection);
      serve(connection);  // what was read while paused
    } else {
      flush(connection);
    }
  }
}

void RespFront::flush(Connection* connection) {
  if (connection->closing) return;
  auto* write = new WriteRequest();
  write->connection = connection;
  while (!connection->slots.empty() && connection->slots.front().ready) {
    write->data += connection->slots.front().bytes;
    connection->slots.pop_front();
    connection->base_seq = (connection->base_seq + 1) & kSeqMask;
  }
  if (!write->data.empty()) {
    connection->unsent += write->data.size();
    uv_buf_t buf = uv_buf_init(write->data.data(), static_cast<unsigned>(write->data.size()));
    write->request.data = write;
    uv_write(&write->request, &connection->h.stream, &buf, 1, [](uv_write_t* request, int) {
      auto* w = static_cast<WriteRequest*>(request->data);
      w->connection->unsent -= w->data.size();
      delete w;
    });
    if (connection->unsent > options_.max_output_bytes) {
      close(connection);  // a client that does not read its replies
      return;
    }
  } else {
    delete write;
  }
  if (connection->quit && connection->slots.empty()) {
    // Closed once what was written has gone out.
    connection->closing = true;
    connections_.erase(connection->id);
    auto* shutdown = new uv_shutdown_t();
    shutdown->data = connection;
    if (uv_shutdown(shutdown, &connection->h.stream, [](uv_shutdown_t* request, int) {
          auto* c = static_cast<Connection*>(request->data);
          delete request;
          uv_close(&c->h.handle,
                   [](uv_handle_t* handle) { delete static_cast<Connection*>(handle->data); });
        }) != 0) {
      delete shutdown;
      uv_close(&connection->h.handle,
               [](uv_handle_t* handle) { delete static_cast<Connection*>(handle->data); });
    }
  }
}

void RespFront::close(Connection* connection) {
  if (connection->closing) return;
  connection->closing = true;
  connections_.erase(connection->id);
  uv_close(&connection->h.handle,
           [](uv_handle_t* handle) { delete static_cast<Connection*>(handle->data); });
}

}  // namespace sluice

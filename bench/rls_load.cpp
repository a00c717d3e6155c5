// rls_load: a load generator for Envoy's rate limit service, as Envoy calls
// it: ShouldRateLimit with one domain and N descriptors, over THREADS HTTP/2
// connections, either closed loop (`depth` calls in flight per connection,
// each answer sending the next) or paced to a total `rate` (calls/s) for
// the latency at a given load.
//
//   rls_load TARGET DESCRIPTORS SECONDS [THREADS] [DEPTH] [RATE] [KEYS] [DEADLINE_MS] [SPIN_US] [BATCH_US]
//
// TARGET is unix:PATH or HOST:PORT (IPv4). Prints one line: calls/s,
// p50/p99/max latency in µs, OK, OVER_LIMIT, deadline_exceeded and errors, and
// driver_cpu_us_per_call (this process's user + system CPU over the calls
// answered: what the driver takes from a machine it shares); paced runs add
// send_lag_p99_us (how late the sends left, below). Keys cycle through
// KEYS values of descriptor i's key "k<i>" (1: one hot key per descriptor).
//
// A connection opens at most as many streams as the server's
// SETTINGS_MAX_CONCURRENT_STREAMS allows; calls past it wait in the
// driver's own queue, in order, as in Envoy's connection pool (not in
// nghttp2's, whose cancelling of a queued stream costs a walk of its
// queue). Every call carries a deadline, DEADLINE_MS (20, Envoy's default
// timeout for its rate limit service; 0: none): `grpc-timeout` tells the
// server, and at the deadline the driver gives up on the call as Envoy
// does: unsent if still queued, else with RST_STREAM (CANCEL). Such a call, and one the server answers
// DEADLINE_EXCEEDED or CANCELLED, counts as deadline_exceeded, not as an
// error, and its latency is the time until it ended: p99 counts the calls
// Envoy gave up on, at 20 ms or more.
//
// It speaks gRPC's framing over HTTP/2 with nghttp2, as Envoy's own gRPC
// client does over its HTTP/2 codec (nghttp2 or oghttp2), not with gRPC's
// C++ client: that costs some 15 to 45 µs of CPU a call (more paced, when
// each call wakes its threads), CPU a sluiced on the same two cores loses,
// so that at half the one-descriptor rate the two together filled the
// machine. Each request's bytes (the 5-byte gRPC prefix and the message)
// are built once per key; an answer is its DATA (the RateLimitResponse,
// parsed) and its trailers' grpc-status.
//
// The thread model: closed loop, one thread per connection; paced, one
// thread for all of them. Each thread runs drive(): a loop in epoll over
// its connections' sockets that, each turn, sends the calls due, writes
// each connection's bytes in one write (a call's HEADERS and DATA, and
// every call sent in the turn, reach the server together and wake it
// once), and sleeps in epoll_pwait2 until a socket is readable, the next
// call is due or the oldest call's deadline passes (nanosecond timeouts:
// no timer to set and read per call). Paced, call n of the run is due at
// start + n / rate (evenly spaced), on connection n % THREADS, as Envoy
// sends each call when its request arrives; its latency and its deadline
// run from that due time, not from when the busy machine let it leave, so
// a driver that falls behind shows in p99 (no coordinated omission), and
// send_lag_p99_us says how late the sends left. With BATCH_US (0, the
// default: each call at its own time) the calls due within each BATCH_US
// tick leave together at its end, as a busy Envoy's event loop flushes the
// calls of one turn together: fewer wake-ups on both sides for up to
// BATCH_US more latency, counted. With SPIN_US (0, the default: never), a
// call due within that many µs is waited for instead by polling the
// sockets without blocking until it is due, sparing the thread a sleep and
// a wake-up per call when calls are close together, at the price of the
// CPU the polling burns (on 2 CPUs, CPU sluiced then lacks).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <nghttp2/nghttp2.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "envoy/service/ratelimit/v3/rls.pb.h"

namespace {

using envoy::service::ratelimit::v3::RateLimitRequest;
using envoy::service::ratelimit::v3::RateLimitResponse;
using Clock = std::chrono::steady_clock;

// How long a run waits for its last answers after SECONDS, before it
// counts them as errors.
constexpr auto kDrainLimit = std::chrono::seconds(10);
// Paced: a call due within this many µs is waited for by polling (SPIN_US).
constexpr int64_t kSpinUs = 0;

struct Totals {
  std::vector<int64_t> latencies_us;
  std::vector<int64_t> send_lags_us;  // paced runs
  uint64_t ok = 0, over = 0, deadline_exceeded = 0, errors = 0;
};

// grpc-status values (gRPC's status codes) that mean the call's deadline
// passed or the call was given up on.
constexpr std::string_view kGrpcCancelled = "1";
constexpr std::string_view kGrpcDeadlineExceeded = "4";

// unix:PATH or HOST:PORT, connected (blocking), or -1 with a message.
int connectTo(const std::string& target) {
  if (target.starts_with("unix:")) {
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    const std::string path = target.substr(5);
    if (path.size() >= sizeof(address.sun_path)) return -1;
    std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) return fd;
    if (fd >= 0) ::close(fd);
    return -1;
  }
  const size_t colon = target.rfind(':');
  if (colon == std::string::npos) return -1;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(target.substr(0, colon).c_str(), target.substr(colon + 1).c_str(), &hints, &found) != 0) {
    return -1;
  }
  int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) != 0) {
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(found);
  if (fd >= 0) {
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  return fd;
}

// A request's bytes on the wire: gRPC's 5-byte prefix (uncompressed,
// big-endian length) and the message.
std::string grpcFrame(const RateLimitRequest& request) {
  const std::string message = request.SerializeAsString();
  std::string frame(5, '\0');
  const uint32_t length = htonl(static_cast<uint32_t>(message.size()));
  std::memcpy(&frame[1], &length, 4);
  return frame + message;
}

// One call in flight: its request's bytes, how much of them went, its
// answer so far.
struct Slot {
  const std::string* body = nullptr;
  size_t body_sent = 0;
  std::string answer;  // DATA: gRPC's prefix and the response
  bool grpc_ok = false;  // trailers said grpc-status 0
  bool late = false;  // given up at its deadline, or answered DEADLINE_EXCEEDED / CANCELLED
  int32_t stream = 0;  // its HTTP/2 stream
  Clock::time_point started;  // its due time when paced, its send closed loop
};

// One HTTP/2 connection and its calls. Not thread-safe: one drive() runs it.
class Connection {
 public:
  Connection(const std::string& target, int descriptors, int keys, int64_t deadline_ms)
      : deadline_(std::chrono::milliseconds(deadline_ms)), grpc_timeout_(std::to_string(deadline_ms) + "m") {
    RateLimitRequest request;
    request.set_domain("bench");
    for (int d = 0; d < descriptors; ++d) {
      auto* entry = request.add_descriptors()->add_entries();
      entry->set_key("k" + std::to_string(d));
      entry->set_value("v0");
    }
    for (int k = 0; k < keys; ++k) {
      for (auto& descriptor : *request.mutable_descriptors()) {
        descriptor.mutable_entries(0)->set_value("v" + std::to_string(k));
      }
      bodies_.push_back(grpcFrame(request));
    }
    fd_ = connectTo(target);
    if (fd_ < 0) {
      std::fprintf(stderr, "rls_load: cannot connect to %s: %s\n", target.c_str(), std::strerror(errno));
      std::exit(2);
    }
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
    nghttp2_session_callbacks* callbacks = nullptr;
    nghttp2_session_callbacks_new(&callbacks);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, onData);
    nghttp2_session_callbacks_set_on_header_callback(callbacks, onHeader);
    nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, onClose);
    nghttp2_session_client_new(&session_, callbacks, this);
    nghttp2_session_callbacks_del(callbacks);
    nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, nullptr, 0);
  }
  ~Connection() {
    nghttp2_session_del(session_);
    if (fd_ >= 0) ::close(fd_);
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Before the first call: answers are counted in `totals`; closed loop
  // (`closed_loop`), each answer before `end` sends the next call.
  void prepare(Totals* totals, bool closed_loop, Clock::time_point end) {
    totals_ = totals;
    closed_loop_ = closed_loop;
    end_ = end;
  }
  int fd() const { return fd_; }
  bool broken() const { return broken_; }
  size_t inFlight() const { return in_flight_; }
  // Whether bytes wait for the socket to take them (EPOLLOUT).
  bool wantsWrite() const { return !out_.empty(); }

  // Starts a call whose latency runs from `started`: submitted to nghttp2
  // when the server's limit on open streams leaves room, else queued
  // (waiting_) until a stream ends, as Envoy's connection pool queues
  // calls past it. Its bytes leave with the next flush().
  void send(Clock::time_point started) {
    size_t i = 0;
    if (free_.empty()) {
      i = slots_.size();
      slots_.emplace_back();
    } else {
      i = free_.back();
      free_.pop_back();
    }
    Slot& slot = slots_[i];
    slot.body = &bodies_[sent_ % bodies_.size()];
    slot.body_sent = 0;
    slot.answer.clear();
    slot.grpc_ok = false;
    slot.late = false;
    slot.stream = 0;
    slot.started = started;
    ++sent_;
    ++in_flight_;
    if (waiting_.empty() && open_ < maxStreams()) {
      submit(i);
    } else {
      waiting_.push_back(i);
    }
  }

  // Reads what the socket has and hands it to nghttp2 (answers are
  // counted in its callbacks).
  void read() {
    char buffer[65536];
    for (;;) {
      const ssize_t got = ::read(fd_, buffer, sizeof(buffer));
      if (got > 0) {
        if (nghttp2_session_mem_recv(session_, reinterpret_cast<uint8_t*>(buffer), static_cast<size_t>(got)) < 0) {
          broken_ = true;
        }
        if (static_cast<size_t>(got) < sizeof(buffer)) return;
        continue;
      }
      if (got == 0 || (errno != EAGAIN && errno != EINTR)) broken_ = true;
      return;
    }
  }

  // Writes everything nghttp2 has for the socket in one write, as far as
  // the socket takes it (the rest waits for EPOLLOUT): a call's HEADERS
  // and DATA, and every call sent since the last flush, reach the server
  // together, waking it once.
  void flush() {
    if (out_.empty()) {
      for (;;) {
        const uint8_t* data = nullptr;
        const ssize_t n = nghttp2_session_mem_send(session_, &data);
        if (n < 0) {
          broken_ = true;
          return;
        }
        if (n == 0) break;
        out_.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
      }
    }
    while (!out_.empty()) {
      const ssize_t wrote = ::write(fd_, out_.data(), out_.size());
      if (wrote < 0) {
        if (errno != EAGAIN && errno != EINTR) broken_ = true;
        return;
      }
      out_.erase(0, static_cast<size_t>(wrote));
    }
  }

  // Gives up on the calls whose deadline passed by `now`, as Envoy does:
  // a queued one ends unsent, a sent one with RST_STREAM (CANCEL), which
  // goes out with the next flush(). Calls leave each queue in the order
  // they started, so the oldest is first.
  void expireCalls(Clock::time_point now) {
    if (deadline_.count() == 0) return;
    while (!waiting_.empty() && slots_[waiting_.front()].started + deadline_ <= now) {
      const size_t i = waiting_.front();
      waiting_.pop_front();
      giveUp(i, now);
    }
    dropAnswered();
    while (!sent_order_.empty()) {
      const auto [i, stream] = sent_order_.front();
      Slot& slot = slots_[i];
      if (slot.started + deadline_ > now) break;
      sent_order_.pop_front();
      slot.late = true;
      slot.stream = 0;
      if (nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, stream, NGHTTP2_CANCEL) != 0) {
        broken_ = true;
      }
      dropAnswered();
    }
  }

  // When the oldest call in flight reaches its deadline (time_point::max()
  // for none).
  Clock::time_point nextExpiry() {
    if (deadline_.count() == 0) return Clock::time_point::max();
    dropAnswered();
    Clock::time_point oldest = Clock::time_point::max();
    if (!sent_order_.empty()) oldest = slots_[sent_order_.front().first].started;
    if (!waiting_.empty()) oldest = std::min(oldest, slots_[waiting_.front()].started);
    return oldest == Clock::time_point::max() ? oldest : oldest + deadline_;
  }

 private:
  // The server's SETTINGS_MAX_CONCURRENT_STREAMS (nghttp2's 100 until it
  // comes).
  size_t maxStreams() const {
    return nghttp2_session_get_remote_settings(session_, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS);
  }

  // Hands slot i's call to nghttp2, which opens its stream.
  void submit(size_t i) {
    Slot& slot = slots_[i];
    const nghttp2_nv headers[] = {
        header(":method", "POST"), header(":scheme", "http"),
        header(":path", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"),
        header(":authority", "localhost"), header("content-type", "application/grpc"),
        header("te", "trailers"), header("grpc-timeout", grpc_timeout_.c_str())};
    nghttp2_data_provider body{};
    body.read_callback = readBody;
    const size_t count = deadline_.count() > 0 ? std::size(headers) : std::size(headers) - 1;
    const int32_t stream = nghttp2_submit_request(session_, nullptr, headers, count, &body,
                                                  reinterpret_cast<void*>(i));
    if (stream < 0) {
      broken_ = true;
      return;
    }
    slot.stream = stream;
    ++open_;
    if (deadline_.count() > 0) sent_order_.emplace_back(i, stream);
  }

  // Submits the queued calls while streams are free; a queued call whose
  // deadline passed is given up on, never sent.
  void submitWaiting(Clock::time_point now) {
    while (!waiting_.empty() && open_ < maxStreams()) {
      const size_t i = waiting_.front();
      waiting_.pop_front();
      if (deadline_.count() > 0 && slots_[i].started + deadline_ <= now) {
        giveUp(i, now);
      } else {
        submit(i);
      }
    }
  }

  // Slot i's call, never sent, ends at its deadline.
  void giveUp(size_t i, Clock::time_point now) {
    totals_->latencies_us.push_back(
        std::chrono::duration_cast<std::chrono::microseconds>(now - slots_[i].started).count());
    ++totals_->deadline_exceeded;
    --in_flight_;
    free_.push_back(i);
    if (closed_loop_ && now < end_) send(now);
  }

  // Pops the answered calls off the front of sent_order_ (a slot whose
  // stream differs was answered and moved on).
  void dropAnswered() {
    while (!sent_order_.empty() && slots_[sent_order_.front().first].stream != sent_order_.front().second) {
      sent_order_.pop_front();
    }
  }

  static nghttp2_nv header(const char* name, const char* value) {
    return {reinterpret_cast<uint8_t*>(const_cast<char*>(name)), reinterpret_cast<uint8_t*>(const_cast<char*>(value)),
            std::strlen(name), std::strlen(value), NGHTTP2_NV_FLAG_NO_COPY_NAME | NGHTTP2_NV_FLAG_NO_COPY_VALUE};
  }

  Slot& slotOf(int32_t stream) {
    return slots_[reinterpret_cast<size_t>(nghttp2_session_get_stream_user_data(session_, stream))];
  }

  static ssize_t readBody(nghttp2_session* session, int32_t stream, uint8_t* buffer, size_t length,
                          uint32_t* flags, nghttp2_data_source*, void* user) {
    (void)session;
    Slot& slot = static_cast<Connection*>(user)->slotOf(stream);
    const size_t n = std::min(length, slot.body->size() - slot.body_sent);
    std::memcpy(buffer, slot.body->data() + slot.body_sent, n);
    slot.body_sent += n;
    if (slot.body_sent == slot.body->size()) *flags |= NGHTTP2_DATA_FLAG_EOF;
    return static_cast<ssize_t>(n);
  }

  static int onData(nghttp2_session*, uint8_t, int32_t stream, const uint8_t* data, size_t length, void* user) {
    static_cast<Connection*>(user)->slotOf(stream).answer.append(reinterpret_cast<const char*>(data), length);
    return 0;
  }

  static int onHeader(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name, size_t name_length,
                      const uint8_t* value, size_t value_length, uint8_t, void* user) {
    if (std::string_view(reinterpret_cast<const char*>(name), name_length) == "grpc-status") {
      Slot& slot = static_cast<Connection*>(user)->slotOf(frame->hd.stream_id);
      const std::string_view status(reinterpret_cast<const char*>(value), value_length);
      slot.grpc_ok = status == "0";
      if (status == kGrpcDeadlineExceeded || status == kGrpcCancelled) slot.late = true;
    }
    return 0;
  }

  static int onClose(nghttp2_session*, int32_t stream, uint32_t error_code, void* user) {
    auto* self = static_cast<Connection*>(user);
    const Clock::time_point answered = Clock::now();
    const size_t i = reinterpret_cast<size_t>(nghttp2_session_get_stream_user_data(self->session_, stream));
    Slot& slot = self->slots_[i];
    self->totals_->latencies_us.push_back(
        std::chrono::duration_cast<std::chrono::microseconds>(answered - slot.started).count());
    slot.stream = 0;
    if (slot.late) {
      ++self->totals_->deadline_exceeded;
    } else if (error_code != NGHTTP2_NO_ERROR || !slot.grpc_ok || slot.answer.size() < 5 ||
        !self->response_.ParseFromArray(slot.answer.data() + 5, static_cast<int>(slot.answer.size() - 5))) {
      ++self->totals_->errors;
    } else if (self->response_.overall_code() == RateLimitResponse::OK) {
      ++self->totals_->ok;
    } else {
      ++self->totals_->over;
    }
    --self->in_flight_;
    --self->open_;
    self->free_.push_back(i);
    if (self->closed_loop_ && answered < self->end_) self->send(answered);
    self->submitWaiting(answered);
    return 0;
  }

  const Clock::duration deadline_;  // zero: none
  const std::string grpc_timeout_;  // deadline_ as grpc-timeout's value
  std::vector<std::string> bodies_;  // one per key
  int fd_ = -1;
  nghttp2_session* session_ = nullptr;
  std::string out_;  // bytes nghttp2 gave that the socket has not taken yet
  std::vector<Slot> slots_;
  std::vector<size_t> free_;  // indexes of slots_ not in flight
  // The calls with a deadline in the order sent: (slot, stream); a slot
  // whose stream differs was answered.
  std::deque<std::pair<size_t, int32_t>> sent_order_;
  std::deque<size_t> waiting_;  // slots started, not yet submitted: the server's streams were all open
  size_t open_ = 0;  // streams submitted and not yet closed
  RateLimitResponse response_;  // each answer parsed into it
  Totals* totals_ = nullptr;
  Clock::time_point end_;
  bool closed_loop_ = true;
  bool broken_ = false;  // the connection failed: the run ends
  uint64_t sent_ = 0;
  size_t in_flight_ = 0;
};

// Drives `connections` on the calling thread until the run ends: closed
// loop (rate 0), `depth` calls in flight on each until `end`; paced, call
// n due at first + n * interval until `end`, on connection n % count.
// Each turn: send the calls due (paced), give up on the calls past their
// deadline, write each connection's bytes in one write, then sleep in
// epoll_pwait2 until a socket is readable, the next call is due or the
// oldest call's deadline (nanosecond timeouts, so no timerfd to set and
// read per call), and read every readable socket.
void drive(const std::vector<Connection*>& connections, size_t depth, double rate, Clock::time_point first,
           Clock::duration interval, Clock::time_point end, Totals* totals, int64_t spin_us, int64_t batch_us) {
  const bool closed_loop = rate <= 0;
  const Clock::duration spin = std::chrono::microseconds(spin_us);
  const Clock::duration batch = std::chrono::microseconds(batch_us);
  const int epoll = ::epoll_create1(EPOLL_CLOEXEC);
  std::vector<bool> want_write(connections.size(), false);
  for (size_t c = 0; c < connections.size(); ++c) {
    connections[c]->prepare(totals, closed_loop, end);
    epoll_event event{.events = EPOLLIN, .data = {.u64 = c}};
    ::epoll_ctl(epoll, EPOLL_CTL_ADD, connections[c]->fd(), &event);
  }
  if (closed_loop) {
    const Clock::time_point now = Clock::now();
    for (Connection* connection : connections) {
      for (size_t i = 0; i < depth; ++i) connection->send(now);
    }
  } else {
    ::prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);  // wake at the due time, not up to 50 µs after
  }
  uint64_t due_index = 0;
  auto due = [&] { return first + interval * static_cast<int64_t>(due_index); };
  // When the next call leaves: at its due time, or with BATCH_US at the
  // end of the batch_us-long tick it falls in, with the others due in it.
  auto leave = [&] {
    if (batch.count() == 0) return due();
    const auto ticks = (due() - first + batch - Clock::duration(1)) / batch;
    return first + batch * ticks;
  };
  for (;;) {
    const Clock::time_point now = Clock::now();
    while (!closed_loop && due() < end && leave() <= now) {
      connections[due_index % connections.size()]->send(due());
      totals->send_lags_us.push_back(std::chrono::duration_cast<std::chrono::microseconds>(now - due()).count());
      ++due_index;
    }
    const bool paced_more = !closed_loop && due() < end;
    bool broken = false;
    size_t in_flight = 0;
    Clock::time_point wake = now + std::chrono::milliseconds(100);
    for (size_t c = 0; c < connections.size(); ++c) {
      Connection* connection = connections[c];
      connection->expireCalls(now);
      connection->flush();
      if (want_write[c] != connection->wantsWrite()) {
        want_write[c] = connection->wantsWrite();
        epoll_event event{.events = EPOLLIN | (want_write[c] ? EPOLLOUT : 0U), .data = {.u64 = c}};
        ::epoll_ctl(epoll, EPOLL_CTL_MOD, connection->fd(), &event);
      }
      broken = broken || connection->broken();
      in_flight += connection->inFlight();
      wake = std::min(wake, connection->nextExpiry());
    }
    if (broken) break;
    if (!paced_more && in_flight == 0 && (!closed_loop || now >= end)) break;
    if (now >= end + kDrainLimit) break;
    if (paced_more) {
      // With SPIN_US, a call leaving within it is waited for by polling.
      wake = std::min(wake, leave() - now <= spin ? now : leave());
    }
    const auto wait_ns = std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(wake - now).count());
    const timespec timeout{.tv_sec = static_cast<time_t>(wait_ns / 1'000'000'000),
                           .tv_nsec = static_cast<long>(wait_ns % 1'000'000'000)};
    epoll_event events[16];
    const int n = ::epoll_pwait2(epoll, events, std::size(events), &timeout, nullptr);
    for (int e = 0; e < n; ++e) {
      if (events[e].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) connections[events[e].data.u64]->read();
    }
  }
  for (Connection* connection : connections) {
    totals->errors += connection->inFlight();  // unanswered: a connection broke, or the drain gave up
  }
  ::close(epoll);
}

int64_t quantile(const std::vector<int64_t>& sorted, double q) {
  if (sorted.empty()) return 0;
  return sorted[static_cast<size_t>(q * static_cast<double>(sorted.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: rls_load TARGET DESCRIPTORS SECONDS [THREADS] [DEPTH] [RATE] [KEYS] [DEADLINE_MS] [SPIN_US] [BATCH_US]\n");
    return 2;
  }
  const std::string target = argv[1];
  const int descriptors = std::atoi(argv[2]);
  const double seconds = std::atof(argv[3]);
  const int threads = std::max(1, argc > 4 ? std::atoi(argv[4]) : 2);
  const int depth = std::max(1, argc > 5 ? std::atoi(argv[5]) : 32);
  const double rate = argc > 6 ? std::atof(argv[6]) : 0;
  const int keys = std::clamp(argc > 7 ? std::atoi(argv[7]) : 1, 1, 1'000'000);
  const int64_t deadline_ms = std::clamp<int64_t>(argc > 8 ? std::atoll(argv[8]) : 20, 0, 99'999'999);
  const int64_t spin_us = std::clamp<int64_t>(argc > 9 ? std::atoll(argv[9]) : kSpinUs, 0, 1'000'000);
  const int64_t batch_us = std::clamp<int64_t>(argc > 10 ? std::atoll(argv[10]) : 0, 0, 1'000'000);
  std::vector<std::unique_ptr<Connection>> connections;
  for (int t = 0; t < threads; ++t) connections.push_back(std::make_unique<Connection>(target, descriptors, keys, deadline_ms));
  // Closed loop, a thread per connection; paced, one thread for them all.
  const size_t loops = rate > 0 ? 1 : static_cast<size_t>(threads);
  std::vector<Totals> totals(loops);
  for (Totals& part : totals) {
    part.latencies_us.reserve(static_cast<size_t>(std::min(seconds * (rate > 0 ? rate : 1e5), 1e8) / static_cast<double>(loops)));
    if (rate > 0) part.send_lags_us.reserve(part.latencies_us.capacity());
  }
  const auto started = Clock::now();
  const auto end = started + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  const auto spacing = rate > 0 ? std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1.0 / rate))
                                : Clock::duration::zero();
  std::vector<std::thread> workers;
  if (rate > 0) {
    std::vector<Connection*> all;
    for (auto& connection : connections) all.push_back(connection.get());
    drive(all, static_cast<size_t>(depth), rate, started, spacing, end, &totals[0], spin_us, batch_us);
  } else {
    for (size_t t = 0; t < loops; ++t) {
      workers.emplace_back([&, t] {
        drive({connections[t].get()}, static_cast<size_t>(depth), rate, started, spacing, end, &totals[t], spin_us, 0);
      });
    }
  }
  for (std::thread& worker : workers) worker.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
  Totals all;
  for (Totals& part : totals) {
    all.latencies_us.insert(all.latencies_us.end(), part.latencies_us.begin(), part.latencies_us.end());
    all.send_lags_us.insert(all.send_lags_us.end(), part.send_lags_us.begin(), part.send_lags_us.end());
    all.ok += part.ok;
    all.over += part.over;
    all.deadline_exceeded += part.deadline_exceeded;
    all.errors += part.errors;
  }
  std::sort(all.latencies_us.begin(), all.latencies_us.end());
  std::sort(all.send_lags_us.begin(), all.send_lags_us.end());
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  const double cpu_us = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1e6 +
                        static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
  std::printf("calls_per_s=%.0f p50_us=%lld p99_us=%lld max_us=%lld ok=%llu over_limit=%llu "
              "deadline_exceeded=%llu errors=%llu driver_cpu_us_per_call=%.1f",
              static_cast<double>(all.latencies_us.size()) / elapsed,
              static_cast<long long>(quantile(all.latencies_us, 0.5)),
              static_cast<long long>(quantile(all.latencies_us, 0.99)),
              static_cast<long long>(quantile(all.latencies_us, 1.0)),
              static_cast<unsigned long long>(all.ok), static_cast<unsigned long long>(all.over),
              static_cast<unsigned long long>(all.deadline_exceeded),
              static_cast<unsigned long long>(all.errors),
              all.latencies_us.empty() ? 0.0 : cpu_us / static_cast<double>(all.latencies_us.size()));
  if (rate > 0) std::printf(" send_lag_p99_us=%lld", static_cast<long long>(quantile(all.send_lags_us, 0.99)));
  std::printf("\n");
  return all.errors == 0 ? 0 : 1;
}

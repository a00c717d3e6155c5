// rls_load: a load generator for Envoy's rate limit service, as Envoy calls
// it: ShouldRateLimit with one domain and N descriptors, over one HTTP/2
// connection per thread, either closed loop (`depth` calls in flight per
// thread, each answer sending the next) or paced to a total `rate` (calls/s)
// for the latency at a given load.
//
//   rls_load TARGET DESCRIPTORS SECONDS [THREADS] [DEPTH] [RATE] [KEYS] [DEADLINE_MS] [SPIN_US]
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
// The thread model: one thread per connection, in epoll on its socket and,
// paced, a timerfd. Closed loop, each answer sends that slot's next call.
// Paced, every call has its own due time, start + i / rate (the
// connections' schedules interleaved, so the calls of all of them are
// evenly spaced), and the timerfd (absolute, monotonic, 1 ns timer slack)
// wakes the thread to send it: as Envoy sends each call when its request
// arrives. With SPIN_US (0, the default: never), a call due within that
// many µs is waited for instead by polling the socket without blocking
// (epoll_wait with no timeout) until it is due, sparing the thread a sleep
// and a wake-up per call when calls are close together, at the price of
// the CPU the polling burns (on 2 CPUs, CPU sluiced then lacks). A call's latency runs from its send to its answer's end of
// stream; send_lag_p99_us is the p99 of how late the sends left after
// their due time (a busy machine delays the thread), so a reader can tell
// whether the pacing held.
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
#include <sys/timerfd.h>
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
  Clock::time_point sent;
};

// One HTTP/2 connection and its calls, on one thread.
class Connection {
 public:
  Connection(const std::string& target, int descriptors, int keys, int64_t deadline_ms, int64_t spin_us)
      : deadline_(std::chrono::milliseconds(deadline_ms)), spin_(std::chrono::microseconds(spin_us)),
        grpc_timeout_(std::to_string(deadline_ms) + "m") {
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

  // Closed loop (rate 0): `depth` calls in flight until `end`. Paced: call
  // n due at first + n * interval, until `end`.
  void run(size_t depth, double rate, Clock::time_point first, Clock::duration interval,
           Clock::time_point end, Totals* totals) {
    totals_ = totals;
    end_ = end;
    closed_loop_ = rate <= 0;
    const int epoll = ::epoll_create1(EPOLL_CLOEXEC);
    const int timer = closed_loop_ ? -1 : ::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
    epoll_event event{.events = EPOLLIN, .data = {.fd = fd_}};
    ::epoll_ctl(epoll, EPOLL_CTL_ADD, fd_, &event);
    uint64_t due_index = 0;
    auto due = [&] { return first + interval * static_cast<int64_t>(due_index); };
    auto arm = [&] {
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(due().time_since_epoch()).count();
      itimerspec at{};
      at.it_value = {.tv_sec = static_cast<time_t>(ns / 1'000'000'000), .tv_nsec = static_cast<long>(ns % 1'000'000'000)};
      ::timerfd_settime(timer, TFD_TIMER_ABSTIME, &at, nullptr);
    };
    if (closed_loop_) {
      for (size_t i = 0; i < depth; ++i) send();
    } else {
      ::prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
      epoll_event tick{.events = EPOLLIN, .data = {.fd = timer}};
      ::epoll_ctl(epoll, EPOLL_CTL_ADD, timer, &tick);
    }
    bool armed = false;  // the timer is set for due()
    bool want_write = false;
    char buffer[65536];
    while (!broken_) {
      // Out: what nghttp2 has to send, as far as the socket takes it.
      flush();
      if (want_write != !pending_.empty()) {
        want_write = !pending_.empty();
        event.events = EPOLLIN | (want_write ? EPOLLOUT : 0U);
        ::epoll_ctl(epoll, EPOLL_CTL_MOD, fd_, &event);
      }
      const Clock::time_point now = Clock::now();
      const bool sending = !closed_loop_ && due() < end_;
      if (!sending && in_flight_ == 0 && (!closed_loop_ || now >= end_)) break;
      if (now >= end_ + kDrainLimit) break;
      int wait_ms = 100;
      if (expireCalls(now)) {
        wait_ms = 0;  // RST_STREAMs to send
      } else if (deadline_.count() > 0 && (!sent_order_.empty() || !waiting_.empty())) {
        Clock::time_point oldest = Clock::time_point::max();
        if (!sent_order_.empty()) oldest = slots_[sent_order_.front().first].sent;
        if (!waiting_.empty()) oldest = std::min(oldest, slots_[waiting_.front()].sent);
        const auto next = oldest + deadline_ - now;
        wait_ms = static_cast<int>(std::clamp<int64_t>(
            std::chrono::ceil<std::chrono::milliseconds>(next).count(), 0, wait_ms));
      }
      if (sending) {
        if (due() - now <= spin_) {
          wait_ms = 0;  // near: poll until it is due
        } else if (!armed) {
          arm();
          armed = true;
        }
      }
      epoll_event events[4];
      const int n = ::epoll_wait(epoll, events, 4, wait_ms);
      for (int e = 0; e < n; ++e) {
        if (events[e].data.fd == timer) {
          uint64_t expirations = 0;
          [[maybe_unused]] const ssize_t got = ::read(timer, &expirations, sizeof(expirations));
          armed = false;
          continue;
        }
        if (events[e].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
          for (;;) {
            const ssize_t got = ::read(fd_, buffer, sizeof(buffer));
            if (got > 0) {
              if (nghttp2_session_mem_recv(session_, reinterpret_cast<uint8_t*>(buffer), static_cast<size_t>(got)) < 0) {
                broken_ = true;
              }
              if (static_cast<size_t>(got) < sizeof(buffer)) break;
              continue;
            }
            if (got == 0 || (errno != EAGAIN && errno != EINTR)) broken_ = true;
            break;
          }
        }
      }
      if (!closed_loop_) {
        const Clock::time_point woke = Clock::now();
        while (due() <= woke && due() < end_) {
          send();
          totals_->send_lags_us.push_back(
              std::chrono::duration_cast<std::chrono::microseconds>(slots_[last_].sent - due()).count());
          ++due_index;
          armed = false;  // set for a time gone by; set again for the next
        }
      }
    }
    totals_->errors += in_flight_;  // unanswered: the connection broke, or the drain gave up
    if (timer >= 0) ::close(timer);
    ::close(epoll);
  }

 private:
  // Starts the next call on a free slot: submitted to nghttp2 when the
  // server's limit on open streams leaves room, else queued (waiting_)
  // until a stream ends, as Envoy's connection pool queues calls past it.
  // The call's latency runs from here either way.
  void send() {
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
    slot.sent = Clock::now();
    ++sent_;
    ++in_flight_;
    last_ = i;
    if (waiting_.empty() && open_ < maxStreams()) {
      submit(i);
    } else {
      waiting_.push_back(i);
    }
  }

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
      if (deadline_.count() > 0 && slots_[i].sent + deadline_ <= now) {
        giveUp(i, now);
      } else {
        submit(i);
      }
    }
  }

  // Slot i's call, never sent, ends at its deadline.
  void giveUp(size_t i, Clock::time_point now) {
    totals_->latencies_us.push_back(
        std::chrono::duration_cast<std::chrono::microseconds>(now - slots_[i].sent).count());
    ++totals_->deadline_exceeded;
    --in_flight_;
    free_.push_back(i);
    if (closed_loop_ && now < end_) send();
  }

  // Gives up on the calls whose deadline passed by `now`, as Envoy does:
  // a queued one ends unsent, a sent one with RST_STREAM (CANCEL). Calls
  // leave each queue in the order they started, so the oldest is first.
  // true when it reset any (they go out with the next flush).
  bool expireCalls(Clock::time_point now) {
    if (deadline_.count() == 0) return false;
    while (!waiting_.empty() && slots_[waiting_.front()].sent + deadline_ <= now) {
      const size_t i = waiting_.front();
      waiting_.pop_front();
      giveUp(i, now);
    }
    bool reset = false;
    while (!sent_order_.empty()) {
      const auto [i, stream] = sent_order_.front();
      Slot& slot = slots_[i];
      if (slot.stream != stream) {  // answered already; the slot moved on
        sent_order_.pop_front();
        continue;
      }
      if (slot.sent + deadline_ > now) break;
      sent_order_.pop_front();
      slot.late = true;
      slot.stream = 0;
      if (nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, stream, NGHTTP2_CANCEL) != 0) {
        broken_ = true;
      }
      reset = true;
    }
    return reset;
  }

  static nghttp2_nv header(const char* name, const char* value) {
    return {reinterpret_cast<uint8_t*>(const_cast<char*>(name)), reinterpret_cast<uint8_t*>(const_cast<char*>(value)),
            std::strlen(name), std::strlen(value), NGHTTP2_NV_FLAG_NO_COPY_NAME | NGHTTP2_NV_FLAG_NO_COPY_VALUE};
  }

  // Writes what nghttp2 has for the socket; keeps what it does not take.
  void flush() {
    for (;;) {
      if (pending_.empty()) {
        const uint8_t* data = nullptr;
        const ssize_t n = nghttp2_session_mem_send(session_, &data);
        if (n < 0) {
          broken_ = true;
          return;
        }
        if (n == 0) return;
        pending_.assign(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
      }
      const ssize_t wrote = ::write(fd_, pending_.data(), pending_.size());
      if (wrote < 0) {
        if (errno != EAGAIN && errno != EINTR) broken_ = true;
        return;
      }
      pending_.erase(0, static_cast<size_t>(wrote));
    }
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
        std::chrono::duration_cast<std::chrono::microseconds>(answered - slot.sent).count());
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
    if (self->closed_loop_ && answered < self->end_) self->send();
    self->submitWaiting(answered);
    return 0;
  }

  const Clock::duration deadline_;  // zero: none
  const Clock::duration spin_;  // paced: a call due within this is waited for polling
  const std::string grpc_timeout_;  // deadline_ as grpc-timeout's value
  std::vector<std::string> bodies_;  // one per key
  int fd_ = -1;
  nghttp2_session* session_ = nullptr;
  std::string pending_;  // bytes nghttp2 gave that the socket has not taken yet
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
  size_t last_ = 0;  // the slot send() used last
};

int64_t quantile(const std::vector<int64_t>& sorted, double q) {
  if (sorted.empty()) return 0;
  return sorted[static_cast<size_t>(q * static_cast<double>(sorted.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: rls_load TARGET DESCRIPTORS SECONDS [THREADS] [DEPTH] [RATE] [KEYS] [DEADLINE_MS] [SPIN_US]\n");
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
  std::vector<std::unique_ptr<Connection>> connections;
  for (int t = 0; t < threads; ++t) connections.push_back(std::make_unique<Connection>(target, descriptors, keys, deadline_ms, spin_us));
  std::vector<Totals> totals(static_cast<size_t>(threads));
  for (Totals& part : totals) {
    part.latencies_us.reserve(static_cast<size_t>(std::min(seconds * (rate > 0 ? rate : 1e5), 1e8) / threads));
    if (rate > 0) part.send_lags_us.reserve(part.latencies_us.capacity());
  }
  const auto started = Clock::now();
  const auto end = started + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  // Connection t's calls are t, t + threads, t + 2 * threads, ... of one
  // schedule of `rate` calls/s.
  const auto spacing = rate > 0 ? std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1.0 / rate))
                                : Clock::duration::zero();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      connections[static_cast<size_t>(t)]->run(static_cast<size_t>(depth), rate, started + spacing * t,
                                               spacing * threads, end, &totals[static_cast<size_t>(t)]);
    });
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

// rls_load: a load generator for Envoy's rate limit service, as Envoy calls
// it: ShouldRateLimit with one domain and N descriptors, over one HTTP/2
// connection per thread, either closed loop (`depth` calls in flight per
// thread, each answer sending the next) or paced to a total `rate` (calls/s)
// for the latency at a given load.
//
//   rls_load TARGET DESCRIPTORS SECONDS [THREADS] [DEPTH] [RATE] [KEYS]
//
// Prints one line: calls/s, p50/p99/max latency in µs, OK, OVER_LIMIT and
// errors; paced runs add send_lag_p99_us (how late the sends left, below).
// Keys cycle through KEYS values of descriptor i's key "k<i>" (1: one hot
// key per descriptor).
//
// The thread model: each connection has its own channel and completion
// queue (gRPC's async API), and a thread blocked in its queue's Next(),
// which reads the answers (the queue's poller) and timestamps each as it
// arrives. Closed loop, that thread also sends each slot's next call. Paced,
// a sender thread of its own sends: each call at its own time,
// start + i / rate (the connections' schedules interleaved, so the calls of
// all of them are evenly spaced), sleeping to it with clock_nanosleep on
// the monotonic clock (timer slack 1 ns): as Envoy sends each call when its
// request arrives. gRPC's own timers (an alarm, AsyncNext's deadline) round
// up to whole milliseconds and would send in bursts. A call's latency runs
// from its send to its answer; send_lag_p99_us is the p99 of how late the
// sends left after their due time (a busy machine delays the sender), so a
// reader can tell the pacing held.
//
// Per call the driver allocates nothing of its own: the request is built
// once per connection (only its values change, in place), and each slot
// reuses its response and rebuilds its ClientContext in place; what gRPC
// allocates for a call is gRPC's.
#include <grpcpp/grpcpp.h>
#include <sys/prctl.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"

namespace {

using envoy::service::ratelimit::v3::RateLimitRequest;
using envoy::service::ratelimit::v3::RateLimitResponse;
using envoy::service::ratelimit::v3::RateLimitService;
using Clock = std::chrono::steady_clock;

struct Totals {
  std::vector<int64_t> latencies_us;
  std::vector<int64_t> send_lags_us;  // paced runs
  uint64_t ok = 0, over = 0, errors = 0;
};

// One call in flight; its tag is its index in the connection's slots.
struct Slot {
  std::optional<grpc::ClientContext> context;
  RateLimitResponse response;
  grpc::Status status;
  Clock::time_point sent;
};

// One connection: its channel, queue, slots and the request it sends.
class Connection {
 public:
  Connection(const std::string& target, int descriptors, int keys, size_t slots)
      : keys_(static_cast<uint64_t>(keys)), slots_(slots) {
    // A connection of its own, as each of Envoy's worker threads has: gRPC
    // would otherwise share one subchannel (one HTTP/2 connection) between
    // the threads' channels, and the server would read every call from it.
    grpc::ChannelArguments arguments;
    arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    // Off, as Envoy's own client has none of them: retries (their filter
    // holds each call's messages), the optional filters (deadline, message
    // size) and HTTP/2's BDP pings, which a Unix socket does not need.
    // Together about a seventh of the driver's instructions a call
    // (callgrind), CPU the daemon gets on a machine the two share.
    arguments.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    arguments.SetInt(GRPC_ARG_MINIMAL_STACK, 1);
    arguments.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    stub_ = RateLimitService::NewStub(
        grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), arguments));
    request_.set_domain("bench");
    for (int d = 0; d < descriptors; ++d) {
      auto* entry = request_.add_descriptors()->add_entries();
      entry->set_key("k" + std::to_string(d));
      entry->set_value("v0");
    }
  }

  // Sends call number `n` on slot `i` (free). Only one thread sends.
  void send(size_t i, uint64_t n) {
    if (keys_ > 1) {
      const std::string value = "v" + std::to_string(n % keys_);
      for (auto& descriptor : *request_.mutable_descriptors()) {
        descriptor.mutable_entries(0)->set_value(value);
      }
    }
    Slot& slot = slots_[i];
    slot.context.reset();
    slot.context.emplace();
    slot.sent = Clock::now();
    auto reader = stub_->PrepareAsyncShouldRateLimit(&*slot.context, request_, &queue_);
    reader->StartCall();
    reader->Finish(&slot.response, &slot.status, reinterpret_cast<void*>(i));
  }

  // The next answer: its slot, or false once the queue is shut down and empty.
  bool next(size_t* i, bool* ok) {
    void* tag = nullptr;
    if (!queue_.Next(&tag, ok)) return false;
    *i = reinterpret_cast<size_t>(tag);
    return true;
  }

  // Counts slot i's answer, which arrived at `answered`.
  void count(size_t i, bool ok, Clock::time_point answered, Totals* totals) const {
    const Slot& slot = slots_[i];
    totals->latencies_us.push_back(
        std::chrono::duration_cast<std::chrono::microseconds>(answered - slot.sent).count());
    if (!ok || !slot.status.ok()) {
      ++totals->errors;
    } else if (slot.response.overall_code() == RateLimitResponse::OK) {
      ++totals->ok;
    } else {
      ++totals->over;
    }
  }

  size_t slots() const { return slots_.size(); }
  // No call may be sent after this; next() returns the rest, then false.
  void shutdown() { queue_.Shutdown(); }

 private:
  const uint64_t keys_;
  std::unique_ptr<RateLimitService::Stub> stub_;
  grpc::CompletionQueue queue_;
  RateLimitRequest request_;
  std::vector<Slot> slots_;
};

// Closed loop: `depth` calls in flight, each answer sending the next until `end`.
void closedLoop(Connection& connection, Clock::time_point end, Totals* totals) {
  uint64_t sent = 0;
  size_t in_flight = 0;
  for (size_t i = 0; i < connection.slots(); ++i, ++in_flight) connection.send(i, sent++);
  size_t i = 0;
  bool ok = false;
  while (in_flight > 0 && connection.next(&i, &ok)) {
    const Clock::time_point answered = Clock::now();
    connection.count(i, ok, answered, totals);
    --in_flight;
    if (answered < end) {
      connection.send(i, sent++);
      ++in_flight;
    }
  }
  connection.shutdown();
  while (connection.next(&i, &ok)) {
  }
}

// Paced: this connection's calls due at first + n * interval until `end`,
// sent by a thread of their own; this thread reads the answers.
void paced(Connection& connection, Clock::time_point first, Clock::duration interval,
           Clock::time_point end, Totals* totals) {
  std::mutex mutex;  // free
  std::condition_variable freed;
  std::vector<size_t> free;
  for (size_t i = connection.slots(); i-- > 0;) free.push_back(i);
  std::thread sender([&] {
    ::prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    for (uint64_t n = 0;; ++n) {
      const Clock::time_point due = first + interval * static_cast<int64_t>(n);
      if (due >= end) break;
      const auto due_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(due.time_since_epoch()).count();
      const timespec at{.tv_sec = static_cast<time_t>(due_ns / 1'000'000'000),
                        .tv_nsec = static_cast<long>(due_ns % 1'000'000'000)};
      // steady_clock is CLOCK_MONOTONIC in libstdc++.
      while (::clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, nullptr) != 0) {
      }
      size_t i = 0;
      {
        std::unique_lock<std::mutex> lock(mutex);
        freed.wait(lock, [&] { return !free.empty(); });
        i = free.back();
        free.pop_back();
      }
      connection.send(i, n);
      totals->send_lags_us.push_back(
          std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - due).count());
    }
    connection.shutdown();
  });
  size_t i = 0;
  bool ok = false;
  while (connection.next(&i, &ok)) {
    connection.count(i, ok, Clock::now(), totals);
    std::lock_guard<std::mutex> lock(mutex);
    free.push_back(i);
    freed.notify_one();
  }
  sender.join();
}

int64_t quantile(const std::vector<int64_t>& sorted, double q) {
  if (sorted.empty()) return 0;
  return sorted[static_cast<size_t>(q * static_cast<double>(sorted.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: rls_load TARGET DESCRIPTORS SECONDS [THREADS] [DEPTH] [RATE] [KEYS]\n");
    return 2;
  }
  const std::string target = argv[1];
  const int descriptors = std::atoi(argv[2]);
  const double seconds = std::atof(argv[3]);
  const int threads = std::max(1, argc > 4 ? std::atoi(argv[4]) : 2);
  const int depth = std::max(1, argc > 5 ? std::atoi(argv[5]) : 32);
  const double rate = argc > 6 ? std::atof(argv[6]) : 0;
  const int keys = argc > 7 ? std::max(1, std::atoi(argv[7])) : 1;
  // Paced, a slot per call that may be in flight: enough for 100 ms of
  // answers late, so that the sender never waits on a slow answer.
  const size_t slots = rate > 0 ? std::max<size_t>(static_cast<size_t>(depth),
                                                   static_cast<size_t>(rate / threads / 10) + 1)
                                : static_cast<size_t>(depth);
  std::vector<std::unique_ptr<Connection>> connections;
  for (int t = 0; t < threads; ++t) {
    connections.push_back(std::make_unique<Connection>(target, descriptors, keys, slots));
  }
  std::vector<Totals> totals(static_cast<size_t>(threads));
  for (Totals& part : totals) {
    part.latencies_us.reserve(static_cast<size_t>(std::min(seconds * (rate > 0 ? rate : 1e5), 1e8) / threads));
    if (rate > 0) part.send_lags_us.reserve(part.latencies_us.capacity());
  }
  const auto started = Clock::now();
  const auto end = started + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    Connection& connection = *connections[static_cast<size_t>(t)];
    Totals* part = &totals[static_cast<size_t>(t)];
    if (rate > 0) {
      // Connection t's calls are t, t + threads, t + 2 * threads, ... of one
      // schedule of `rate` calls/s.
      const auto spacing = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1.0 / rate));
      workers.emplace_back(paced, std::ref(connection), started + spacing * t, spacing * threads, end, part);
    } else {
      workers.emplace_back(closedLoop, std::ref(connection), end, part);
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
    all.errors += part.errors;
  }
  std::sort(all.latencies_us.begin(), all.latencies_us.end());
  std::sort(all.send_lags_us.begin(), all.send_lags_us.end());
  std::printf("calls_per_s=%.0f p50_us=%lld p99_us=%lld max_us=%lld ok=%llu over_limit=%llu errors=%llu",
              static_cast<double>(all.latencies_us.size()) / elapsed,
              static_cast<long long>(quantile(all.latencies_us, 0.5)),
              static_cast<long long>(quantile(all.latencies_us, 0.99)),
              static_cast<long long>(quantile(all.latencies_us, 1.0)),
              static_cast<unsigned long long>(all.ok), static_cast<unsigned long long>(all.over),
              static_cast<unsigned long long>(all.errors));
  if (rate > 0) std::printf(" send_lag_p99_us=%lld", static_cast<long long>(quantile(all.send_lags_us, 0.99)));
  std::printf("\n");
  return all.errors == 0 ? 0 : 1;
}

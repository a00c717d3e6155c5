// rls_load: a load generator for Envoy's rate limit service, as Envoy calls
// it: ShouldRateLimit with one domain and N descriptors, over one HTTP/2
// channel per thread, `depth` calls in flight per thread (closed loop), or
// paced to a total `rate` (calls/s) for latency at a given load.
//
//   rls_load TARGET DESCRIPTORS SECONDS [THREADS] [DEPTH] [RATE] [KEYS]
//
// Prints one line: calls/s, p50/p99/max latency in µs, OK, OVER_LIMIT and
// errors. Keys cycle through KEYS values of descriptor i's key "k<i>"
// (1: one hot key per descriptor).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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
  uint64_t ok = 0, over = 0, errors = 0;
};

struct Slot {
  grpc::ClientContext* context = nullptr;
  RateLimitResponse response;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<RateLimitResponse>> reader;
  Clock::time_point started;
};

void run(const std::string& target, int descriptors, double seconds, int depth, double rate,
         int keys, Totals* totals) {
  // A connection of its own, as each of Envoy's worker threads has: gRPC
  // would otherwise share one subchannel (one HTTP/2 connection) between
  // the threads' channels, and the server would read every call from it.
  grpc::ChannelArguments arguments;
  arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), arguments);
  auto stub = RateLimitService::NewStub(channel);
  grpc::CompletionQueue queue;
  std::vector<Slot> slots(static_cast<size_t>(depth));
  uint64_t sent = 0;
  const Clock::time_point start = Clock::now();
  const Clock::time_point end = start + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(seconds));
  // When the next call is due (paced runs); never sleeps with answers waiting.
  auto due = [&] {
    return start + std::chrono::duration_cast<Clock::duration>(
                       std::chrono::duration<double>(static_cast<double>(sent) / rate));
  };
  auto send = [&](size_t i) {
    RateLimitRequest request;
    request.set_domain("bench");
    for (int d = 0; d < descriptors; ++d) {
      auto* entry = request.add_descriptors()->add_entries();
      entry->set_key("k" + std::to_string(d));
      entry->set_value("v" + std::to_string(static_cast<int>(sent % static_cast<uint64_t>(keys))));
    }
    ++sent;
    Slot& slot = slots[i];
    delete slot.context;
    slot.context = new grpc::ClientContext();
    slot.started = Clock::now();
    slot.reader = stub->AsyncShouldRateLimit(slot.context, request, &queue);
    slot.reader->Finish(&slot.response, &slot.status, reinterpret_cast<void*>(i));
  };
  std::vector<size_t> idle;  // paced runs: slots waiting for their call's due time
  size_t in_flight = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (rate > 0) {
      idle.push_back(i);
    } else {
      send(i);
      ++in_flight;
    }
  }
  for (;;) {
    const Clock::time_point now = Clock::now();
    while (rate > 0 && !idle.empty() && now < end && due() <= now) {
      send(idle.back());
      idle.pop_back();
      ++in_flight;
    }
    if (in_flight == 0 && (rate <= 0 || now >= end)) break;
    void* tag = nullptr;
    bool ok = false;
    const Clock::time_point wake = rate > 0 && !idle.empty() ? std::min(due(), end) : end + std::chrono::seconds(10);
    // gRPC takes deadlines on the system clock.
    const auto got = queue.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + (wake - Clock::now()));
    if (got == grpc::CompletionQueue::SHUTDOWN) break;
    if (got == grpc::CompletionQueue::TIMEOUT) continue;
    const auto i = reinterpret_cast<size_t>(tag);
    Slot& slot = slots[i];
    const Clock::time_point answered = Clock::now();
    totals->latencies_us.push_back(
        std::chrono::duration_cast<std::chrono::microseconds>(answered - slot.started).count());
    --in_flight;
    if (!ok || !slot.status.ok()) {
      ++totals->errors;
    } else if (slot.response.overall_code() == RateLimitResponse::OK) {
      ++totals->ok;
    } else {
      ++totals->over;
    }
    if (answered >= end) continue;
    if (rate > 0) {
      idle.push_back(i);
    } else {
      send(i);
      ++in_flight;
    }
  }
  for (Slot& slot : slots) delete slot.context;
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
  const int threads = argc > 4 ? std::atoi(argv[4]) : 2;
  const int depth = argc > 5 ? std::atoi(argv[5]) : 32;
  const double rate = argc > 6 ? std::atof(argv[6]) : 0;
  const int keys = argc > 7 ? std::max(1, std::atoi(argv[7])) : 1;
  std::vector<Totals> totals(static_cast<size_t>(threads));
  std::vector<std::thread> workers;
  const auto started = Clock::now();
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back(run, target, descriptors, seconds, depth, rate / threads, keys,
                         &totals[static_cast<size_t>(t)]);
  }
  for (std::thread& worker : workers) worker.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
  Totals all;
  for (Totals& part : totals) {
    all.latencies_us.insert(all.latencies_us.end(), part.latencies_us.begin(), part.latencies_us.end());
    all.ok += part.ok;
    all.over += part.over;
    all.errors += part.errors;
  }
  std::sort(all.latencies_us.begin(), all.latencies_us.end());
  auto at = [&](double q) {
    if (all.latencies_us.empty()) return int64_t{0};
    return all.latencies_us[static_cast<size_t>(q * static_cast<double>(all.latencies_us.size() - 1))];
  };
  std::printf("calls_per_s=%.0f p50_us=%lld p99_us=%lld max_us=%lld ok=%llu over_limit=%llu errors=%llu\n",
              static_cast<double>(all.latencies_us.size()) / elapsed, static_cast<long long>(at(0.5)),
              static_cast<long long>(at(0.99)), static_cast<long long>(at(1.0)),
              static_cast<unsigned long long>(all.ok), static_cast<unsigned long long>(all.over),
              static_cast<unsigned long long>(all.errors));
  return all.errors == 0 ? 0 : 1;
}

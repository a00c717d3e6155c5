// Clock: the daemon's clocks and the offset between its monotonic clock and
// Redis's.
//
// Every decision uses the monotonic clock (CLOCK_MONOTONIC: never steps,
// read through the vDSO, no system call). Redis has its own clock, TIME: wall
// time of the Redis host, shared by every node through the Lua scripts. The
// lease path must turn Redis times ("nothing left until t") into local
// monotonic times, so the control thread estimates
//     offset = redis_time - monotonic_time
// from the heartbeat replies (ClockOffsetEstimator below).
//
// Units: microseconds unless a name says otherwise; Redis times are since the
// Unix epoch, monotonic times since an arbitrary start (boot).
//
// Thread-safety: the free functions may be called from any thread. A
// ClockOffsetEstimator is a plain value; its owner (the control thread)
// publishes the estimate to other threads.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>

namespace sluice {

// Monotonic time in nanoseconds (CLOCK_MONOTONIC), the clock every decision uses.
int64_t monotonicNowNs();

// The monotonic clock as something to inject: a class that reads the time
// takes one (monotonicNowNs in the daemon) and reads it through that alone,
// so a test can run it on a simulated clock. Called on the owner's threads;
// a test's clock must be safe to call from each of them.
using MonotonicClock = std::function<int64_t()>;

// CLOCK_REALTIME minus CLOCK_MONOTONIC now, in microseconds: what turns a
// monotonic time into this host's wall time. It moves when the wall clock is
// stepped or slewed.
int64_t realtimeMinusMonotonicUs();

// Estimates redis_time - monotonic_time from round trips to Redis.
//
// The method (Cristian's algorithm, with NTP's minimum-delay filter): a call
// is sent at monotonic time t0 and answered at t1; Redis read its clock at
// some instant in [t0, t1], so the best guess for that instant is the
// midpoint, and the error is at most rtt/2 = (t1 - t0)/2. Redis reports whole
// milliseconds (floored), so the sample takes the middle of that millisecond,
// adding at most 0.5 ms of error:
//     offset = redis_ms * 1000 + 500 - (t0 + t1) / 2.
// Queueing delay makes a round trip long and its sample uncertain, so of the
// last kWindow samples the estimate is the one with the smallest round trip.
// A window rather than the all-time best lets the estimate follow the slow
// drift between the two clocks (NTP slewing on the Redis host) and a step of
// Redis's clock within kWindow samples.
class ClockOffsetEstimator {
 public:
  static constexpr size_t kWindow = 8;  // samples; one per heartbeat

  // One round trip: sent at t0_us, answered at t1_us (monotonic), carrying
  // Redis's time redis_ms. Ignored when t1_us < t0_us.
  void addSample(int64_t t0_us, int64_t t1_us, int64_t redis_ms);

  // redis_time - monotonic_time in microseconds; nullopt before any sample.
  std::optional<int64_t> offsetUs() const;
  // The estimate's error bound (rtt/2 + 500 µs); 0 before any sample.
  int64_t errorBoundUs() const;

 private:
  struct Sample {
    int64_t offset_us;
    int64_t rtt_us;
  };
  const Sample* best() const;

  std::array<Sample, kWindow> samples_{};
  size_t count_ = 0;  // samples held, up to kWindow
  size_t next_ = 0;   // where the next sample goes (the oldest once full)
};

}  // namespace sluice

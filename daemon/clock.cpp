// Clock: clock reads and the Redis clock offset estimate; see clock.h.
#include "clock.h"

#include <ctime>

namespace sluice {

namespace {

int64_t nowNs(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace

int64_t monotonicNowNs() { return nowNs(CLOCK_MONOTONIC); }

int64_t realtimeMinusMonotonicUs() {
  // Read the monotonic clock on both sides and take the middle, so that a
  // preemption between the reads costs at most half its length.
  int64_t before_ns = nowNs(CLOCK_MONOTONIC);
  int64_t real_ns = nowNs(CLOCK_REALTIME);
  int64_t after_ns = nowNs(CLOCK_MONOTONIC);
  return (real_ns - (before_ns + (after_ns - before_ns) / 2)) / 1000;
}

void ClockOffsetEstimator::addSample(int64_t t0_us, int64_t t1_us, int64_t redis_ms) {
  if (t1_us < t0_us) return;
  int64_t rtt_us = t1_us - t0_us;
  samples_[next_] = Sample{redis_ms * 1000 + 500 - (t0_us + rtt_us / 2), rtt_us};
  next_ = (next_ + 1) % kWindow;
  if (count_ < kWindow) count_++;
}

const ClockOffsetEstimator::Sample* ClockOffsetEstimator::best() const {
  const Sample* best = nullptr;
  for (size_t i = 0; i < count_; i++) {
    if (best == nullptr || samples_[i].rtt_us < best->rtt_us) best = &samples_[i];
  }
  return best;
}

std::optional<int64_t> ClockOffsetEstimator::offsetUs() const {
  const Sample* sample = best();
  if (sample == nullptr) return std::nullopt;
  return sample->offset_us;
}

int64_t ClockOffsetEstimator::errorBoundUs() const {
  const Sample* sample = best();
  return sample == nullptr ? 0 : sample->rtt_us / 2 + 500;
}

}  // namespace sluice

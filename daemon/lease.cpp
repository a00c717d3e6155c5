// Lease: the broker between workers and the control thread; see lease.h.
#include "lease.h"

#include "breaker.h"

namespace sluice {

LeaseBroker::LeaseBroker(int64_t lease_interval_ns, int64_t holding_return_ns)
    : lease_interval_ns_(lease_interval_ns), holding_return_ns_(holding_return_ns) {}

int64_t LeaseBroker::learningUntilNs(const Rule& rule) const {
  int64_t since = learning_since_ns_.load(std::memory_order_acquire);
  if (since == 0) return 0;
  return since + learningSpanNs(rule, learning_holding_ns_.load(std::memory_order_acquire),
                                learning_reconnect_ns_.load(std::memory_order_acquire));
}

void LeaseBroker::submit(LeaseRequest request) {
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.push_back(std::move(request));
  if (wakeup_ != nullptr && queue_.size() == 1) uv_async_send(wakeup_);
}

void LeaseBroker::setBreaker(Breaker breaker, int64_t now_ns) {
  auto was = static_cast<Breaker>(breaker_.exchange(static_cast<int>(breaker), std::memory_order_acq_rel));
  if (was == breaker) return;
  if (breaker == Breaker::kOpen) {
    counters_.fallback_entries.fetch_add(1, std::memory_order_relaxed);
    // An outage begins here, unless the breaker has not closed since the
    // last opening: then a recovery failed, and Redis has been away since
    // that opening. Stored before the opening: a worker that sees the
    // breaker open sees the outage it is in (LeasePath::outage).
    if (closed_since_opened_) {
      last_opened_ns_.store(now_ns, std::memory_order_release);
      closed_since_opened_ = false;
    }
    open_since_ns_.store(now_ns, std::memory_order_release);
  } else if (was == Breaker::kOpen) {
    int64_t since = open_since_ns_.exchange(0, std::memory_order_acq_rel);
    if (since != 0) {
      open_ns_total_.fetch_add(static_cast<uint64_t>(now_ns - since), std::memory_order_relaxed);
    }
  }
  if (breaker == Breaker::kClosed) closed_since_opened_ = true;
}

void LeaseBroker::startLearning(int64_t now_ns, int64_t holding_memory_ns, int64_t reconnect_ns,
                                int64_t longest_ns) {
  counters_.learning_entries.fetch_add(1, std::memory_order_relaxed);
  learning_holding_ns_.store(holding_memory_ns, std::memory_order_release);
  learning_reconnect_ns_.store(reconnect_ns, std::memory_order_release);
  learning_since_ns_.store(now_ns, std::memory_order_release);
  learning_until_ns_.store(now_ns + longest_ns, std::memory_order_release);
}

void LeaseBroker::takeRequests(std::vector<LeaseRequest>* out) {
  out->clear();
  std::lock_guard<std::mutex> lock(mutex_);
  out->swap(queue_);
}

void LeaseBroker::setWakeup(uv_async_t* wakeup) {
  std::lock_guard<std::mutex> lock(mutex_);
  wakeup_ = wakeup;
  if (wakeup_ != nullptr && !queue_.empty()) uv_async_send(wakeup_);
}

LeaseStats LeaseBroker::stats(int64_t now_ns) const {
  auto get = [](const std::atomic<uint64_t>& value) { return value.load(std::memory_order_relaxed); };
  LeaseStats s;
  s.requested = get(counters_.requested);
  s.granted = get(counters_.granted);
  s.empty = get(counters_.empty);
  s.failed = get(counters_.failed);
  s.granted_units = get(counters_.granted_units);
  s.returned_units = get(counters_.returned_units);
  s.debited_units = get(counters_.debited_units);
  s.latency_us_sum = get(counters_.latency_us_sum);
  s.latency_us_max = get(counters_.latency_us_max);
  s.fallback_entries = get(counters_.fallback_entries);
  s.learning_entries = get(counters_.learning_entries);
  s.released_units = get(counters_.released_units);
  s.lost_units = get(counters_.lost_units);
  s.renewed = get(counters_.renewed);
  s.renew_words = get(counters_.renew_words);
  uint64_t open_ns = open_ns_total_.load(std::memory_order_relaxed);
  int64_t since = open_since_ns_.load(std::memory_order_acquire);
  if (since != 0 && now_ns > since) open_ns += static_cast<uint64_t>(now_ns - since);
  s.fallback_ms = open_ns / 1'000'000;
  return s;
}

}  // namespace sluice

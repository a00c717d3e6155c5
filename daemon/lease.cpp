// Lease: slices in key-table entries and the broker; see lease.h.
#include "lease.h"

#include <algorithm>

#include "breaker.h"
#include "holding.h"
#include "limiter.h"
#include "penalty.h"

namespace sluice {

namespace {

int64_t load(std::span<const std::atomic<uint64_t>> words, slice::Word word) {
  return static_cast<int64_t>(words[word].load(std::memory_order_acquire));
}

}  // namespace

bool leasable(const Rule& rule) {
  return rule.scope == Scope::kGlobal && rule.limits.size() == 1 &&
         hasRateLeaseScript(rule.algorithm);
}

bool leasesHolding(const Rule& rule) {
  return rule.scope == Scope::kGlobal && rule.limits.size() == 1 &&
         algorithmTraits(rule.algorithm).holds;
}

int64_t leaseCapacity(const Limit& limit) { return limit.burst > 0 ? limit.burst : limit.limit; }

namespace {

// Where the words after a rule's state begin.
size_t stateEnd(const Rule& rule) {
  if (leasable(rule)) return slice::kWords;
  if (leasesHolding(rule)) return holding::words(rule.limits.front());
  return stateWords(rule);
}

size_t overrideWord(const Rule& rule) { return entryWords(rule) - 1; }

}  // namespace

size_t undebitedWord(const Rule& share) { return stateWords(share); }

size_t entryWords(const Rule& rule) {
  size_t words = stateEnd(rule) + penaltyWords(rule);
  if ((rule.id & kFallbackIdBit) != 0) ++words;  // undebited
  if (!rule.overrides.empty()) ++words;
  return words;
}

size_t penaltyWords(const Rule& rule) { return rule.penalty ? size_t{penalty::kWords} : 0; }

std::span<std::atomic<uint64_t>> penaltyState(const Rule& rule,
                                              std::span<std::atomic<uint64_t>> words) {
  return words.subspan(stateEnd(rule), penaltyWords(rule));
}

const Rule& decidingRule(const RuleSet& rules, const Rule& rule, std::string_view key,
                         std::span<std::atomic<uint64_t>> words) {
  if (rule.overrides.empty()) return rule;
  // Every variant has the rule's layout (rules.h), so the word follows it.
  std::atomic<uint64_t>& which = words[overrideWord(rule)];
  uint64_t stored = which.load(std::memory_order_relaxed);
  if (stored == 0) {
    // Racing creators compute the same answer, so the last store is fine.
    stored = rules.matchOverride(rule, key) + 1;
    which.store(stored, std::memory_order_relaxed);
  }
  return rules.variant(rule, static_cast<uint32_t>(stored - 1));
}

uint32_t storedOverride(const Rule& rule, std::span<const std::atomic<uint64_t>> words) {
  if (rule.overrides.empty() || words.size() != entryWords(rule)) return 0;
  uint64_t stored = words[overrideWord(rule)].load(std::memory_order_relaxed);
  // stored: matchOverride + 1, so 1 (the rule itself) to overrides + 1.
  return stored == 0 || stored - 1 > rule.overrides.size() ? 0 : static_cast<uint32_t>(stored - 1);
}

namespace slice {

namespace {

// Claims the in-flight bit; true when this caller got it.
bool claim(std::span<std::atomic<uint64_t>> words) {
  uint64_t flags = words[kFlags].load(std::memory_order_relaxed);
  while ((flags & kInFlight) == 0) {
    if (words[kFlags].compare_exchange_weak(flags, flags | kInFlight, std::memory_order_acq_rel)) {
      return true;
    }
  }
  return false;
}

// Units the slice holds at now_ns: none once they have expired.
int64_t spendable(std::span<const std::atomic<uint64_t>> words, int64_t now_ns) {
  int64_t expires = load(words, kExpires);
  if (expires != 0 && now_ns >= expires) return 0;
  return load(words, kUnits);
}

// Reports a denial when Redis said "nothing until t" and t has not come.
bool negativelyCached(std::span<const std::atomic<uint64_t>> words, int64_t now_ns,
                      TakeResult* result) {
  int64_t deny_until = load(words, kDenyUntil);
  if (now_ns >= deny_until) return false;
  result->outcome = Outcome::kDenied;
  result->until_ns = deny_until;
  return true;
}

}  // namespace

TakeResult look(std::span<const std::atomic<uint64_t>> words, int64_t now_ns, int64_t cost) {
  TakeResult result;
  result.cold = (words[kFlags].load(std::memory_order_acquire) & kWarm) == 0;
  if (now_ns < load(words, kFallbackUntil)) {
    result.outcome = Outcome::kFallback;
    return result;
  }
  if ((words[kFlags].load(std::memory_order_acquire) & kLine) != 0) {
    result.outcome = Outcome::kQueued;
    int64_t deny_until = load(words, kDenyUntil);
    result.until_ns = now_ns < deny_until ? deny_until : 0;
    return result;
  }
  int64_t units = spendable(words, now_ns);
  result.left = units;
  if (units >= cost) {
    result.outcome = Outcome::kTaken;
    result.left = units - cost;
    return result;
  }
  negativelyCached(words, now_ns, &result);
  return result;
}

TakeResult take(std::span<std::atomic<uint64_t>> words, int64_t now_ns, int64_t cost, bool again,
                bool first_in_line) {
  TakeResult result;
  uint64_t flags = words[kFlags].load(std::memory_order_acquire);
  result.cold = (flags & kWarm) == 0;
  if (now_ns < load(words, kFallbackUntil)) {
    result.outcome = Outcome::kFallback;
    return result;
  }
  // Demand counts every unit asked for, granted or not, once. A plain load
  // and store: racing workers may lose an increment, which only makes the
  // next batch a little smaller.
  if (!again) {
    words[kDemand].store(words[kDemand].load(std::memory_order_relaxed) + static_cast<uint64_t>(cost),
                         std::memory_order_relaxed);
  }
  if ((flags & kLine) != 0 && !first_in_line) {
    // The units are the waiters'; the first of them asks for leases.
    result.outcome = Outcome::kQueued;
    int64_t deny_until = load(words, kDenyUntil);
    result.until_ns = now_ns < deny_until ? deny_until : 0;
    return result;
  }

  int64_t expires = load(words, kExpires);
  uint64_t units = words[kUnits].load(std::memory_order_acquire);
  if (expires != 0 && now_ns >= expires && units != 0) {
    // The units were counted in a window that has ended: spending them now
    // would count them in no window at all. Drop them (the control thread
    // counts nothing back: the window is over).
    if (words[kUnits].compare_exchange_strong(units, 0, std::memory_order_acq_rel)) {
      result.dropped = static_cast<int64_t>(units);
    }
    units = words[kUnits].load(std::memory_order_acquire);
  }
  while (static_cast<int64_t>(units) >= cost) {
    if (words[kUnits].compare_exchange_weak(units, units - static_cast<uint64_t>(cost),
                                            std::memory_order_acq_rel)) {
      result.outcome = Outcome::kTaken;
      result.left = static_cast<int64_t>(units) - cost;
      // Refill below a quarter of the last batch, so the next lease lands
      // before the slice runs dry.
      int64_t low_water = std::max<int64_t>(load(words, kBatch) / 4, 1);
      if (result.left < low_water && now_ns >= load(words, kDenyUntil)) {
        result.must_request = claim(words);
      }
      return result;
    }
  }
  if (negativelyCached(words, now_ns, &result)) return result;
  result.outcome = Outcome::kEmpty;
  result.must_request = claim(words);
  return result;
}

void unclaim(std::span<std::atomic<uint64_t>> words) {
  words[kFlags].fetch_and(~kInFlight, std::memory_order_acq_rel);
}

void refund(std::span<std::atomic<uint64_t>> words, int64_t cost) {
  words[kUnits].fetch_add(static_cast<uint64_t>(cost), std::memory_order_acq_rel);
}

void noteGrant(std::span<std::atomic<uint64_t>> words, int64_t granted, int64_t remaining) {
  if (granted > 0 && remaining >= kRoomyFactor * granted) {
    words[kFlags].fetch_or(kRoomy, std::memory_order_acq_rel);
  } else {
    words[kFlags].fetch_and(~kRoomy, std::memory_order_acq_rel);
  }
}

Batch nextBatch(std::span<std::atomic<uint64_t>> words, int64_t now_ns, int64_t cost,
                const Rule& rule, uint32_t nodes, int64_t lease_interval_ns) {
  const Limit& limit = rule.limits.front();
  int64_t capacity = leaseCapacity(limit);
  // Demand per lease interval: the last full measurement (kRate), or what
  // the one under way has seen already when that is more (a first request
  // counts only what it asks for). A measurement that spans an interval or
  // more becomes the rate; after a pause it spans the pause, so the rate
  // falls with it.
  int64_t demand = load(words, kDemand);
  int64_t since = load(words, kDemandSince);
  double per_interval = static_cast<double>(std::max(load(words, kRate), demand));
  if (since == 0) {
    words[kDemandSince].store(static_cast<uint64_t>(now_ns), std::memory_order_relaxed);
  } else if (now_ns - since >= lease_interval_ns) {
    demand = static_cast<int64_t>(words[kDemand].exchange(0, std::memory_order_relaxed));
    per_interval = static_cast<double>(demand) * static_cast<double>(lease_interval_ns) /
                   static_cast<double>(now_ns - since);
    words[kRate].store(static_cast<uint64_t>(per_interval + 0.5), std::memory_order_relaxed);
    words[kDemandSince].store(static_cast<uint64_t>(now_ns), std::memory_order_relaxed);
  }
  int64_t share = std::max<int64_t>(capacity / std::max<uint32_t>(nodes, 1), 1);
  // The caller holds the in-flight bit, so no reply changes kRoomy now.
  uint64_t flags = words[kFlags].load(std::memory_order_acquire);
  int boost = static_cast<int>((flags & kBoostMask) >> kBoostShift);
  boost = (flags & kRoomy) != 0 ? std::min(boost + 1, kMaxBoost) : 0;
  words[kFlags].fetch_and(~kBoostMask, std::memory_order_acq_rel);
  words[kFlags].fetch_or(static_cast<uint64_t>(boost) << kBoostShift, std::memory_order_acq_rel);
  Batch batch;
  batch.n = std::clamp<int64_t>(static_cast<int64_t>(per_interval * (1 << boost) + 0.999), 1, share);
  batch.n = std::max(batch.n, cost);
  bool warm = (flags & kWarm) != 0;
  batch.need = cost;
  if (warm && algorithmTraits(rule.algorithm).refills) {
    double refill = static_cast<double>(limit.limit) * static_cast<double>(lease_interval_ns) /
                    static_cast<double>(limit.period_ns);
    batch.need = std::max(cost, std::min(batch.n / 4, static_cast<int64_t>(refill)));
  }
  words[kBatch].store(static_cast<uint64_t>(batch.n), std::memory_order_relaxed);
  return batch;
}

}  // namespace slice

std::string_view breakerName(Breaker breaker) {
  switch (breaker) {
    case Breaker::kClosed: return "closed";
    case Breaker::kOpen: return "open";
    case Breaker::kHalfOpen: return "half_open";
  }
  return "unknown";
}

std::string WaitLines::lineName(uint32_t rule_id, std::string_view key) {
  std::string name(reinterpret_cast<const char*>(&rule_id), sizeof rule_id);
  name.append(key);
  return name;
}

uint64_t WaitLines::join(uint32_t rule_id, std::string_view key,
                         std::span<std::atomic<uint64_t>> slice, int64_t cost, int64_t max_ahead,
                         int64_t* ahead) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string name = lineName(rule_id, key);
  Line& line = lines_[name];
  *ahead = line.units;
  if (!line.tickets.empty() && line.units > max_ahead) return 0;
  uint64_t ticket = next_ticket_++;
  line.tickets.push_back(ticket);
  line.units += cost;
  places_.emplace(ticket, Place{std::move(name), cost});
  slice[slice::kFlags].fetch_or(slice::kLine, std::memory_order_acq_rel);
  return ticket;
}

bool WaitLines::first(uint64_t ticket) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = places_.find(ticket);
  return it != places_.end() && lines_.at(it->second.line).tickets.front() == ticket;
}

bool WaitLines::leave(uint64_t ticket, std::span<std::atomic<uint64_t>> slice) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto place = places_.find(ticket);
  if (place == places_.end()) return false;
  auto it = lines_.find(place->second.line);
  Line& line = it->second;
  line.units -= place->second.cost;
  places_.erase(place);
  bool was_first = line.tickets.front() == ticket;
  line.tickets.erase(std::find(line.tickets.begin(), line.tickets.end(), ticket));
  if (line.tickets.empty()) {
    lines_.erase(it);
    if (!slice.empty()) slice[slice::kFlags].fetch_and(~slice::kLine, std::memory_order_acq_rel);
    return false;
  }
  if (!was_first) return false;
  promotions_.fetch_add(1, std::memory_order_acq_rel);
  return true;
}

bool WaitLines::standing(uint32_t rule_id, std::string_view key,
                         std::span<std::atomic<uint64_t>> slice) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (lines_.contains(lineName(rule_id, key))) return true;
  slice[slice::kFlags].fetch_and(~slice::kLine, std::memory_order_acq_rel);
  return false;
}

size_t WaitLines::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return places_.size();
}

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
    open_since_ns_.store(now_ns, std::memory_order_release);
  } else if (was == Breaker::kOpen) {
    int64_t since = open_since_ns_.exchange(0, std::memory_order_acq_rel);
    if (since != 0) {
      open_ns_total_.fetch_add(static_cast<uint64_t>(now_ns - since), std::memory_order_relaxed);
    }
  }
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
  uint64_t open_ns = open_ns_total_.load(std::memory_order_relaxed);
  int64_t since = open_since_ns_.load(std::memory_order_acquire);
  if (since != 0 && now_ns > since) open_ns += static_cast<uint64_t>(now_ns - since);
  s.fallback_ms = open_ns / 1'000'000;
  return s;
}

}  // namespace sluice

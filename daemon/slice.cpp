// Slice: a leasing key's words and their transitions; see slice.h.
#include "slice.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "algorithm.h"
#include "entry.h"

namespace sluice::slice {

namespace {

int64_t load(ConstWords words, Word word) {
  return static_cast<int64_t>(words[word].load(std::memory_order_acquire));
}

void store(Words words, Word word, int64_t value) {
  words[word].store(static_cast<uint64_t>(value), std::memory_order_release);
}

}  // namespace


namespace {

// Claims the in-flight bit; true when this caller got it.
bool claim(Words words) {
  uint64_t flags = words[kFlags].load(std::memory_order_relaxed);
  while ((flags & kInFlight) == 0) {
    if (words[kFlags].compare_exchange_weak(flags, flags | kInFlight, std::memory_order_acq_rel)) {
      return true;
    }
  }
  return false;
}

// Units the slice holds at now_ns: none once they have expired.
int64_t spendable(ConstWords words, int64_t now_ns) {
  int64_t expires = load(words, kExpires);
  if (expires != 0 && now_ns >= expires) return 0;
  return load(words, kUnits);
}

// The rate lease's refill up to now_ns (or its end): whole units since
// kRateRefilledAt, up to kRateCap in the slice; the refill past the cap is
// lost, as a full bucket's is. Whoever moves kRateRefilledAt adds the units,
// so racing workers add each span's units once.
// hold_until_ns: a later end, for takeOnRate's hold past the rate's end.
// fallback: at the fallback's slower refill (fallbackNsPerUnit).
void refillRate(Words words, int64_t now_ns, int64_t hold_until_ns = 0, bool fallback = false) {
  const int64_t until = load(words, kRateUntil);
  const int64_t per_unit = fallback ? fallbackNsPerUnit(load(words, kRateNsPerUnit)) : load(words, kRateNsPerUnit);
  if (until == 0 || per_unit <= 0) return;
  const int64_t end = std::min(now_ns, std::max(until, hold_until_ns));
  uint64_t at = words[kRateRefilledAt].load(std::memory_order_acquire);
  while (end - static_cast<int64_t>(at) >= per_unit) {
    const int64_t units = (end - static_cast<int64_t>(at)) / per_unit;
    if (!words[kRateRefilledAt].compare_exchange_weak(at, at + static_cast<uint64_t>(units * per_unit),
                                                      std::memory_order_acq_rel)) {
      continue;
    }
    const int64_t cap = load(words, kRateCap);
    uint64_t held = words[kUnits].load(std::memory_order_acquire);
    while (static_cast<int64_t>(held) < cap &&
           !words[kUnits].compare_exchange_weak(
               held, held + static_cast<uint64_t>(std::min(units, cap - static_cast<int64_t>(held))),
               std::memory_order_acq_rel)) {
    }
    return;
  }
}

// `units` and what the rate's refill would add to them by now_ns, up to its
// cap (changing nothing, for the looks). refilled_at_ns: where the refill
// stands (0: kRateRefilledAt); fallback: at the fallback's refill.
int64_t withRateRefill(ConstWords words, int64_t now_ns, int64_t units, int64_t hold_until_ns = 0,
                       int64_t refilled_at_ns = 0, bool fallback = false) {
  const int64_t per_unit = fallback ? fallbackNsPerUnit(load(words, kRateNsPerUnit)) : load(words, kRateNsPerUnit);
  if (load(words, kRateUntil) == 0 || per_unit <= 0 || units >= load(words, kRateCap)) {
    return units;
  }
  const int64_t end = std::min(now_ns, std::max(load(words, kRateUntil), hold_until_ns));
  const int64_t from = refilled_at_ns > 0 ? refilled_at_ns : load(words, kRateRefilledAt);
  const int64_t due = (end - from) / per_unit;
  return std::min(units + std::max<int64_t>(due, 0), load(words, kRateCap));
}

// When a rate lease's slice has `cost` units again: the refill of what it
// lacks, from kRateRefilledAt (or refilled_at_ns), at the fallback's
// refill when `fallback`.
int64_t rateDueNs(ConstWords words, int64_t cost, int64_t units, int64_t refilled_at_ns = 0,
                  bool fallback = false) {
  const int64_t per_unit = fallback ? fallbackNsPerUnit(load(words, kRateNsPerUnit)) : load(words, kRateNsPerUnit);
  const int64_t from = refilled_at_ns > 0 ? refilled_at_ns : load(words, kRateRefilledAt);
  return from + (cost - std::max<int64_t>(units, 0)) * per_unit;
}

// The breaker opened at open_since_ns (> 0) and the key spends its rate in
// fallback: the first of its takes since the opening drops the units the
// slice held and restarts the refill there (one taker moves
// kRateRefilledAt, and it alone drops them), so that what the rate admits
// from the opening is its fallback refill alone (fallbackNsPerUnit).
void startFallback(Words words, int64_t open_since_ns) {
  if (open_since_ns <= 0) return;
  uint64_t at = words[kRateRefilledAt].load(std::memory_order_acquire);
  while (static_cast<int64_t>(at) < open_since_ns) {
    if (words[kRateRefilledAt].compare_exchange_weak(at, static_cast<uint64_t>(open_since_ns),
                                                     std::memory_order_acq_rel)) {
      uint64_t held = words[kUnits].load(std::memory_order_acquire);
      // A debt stays (a settle's: slice::charge).
      while (static_cast<int64_t>(held) > 0 &&
             !words[kUnits].compare_exchange_weak(held, 0, std::memory_order_acq_rel)) {
      }
      return;
    }
  }
}

// Reports a denial when Redis said "nothing until t" and t has not come.
bool negativelyCached(ConstWords words, int64_t now_ns,
                      TakeResult* result) {
  int64_t deny_until = load(words, kDenyUntil);
  if (now_ns >= deny_until) return false;
  result->outcome = Outcome::kDenied;
  result->until_ns = deny_until;
  return true;
}

}  // namespace

// The end of what takeOnRate and lookOnRate spend at now_ns: the rate's
// end while it holds, or past it the outage's hold for a rate that held
// when the outage began (the demand-weighted share in fallback); 0:
// neither.
int64_t fallbackRateEnd(ConstWords words, int64_t now_ns, const Outage& outage) {
  const int64_t until = load(words, kRateUntil);
  if (now_ns < until) return until;
  if (outage.began_ns > 0 && until > outage.began_ns && now_ns < outage.hold_until_ns) return outage.hold_until_ns;
  return 0;
}

TakeResult takeOnRate(Words words, int64_t now_ns, int64_t cost, const Outage& outage) {
  TakeResult result;
  const int64_t end = fallbackRateEnd(words, now_ns, outage);
  if (end == 0 || load(words, kRateNsPerUnit) <= 0 || cost > load(words, kRateCap)) {
    result.outcome = Outcome::kFallback;
    return result;
  }
  const bool fallback = outage.opened_ns > 0;
  if (fallback) startFallback(words, outage.opened_ns);
  refillRate(words, now_ns, end, fallback);
  uint64_t units = words[kUnits].load(std::memory_order_acquire);
  while (static_cast<int64_t>(units) >= cost) {
    if (words[kUnits].compare_exchange_weak(units, units - static_cast<uint64_t>(cost),
                                            std::memory_order_acq_rel)) {
      result.outcome = Outcome::kTaken;
      result.left = static_cast<int64_t>(units) - cost;
      return result;
    }
  }
  result.outcome = Outcome::kDenied;
  result.until_ns = std::max(rateDueNs(words, cost, static_cast<int64_t>(units), 0, fallback), now_ns + 1);
  return result;
}

TakeResult lookOnRate(ConstWords words, int64_t now_ns, int64_t cost, const Outage& outage) {
  TakeResult result;
  const int64_t end = fallbackRateEnd(words, now_ns, outage);
  if (end == 0 || load(words, kRateNsPerUnit) <= 0 || cost > load(words, kRateCap)) {
    result.outcome = Outcome::kFallback;
    return result;
  }
  // As takeOnRate would find the slice: from the opening, a key that has
  // not spent since holds nothing but the fallback's refill since then.
  const bool fallback = outage.opened_ns > 0;
  const bool fresh = fallback && load(words, kRateRefilledAt) < outage.opened_ns;
  const int64_t from = fresh ? outage.opened_ns : 0;
  const int64_t held = fresh ? std::min<int64_t>(load(words, kUnits), 0) : load(words, kUnits);
  const int64_t units = withRateRefill(words, now_ns, held, end, from, fallback);
  if (units >= cost) {
    result.outcome = Outcome::kTaken;
    result.left = units - cost;
    return result;
  }
  result.left = units;
  result.outcome = Outcome::kDenied;
  result.until_ns = std::max(rateDueNs(words, cost, units, from, fallback), now_ns + 1);
  return result;
}

TakeResult look(ConstWords words, int64_t now_ns, int64_t cost) {
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
  const bool rated = now_ns < load(words, kRateUntil) && cost <= load(words, kRateCap);
  const int64_t units = withRateRefill(words, now_ns, spendable(words, now_ns));
  result.left = units;
  if (units >= cost) {
    result.outcome = Outcome::kTaken;
    result.left = units - cost;
    return result;
  }
  if (rated) {
    result.outcome = Outcome::kDenied;
    result.until_ns = std::max(rateDueNs(words, cost, units), now_ns + 1);
    return result;
  }
  negativelyCached(words, now_ns, &result);
  return result;
}

TakeResult take(Words words, int64_t now_ns, int64_t cost, bool again,
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

  // (An ended rate still adds what it refilled up to its end.) A cost past
  // the rate's cap, which its refill never reaches, leases tokens.
  const bool rated = now_ns < load(words, kRateUntil) && cost <= load(words, kRateCap);
  refillRate(words, now_ns);
  int64_t expires = load(words, kExpires);
  uint64_t units = words[kUnits].load(std::memory_order_acquire);
  if (expires != 0 && now_ns >= expires && units != 0) {
    // The units were counted in a window that has ended: spending them now
    // would count them in no window at all. Drop them (the control thread
    // counts nothing back: the window is over).
    if (words[kUnits].compare_exchange_strong(units, 0, std::memory_order_acq_rel)) {
      // A debt ends with its window: it was owed to that window alone.
      result.dropped = std::max<int64_t>(static_cast<int64_t>(units), 0);
    }
    units = words[kUnits].load(std::memory_order_acquire);
  }
  while (static_cast<int64_t>(units) >= cost) {
    if (words[kUnits].compare_exchange_weak(units, units - static_cast<uint64_t>(cost),
                                            std::memory_order_acq_rel)) {
      result.outcome = Outcome::kTaken;
      result.left = static_cast<int64_t>(units) - cost;
      if (rated) {
        // The rate refills the slice: Redis is asked only for its renewal.
        if (now_ns >= load(words, kRateRenewAt) || demandMoved(words, now_ns)) {
          result.must_request = claim(words);
        }
        return result;
      }
      // Refill below a quarter of the last batch, so the next lease lands
      // before the slice runs dry.
      int64_t low_water = std::max<int64_t>(load(words, kBatch) / 4, 1);
      if (result.left < low_water &&
          (now_ns >= load(words, kDenyUntil) || now_ns >= load(words, kRecheckAt))) {
        result.must_request = claim(words);
      }
      return result;
    }
  }
  if (rated) {
    // Nothing until the rate refills what the cost lacks: denied here, at
    // no cost to Redis.
    result.outcome = Outcome::kDenied;
    result.until_ns = std::max(rateDueNs(words, cost, static_cast<int64_t>(units)), now_ns + 1);
    if (now_ns >= load(words, kRateRenewAt) || demandMoved(words, now_ns)) {
      result.must_request = claim(words);
    }
    return result;
  }
  if (negativelyCached(words, now_ns, &result)) {
    // Past its recheck time, the cache sends one lease to see whether units
    // came back; the denial stands until its answer.
    if (now_ns >= load(words, kRecheckAt)) result.must_request = claim(words);
    return result;
  }
  result.outcome = Outcome::kEmpty;
  result.must_request = claim(words);
  return result;
}

void unclaim(Words words) {
  words[kFlags].fetch_and(~kInFlight, std::memory_order_acq_rel);
}

void refund(Words words, int64_t cost) {
  words[kUnits].fetch_add(static_cast<uint64_t>(cost), std::memory_order_acq_rel);
}

void refundSpent(Words words, int64_t units, int64_t spent_ns, int64_t now_ns, int64_t window_ns) {
  if (units <= 0) return;
  const int64_t expires = load(words, kExpires);
  if (expires != 0 && (now_ns >= expires || spent_ns < expires - window_ns)) return;
  words[kUnits].fetch_add(static_cast<uint64_t>(units), std::memory_order_acq_rel);
}

int64_t charge(Words words, int64_t units, int64_t max_debt) {
  uint64_t seen = words[kUnits].load(std::memory_order_acquire);
  for (;;) {
    // The slice may go down to -max_debt: what it holds, and the bound past it.
    const int64_t charging = std::clamp<int64_t>(static_cast<int64_t>(seen) + max_debt, 0, units);
    if (charging == 0) return 0;
    if (words[kUnits].compare_exchange_weak(seen, seen - static_cast<uint64_t>(charging),
                                            std::memory_order_acq_rel)) {
      return charging;
    }
  }
}

int64_t owed(ConstWords words, int64_t now_ns) {
  const int64_t units = load(words, kUnits);
  if (units >= 0) return 0;
  // A debt ends with its window (take() drops it there).
  const int64_t expires = load(words, kExpires);
  return expires != 0 && now_ns >= expires ? 0 : -units;
}

int64_t balance(ConstWords words, int64_t now_ns) {
  const int64_t units = load(words, kUnits);
  return units > 0 ? spendable(words, now_ns) : units;
}

bool untouched(ConstWords words, const Rule& rule, int64_t sent_ns, int64_t granted,
               int64_t remaining) {
  const int64_t capacity = leaseCapacity(rule.limits.front());
  if (algorithmTraits(rule.algorithm).refills) {
    // Found full to within the reply's rounding (remaining is whole units).
    return remaining + granted + 1 >= capacity;
  }
  if (rule.algorithm != Algorithm::kFixedWindow) return false;
  // As this node's last answer left the window, or a fresh window full.
  const bool same_window = (words[kFlags].load(std::memory_order_acquire) & kRedisLeftKnown) != 0 &&
                           sent_ns < load(words, kExpires);
  return remaining + granted >= (same_window ? redisLeft(words, rule, sent_ns) : capacity);
}

void noteGrant(Words words, int64_t granted, int64_t remaining, bool untouched) {
  if (granted > 0 && (remaining >= kRoomyFactor * granted || untouched)) {
    words[kFlags].fetch_or(kRoomy, std::memory_order_acq_rel);
  } else {
    words[kFlags].fetch_and(~kRoomy, std::memory_order_acq_rel);
  }
}

void noteShort(Words words, int64_t asked, int64_t granted) {
  if (granted < asked) {
    words[kFlags].fetch_or(kDrained, std::memory_order_acq_rel);
  } else {
    words[kFlags].fetch_and(~kDrained, std::memory_order_acq_rel);
  }
}

Batch nextBatch(Words words, int64_t now_ns, int64_t cost,
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
  double per_interval = std::max(static_cast<double>(load(words, kRate)) / kRateParts, static_cast<double>(demand));
  if (since == 0) {
    // The first measurement starts at this request, and counts from the
    // next: n requests from it span n - 1 gaps, and counted in, it would
    // read a key at 171/s as 180/s over one interval (a rate asks for that).
    words[kDemandSince].store(static_cast<uint64_t>(now_ns), std::memory_order_relaxed);
    words[kDemand].store(0, std::memory_order_relaxed);
  } else if (now_ns - since >= lease_interval_ns) {
    demand = static_cast<int64_t>(words[kDemand].exchange(0, std::memory_order_relaxed));
    per_interval = static_cast<double>(demand) * static_cast<double>(lease_interval_ns) /
                   static_cast<double>(now_ns - since);
    words[kRate].store(static_cast<uint64_t>(per_interval * kRateParts + 0.5), std::memory_order_relaxed);
    words[kDemandSince].store(static_cast<uint64_t>(now_ns), std::memory_order_relaxed);
  }
  int64_t share = std::max<int64_t>(capacity / std::max<uint32_t>(nodes, 1), 1);
  // The caller holds the in-flight bit, so no reply changes kRoomy now.
  uint64_t flags = words[kFlags].load(std::memory_order_acquire);
  int boost = static_cast<int>((flags & kBoostMask) >> kBoostShift);
  boost = (flags & kRoomy) != 0 ? std::min(boost + 1, kMaxBoost) : 0;
  // A stamped lease's units count from the lease, not from their spending:
  // the longer a slice holds them, the more they may overshoot
  // (overshoot.h), so such a key leases one interval of demand at a time.
  // And they leave the log one period after the lease, however late they
  // are spent. Unless the log had room for kRoomyFactor such batches of
  // every node, a part of an interval's demand at a time: what leaves a
  // full log is then spent again about when it left.
  if (algorithmTraits(rule.algorithm).stamps_lease) {
    boost = 0;
    const double fleet_batch = per_interval * std::max<uint32_t>(nodes, 1);
    if (static_cast<double>(redisLeft(words, rule, now_ns)) < kRoomyFactor * fleet_batch) {
      per_interval /= kTightStampedParts;
    }
  }
  words[kFlags].fetch_and(~kBoostMask, std::memory_order_acq_rel);
  words[kFlags].fetch_or(static_cast<uint64_t>(boost) << kBoostShift, std::memory_order_acq_rel);
  Batch batch;
  // A debt the slice carries is paid from this lease before the cost.
  cost += std::max<int64_t>(-load(words, kUnits), 0);
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


bool recheckBlock(Words words, int64_t now_ns) {
  if (now_ns < load(words, kDenyUntil)) return false;
  store(words, kUnits, 0);  // a lease's, granted before the block
  return true;
}

void block(Words words, int64_t now_ns, int64_t block_ns) {
  store(words, kUnits, 0);
  int64_t recheck_ns = now_ns + std::min(block_ns, kBlockRecheckNs);
  store(words, kDenyUntil, recheck_ns);
  store(words, kRecheckAt, recheck_ns);
}

void forget(Words words) {
  for (size_t i = 0; i < kWords; ++i) {
    words[i].fetch_and(i == kFlags ? kInFlight : 0, std::memory_order_relaxed);
  }
}

void markLine(Words words) { words[kFlags].fetch_or(kLine, std::memory_order_acq_rel); }

void clearLine(Words words) { words[kFlags].fetch_and(~kLine, std::memory_order_acq_rel); }

void applyGrant(Words words, int64_t granted, int64_t lease_now_ms, int64_t expires_ns,
                bool new_window) {
  if (expires_ns != 0) {
    if (new_window) store(words, kUnits, 0);
    store(words, kExpires, expires_ns);
  }
  words[kUnits].fetch_add(static_cast<uint64_t>(granted), std::memory_order_acq_rel);
  store(words, kLeaseNowMs, lease_now_ms);
  store(words, kDenyUntil, 0);
  words[kFlags].fetch_or(kWarm, std::memory_order_acq_rel);
}

void applyEmpty(Words words, int64_t now_ns, int64_t wait_ns) {
  store(words, kDenyUntil, now_ns + wait_ns);
  store(words, kRecheckAt, now_ns + std::min(wait_ns, kEmptyRecheckNs));
}

int64_t emptyWaitMs(const Rule& rule, int64_t retry_after_ms) {
  if (algorithmTraits(rule.algorithm).stamps_lease) return std::max<int64_t>(retry_after_ms - 1, 0);
  return std::max<int64_t>(retry_after_ms, 1);
}

namespace {

constexpr uint64_t kRedisLeftMask = ~uint64_t{0} << kRedisLeftShift;
constexpr int64_t kRedisLeftMax = (int64_t{1} << (64 - kRedisLeftShift)) - 1;
// A bucket's empty time is kept as µs plus this, so that one before the
// clock's start (what was left spans further back than now) stays positive.
constexpr int64_t kEmptyBiasUs = int64_t{1} << 51;
constexpr int64_t kMaxSpanUs = int64_t{1} << 50;

// The scripts' interval of a bucket, in µs: period / limit rounded up, of
// the period in whole ms they are given (lua/token_bucket.lua).
int64_t refillIntervalUs(const Limit& limit) {
  const int64_t period_us = (limit.period_ns + 999'999) / 1'000'000 * 1000;
  const int64_t per = std::max<int64_t>(limit.limit, 1);
  return std::max<int64_t>((period_us + per - 1) / per, 1);
}

}  // namespace

void noteRedisLeft(Words words, const Rule& rule, int64_t left, int64_t now_ns) {
  const Limit& limit = rule.limits.front();
  left = std::clamp<int64_t>(left, 0, leaseCapacity(limit));
  int64_t field = left;
  if (algorithmTraits(rule.algorithm).refills) {
    // Now rounded up and the interval the scripts' (rounded up): the refill
    // that redisLeft() adds never comes before Redis's.
    const int64_t interval_us = refillIntervalUs(limit);
    const int64_t span_us = left > kMaxSpanUs / interval_us ? kMaxSpanUs : left * interval_us;
    const int64_t now_us = now_ns <= 0 ? 0 : (now_ns - 1) / 1000 + 1;
    field = now_us - span_us + kEmptyBiasUs;
  }
  const uint64_t bits = static_cast<uint64_t>(std::clamp<int64_t>(field, 0, kRedisLeftMax))
                        << kRedisLeftShift;
  // The other bits change under workers' feet: only a compare-and-swap
  // keeps them.
  uint64_t flags = words[kFlags].load(std::memory_order_relaxed);
  while (!words[kFlags].compare_exchange_weak(
      flags, (flags & ~kRedisLeftMask) | bits | kRedisLeftKnown, std::memory_order_acq_rel)) {
  }
}

int64_t redisLeft(ConstWords words, const Rule& rule, int64_t now_ns) {
  const uint64_t flags = words[kFlags].load(std::memory_order_acquire);
  if ((flags & kRedisLeftKnown) == 0) return 0;
  const Limit& limit = rule.limits.front();
  const AlgorithmTraits& traits = algorithmTraits(rule.algorithm);
  const int64_t capacity = leaseCapacity(limit);
  const auto field = static_cast<int64_t>(flags >> kRedisLeftShift);
  if (traits.refills) {
    // Whole units since the (virtual) empty time: what was left, plus what
    // refilled since, each rounded down.
    const int64_t since_us = std::max<int64_t>(now_ns, 0) / 1000 - (field - kEmptyBiasUs);
    return since_us <= 0 ? 0 : std::min(capacity, since_us / refillIntervalUs(limit));
  }
  if (traits.windowed) {
    const int64_t expires = load(words, kExpires);
    if (expires == 0 || now_ns >= expires) return 0;
  }
  return std::min(field, capacity);
}

bool windowEndsFirst(ConstWords words, const Rule& rule, int64_t now_ns, int64_t lease_interval_ns) {
  if (!algorithmTraits(rule.algorithm).windowed) return false;
  const int64_t expires = load(words, kExpires);
  if (expires == 0 || now_ns >= expires) return false;
  const double per_interval = demandPerInterval(words, now_ns, lease_interval_ns);
  return static_cast<double>(expires - now_ns) * per_interval < static_cast<double>(lease_interval_ns);
}

bool holdsRate(ConstWords words, int64_t now_ns) { return now_ns < load(words, kRateUntil); }

void noteRateFallback(Words words, int64_t units) {
  words[kRateFallback].fetch_add(static_cast<uint64_t>(units), std::memory_order_acq_rel);
}

void unnoteRateFallback(Words words, int64_t units) {
  uint64_t counted = words[kRateFallback].load(std::memory_order_acquire);
  while (!words[kRateFallback].compare_exchange_weak(
      counted, counted - std::min(counted, static_cast<uint64_t>(std::max<int64_t>(units, 0))),
      std::memory_order_acq_rel)) {
  }
}

int64_t takeRateFallback(Words words) {
  return static_cast<int64_t>(words[kRateFallback].exchange(0, std::memory_order_acq_rel));
}

bool drained(ConstWords words) { return (words[kFlags].load(std::memory_order_acquire) & kDrained) != 0; }

double demandPerInterval(ConstWords words, int64_t now_ns, int64_t lease_interval_ns) {
  const int64_t since = load(words, kDemandSince);
  const int64_t counted = load(words, kDemand);
  int64_t under_way = counted;
  if (since > 0 && lease_interval_ns > 0) {
    const int64_t span_ns = std::clamp<int64_t>(now_ns - since, std::min(kDemandMinSpanNs, lease_interval_ns),
                                                lease_interval_ns);
    under_way = static_cast<int64_t>(
        std::ceil(static_cast<double>(counted) * static_cast<double>(lease_interval_ns) / static_cast<double>(span_ns)));
  }
  // The span is at most an interval: under_way is never below counted.
  return std::max(static_cast<double>(load(words, kRate)) / kRateParts, static_cast<double>(under_way));
}

int64_t rateNsPerUnit(ConstWords words, int64_t now_ns) {
  return holdsRate(words, now_ns) ? load(words, kRateNsPerUnit) : 0;
}

int64_t rateSentNs(ConstWords words, int64_t now_ns, int64_t lease_ns) {
  return holdsRate(words, now_ns) ? std::max<int64_t>(load(words, kRateUntil) - lease_ns, 0) : 0;
}

int64_t rateCapUnits(ConstWords words, int64_t now_ns) {
  return holdsRate(words, now_ns) ? load(words, kRateCap) : 0;
}

int64_t fallbackNsPerUnit(int64_t ns_per_unit) {
  if (ns_per_unit <= 0) return ns_per_unit;
  // ns_per_unit * kFallbackRateParts / (kFallbackRateParts - 1), rounded up.
  return ns_per_unit + (ns_per_unit + kFallbackRateParts - 2) / (kFallbackRateParts - 1);
}

int64_t ratePerPeriod(ConstWords words, int64_t period_ns) {
  const int64_t per_unit = load(words, kRateNsPerUnit);
  return per_unit <= 0 ? 0 : (period_ns + per_unit - 1) / per_unit;
}

void applyRate(Words words, int64_t ns_per_unit, int64_t cap, int64_t until_ns, int64_t renew_at_ns,
               int64_t now_ns) {
  if (ns_per_unit <= 0) {
    store(words, kRateUntil, 0);
    store(words, kRateNsPerUnit, 0);
    return;
  }
  // A rate held already refills on from where it was; a new one from now
  // (the refill stopped at the old one's end).
  if (!holdsRate(words, now_ns)) store(words, kRateRefilledAt, now_ns);
  refillRate(words, now_ns);
  store(words, kRateNsPerUnit, ns_per_unit);
  store(words, kRateCap, cap);
  store(words, kRateRenewAt, renew_at_ns);
  store(words, kRateUntil, until_ns);
  store(words, kDenyUntil, 0);
}

void endRate(Words words, int64_t now_ns) {
  if (load(words, kRateUntil) > now_ns) store(words, kRateUntil, now_ns);
  uint64_t at = words[kRateRefilledAt].load(std::memory_order_acquire);
  while (static_cast<int64_t>(at) < now_ns &&
         !words[kRateRefilledAt].compare_exchange_weak(at, static_cast<uint64_t>(now_ns),
                                                       std::memory_order_acq_rel)) {
  }
}

bool renewRateNow(Words words, int64_t now_ns) {
  if (holdsRate(words, now_ns)) {
    if (load(words, kRateRenewAt) <= now_ns) return false;
    store(words, kRateRenewAt, now_ns);
    return true;
  }
  // Waiting to ask again (a rate op that got nothing, an empty bucket).
  if (load(words, kDenyUntil) <= now_ns || load(words, kRecheckAt) <= now_ns) return false;
  store(words, kRecheckAt, now_ns);
  return true;
}

void holdAtMostRate(Words words, int64_t ns_per_unit, int64_t cap, int64_t now_ns) {
  const int64_t held = load(words, kRateNsPerUnit);
  if (held <= 0 || (ns_per_unit > 0 && ns_per_unit <= held)) return;
  if (ns_per_unit <= 0) {
    store(words, kRateUntil, 0);
    store(words, kRateNsPerUnit, 0);
    return;
  }
  refillRate(words, now_ns);
  store(words, kRateNsPerUnit, ns_per_unit);
  store(words, kRateCap, std::min(cap, load(words, kRateCap)));
}

void noteAsked(Words words, const Limit& limit, int64_t asked, int64_t span_ns, int64_t now_ns) {
  if (asked <= 0 || span_ns <= 0) {
    store(words, kRateMovedSpan, 0);
    return;
  }
  const int64_t per_unit = std::max<int64_t>(limit.period_ns / asked, 1);
  store(words, kRateMoreNsPerUnit, asked >= limit.limit ? 0 : std::max<int64_t>(per_unit / 2, 1));
  store(words, kRateLessNsPerUnit, 2 * per_unit);
  store(words, kRateMovedDemand, load(words, kDemand));
  store(words, kRateMovedSince, now_ns);
  store(words, kRateMovedSpan, span_ns);
}

namespace {

// The window of demandMoved: kMovedWindowUnits units at the rate asked
// (kRateLessNsPerUnit is twice its ns per unit), within [a
// kMovedWindowsPerInterval-th of the lease interval (span), kMovedMaxIntervals
// of them].
int64_t movedWindowNs(ConstWords words, int64_t span) {
  return std::clamp<int64_t>(kMovedWindowUnits * (load(words, kRateLessNsPerUnit) / 2),
                             span / kMovedWindowsPerInterval, kMovedMaxIntervals * span);
}

// Reports a move of the key's demand to `demand` units over `elapsed` ns
// (demandMoved, reportIdle) for the one caller whose compare-and-swap of
// kRateMovedSince from `since` succeeds, and disarms the check until the
// renewal's answer re-arms it (noteAsked). The demand becomes the key's rate
// (kRate, per lease interval `span`) and a new measurement starts: the
// renewal asks for what the key wants now, not an average with the spell
// before the move.
bool reportMove(Words words, uint64_t since, int64_t now_ns, double demand, int64_t elapsed, int64_t span) {
  if (!words[kRateMovedSince].compare_exchange_strong(since, static_cast<uint64_t>(now_ns),
                                                      std::memory_order_acq_rel)) {
    return false;
  }
  store(words, kRateMovedSpan, 0);
  store(words, kRate,
        static_cast<int64_t>(demand * static_cast<double>(span) / static_cast<double>(elapsed) * kRateParts + 0.5));
  words[kDemand].store(0, std::memory_order_relaxed);
  store(words, kDemandSince, now_ns);
  store(words, kRateMovedDemand, 0);
  return true;
}

// A rate holder idle since its last use (claimMovedRenewal): its demand is
// none (0 units over an interval). Reported once, as demandMoved reports a
// move.
bool reportIdle(Words words, int64_t now_ns) {
  const int64_t span = load(words, kRateMovedSpan);
  if (span <= 0) return false;
  return reportMove(words, words[kRateMovedSince].load(std::memory_order_acquire), now_ns, 0, span, span);
}

}  // namespace

int64_t idleAfterNs(ConstWords words) {
  const int64_t span = load(words, kRateMovedSpan);
  if (span <= 0) return std::numeric_limits<int64_t>::max();
  return std::clamp<int64_t>(kMovedWindowUnits * (load(words, kRateLessNsPerUnit) / 2), span / kIdleWindowsPerInterval,
                             movedWindowNs(words, span));
}

bool demandMoved(Words words, int64_t now_ns) {
  const int64_t span = load(words, kRateMovedSpan);
  uint64_t since = words[kRateMovedSince].load(std::memory_order_acquire);
  const int64_t elapsed = now_ns - static_cast<int64_t>(since);
  if (span <= 0 || elapsed <= 0) return false;
  const int64_t less = load(words, kRateLessNsPerUnit);
  const int64_t window = movedWindowNs(words, span);
  // kDemand restarts from 0 at each measurement nextBatch ends: a window
  // across that counts what came since.
  const int64_t total = load(words, kDemand);
  const int64_t from = load(words, kRateMovedDemand);
  const double demand = static_cast<double>(total >= from ? total - from : total);
  const int64_t more = load(words, kRateMoreNsPerUnit);
  // Above twice what it asked over the whole window is seen as soon as the
  // count gets there; below half only once the window is over.
  const bool up = more > 0 && demand * static_cast<double>(more) >
                                  static_cast<double>(std::max(elapsed, window));
  // A fall is one below half of what it holds too: a holder granted less
  // than it asked (contending nodes hold their share) reads a gap of its
  // requests (a stall of its process) as a fall only when the gap took most
  // of the window, and its renewal would not change its rate anyway.
  const int64_t held_ns_per_unit = load(words, kRateNsPerUnit);
  const bool down = elapsed >= window && demand * static_cast<double>(std::max(less, 2 * held_ns_per_unit)) <
                                             static_cast<double>(elapsed);
  if (up || down) return reportMove(words, since, now_ns, demand, elapsed, span);
  if (elapsed < window) return false;
  // As asked: the next window starts (one taker moves it).
  if (words[kRateMovedSince].compare_exchange_strong(since, static_cast<uint64_t>(now_ns),
                                                     std::memory_order_acq_rel)) {
    store(words, kRateMovedDemand, total);
  }
  return false;
}

bool claimMovedRenewal(Words words, int64_t now_ns, int64_t last_use_ns) {
  if (!holdsRate(words, now_ns) || (words[kFlags].load(std::memory_order_acquire) & kInFlight) != 0) {
    return false;
  }
  const bool moved = now_ns - last_use_ns >= idleAfterNs(words) ? reportIdle(words, now_ns) : demandMoved(words, now_ns);
  return moved && claim(words);
}

int64_t moveCheckDueNs(ConstWords words, int64_t last_use_ns) {
  const int64_t span = load(words, kRateMovedSpan);
  if (span <= 0) return std::numeric_limits<int64_t>::max();
  const auto since = static_cast<int64_t>(words[kRateMovedSince].load(std::memory_order_acquire));
  return std::min(last_use_ns + idleAfterNs(words), since + movedWindowNs(words, span));
}

bool noteRateShort(Words words, bool short_unmet, int64_t now_ns, int64_t span_ns, int64_t intervals) {
  if (!short_unmet) {
    store(words, kRateShortSince, 0);
    return false;
  }
  int64_t since = load(words, kRateShortSince);
  if (since == 0) {
    since = now_ns;
    store(words, kRateShortSince, since);
  }
  return now_ns - since < intervals * span_ns;
}

int64_t leaseNowMs(ConstWords words) { return load(words, kLeaseNowMs); }

int64_t deniedUntilNs(ConstWords words) { return load(words, kDenyUntil); }

void failUntil(Words words, int64_t until_ns) { store(words, kFallbackUntil, until_ns); }

bool inFlight(ConstWords words) {
  return (words[kFlags].load(std::memory_order_acquire) & kInFlight) != 0;
}

bool idle(ConstWords words, int64_t now_ns) {
  // A rate's fallback admissions wait for their debit, as a share's do.
  return !inFlight(words) && now_ns >= load(words, kDenyUntil) && load(words, kRateFallback) == 0;
}

bool lineMarked(ConstWords words) {
  return (words[kFlags].load(std::memory_order_acquire) & kLine) != 0;
}

bool holdsUnits(ConstWords words) { return load(words, kUnits) > 0; }

int64_t heldUnits(ConstWords words, int64_t now_ns) { return std::max<int64_t>(spendable(words, now_ns), 0); }

Taken takeBack(Words words, int64_t now_ns) {
  int64_t expires = load(words, kExpires);
  uint64_t held = words[kUnits].load(std::memory_order_acquire);
  // A debt stays; units go, and race a worker's take() for them.
  while (static_cast<int64_t>(held) > 0 &&
         !words[kUnits].compare_exchange_weak(held, 0, std::memory_order_acq_rel)) {
  }
  auto units = static_cast<int64_t>(held);
  if (units <= 0 || (expires != 0 && now_ns >= expires)) return {};
  return {units, load(words, kLeaseNowMs)};
}

}  // namespace sluice::slice

// Sliding-window counter: the maths on one packed word (see sliding_window.h).
#include "algorithms/sliding_window.h"

#include <algorithm>

#include "algorithms/time_math.h"

namespace sluice::sliding_window {
namespace {

using time_math::i128;

constexpr int kIdBits = 24;
constexpr int kCountBits = 20;
constexpr uint64_t kCountMask = (1ULL << kCountBits) - 1;
constexpr uint64_t kIdMask = (1ULL << kIdBits) - 1;

// The counts as they apply at decision time `at_ns`, which is now_ns or, when
// a racing thread stored a newer window, the start of that window.
struct Window {
  int64_t id = 0;
  int64_t cur = 0;
  int64_t prev = 0;
  int64_t at_ns = 0;
};

Window resolve(uint64_t state, int64_t period_ns, int64_t now_ns) {
  const int64_t now_id = time_math::windowId(now_ns, period_ns);
  Window w{now_id, 0, 0, now_ns};
  if (state == 0) return w;
  const int64_t cur = static_cast<int64_t>((state >> kCountBits) & kCountMask);
  const int64_t prev = static_cast<int64_t>(state & kCountMask);
  const int64_t since = time_math::windowsSince(state >> (2 * kCountBits), now_id, kIdBits);
  if (since == 0) {
    w.cur = cur;
    w.prev = prev;
  } else if (since == 1) {
    w.prev = cur;
  } else if (since < 0) {
    w.id = now_id - since;
    w.cur = cur;
    w.prev = prev;
    w.at_ns = w.id * period_ns;
  }
  return w;
}

uint64_t pack(const Window& w) {
  if (w.cur == 0 && w.prev == 0) return 0;
  return ((static_cast<uint64_t>(w.id) & kIdMask) << (2 * kCountBits)) |
         (static_cast<uint64_t>(w.cur) << kCountBits) | static_cast<uint64_t>(w.prev);
}

// The first offset e in [0, period] into a window with `prev` units in the
// previous window such that prev * (period - e) <= budget * period, i.e. the
// previous window's weight has decayed enough. budget >= 0.
i128 firstFitOffsetNs(int64_t prev, int64_t budget, int64_t period_ns) {
  if (prev == 0) return 0;
  const i128 allowed = static_cast<i128>(budget) * period_ns / prev;  // floor
  return allowed >= period_ns ? 0 : period_ns - allowed;
}

}  // namespace

Decision acquire(uint64_t& state, const Limit& limit, int64_t now_ns, int64_t cost) {
  const int64_t period_ns = std::max<int64_t>(limit.period_ns, 1);
  // The config loader refuses limits above maxLimit; clamping here as well
  // keeps a count from ever spilling into the neighbouring field.
  const int64_t units = std::min<int64_t>(limit.limit, kCountMask);
  Window w = resolve(state, period_ns, now_ns);
  const i128 start_ns = static_cast<i128>(w.id) * period_ns;
  const i128 elapsed_ns = w.at_ns - start_ns;
  const i128 prev_weight = static_cast<i128>(w.prev) * (period_ns - elapsed_ns);
  const i128 capacity = static_cast<i128>(units) * period_ns;
  const int64_t spend = std::max<int64_t>(cost, 0);

  Decision d;
  d.limit = limit.limit;
  if (cost > units) {
    d.cost_exceeds_limit = true;
  } else if (prev_weight + static_cast<i128>(w.cur + spend) * period_ns <= capacity) {
    d.allowed = true;
    if (spend > 0) {
      w.cur += spend;
      state = pack(w);
    }
  } else {
    // The estimate falls while the previous window decays, then again as the
    // current count becomes the next window's decaying previous count.
    const int64_t budget = units - w.cur - spend;
    const i128 fit_ns = budget >= 0
                            ? start_ns + firstFitOffsetNs(w.prev, budget, period_ns)
                            : start_ns + period_ns + firstFitOffsetNs(w.cur, units - spend, period_ns);
    d.retry_after_ms = time_math::ceilMs(fit_ns - now_ns);
  }
  const i128 used = prev_weight + static_cast<i128>(w.cur) * period_ns;
  // Negative only in a settle's debt: floor, so a part of a unit owed is one.
  d.remaining = used > capacity ? -time_math::clampToI64((used - capacity + period_ns - 1) / period_ns)
                                : static_cast<int64_t>((capacity - used) / period_ns);
  if (w.cur > 0) {
    d.reset_after_ms = time_math::ceilMs(start_ns + 2 * static_cast<i128>(period_ns) - now_ns);
  } else if (w.prev > 0) {
    d.reset_after_ms = time_math::ceilMs(start_ns + period_ns - now_ns);
  }
  return d;
}

uint64_t refund(uint64_t state, const Limit& limit, int64_t now_ns, int64_t cost) {
  if (cost <= 0 || state == 0) return state;
  Window w = resolve(state, std::max<int64_t>(limit.period_ns, 1), now_ns);
  // A spend made in a window that has since ended left nothing to give back.
  if (w.cur == 0) return state;
  w.cur -= std::min(cost, w.cur);
  return pack(w);
}

uint64_t refundSpent(uint64_t state, const Limit& limit, int64_t spent_ns, int64_t now_ns,
                     int64_t cost) {
  if (cost <= 0 || state == 0) return state;
  const int64_t period_ns = std::max<int64_t>(limit.period_ns, 1);
  Window w = resolve(state, period_ns, now_ns);
  const int64_t spent_id = time_math::windowId(spent_ns, period_ns);
  if (spent_id == w.id) {
    w.cur -= std::min(cost, w.cur);
  } else if (spent_id == w.id - 1) {
    w.prev -= std::min(cost, w.prev);
  } else {
    return state;
  }
  return pack(w);
}

uint64_t charge(uint64_t state, const Limit& limit, int64_t now_ns, int64_t cost) {
  if (cost <= 0) return state;
  Window w = resolve(state, std::max<int64_t>(limit.period_ns, 1), now_ns);
  w.cur = std::min<int64_t>(w.cur + std::min<int64_t>(cost, kCountMask), kCountMask);
  return pack(w);
}

bool isIdle(uint64_t state, const Limit& limit, int64_t now_ns) {
  const Window w = resolve(state, std::max<int64_t>(limit.period_ns, 1), now_ns);
  return w.cur == 0 && w.prev == 0;
}

}  // namespace sluice::sliding_window

// Fixed window: the maths on one (window id, count) word (see fixed_window.h).
#include "algorithms/fixed_window.h"

#include <algorithm>

#include "algorithms/time_math.h"
#include "calendar.h"

namespace sluice::fixed_window {
namespace {

using time_math::i128;

constexpr int kIdBits = 32;
constexpr uint64_t kCountMask = 0xFFFFFFFFULL;

// The window a decision at now_ns applies to and its count: the stored window
// when it is now's or a racing thread's newer one, else a fresh window.
struct Window {
  int64_t id = 0;
  int64_t count = 0;
};

// The window that now_ns falls in: its id and where it ends (monotonic ns).
struct Current {
  int64_t id = 0;
  i128 end_ns = 0;
};

Current current(const Limit& limit, int64_t now_ns, int64_t wall_offset_ns) {
  if (limit.window == calendar::Span::kNone) {
    const int64_t period_ns = std::max<int64_t>(limit.period_ns, 1);
    const int64_t id = time_math::windowId(now_ns, period_ns);
    return {id, static_cast<i128>(id + 1) * period_ns};
  }
  const int64_t unix_ns =
      time_math::clampToI64(static_cast<i128>(now_ns) + static_cast<i128>(wall_offset_ns));
  const calendar::Window w = calendar::windowAt(unix_ns, limit.window, limit.time_zone);
  return {w.id, static_cast<i128>(w.end_unix_ns) - wall_offset_ns};
}

Window resolve(uint64_t state, int64_t now_id) {
  const int64_t count = static_cast<int64_t>(state & kCountMask);
  if (count == 0) return {now_id, 0};
  const int64_t since = time_math::windowsSince(state >> kIdBits, now_id, kIdBits);
  if (since > 0) return {now_id, 0};
  return {now_id - since, count};
}

int64_t offsetFor(const Limit& limit) {
  return limit.window == calendar::Span::kNone ? 0 : calendar::wallOffsetNs();
}

uint64_t pack(const Window& w) {
  if (w.count == 0) return 0;
  return (static_cast<uint64_t>(w.id) << kIdBits) | static_cast<uint64_t>(w.count);
}

}  // namespace

Decision acquire(uint64_t& state, const Limit& limit, int64_t now_ns, int64_t cost) {
  return acquireOnWall(state, limit, now_ns, cost, offsetFor(limit));
}

Decision acquireOnWall(uint64_t& state, const Limit& limit, int64_t now_ns, int64_t cost,
                       int64_t wall_offset_ns) {
  const Current now = current(limit, now_ns, wall_offset_ns);
  Window w = resolve(state, now.id);
  // A racing thread's newer window (w.id > now.id) ends that many periods
  // later; a calendar one is a moment ahead at most, and ends with now's.
  const i128 end_ns = limit.window == calendar::Span::kNone
                          ? now.end_ns + static_cast<i128>(w.id - now.id) *
                                             std::max<int64_t>(limit.period_ns, 1)
                          : now.end_ns;

  // The config loader refuses limits above maxLimit; clamping here as well
  // keeps the count from ever spilling into the id bits.
  const int64_t units = std::min<int64_t>(limit.limit, kCountMask);

  Decision d;
  d.limit = limit.limit;
  if (cost > units) {
    d.cost_exceeds_limit = true;
  } else if (w.count + std::max<int64_t>(cost, 0) <= units) {
    d.allowed = true;
    if (cost > 0) {
      w.count += cost;
      state = pack(w);
    }
  } else {
    d.retry_after_ms = time_math::ceilMs(end_ns - now_ns);
  }
  d.remaining = units - w.count;  // negative only in a settle's debt
  d.reset_after_ms = w.count == 0 ? 0 : time_math::ceilMs(end_ns - now_ns);
  return d;
}

uint64_t refund(uint64_t state, const Limit& limit, int64_t now_ns, int64_t cost) {
  if (cost <= 0) return state;
  Window w = resolve(state, current(limit, now_ns, offsetFor(limit)).id);
  // A spend made in a window that has since ended left nothing to give back.
  if (w.count == 0) return state;
  w.count -= std::min(cost, w.count);
  return pack(w);
}

uint64_t refundSpent(uint64_t state, const Limit& limit, int64_t spent_ns, int64_t now_ns,
                     int64_t cost) {
  const int64_t offset_ns = offsetFor(limit);
  if (current(limit, spent_ns, offset_ns).id != current(limit, now_ns, offset_ns).id) return state;
  return refund(state, limit, now_ns, cost);
}

uint64_t charge(uint64_t state, const Limit& limit, int64_t now_ns, int64_t cost) {
  if (cost <= 0) return state;
  Window w = resolve(state, current(limit, now_ns, offsetFor(limit)).id);
  w.count = static_cast<int64_t>(
      std::min<uint64_t>(static_cast<uint64_t>(w.count) + static_cast<uint64_t>(cost), kCountMask));
  return pack(w);
}

bool isIdle(uint64_t state, const Limit& limit, int64_t now_ns) {
  return resolve(state, current(limit, now_ns, offsetFor(limit)).id).count == 0;
}

}  // namespace sluice::fixed_window

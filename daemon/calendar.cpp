// Calendar windows: the zone arithmetic behind windowAt (see calendar.h).
#include "calendar.h"

#include <date/date.h>
#include <date/tz.h>

#include <time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <stdexcept>

namespace sluice::calendar {
namespace {

using std::chrono::days;
using std::chrono::nanoseconds;
using std::chrono::seconds;

// 1970-01-01 was a Thursday: the Monday that starts its ISO week is 3 days
// earlier.
constexpr int64_t kEpochWeekdayFromMonday = 3;

// The first instant of local day `day` in `zone`: its midnight, or the
// transition when that midnight does not exist, or the earlier of two.
int64_t dayStartUnixNs(date::local_days day, const date::time_zone* zone) {
  const date::local_seconds midnight{day.time_since_epoch()};
  const date::sys_seconds start = zone->to_sys(midnight, date::choose::earliest);
  return std::chrono::duration_cast<nanoseconds>(start.time_since_epoch()).count();
}

const date::time_zone* utcZone() {
  static const date::time_zone* const kUtc = date::locate_zone("UTC");
  return kUtc;
}

constexpr int64_t kUnsetOffset = std::numeric_limits<int64_t>::min();
std::atomic<int64_t> g_wall_offset_ns{kUnsetOffset};

int64_t clockNs(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

int64_t floorDiv(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

}  // namespace

Span spanNamed(std::string_view name) {
  if (name == "day") return Span::kDay;
  if (name == "week") return Span::kWeek;
  if (name == "month") return Span::kMonth;
  return Span::kNone;
}

std::string_view spanName(Span span) {
  switch (span) {
    case Span::kNone: return "";
    case Span::kDay: return "day";
    case Span::kWeek: return "week";
    case Span::kMonth: return "month";
  }
  return "";
}

std::optional<Zone> Zone::named(std::string_view name) {
  try {
    return Zone(date::locate_zone(name));
  } catch (const std::runtime_error&) {
    return std::nullopt;
  }
}

Zone Zone::utc() { return Zone(utcZone()); }

const date::time_zone* Zone::get() const { return zone_ != nullptr ? zone_ : utcZone(); }

const std::string& Zone::name() const { return get()->name(); }

int64_t longestNs(Span span) {
  constexpr int64_t kHourNs = 3600LL * 1'000'000'000;
  switch (span) {
    case Span::kNone: return 0;
    case Span::kDay: return 25 * kHourNs;
    case Span::kWeek: return 7 * 24 * kHourNs + kHourNs;
    case Span::kMonth: return 31 * 24 * kHourNs + kHourNs;
  }
  return 0;
}

int64_t wallOffsetNs() {
  const int64_t offset = g_wall_offset_ns.load(std::memory_order_relaxed);
  if (offset != kUnsetOffset) return offset;
  refreshWallOffset();
  return g_wall_offset_ns.load(std::memory_order_relaxed);
}

void refreshWallOffset() {
  setWallOffsetNs(clockNs(CLOCK_REALTIME) - clockNs(CLOCK_MONOTONIC));
}

void setWallOffsetNs(int64_t offset_ns) {
  g_wall_offset_ns.store(offset_ns, std::memory_order_relaxed);
}

namespace {

Window computeWindow(int64_t unix_ns, Span span, const date::time_zone* tz);

// The last windows this thread found, one per slot: a decision asks for the
// window of its limit again and again while the window lasts, and the zone
// arithmetic costs some 500 ns where a hit costs a few comparisons. A hit
// gives exactly what computeWindow would (the window holds the instant).
struct CachedWindow {
  const date::time_zone* tz = nullptr;
  Span span = Span::kNone;
  Window window;
};
constexpr size_t kCacheSlots = 8;
thread_local std::array<CachedWindow, kCacheSlots> t_cache;

}  // namespace

Window windowAt(int64_t unix_ns, Span span, const Zone& zone) {
  const date::time_zone* tz = zone.get();
  const int64_t at_ns = std::max<int64_t>(unix_ns, 0);
  CachedWindow& slot =
      t_cache[(reinterpret_cast<uintptr_t>(tz) / 64 + static_cast<size_t>(span)) % kCacheSlots];
  if (slot.tz == tz && slot.span == span && slot.window.start_unix_ns <= at_ns &&
      at_ns < slot.window.end_unix_ns) {
    return slot.window;
  }
  const Window w = computeWindow(at_ns, span, tz);
  slot = CachedWindow{tz, span, w};
  return w;
}

namespace {

Window computeWindow(int64_t unix_ns, Span span, const date::time_zone* tz) {
  const date::sys_seconds instant =
      std::chrono::floor<seconds>(date::sys_time<nanoseconds>(nanoseconds(std::max<int64_t>(unix_ns, 0))));
  const date::local_days today = std::chrono::floor<days>(tz->to_local(instant));
  const int64_t day_number = today.time_since_epoch().count();

  date::local_days first;
  date::local_days next;
  int64_t id = 0;
  switch (span) {
    case Span::kNone:
    case Span::kDay:
      first = today;
      next = today + days(1);
      id = day_number;
      break;
    case Span::kWeek: {
      const int64_t week = floorDiv(day_number + kEpochWeekdayFromMonday, 7);
      first = date::local_days(days(week * 7 - kEpochWeekdayFromMonday));
      next = first + days(7);
      id = week;
      break;
    }
    case Span::kMonth: {
      const date::year_month_day ymd{today};
      const date::year_month month = ymd.year() / ymd.month();
      const date::year_month following = month + date::months(1);
      first = date::local_days(month / 1);
      next = date::local_days(following / 1);
      id = (static_cast<int64_t>(static_cast<int>(ymd.year())) - 1970) * 12 +
           static_cast<int64_t>(static_cast<unsigned>(ymd.month())) - 1;
      break;
    }
  }
  return Window{.id = id,
                .start_unix_ns = dayStartUnixNs(first, tz),
                .end_unix_ns = dayStartUnixNs(next, tz)};
}

}  // namespace

}  // namespace sluice::calendar

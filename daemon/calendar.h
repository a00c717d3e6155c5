// Calendar windows: fixed windows that follow a time zone's calendar (a day,
// an ISO week from Monday, a month) instead of a fixed number of nanoseconds.
//
// A budget is "10 M tokens a month in Berlin": its window starts at local
// midnight of the 1st and lasts as long as that month really lasts there (28
// to 31 days, and 23 or 25 hours more or less when a daylight-saving change
// falls inside it). windowAt() is the one place that turns a wall-clock
// instant and a zone into that window; the fixed-window algorithm counts in
// it, and the Lua script of a global rule is handed its id and end by the
// daemon (it never computes a time zone itself).
//
// Window ids count calendar windows since 1970 in the zone's own calendar:
// days since 1970-01-01, weeks since the Monday 1969-12-29, months since
// January 1970. Consecutive windows have consecutive ids, whatever their
// length, which is what the fixed-window state word keeps.
//
// A local midnight that does not exist (a zone that springs forward at
// 00:00) starts its day at the first instant that exists, the transition; a
// midnight that happens twice starts it at the earlier one. So windows never
// overlap and leave no gap.
//
// Zones come from the system's zoneinfo (tzdata) through Howard Hinnant's
// date/tz (USE_OS_TZDB). A Zone is a handle into that database, which lives
// for the whole process: copy it freely. windowAt() is a pure function of
// (instant, span, zone); any thread. It keeps the last few windows each
// thread found, so that asking again within a window costs a few
// comparisons instead of the zone arithmetic (about 0.5 µs).
//
// Units: Unix-epoch nanoseconds of the wall clock (unix_ns), UTC.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace date {
class time_zone;
}

namespace sluice::calendar {

// How long one window of a calendar limit is.
enum class Span : uint8_t {
  kNone,   // not a calendar window: the limit's period_ns applies
  kDay,    // from local midnight to the next
  kWeek,   // from local midnight on Monday to the next Monday's (ISO 8601)
  kMonth,  // from local midnight on the 1st to the next month's 1st
};

// "day", "week", "month" (kNone for anything else).
Span spanNamed(std::string_view name);
std::string_view spanName(Span span);

// A time zone of the IANA database ("UTC", "Europe/Berlin"); UTC when
// default-constructed.
class Zone {
 public:
  Zone() = default;
  // The zone called `name`; nullopt when the zoneinfo has no such zone.
  static std::optional<Zone> named(std::string_view name);
  static Zone utc();

  const std::string& name() const;
  const date::time_zone* get() const;
  bool operator==(const Zone& other) const { return get() == other.get(); }

 private:
  explicit Zone(const date::time_zone* zone) : zone_(zone) {}
  const date::time_zone* zone_ = nullptr;  // owned by the process-wide tzdb; nullptr: UTC
};

// One calendar window: [start_unix_ns, end_unix_ns) and its id.
struct Window {
  int64_t id = 0;
  int64_t start_unix_ns = 0;
  int64_t end_unix_ns = 0;
  bool operator==(const Window&) const = default;
};

// The `span` window of `zone` that contains the instant unix_ns.
// Requires span != kNone. An instant before 1970 (never read from a clock
// that is set) is taken as 1970-01-01T00:00Z.
Window windowAt(int64_t unix_ns, Span span, const Zone& zone);

// The longest a `span` window can last, in ns: a day of 25 hours, a week of
// 7 days and an hour, a month of 31 days and an hour (no zone moves its clock
// by more than an hour at a time within a month). What a calendar limit's
// period_ns is set to.
int64_t longestNs(Span span);

// The offset of the wall clock from the daemon's monotonic clock,
// unix_ns - now_ns, that the limiter counts calendar windows with: the
// decisions take monotonic times, a calendar window is on the wall clock.
// Read with one relaxed atomic load (no clock read); taken from the clocks
// on first use and again by refreshWallOffset(), which the server calls on
// each key sweep ([keys] sweep_interval) so that a step of the wall clock is
// followed.
// setWallOffsetNs pins it (tests on a simulated clock). Any thread.
int64_t wallOffsetNs();
void refreshWallOffset();
void setWallOffsetNs(int64_t offset_ns);

}  // namespace sluice::calendar

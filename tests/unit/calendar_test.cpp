// Calendar windows: day, week and month windows of a time zone, as pure
// functions of (instant, span, zone), across DST changes, month lengths and
// the year's end.
#include "calendar.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace sluice::calendar {
namespace {

constexpr int64_t kNsPerS = 1'000'000'000;
constexpr int64_t kHourNs = 3600 * kNsPerS;
constexpr int64_t kDayNs = 24 * kHourNs;

// Days from 1970-01-01 to y-m-d (proleptic Gregorian), Howard Hinnant's
// days_from_civil: the tests' own arithmetic, independent of date/tz.
int64_t daysFromCivil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

// The instant y-m-d hh:mm UTC, in Unix ns.
int64_t utc(int64_t y, unsigned m, unsigned d, int64_t hh = 0, int64_t mm = 0) {
  return daysFromCivil(y, m, d) * kDayNs + hh * kHourNs + mm * 60 * kNsPerS;
}

Zone zone(const std::string& name) {
  std::optional<Zone> z = Zone::named(name);
  EXPECT_TRUE(z.has_value()) << name;
  return z.value_or(Zone::utc());
}

TEST(CalendarTest, SpansAreNamedAsInTheConfigFile) {
  EXPECT_EQ(spanNamed("day"), Span::kDay);
  EXPECT_EQ(spanNamed("week"), Span::kWeek);
  EXPECT_EQ(spanNamed("month"), Span::kMonth);
  EXPECT_EQ(spanNamed("1mo"), Span::kNone);
  EXPECT_EQ(spanName(Span::kMonth), "month");
}

TEST(CalendarTest, AZoneIsFoundByItsIanaNameAndAnUnknownNameIsNot) {
  EXPECT_EQ(zone("Europe/Berlin").name(), "Europe/Berlin");
  EXPECT_EQ(Zone::utc().name(), "UTC");
  EXPECT_FALSE(Zone::named("Europe/Atlantis").has_value());
  EXPECT_FALSE(Zone::named("").has_value());
}

TEST(CalendarTest, AUtcDayRunsFromMidnightToMidnightWithTheDaysSince1970AsItsId) {
  const Window w = windowAt(utc(2026, 11, 26, 18, 5), Span::kDay, Zone::utc());
  EXPECT_EQ(w.start_unix_ns, utc(2026, 11, 26));
  EXPECT_EQ(w.end_unix_ns, utc(2026, 11, 27));
  EXPECT_EQ(w.id, daysFromCivil(2026, 11, 26));
  // The last nanosecond of the day is in it; midnight is the next day's.
  EXPECT_EQ(windowAt(utc(2026, 11, 27) - 1, Span::kDay, Zone::utc()), w);
  EXPECT_EQ(windowAt(utc(2026, 11, 27), Span::kDay, Zone::utc()).id, w.id + 1);
}

TEST(CalendarTest, ABerlinDayStartsAtLocalMidnightWhichIsUtcTheEveningBefore) {
  // 2026-11-26 00:30 in Berlin (CET, UTC+1) is 23:30 UTC on the 25th.
  const Window w = windowAt(utc(2026, 11, 25, 23, 30), Span::kDay, zone("Europe/Berlin"));
  EXPECT_EQ(w.start_unix_ns, utc(2026, 11, 25, 23));
  EXPECT_EQ(w.end_unix_ns, utc(2026, 11, 26, 23));
  EXPECT_EQ(w.id, daysFromCivil(2026, 11, 26));
}

TEST(CalendarTest, TheDayBerlinSpringsForwardLasts23HoursAndTheDayItFallsBack25) {
  const Zone berlin = zone("Europe/Berlin");
  // 2026-03-29: 02:00 CET -> 03:00 CEST. Midnight is 23:00 UTC the day before,
  // the next midnight 22:00 UTC.
  const Window spring = windowAt(utc(2026, 3, 29, 12), Span::kDay, berlin);
  EXPECT_EQ(spring.start_unix_ns, utc(2026, 3, 28, 23));
  EXPECT_EQ(spring.end_unix_ns, utc(2026, 3, 29, 22));
  EXPECT_EQ(spring.end_unix_ns - spring.start_unix_ns, 23 * kHourNs);
  // 2026-10-25: 03:00 CEST -> 02:00 CET.
  const Window fall = windowAt(utc(2026, 10, 25, 12), Span::kDay, berlin);
  EXPECT_EQ(fall.start_unix_ns, utc(2026, 10, 24, 22));
  EXPECT_EQ(fall.end_unix_ns, utc(2026, 10, 25, 23));
  EXPECT_EQ(fall.end_unix_ns - fall.start_unix_ns, 25 * kHourNs);
}

TEST(CalendarTest, NewYorkDaysAcrossBothDstChangesAreShortAndLongAndLeaveNoGap) {
  const Zone ny = zone("America/New_York");
  // 2026-03-08 02:00 EST -> 03:00 EDT; 2026-11-01 02:00 EDT -> 01:00 EST.
  const Window before = windowAt(utc(2026, 3, 7, 12), Span::kDay, ny);
  const Window spring = windowAt(utc(2026, 3, 8, 12), Span::kDay, ny);
  const Window after = windowAt(utc(2026, 3, 9, 12), Span::kDay, ny);
  EXPECT_EQ(before.end_unix_ns, spring.start_unix_ns);
  EXPECT_EQ(spring.end_unix_ns, after.start_unix_ns);
  EXPECT_EQ(spring.start_unix_ns, utc(2026, 3, 8, 5));
  EXPECT_EQ(spring.end_unix_ns - spring.start_unix_ns, 23 * kHourNs);
  EXPECT_EQ(after.id, spring.id + 1);
  const Window fall = windowAt(utc(2026, 11, 1, 12), Span::kDay, ny);
  EXPECT_EQ(fall.start_unix_ns, utc(2026, 11, 1, 4));
  EXPECT_EQ(fall.end_unix_ns, utc(2026, 11, 2, 5));
  // 01:30 local happens twice that night; both are in the same day.
  EXPECT_EQ(windowAt(utc(2026, 11, 1, 5, 30), Span::kDay, ny), fall);
  EXPECT_EQ(windowAt(utc(2026, 11, 1, 6, 30), Span::kDay, ny), fall);
}

TEST(CalendarTest, SydneyDstIsInTheSouthernSummerAndItsDaysFollowIt) {
  const Zone sydney = zone("Australia/Sydney");
  // 2026-04-05 03:00 AEDT -> 02:00 AEST (25 h); 2026-10-04 02:00 AEST ->
  // 03:00 AEDT (23 h).
  const Window fall = windowAt(utc(2026, 4, 5, 6), Span::kDay, sydney);
  EXPECT_EQ(fall.start_unix_ns, utc(2026, 4, 4, 13));
  EXPECT_EQ(fall.end_unix_ns - fall.start_unix_ns, 25 * kHourNs);
  const Window spring = windowAt(utc(2026, 10, 4, 6), Span::kDay, sydney);
  EXPECT_EQ(spring.start_unix_ns, utc(2026, 10, 3, 14));
  EXPECT_EQ(spring.end_unix_ns - spring.start_unix_ns, 23 * kHourNs);
}

TEST(CalendarTest, AMidnightThatDoesNotExistStartsTheDayAtTheTransition) {
  // America/Santiago springs forward at 24:00 on 2026-09-05: local 00:00 on
  // the 6th never happens, and the day starts at 01:00 -03 (04:00 UTC).
  const Zone santiago = zone("America/Santiago");
  const Window w = windowAt(utc(2026, 9, 6, 12), Span::kDay, santiago);
  EXPECT_EQ(w.start_unix_ns, utc(2026, 9, 6, 4));
  EXPECT_EQ(windowAt(utc(2026, 9, 5, 12), Span::kDay, santiago).end_unix_ns, w.start_unix_ns);
}

TEST(CalendarTest, AWeekRunsFromMondayToMondayAcrossTheYearsEnd) {
  const Zone berlin = zone("Europe/Berlin");
  // Thursday 2026-12-31 belongs to the week of Monday 2026-12-28.
  const Window w = windowAt(utc(2026, 12, 31, 12), Span::kWeek, berlin);
  EXPECT_EQ(w.start_unix_ns, utc(2026, 12, 27, 23));
  EXPECT_EQ(w.end_unix_ns, utc(2027, 1, 3, 23));
  EXPECT_EQ(windowAt(utc(2027, 1, 3, 22, 59), Span::kWeek, berlin), w);
  EXPECT_EQ(windowAt(utc(2027, 1, 3, 23), Span::kWeek, berlin).id, w.id + 1);
  // 1970-01-01 (a Thursday) is in week 0, which began Monday 1969-12-29.
  EXPECT_EQ(windowAt(utc(1970, 1, 1, 12), Span::kWeek, Zone::utc()).id, 0);
  EXPECT_EQ(windowAt(utc(1970, 1, 5), Span::kWeek, Zone::utc()).id, 1);
}

TEST(CalendarTest, AWeekWithADstChangeLasts167Or169Hours) {
  const Zone berlin = zone("Europe/Berlin");
  const Window spring = windowAt(utc(2026, 3, 26), Span::kWeek, berlin);
  EXPECT_EQ(spring.end_unix_ns - spring.start_unix_ns, 167 * kHourNs);
  const Window fall = windowAt(utc(2026, 10, 22), Span::kWeek, berlin);
  EXPECT_EQ(fall.end_unix_ns - fall.start_unix_ns, 169 * kHourNs);
}

TEST(CalendarTest, MonthsLast28To31DaysAndFebruaryOfALeapYear29) {
  const Zone utc0 = Zone::utc();
  struct Case {
    int64_t year;
    unsigned month;
    int64_t days;
  };
  for (const Case& c : {Case{2026, 2, 28}, Case{2028, 2, 29}, Case{2100, 2, 28}, Case{2000, 2, 29},
                        Case{2026, 4, 30}, Case{2026, 1, 31}, Case{2026, 12, 31}}) {
    const Window w = windowAt(utc(c.year, c.month, 15, 12), Span::kMonth, utc0);
    EXPECT_EQ(w.start_unix_ns, utc(c.year, c.month, 1)) << c.year << "-" << c.month;
    EXPECT_EQ(w.end_unix_ns - w.start_unix_ns, c.days * kDayNs) << c.year << "-" << c.month;
    EXPECT_EQ(w.id, (c.year - 1970) * 12 + c.month - 1);
  }
}

TEST(CalendarTest, TheMonthEndsAtLocalMidnightOfTheFirstAndTheYearRollsOver) {
  const Zone berlin = zone("Europe/Berlin");
  // 2026-12-31 23:30 in Berlin is still December; 2027-01-01 00:00 is not.
  const Window december = windowAt(utc(2026, 12, 31, 22, 30), Span::kMonth, berlin);
  EXPECT_EQ(december.start_unix_ns, utc(2026, 11, 30, 23));
  EXPECT_EQ(december.end_unix_ns, utc(2026, 12, 31, 23));
  const Window january = windowAt(utc(2026, 12, 31, 23), Span::kMonth, berlin);
  EXPECT_EQ(january.id, december.id + 1);
  EXPECT_EQ(january.start_unix_ns, december.end_unix_ns);
  EXPECT_EQ(january.end_unix_ns, utc(2027, 1, 31, 23));
}

TEST(CalendarTest, AMonthWithADstChangeIsAnHourShortOrLong) {
  const Zone ny = zone("America/New_York");
  const Window march = windowAt(utc(2026, 3, 15), Span::kMonth, ny);
  EXPECT_EQ(march.end_unix_ns - march.start_unix_ns, 31 * kDayNs - kHourNs);
  const Window november = windowAt(utc(2026, 11, 15), Span::kMonth, ny);
  EXPECT_EQ(november.end_unix_ns - november.start_unix_ns, 30 * kDayNs + kHourNs);
}

TEST(CalendarTest, ConsecutiveDaysTileAYearInEveryZoneWithoutGapOrOverlap) {
  for (const char* name : {"UTC", "Europe/Berlin", "America/New_York", "Australia/Sydney"}) {
    const Zone z = zone(name);
    Window w = windowAt(utc(2026, 1, 1, 12), Span::kDay, z);
    for (int i = 0; i < 366; ++i) {
      const Window next = windowAt(w.end_unix_ns, Span::kDay, z);
      ASSERT_EQ(next.start_unix_ns, w.end_unix_ns) << name << " day " << i;
      ASSERT_EQ(next.id, w.id + 1) << name << " day " << i;
      ASSERT_EQ(windowAt(w.end_unix_ns - 1, Span::kDay, z), w) << name << " day " << i;
      w = next;
    }
  }
}

TEST(CalendarTest, AskingAgainInAnotherZoneOrSpanIsNotAnsweredWithTheWindowAskedBefore) {
  const Zone berlin = zone("Europe/Berlin");
  const Zone tokyo = zone("Asia/Tokyo");
  // 2026-11-26 22:30 UTC: the 26th in UTC, the 26th in Berlin (23:30) and
  // the 27th in Tokyo (07:30).
  const int64_t t = utc(2026, 11, 26, 22, 30);
  for (int round = 0; round < 3; ++round) {
    EXPECT_EQ(windowAt(t, Span::kDay, Zone::utc()).start_unix_ns, utc(2026, 11, 26));
    EXPECT_EQ(windowAt(t, Span::kDay, berlin).start_unix_ns, utc(2026, 11, 25, 23));
    EXPECT_EQ(windowAt(t, Span::kDay, tokyo).start_unix_ns, utc(2026, 11, 26, 15));
    EXPECT_EQ(windowAt(t, Span::kMonth, berlin).start_unix_ns, utc(2026, 10, 31, 23));
    EXPECT_EQ(windowAt(t, Span::kWeek, tokyo).start_unix_ns, utc(2026, 11, 22, 15));
  }
}

}  // namespace
}  // namespace sluice::calendar

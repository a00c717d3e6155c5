// Tests for the clock reads and ClockOffsetEstimator (pure: samples are
// given, no clock is read except in the last test).
#include "clock.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <ctime>

namespace sluice {
namespace {

// Verifies that there is no estimate before the first sample.
TEST(ClockOffsetEstimatorTest, HasNoEstimateBeforeASample) {
  ClockOffsetEstimator clock;
  EXPECT_FALSE(clock.offsetUs().has_value());
  EXPECT_EQ(clock.errorBoundUs(), 0);
}

// Verifies that a sample puts Redis's read at the middle of the round trip
// and in the middle of Redis's (floored) millisecond.
TEST(ClockOffsetEstimatorTest, PutsRedisTimeAtTheMidpointOfTheRoundTrip) {
  ClockOffsetEstimator clock;
  clock.addSample(10'000, 12'000, 1'000'000);  // sent at 10 ms, answered at 12 ms
  ASSERT_TRUE(clock.offsetUs().has_value());
  EXPECT_EQ(*clock.offsetUs(), 1'000'000'000 + 500 - 11'000);
  EXPECT_EQ(clock.errorBoundUs(), 1'000 + 500);
}

// Verifies that of the samples in the window the one with the shortest round
// trip decides, whatever its place.
TEST(ClockOffsetEstimatorTest, KeepsTheSampleWithTheShortestRoundTrip) {
  ClockOffsetEstimator clock;
  clock.addSample(0, 8'000, 100);        // rtt 8 ms
  clock.addSample(20'000, 20'200, 120);  // rtt 0.2 ms: the best
  clock.addSample(40'000, 45'000, 140);  // rtt 5 ms
  EXPECT_EQ(*clock.offsetUs(), 120'000 + 500 - 20'100);
  EXPECT_EQ(clock.errorBoundUs(), 100 + 500);
}

// Verifies that the best sample leaves the estimate once kWindow newer
// samples have come, so the estimate follows the clocks' drift.
TEST(ClockOffsetEstimatorTest, ForgetsTheBestSampleAfterAWindowOfNewerOnes) {
  ClockOffsetEstimator clock;
  clock.addSample(0, 100, 50);  // rtt 100 µs: the best for now
  int64_t best = *clock.offsetUs();
  for (size_t i = 1; i < ClockOffsetEstimator::kWindow; i++) {
    int64_t t0 = static_cast<int64_t>(i) * 1'000'000;
    clock.addSample(t0, t0 + 2'000, t0 / 1000 + 60);  // rtt 2 ms, offset ~9 ms later
    EXPECT_EQ(*clock.offsetUs(), best) << i;
  }
  int64_t t0 = static_cast<int64_t>(ClockOffsetEstimator::kWindow) * 1'000'000;
  clock.addSample(t0, t0 + 2'000, t0 / 1000 + 60);
  EXPECT_EQ(*clock.offsetUs(), 60'000 + 500 - 1'000);
}

// Verifies that a round trip that ends before it starts is ignored.
TEST(ClockOffsetEstimatorTest, IgnoresARoundTripThatEndsBeforeItStarts) {
  ClockOffsetEstimator clock;
  clock.addSample(5'000, 4'000, 7);
  EXPECT_FALSE(clock.offsetUs().has_value());
}

// Verifies realtimeMinusMonotonicUs against the two clocks read here.
TEST(ClockTest, RealtimeMinusMonotonicMatchesTheClocks) {
  timespec real{};
  clock_gettime(CLOCK_REALTIME, &real);
  int64_t expected_us = (static_cast<int64_t>(real.tv_sec) * 1'000'000'000 + real.tv_nsec -
                         monotonicNowNs()) /
                        1000;
  EXPECT_LT(std::llabs(realtimeMinusMonotonicUs() - expected_us), 5'000);
}

}  // namespace
}  // namespace sluice

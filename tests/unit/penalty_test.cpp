// Tests for penalties (daemon/penalty.h): counting denials in a window,
// blocking on the D-th, and the block's end, on a simulated clock.
#include "penalty.h"

#include <gtest/gtest.h>

#include <array>
#include <atomic>

namespace sluice {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kSecond = 1'000 * kMs;

// 3 denials within 10 s block the key for a minute.
constexpr Penalty kThreeInTenSeconds{3, 10 * kSecond, 60 * kSecond};

struct Words {
  std::array<std::atomic<uint64_t>, penalty::kWords> words{};
  std::span<std::atomic<uint64_t>> span() { return words; }
};

// Verifies that the D-th denial within the window blocks the key for the
// block time, and not one denial earlier.
TEST(PenaltyTest, TheDthDenialWithinTheWindowBlocks) {
  Words key;
  const int64_t start = 1000 * kSecond;
  EXPECT_FALSE(penalty::recordDenial(kThreeInTenSeconds, key.span(), start));
  EXPECT_FALSE(penalty::recordDenial(kThreeInTenSeconds, key.span(), start + 4 * kSecond));
  EXPECT_EQ(penalty::blockedFor(key.span(), start + 4 * kSecond), 0);
  EXPECT_TRUE(penalty::recordDenial(kThreeInTenSeconds, key.span(), start + 9 * kSecond));
  EXPECT_EQ(penalty::blockedFor(key.span(), start + 9 * kSecond), 60 * kSecond);
  EXPECT_EQ(penalty::blockedFor(key.span(), start + 39 * kSecond), 30 * kSecond);
  EXPECT_EQ(penalty::blockedFor(key.span(), start + 69 * kSecond), 0);
}

// Verifies that denials spread wider than the window never block: each
// window counts from its first denial.
TEST(PenaltyTest, DenialsSpreadWiderThanTheWindowNeverBlock) {
  Words key;
  for (int i = 0; i < 30; ++i) {
    ASSERT_FALSE(penalty::recordDenial(kThreeInTenSeconds, key.span(), i * 6 * kSecond)) << i;
  }
}

// Verifies a block starts the count afresh, and idleness: not while a
// window counts or a block lasts, again once both have passed.
TEST(PenaltyTest, IdleOnlyOnceTheWindowAndTheBlockHavePassed) {
  Words key;
  const int64_t start = 5 * kSecond;
  EXPECT_TRUE(penalty::isIdle(kThreeInTenSeconds, key.span(), start));
  penalty::recordDenial(kThreeInTenSeconds, key.span(), start);
  EXPECT_FALSE(penalty::isIdle(kThreeInTenSeconds, key.span(), start + kSecond));
  EXPECT_TRUE(penalty::isIdle(kThreeInTenSeconds, key.span(), start + 11 * kSecond));
  for (int i = 0; i < 3; ++i) penalty::recordDenial(kThreeInTenSeconds, key.span(), start + 20 * kSecond);
  EXPECT_FALSE(penalty::isIdle(kThreeInTenSeconds, key.span(), start + 70 * kSecond));
  EXPECT_TRUE(penalty::isIdle(kThreeInTenSeconds, key.span(), start + 81 * kSecond));
  // After the block, two denials do not block again: the count restarted.
  EXPECT_FALSE(penalty::recordDenial(kThreeInTenSeconds, key.span(), start + 90 * kSecond));
  EXPECT_FALSE(penalty::recordDenial(kThreeInTenSeconds, key.span(), start + 91 * kSecond));
}

// Verifies a penalty of one denial blocks at the first.
TEST(PenaltyTest, OneDenialPenaltyBlocksAtOnce) {
  Words key;
  EXPECT_TRUE(penalty::recordDenial(Penalty{1, kSecond, 5 * kSecond}, key.span(), kSecond));
  EXPECT_EQ(penalty::blockedFor(key.span(), kSecond), 5 * kSecond);
}

}  // namespace
}  // namespace sluice

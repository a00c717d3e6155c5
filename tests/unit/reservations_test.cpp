// Reservations: one worker's open reserve → settle budgets, on a simulated
// clock: ids, settle and cancel, expiry at the estimate, bounds.
#include "reservations.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>

namespace sluice {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kSecond = 1000 * kMs;
constexpr uint32_t kRule = 7;

TEST(SettlementTest, ASmallerActualIsRefundedAndALargerOneIsDebt) {
  EXPECT_EQ(settlementOf(1000, 300).refund, 700);
  EXPECT_EQ(settlementOf(1000, 300).debt, 0);
  EXPECT_EQ(settlementOf(1000, 1000).refund, 0);
  EXPECT_EQ(settlementOf(1000, 1000).debt, 0);
  EXPECT_EQ(settlementOf(1000, 1600).refund, 0);
  EXPECT_EQ(settlementOf(1000, 1600).debt, 600);
  // cancel is a settle of 0: all of it back.
  EXPECT_EQ(settlementOf(1000, 0).refund, 1000);
}

TEST(ReservationsTest, IdsAreUniqueNonZeroAndNameTheirWorker) {
  Reservations worker3(3, {});
  Reservations worker4(4, {});
  std::set<uint64_t> ids;
  for (int i = 0; i < 100; ++i) {
    const uint64_t a = worker3.open(kRule, "k", 1, kSecond, 0);
    const uint64_t b = worker4.open(kRule, "k", 1, kSecond, 0);
    EXPECT_NE(a, 0u);
    EXPECT_EQ(Reservations::workerOf(a), 3u);
    EXPECT_EQ(Reservations::workerOf(b), 4u);
    EXPECT_TRUE(ids.insert(a).second);
    EXPECT_TRUE(ids.insert(b).second);
  }
}

TEST(ReservationsTest, ASettleTakesTheReservationOnceWithItsRuleKeyAndEstimate) {
  Reservations table(0, {});
  const uint64_t id = table.open(kRule, "tenant", 4096, 30 * kSecond, 5 * kSecond);
  EXPECT_EQ(table.size(), 1u);
  EXPECT_EQ(table.reservedUnits(), 4096);
  std::optional<Reservations::Reservation> taken = table.take(id);
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->rule_id, kRule);
  EXPECT_EQ(taken->key, "tenant");
  EXPECT_EQ(taken->estimate, 4096);
  EXPECT_EQ(taken->expires_ns, 35 * kSecond);
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(table.reservedUnits(), 0);
  // A second settle of the same id, or one never opened, finds nothing.
  EXPECT_FALSE(table.take(id).has_value());
  EXPECT_FALSE(table.take(id + 1).has_value());
}

TEST(ReservationsTest, AnUnsettledReservationExpiresAtItsTtlAndNotBefore) {
  Reservations table(0, {});
  const uint64_t early = table.open(kRule, "a", 10, 2 * kSecond, 0);
  const uint64_t late = table.open(kRule, "b", 20, 5 * kSecond, 0);
  EXPECT_EQ(table.nextExpiryNs(), 2 * kSecond);
  EXPECT_TRUE(table.expire(2 * kSecond - 1).empty());
  std::vector<Reservations::Reservation> expired = table.expire(2 * kSecond);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].id, early);
  EXPECT_EQ(expired[0].estimate, 10);  // settled at its estimate
  EXPECT_EQ(table.nextExpiryNs(), 5 * kSecond);
  EXPECT_FALSE(table.take(early).has_value());
  // A settle before its TTL takes it out of the expiry order too.
  EXPECT_TRUE(table.take(late).has_value());
  EXPECT_FALSE(table.nextExpiryNs().has_value());
  EXPECT_TRUE(table.expire(100 * kSecond).empty());
}

TEST(ReservationsTest, ExpiryReturnsTheOldestFirst) {
  Reservations table(0, {});
  const uint64_t c = table.open(kRule, "k", 1, 3 * kSecond, 0);
  const uint64_t a = table.open(kRule, "k", 1, 1 * kSecond, 0);
  const uint64_t b = table.open(kRule, "k", 1, 2 * kSecond, 0);
  std::vector<Reservations::Reservation> expired = table.expire(10 * kSecond);
  ASSERT_EQ(expired.size(), 3u);
  EXPECT_EQ(expired[0].id, a);
  EXPECT_EQ(expired[1].id, b);
  EXPECT_EQ(expired[2].id, c);
}

TEST(ReservationsTest, TheTableAndEachKeyAreBoundedAndFreeAgainWhenSettled) {
  Reservations table(0, {.max_open = 3, .max_per_key = 2});
  EXPECT_FALSE(table.refusal(kRule, "k").has_value());
  const uint64_t first = table.open(kRule, "k", 1, kSecond, 0);
  table.open(kRule, "k", 1, kSecond, 0);
  EXPECT_EQ(table.refusal(kRule, "k"), Reservations::Refusal::kKeyFull);
  // Another key, or the same key of another rule, is not held back.
  EXPECT_FALSE(table.refusal(kRule, "other").has_value());
  EXPECT_FALSE(table.refusal(kRule + 1, "k").has_value());
  table.open(kRule, "other", 1, kSecond, 0);
  EXPECT_EQ(table.refusal(kRule + 1, "k"), Reservations::Refusal::kTableFull);
  ASSERT_TRUE(table.take(first).has_value());
  EXPECT_FALSE(table.refusal(kRule, "k").has_value());
  table.expire(kSecond);
  EXPECT_EQ(table.size(), 0u);
  EXPECT_FALSE(table.refusal(kRule, "k").has_value());
}

TEST(ReservationsTest, AHugeTtlSaturatesInsteadOfOverflowing) {
  Reservations table(0, {});
  table.open(kRule, "k", 1, INT64_MAX, 10 * kSecond);
  EXPECT_EQ(table.nextExpiryNs(), INT64_MAX);
  EXPECT_TRUE(table.expire(INT64_MAX - 1).empty());
}

}  // namespace
}  // namespace sluice

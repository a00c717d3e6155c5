// The waiting module (waiting.h) on its own, on a simulated clock: what it
// keeps and refuses, the order it asks again in, and an impossible frame.
#include "waiting.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "response.h"
#include "failure.h"
#include "metrics.h"
#include "rpc.h"

namespace sluice {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kTimeout = 50 * kMs;

class WaitingTest : public ::testing::Test {
 protected:
  WaitingTest() {
    waiting_.onDeliver([this](void* owner, std::string_view response) {
      EXPECT_EQ(owner, static_cast<void*>(this));
      delivered_.push_back(decode(response));
    });
    waiting_.onAskAgain([this](const rpc::Request& request, int64_t now_ns, std::string* out,
                               const Asker& asker) {
      asked_.push_back({request.msgid.bits, now_ns, asker.may_wait, asker.again, asker.kept});
      rpc::writeError(out, request.msgid, rpc::ErrorCode::kBadRequest, "asked again");
      return Outcome::kAnswered;
    });
  }

  // An asker for a request [0, msgid, "peek", ["r", "k"]] owned by this test.
  Asker askerFor(uint32_t msgid) {
    frames_.push_back(frameOf(msgid));
    Asker asker;
    asker.owner = this;
    asker.msgid = msgid;
    asker.frame = std::span<const uint8_t>(
        reinterpret_cast<const uint8_t*>(frames_.back().data()), frames_.back().size());
    asker.deadline_ns = kTimeout;
    asker.may_wait = true;
    return asker;
  }
  static std::string frameOf(uint32_t msgid) {
    std::string frame;
    msgpack::Writer w(&frame);
    w.writeArrayHeader(4);
    w.writeInt(0);
    w.writeUint(msgid);
    w.writeStr("peek");
    w.writeArrayHeader(2);
    w.writeStr("r");
    w.writeStr("k");
    return frame;
  }

  struct Asked {
    uint64_t msgid;
    int64_t now_ns;
    bool may_wait;
    bool again;
    bool kept;
  };
  Metrics metrics_{1};
  Waiting waiting_{metrics_.shard(0), nullptr, kTimeout};
  std::vector<std::string> frames_{};
  std::vector<Response> delivered_;
  std::vector<Asked> asked_;
};

// Verifies a request that may not wait is not kept for a lease, and that a
// lease waiter asked again keeps its place without being kept twice.
TEST_F(WaitingTest, OnlyARequestThatMayWaitIsKeptForALease) {
  frames_.reserve(4);
  Asker no_wait = askerFor(1);
  no_wait.may_wait = false;
  EXPECT_FALSE(waiting_.waitForLease(no_wait, {}));
  Asker kept = askerFor(2);
  kept.kept = true;
  EXPECT_TRUE(waiting_.waitForLease(kept, {}));
  EXPECT_EQ(waiting_.count(WaitKind::kLease), 0u);
  EXPECT_TRUE(waiting_.waitForLease(askerFor(3), {}));
  EXPECT_EQ(waiting_.count(WaitKind::kLease), 1u);
  EXPECT_EQ(waiting_.nextDeadlineNs(), kTimeout);
}

// Verifies a lease waiter is asked again, as one that keeps its place,
// before its deadline, and as one that may not wait after it, when its
// policy answers.
TEST_F(WaitingTest, ALeaseWaiterIsAskedAgainAndMayNotWaitPastItsDeadline) {
  frames_.reserve(2);
  ASSERT_TRUE(waiting_.waitForLease(askerFor(7), {}));
  waiting_.askAgain(kTimeout - 1, false);
  ASSERT_EQ(asked_.size(), 1u);
  EXPECT_TRUE(asked_[0].may_wait);
  EXPECT_TRUE(asked_[0].again);
  EXPECT_TRUE(asked_[0].kept);
  ASSERT_EQ(delivered_.size(), 1u);
  EXPECT_EQ(delivered_[0].msgid, 7u);
  ASSERT_TRUE(waiting_.waitForLease(askerFor(8), {}));
  waiting_.askAgain(kTimeout, false);
  ASSERT_EQ(asked_.size(), 2u);
  EXPECT_FALSE(asked_[1].may_wait);
  EXPECT_TRUE(asked_[1].again);
  EXPECT_EQ(metrics_.snapshot().lease_deferred_expired, 1u);
  EXPECT_FALSE(waiting_.any());
}

// Verifies requests waiting until due are asked again in due order, then
// arrival order, each when it is due.
TEST_F(WaitingTest, DueWaitersAreAskedAgainInDueThenArrivalOrder) {
  frames_.reserve(3);
  ASSERT_TRUE(waiting_.waitUntilDue(askerFor(1), {.seq = 1}, 20 * kMs));
  ASSERT_TRUE(waiting_.waitUntilDue(askerFor(2), {.seq = 0}, 20 * kMs));
  ASSERT_TRUE(waiting_.waitUntilDue(askerFor(3), {.seq = 2}, 10 * kMs));
  EXPECT_EQ(waiting_.nextDeadlineNs(), 10 * kMs);
  waiting_.askAgain(10 * kMs, false);
  ASSERT_EQ(asked_.size(), 1u);
  EXPECT_EQ(asked_[0].msgid, 3u);
  waiting_.askAgain(20 * kMs, false);
  ASSERT_EQ(asked_.size(), 3u);
  EXPECT_EQ(asked_[1].msgid, 2u);
  EXPECT_EQ(asked_[2].msgid, 1u);
}

// Verifies lease waiters are bounded by the bytes of their frames.
TEST_F(WaitingTest, LeaseWaitersAreBoundedByTheBytesOfTheirFrames) {
  std::string big(kMaxDeferredBytes, 'x');
  Asker asker;
  asker.owner = this;
  asker.may_wait = true;
  asker.frame = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(big.data()), big.size());
  EXPECT_TRUE(waiting_.waitForLease(asker, {}));
  asker.frame = asker.frame.first(1);
  EXPECT_FALSE(waiting_.waitForLease(asker, {}));
  waiting_.forget(this);
  EXPECT_TRUE(waiting_.waitForLease(asker, {}));
}

// Verifies a waiter whose frame does not parse again (an impossible state)
// is never dropped: debug and sanitizer builds stop, release builds answer
// it INTERNAL and count the error.
TEST_F(WaitingTest, AFrameThatDoesNotParseAgainIsAnsweredInternal) {
  const std::string junk = "\xc1 not a frame";
  Asker asker;
  asker.owner = this;
  asker.msgid = 9;
  asker.may_wait = true;
  asker.frame =
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(junk.data()), junk.size());
  ASSERT_TRUE(waiting_.waitUntilDue(asker, {}, 10 * kMs));
  if constexpr (kImpossibleAborts) {
    EXPECT_DEATH(waiting_.askAgain(10 * kMs, false), "impossible state");
  } else {
    waiting_.askAgain(10 * kMs, false);
    EXPECT_TRUE(asked_.empty());
    ASSERT_EQ(delivered_.size(), 1u);
    EXPECT_EQ(delivered_[0].msgid, 9u);
    EXPECT_EQ(delivered_[0].error, "INTERNAL");
    EXPECT_EQ(metrics_.snapshot().errors[static_cast<size_t>(rpc::ErrorCode::kInternal)], 1u);
    EXPECT_FALSE(waiting_.any());
  }
}

}  // namespace
}  // namespace sluice

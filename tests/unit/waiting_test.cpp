// The waiting module (waiting.h) on its own, on a simulated clock: what it
// keeps and refuses, the order it asks again in, and the questions it holds.
#include "waiting.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "metrics.h"
#include "question.h"

namespace sluice {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kTimeout = 50 * kMs;

class WaitingTest : public ::testing::Test, public Recipient {
 protected:
  WaitingTest() {
    waiting_.onAskAgain([this](const Question& question, int64_t now_ns, const Asker& asker,
                               Answer* answer) {
      EXPECT_EQ(asker.recipient, this) << "asked again for the one that asked";
      asked_.push_back({asker.tag.bits, now_ns, asker.may_wait, asker.again, asker.kept});
      questions_.push_back(std::string(question.items.front().rule) + "/" +
                           std::string(question.items.front().key));
      answer->method = question.method;
      answer->fail(ErrorCode::kBadRequest, "asked again");
      return Outcome::kAnswered;
    });
  }

  void receive(MsgId tag, const Answer& answer) override {
    delivered_.push_back({tag.bits, answer.message, !answer.failed && answer.allowed,
                          answer.waited_ms});
  }

  // An asker for a peek of ("r", "k") tagged `tag`, with this test as its
  // recipient.
  Asker askerFor(uint64_t tag) {
    Asker asker;
    asker.recipient = this;
    asker.tag = tag;
    asker.question = {Method::kPeek, {&item_, 1}};
    asker.deadline_ns = kTimeout;
    asker.may_wait = true;
    return asker;
  }

  struct Delivered {
    uint64_t tag;
    std::string message;
    bool allowed;
    int64_t waited_ms;
  };
  struct Asked {
    uint64_t msgid;
    int64_t now_ns;
    bool may_wait;
    bool again;
    bool kept;
  };
  Metrics metrics_{1};
  Waiting waiting_{metrics_.shard(0), nullptr, kTimeout};
  Item item_{"r", "k", 0, -1};
  std::vector<Delivered> delivered_;
  std::vector<Asked> asked_;
  std::vector<std::string> questions_;  // "rule/key" of each question asked again
};

// Verifies a request that may not wait is not kept for a lease, and that a
// lease waiter asked again keeps its place without being kept twice.
TEST_F(WaitingTest, OnlyARequestThatMayWaitIsKeptForALease) {
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
  ASSERT_TRUE(waiting_.waitForLease(askerFor(7), {}));
  waiting_.askAgain(kTimeout - 1, false);
  ASSERT_EQ(asked_.size(), 1u);
  EXPECT_TRUE(asked_[0].may_wait);
  EXPECT_TRUE(asked_[0].again);
  EXPECT_TRUE(asked_[0].kept);
  ASSERT_EQ(delivered_.size(), 1u);
  EXPECT_EQ(delivered_[0].tag, 7u);
  EXPECT_EQ(delivered_[0].message, "asked again");
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

// Verifies lease waiters are bounded by the bytes of their questions.
TEST_F(WaitingTest, LeaseWaitersAreBoundedByTheBytesOfTheirQuestions) {
  std::string big(kMaxDeferredBytes - 1, 'x');
  Item item{"r", big, 1, -1};
  Asker asker = askerFor(1);
  asker.question = {Method::kAcquire, {&item, 1}};
  EXPECT_TRUE(waiting_.waitForLease(asker, {}));
  Asker small = askerFor(2);  // 2 bytes: one too many
  EXPECT_FALSE(waiting_.waitForLease(small, {}));
  waiting_.forget(this);
  EXPECT_TRUE(waiting_.waitForLease(small, {}));
}

// Verifies a waiting question keeps its own copy of its rule and key: the
// front's buffer it was read from is reused at once, and the question asked
// again still names what the client asked.
TEST_F(WaitingTest, AWaitingQuestionOwnsItsBytes) {
  std::string rule = "orders";
  std::string key = "tenant-1";
  Item item{rule, key, 1, -1};
  Asker asker = askerFor(5);
  asker.question = {Method::kAcquire, {&item, 1}};
  ASSERT_TRUE(waiting_.waitUntilDue(asker, {}, 10 * kMs));
  rule.assign(rule.size(), '?');
  key.assign(key.size(), '?');
  waiting_.askAgain(10 * kMs, false);
  ASSERT_EQ(questions_.size(), 1u);
  EXPECT_EQ(questions_[0], "orders/tenant-1");
  ASSERT_EQ(delivered_.size(), 1u);
  EXPECT_EQ(delivered_[0].tag, 5u);
}

// Verifies an answer on a reservation goes to its recipient when due, with
// how long it waited, and a stopping worker denies one not yet due.
TEST_F(WaitingTest, AReservationIsAnsweredWhenDueOrDeniedWhenStopping) {
  Decision allowed;
  allowed.allowed = true;
  waiting_.reserve(this, 3, allowed, Mode::kLocal, 0, 20 * kMs);
  waiting_.reserve(this, 4, allowed, Mode::kLocal, 0, 40 * kMs);
  waiting_.askAgain(20 * kMs, false);
  ASSERT_EQ(delivered_.size(), 1u);
  EXPECT_EQ(delivered_[0].tag, 3u);
  EXPECT_TRUE(delivered_[0].allowed);
  EXPECT_EQ(delivered_[0].waited_ms, 20);
  waiting_.askAgain(30 * kMs, true);
  ASSERT_EQ(delivered_.size(), 2u);
  EXPECT_EQ(delivered_[1].tag, 4u);
  EXPECT_FALSE(delivered_[1].allowed);
  EXPECT_EQ(delivered_[1].waited_ms, 30);
  EXPECT_FALSE(waiting_.any());
}

}  // namespace
}  // namespace sluice

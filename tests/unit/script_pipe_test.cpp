// Tests for ScriptPipe (script_pipe.h) on a fake Redis: the pipeline's
// bound, the order calls go out in, and what calls that never reach Redis
// get. No redis-server, no loop.
#include "script_pipe.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fake_redis.h"

namespace sluice {
namespace {

using test::FakeRedis;

class ScriptPipeTest : public ::testing::Test {
 protected:
  // Calls script 7 with one key, its number, and records what it got.
  void call(int number) {
    pipe_.call(7, {"key-" + std::to_string(number)}, {std::to_string(number)}, 50,
               [this, number](const RedisResult& result) {
                 results_.push_back({number, result.status, ScriptPipe::neverSent(result)});
               });
  }

  struct Got {
    int number;
    RedisStatus status;
    bool never_sent;
  };
  FakeRedis redis_;
  int answered_ = 0;
  ScriptPipe pipe_{redis_, [this] { ++answered_; }};
  std::vector<Got> results_;
};

// Verifies that at most kMaxScriptsInFlight calls wait on Redis at once and
// that the rest go out in order as answers make room.
TEST_F(ScriptPipeTest, AtMostMaxScriptsInFlightAreSentAndTheRestFollowInOrder) {
  const int total = static_cast<int>(kMaxScriptsInFlight) + 2;
  for (int i = 0; i < total; ++i) call(i);
  EXPECT_EQ(redis_.calls.size(), kMaxScriptsInFlight);
  EXPECT_EQ(pipe_.waiting(), 2u);
  EXPECT_FALSE(pipe_.hasRoom());
  redis_.answerIntegers({1});
  ASSERT_EQ(redis_.calls.size(), kMaxScriptsInFlight);
  EXPECT_EQ(redis_.calls.back().argv, std::vector<std::string>{std::to_string(total - 2)});
  EXPECT_EQ(redis_.calls.back().keys, std::vector<std::string>{"key-" + std::to_string(total - 2)});
  EXPECT_EQ(answered_, 1);
  while (!redis_.calls.empty()) redis_.answerIntegers({1});
  ASSERT_EQ(results_.size(), static_cast<size_t>(total));
  for (int i = 0; i < total; ++i) EXPECT_EQ(results_[static_cast<size_t>(i)].number, i);
  EXPECT_TRUE(pipe_.hasRoom());
  EXPECT_EQ(pipe_.inFlight(), 0u);
}

// Verifies that queued calls dropped when Redis goes down get "never sent",
// and calls on the way keep theirs for the link to answer.
TEST_F(ScriptPipeTest, DroppedCallsAreTheOnlyOnesNeverSent) {
  const int total = static_cast<int>(kMaxScriptsInFlight) + 3;
  for (int i = 0; i < total; ++i) call(i);
  pipe_.dropWaiting();
  ASSERT_EQ(results_.size(), 3u);
  for (const Got& got : results_) {
    EXPECT_TRUE(got.never_sent);
    EXPECT_EQ(got.status, RedisStatus::kDisconnected);
  }
  redis_.answerIntegers({1});
  ASSERT_EQ(results_.size(), 4u);
  EXPECT_FALSE(results_.back().never_sent);
  EXPECT_EQ(redis_.calls.size(), kMaxScriptsInFlight - 1);  // nothing queued moved up
}

// Verifies that a call the link refuses (Redis down) gets "never sent" at
// once and leaves the pipeline's room as it was.
TEST_F(ScriptPipeTest, ACallTheLinkRefusesIsNeverSentAndTakesNoRoom) {
  redis_.up = false;
  call(1);
  ASSERT_EQ(results_.size(), 1u);
  EXPECT_TRUE(results_[0].never_sent);
  EXPECT_EQ(pipe_.inFlight(), 0u);
  EXPECT_TRUE(pipe_.hasRoom());
  EXPECT_EQ(answered_, 0);
}

}  // namespace
}  // namespace sluice

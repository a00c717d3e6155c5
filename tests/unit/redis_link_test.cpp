// Tests for RedisLink against a real redis-server per test (RedisServer
// fixture). Each test runs its own loop, waits on conditions with a guard
// timer (never a sleep), and ends by closing the link and checking that the
// loop closes with no handle left open.
#include "redis_link.h"

#include <gtest/gtest.h>
#include <uv.h>

#include <chrono>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>

#include "redis_server.h"
#include "test_support.h"
#include "uv_loop.h"

namespace sluice {
namespace {

// Timing bounds are what the link promises plus room for a loaded machine:
// a detection that hangs for seconds still fails. Sanitizers slow everything.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr uint64_t kSlackMs = 400;
#else
constexpr uint64_t kSlackMs = 100;
#endif

using test::RedisServer;

uint64_t nowMs() { return uv_hrtime() / 1'000'000; }

// What one callback saw, copied out of the (callback-scoped) reply.
struct Seen {
  RedisStatus status = RedisStatus::kOk;
  std::string text;     // string/status reply, or the error/reason
  int64_t integer = 0;
  uint64_t at_ms = 0;   // when the callback ran (uv_hrtime)
  int calls = 0;
};

RedisCallback record(Seen& seen) {
  return [&seen](const RedisResult& result) {
    seen.calls++;
    seen.status = result.status;
    seen.at_ms = nowMs();
    if (result.reply != nullptr) {
      seen.text = std::string(result.reply->str());
      seen.integer = result.reply->integer();
    } else {
      seen.text = std::string(result.error);
    }
  };
}

class RedisLinkTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(uv_loop_init(&loop_), 0); }
  // A test that stopped early (a failed ASSERT) still closes what it opened.
  void TearDown() override {
    if (!loop_closed_) closeAll();
  }

  // Runs the loop until `done()` holds or timeout_ms passes; returns done().
  bool runUntil(const std::function<bool()>& done, int timeout_ms = 5000) {
    return test::runLoopUntil(&loop_, done, timeout_ms);
  }

  RedisConfig configFor(const RedisServer& server) {
    RedisConfig config;
    config.host = server.host();
    config.port = static_cast<uint16_t>(server.port());
    return config;
  }

  // Creates the link with counting observers and starts it.
  RedisLink& startLink(RedisConfig config, RedisLinkOptions options = {},
                       const std::function<void(RedisLink&)>& before_start = {}) {
    link_ = std::make_unique<RedisLink>(&loop_, std::move(config), options);
    link_->onConnected([this] { connects_++; });
    link_->onDisconnected([this](std::string_view reason) {
      disconnects_++;
      last_reason_ = std::string(reason);
      disconnect_times_ms_.push_back(nowMs());
    });
    link_->onLatency([this](uint64_t rtt_us) { latencies_us_.push_back(rtt_us); });
    if (before_start) before_start(*link_);
    link_->start();
    return *link_;
  }

  bool waitConnected(int timeout_ms = 5000) {
    return runUntil([&] { return link_->connected(); }, timeout_ms);
  }

  // Sends one command and waits for its answer.
  Seen roundTrip(std::initializer_list<std::string_view> argv, int64_t timeout_ms = 2000) {
    Seen seen;
    EXPECT_TRUE(link_->command(argv, record(seen), timeout_ms));
    EXPECT_TRUE(runUntil([&] { return seen.calls > 0; }));
    return seen;
  }

  // Closes the link and the loop; every handle must be closed.
  void closeAll() {
    loop_closed_ = true;  // once, even when it fails
    if (link_) {
      bool closed = false;
      link_->close([&] { closed = true; });
      bool ok = runUntil([&] { return closed; });
      EXPECT_TRUE(ok) << "close() callback never ran";
      if (!ok) {
        (void)link_.release();  // leak it rather than abort in its destructor
        return;
      }
      link_.reset();
    }
    uv_run(&loop_, UV_RUN_NOWAIT);
    EXPECT_EQ(uv_loop_close(&loop_), 0);
  }

  uv_loop_t loop_;
  bool loop_closed_ = false;
  std::unique_ptr<RedisLink> link_;
  int connects_ = 0;
  int disconnects_ = 0;
  std::string last_reason_;
  std::vector<uint64_t> disconnect_times_ms_;
  std::vector<uint64_t> latencies_us_;
};

// Verifies that PING is answered with PONG and its round-trip time is reported.
TEST_F(RedisLinkTest, AnswersPingWithPongAndReportsItsRoundTripTime) {
  RedisServer server;
  startLink(configFor(server));
  ASSERT_TRUE(waitConnected());
  EXPECT_EQ(connects_, 1);
  latencies_us_.clear();

  Seen seen = roundTrip({"PING"});
  EXPECT_EQ(seen.status, RedisStatus::kOk);
  EXPECT_EQ(seen.text, "PONG");
  EXPECT_EQ(seen.calls, 1);
  ASSERT_EQ(latencies_us_.size(), 1u);
  EXPECT_GT(latencies_us_[0], 0u);
  EXPECT_LT(latencies_us_[0], 1'000'000u);
  closeAll();
}

// Verifies that keys and values with NUL bytes, braces and 1 KiB of every byte
// value reach Redis and come back unchanged.
TEST_F(RedisLinkTest, KeepsKeysAndValuesBinarySafe) {
  RedisServer server;
  startLink(configFor(server));
  ASSERT_TRUE(waitConnected());

  std::string key("sluice:{tenant}\0key", 19);
  std::string value;
  for (int i = 0; i < 1024; i++) value.push_back(static_cast<char>(i % 256));
  EXPECT_EQ(roundTrip({"SET", key, value}).status, RedisStatus::kOk);
  Seen got = roundTrip({"GET", key});
  EXPECT_EQ(got.status, RedisStatus::kOk);
  EXPECT_EQ(got.text, value);
  EXPECT_EQ(roundTrip({"STRLEN", key}).integer, 1024);
  // Only the exact key holds the value: the NUL did not truncate it.
  EXPECT_EQ(roundTrip({"EXISTS", std::string("sluice:{tenant}")}).integer, 0);
  closeAll();
}

// Verifies that 1,000 commands issued in one loop tick are all answered, in
// the order they were issued.
TEST_F(RedisLinkTest, AnswersAThousandPipelinedCommandsInOrder) {
  RedisServer server;
  startLink(configFor(server));
  ASSERT_TRUE(waitConnected());

  std::vector<int64_t> answers;
  for (int i = 0; i < 1000; i++) {
    ASSERT_TRUE(link_->command(
        {"INCR", "counter"},
        [&](const RedisResult& result) {
          answers.push_back(result.status == RedisStatus::kOk ? result.reply->integer() : -1);
        },
        5000));
  }
  ASSERT_TRUE(runUntil([&] { return answers.size() == 1000; }));
  for (int i = 0; i < 1000; i++) ASSERT_EQ(answers[i], i + 1);
  closeAll();
}

// Verifies that a refused connection is reported within 100 ms, that commands
// are refused (without a callback) while the link is down, and that attempts
// are repeated with a jittered, doubling backoff.
TEST_F(RedisLinkTest, ReportsARefusedConnectionQuicklyAndRetriesWithBackoff) {
  RedisConfig config;
  config.host = "127.0.0.1";
  config.port = static_cast<uint16_t>(test::freeLoopbackPort());
  uint64_t started_ms = nowMs();
  startLink(config);

  ASSERT_TRUE(runUntil([&] { return disconnects_ >= 1; }, 1000));
  EXPECT_LT(disconnect_times_ms_[0] - started_ms, kSlackMs);
  std::cout << "measured: refusal reported " << disconnect_times_ms_[0] - started_ms
            << " ms after start()\n";
  EXPECT_NE(last_reason_.find("refused"), std::string::npos) << last_reason_;
  Seen never;
  EXPECT_FALSE(link_->command({"PING"}, record(never), 100));

  // Delays 50, 100, 200 ms, each +-20 %, timed from each report; the attempt
  // itself takes ~0 ms. The lower bound allows 2 ms of the loop clock's
  // millisecond rounding; no backoff at all still fails it.
  ASSERT_TRUE(runUntil([&] { return disconnects_ >= 4; }, 2000));
  for (int i = 1; i < 4; i++) {
    double expected_ms = 50.0 * (1 << (i - 1));
    auto gap_ms = static_cast<double>(disconnect_times_ms_[i] - disconnect_times_ms_[i - 1]);
    EXPECT_GE(gap_ms, expected_ms * 0.8 - 2) << "attempt " << i;
    EXPECT_LE(gap_ms, expected_ms * 1.2 + kSlackMs / 2) << "attempt " << i;
  }
  EXPECT_EQ(connects_, 0);
  EXPECT_EQ(never.calls, 0);
  closeAll();
}

// Verifies that when Redis is SIGKILLed, a pending command reports
// `disconnected` within 100 ms and the loss is reported to the observer.
TEST_F(RedisLinkTest, FailsAPendingCommandQuicklyWhenRedisIsKilled) {
  RedisServer server;
  startLink(configFor(server));
  ASSERT_TRUE(waitConnected());

  Seen seen;
  ASSERT_TRUE(link_->command({"BLPOP", "nothing", "10"}, record(seen), 10'000));
  ASSERT_TRUE(runUntil([&] { return server.cli({"CLIENT", "LIST"}).find("cmd=blpop") !=
                                    std::string::npos; }));
  uint64_t killed_ms = nowMs();
  server.kill();
  ASSERT_TRUE(runUntil([&] { return seen.calls > 0; }, 2000));
  EXPECT_EQ(seen.status, RedisStatus::kDisconnected);
  EXPECT_EQ(seen.calls, 1);
  EXPECT_LT(seen.at_ms - killed_ms, kSlackMs) << seen.text;
  std::cout << "measured: kill detected " << seen.at_ms - killed_ms << " ms after SIGKILL\n";
  EXPECT_EQ(disconnects_, 1);
  EXPECT_FALSE(link_->connected());
  closeAll();
}

// Verifies that when a stopped Redis is SIGKILLed with our command unread in
// its socket (so the kernel answers with a reset, which hiredis 0.14's own
// libuv adapter never reports), the pending command reports `disconnected`
// within 100 ms.
TEST_F(RedisLinkTest, FailsAPendingCommandQuicklyWhenTheConnectionIsReset) {
  RedisServer server;
  startLink(configFor(server));
  ASSERT_TRUE(waitConnected());

  server.stop();
  Seen seen;
  ASSERT_TRUE(link_->command({"PING"}, record(seen), 10'000));
  // Two loop turns without waiting: the socket is writable, so the PING is
  // written in the first.
  uv_run(&loop_, UV_RUN_NOWAIT);
  uv_run(&loop_, UV_RUN_NOWAIT);
  uint64_t killed_ms = nowMs();
  server.kill();
  ASSERT_TRUE(runUntil([&] { return seen.calls > 0; }, 2000));
  EXPECT_EQ(seen.status, RedisStatus::kDisconnected);
  EXPECT_NE(seen.text.find("reset"), std::string::npos) << seen.text;
  EXPECT_LT(seen.at_ms - killed_ms, kSlackMs) << seen.text;
  std::cout << "measured: reset detected " << seen.at_ms - killed_ms << " ms after SIGKILL\n";
  closeAll();
}

// Verifies that when Redis is SIGSTOPped, a command reports `timeout` at its
// deadline, a command queued behind it reports `disconnected` at the same
// moment, and after SIGCONT the link reconnects and works again.
TEST_F(RedisLinkTest, TimesOutAtTheDeadlineWhenRedisIsStoppedAndRecoversAfterResume) {
  RedisServer server;
  startLink(configFor(server), RedisLinkOptions{.connect_timeout_ms = 300});
  ASSERT_TRUE(waitConnected());

  server.stop();
  Seen first;
  Seen second;
  uv_update_time(&loop_);
  uint64_t sent_ms = nowMs();
  ASSERT_TRUE(link_->command({"PING"}, record(first), 200));
  ASSERT_TRUE(link_->command({"PING"}, record(second), 5000));
  ASSERT_TRUE(runUntil([&] { return first.calls > 0 && second.calls > 0; }, 2000));
  EXPECT_EQ(first.status, RedisStatus::kTimeout);
  EXPECT_EQ(second.status, RedisStatus::kDisconnected);
  EXPECT_GE(first.at_ms - sent_ms, 195u);
  EXPECT_LE(first.at_ms - sent_ms, 200 + kSlackMs);
  std::cout << "measured: 200 ms deadline reported after " << first.at_ms - sent_ms << " ms\n";
  EXPECT_LE(second.at_ms - first.at_ms, 5u);
  EXPECT_FALSE(link_->connected());

  // Reconnect attempts time out in their handshake while Redis is stopped.
  ASSERT_TRUE(runUntil([&] { return disconnects_ >= 2; }, 2000));
  EXPECT_NE(last_reason_.find("connect"), std::string::npos) << last_reason_;
  EXPECT_EQ(connects_, 1);

  server.resume();
  ASSERT_TRUE(runUntil([&] { return connects_ == 2; }, 5000));
  EXPECT_EQ(roundTrip({"PING"}).text, "PONG");
  closeAll();
}

// Verifies that a command stalled by CLIENT PAUSE reports `timeout` at its
// deadline instead of waiting for the pause to end.
TEST_F(RedisLinkTest, TimesOutAtTheDeadlineDuringClientPause) {
  RedisServer server;
  startLink(configFor(server));
  ASSERT_TRUE(waitConnected());

  ASSERT_EQ(server.cli({"CLIENT", "PAUSE", "2000"}), "OK");
  Seen seen;
  uv_update_time(&loop_);
  uint64_t sent_ms = nowMs();
  ASSERT_TRUE(link_->command({"PING"}, record(seen), 200));
  ASSERT_TRUE(runUntil([&] { return seen.calls > 0; }, 3000));
  EXPECT_EQ(seen.status, RedisStatus::kTimeout);
  EXPECT_GE(seen.at_ms - sent_ms, 195u);
  EXPECT_LE(seen.at_ms - sent_ms, 200 + kSlackMs);
  closeAll();
}

// Verifies that the shortest deadline wins even when its command was issued
// last: it reports `timeout`, and the earlier command `disconnected`.
TEST_F(RedisLinkTest, TimesOutAtTheEarliestDeadlineWhateverTheOrderOfCommands) {
  RedisServer server;
  startLink(configFor(server));
  ASSERT_TRUE(waitConnected());

  ASSERT_EQ(server.cli({"CLIENT", "PAUSE", "2000"}), "OK");
  Seen slow;
  Seen quick;
  uv_update_time(&loop_);
  uint64_t sent_ms = nowMs();
  ASSERT_TRUE(link_->command({"PING"}, record(slow), 5000));
  ASSERT_TRUE(link_->command({"PING"}, record(quick), 100));
  ASSERT_TRUE(runUntil([&] { return slow.calls > 0 && quick.calls > 0; }, 3000));
  EXPECT_EQ(quick.status, RedisStatus::kTimeout);
  EXPECT_EQ(slow.status, RedisStatus::kDisconnected);
  EXPECT_GE(quick.at_ms - sent_ms, 95u);
  EXPECT_LE(quick.at_ms - sent_ms, 100 + kSlackMs);
  closeAll();
}

// Verifies that a command waiting its turn behind one Redis is still
// running is not late while Redis keeps answering: sent 20 ms after a 200 ms
// command, a 200 ms command with a 300 ms timeout is answered at about
// 400 ms, past its send + timeout but within 300 ms of the first answer.
// (Redis answers a batch read in one go, so each goes out in its own write.)
TEST_F(RedisLinkTest, ACommandWaitingBehindAnAnsweredOneIsNotLate) {
  RedisServer server;
  startLink(configFor(server));
  ASSERT_TRUE(waitConnected());

  Seen first;
  Seen second;
  uv_update_time(&loop_);
  uint64_t sent_ms = nowMs();
  ASSERT_TRUE(link_->command({"DEBUG", "SLEEP", "0.2"}, record(first), 1000));
  runUntil([] { return false; }, 20);  // the first goes out in a write of its own
  ASSERT_TRUE(link_->command({"DEBUG", "SLEEP", "0.2"}, record(second), 300));
  ASSERT_TRUE(runUntil([&] { return second.calls > 0; }, 3000));
  EXPECT_EQ(first.status, RedisStatus::kOk) << first.text;
  EXPECT_EQ(second.status, RedisStatus::kOk) << second.text;
  EXPECT_GE(second.at_ms - sent_ms, 395u);
  EXPECT_EQ(disconnects_, 0);
  closeAll();
}

// Verifies that answers which arrived while the link's thread was busy are
// read before a command is called late: libuv runs due timers before it
// polls, so a thread that wakes after the deadline finds the timer first.
TEST_F(RedisLinkTest, AnswersThatArrivedWhileTheThreadWasBusyAreNotLate) {
  RedisServer server;
  startLink(configFor(server));
  ASSERT_TRUE(waitConnected());

  Seen seen;
  ASSERT_TRUE(link_->command({"PING"}, record(seen), 50));
  uv_run(&loop_, UV_RUN_NOWAIT);  // writes the command
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // the answer waits unread
  ASSERT_TRUE(runUntil([&] { return seen.calls > 0; }, 500));
  EXPECT_EQ(seen.status, RedisStatus::kOk) << seen.text;
  EXPECT_EQ(seen.text, "PONG");
  EXPECT_EQ(disconnects_, 0);
  closeAll();
}

// Verifies that a command's clock starts when it is written, not when it
// was issued: a command issued early in a 150 ms tick goes out at its end
// and is answered, though its 50 ms timeout ran out before the write.
TEST_F(RedisLinkTest, AClockStartsWhenTheCommandIsWritten) {
  RedisServer server;
  startLink(configFor(server));
  ASSERT_TRUE(waitConnected());

  Seen seen;
  uv_update_time(&loop_);
  ASSERT_TRUE(link_->command({"PING"}, record(seen), 50));
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // the rest of a long tick
  ASSERT_TRUE(runUntil([&] { return seen.calls > 0; }, 2000));
  EXPECT_EQ(seen.status, RedisStatus::kOk) << seen.text;
  EXPECT_EQ(seen.text, "PONG");
  EXPECT_EQ(disconnects_, 0);
  closeAll();
}

// Verifies that a stalled command's timeout counts from Redis's latest
// answer when that came after the command was sent: behind a 100 ms
// command, a 150 ms timeout runs out 150 ms after that command's answer.
TEST_F(RedisLinkTest, ATimeoutCountsFromTheLatestAnswer) {
  RedisServer server;
  startLink(configFor(server));
  ASSERT_TRUE(waitConnected());

  Seen first;
  Seen stalled;
  ASSERT_TRUE(link_->command({"DEBUG", "SLEEP", "0.1"}, record(first), 1000));
  runUntil([] { return false; }, 20);  // the first goes out in a write of its own
  ASSERT_TRUE(link_->command({"DEBUG", "SLEEP", "1"}, record(stalled), 150));
  ASSERT_TRUE(runUntil([&] { return stalled.calls > 0; }, 3000));
  EXPECT_EQ(first.status, RedisStatus::kOk) << first.text;
  EXPECT_EQ(stalled.status, RedisStatus::kTimeout) << stalled.text;
  EXPECT_GE(stalled.at_ms - first.at_ms, 145u);
  EXPECT_LE(stalled.at_ms - first.at_ms, 150 + kSlackMs);
  std::cout << "measured: timeout reported " << stalled.at_ms - first.at_ms
            << " ms after the previous answer\n";
  EXPECT_FALSE(link_->connected());
  closeAll();
}

// Verifies that a server that accepts the connection but never answers the
// handshake is given up at the connect deadline.
TEST_F(RedisLinkTest, GivesUpAConnectionAttemptAtTheConnectDeadline) {
  RedisServer server;
  server.stop();  // the kernel still accepts connections; nobody answers
  uint64_t started_ms = nowMs();
  startLink(configFor(server), RedisLinkOptions{.connect_timeout_ms = 300});
  ASSERT_TRUE(runUntil([&] { return disconnects_ >= 1; }, 2000));
  EXPECT_NE(last_reason_.find("no answer within 300 ms"), std::string::npos) << last_reason_;
  EXPECT_GE(disconnect_times_ms_[0] - started_ms, 295u);
  EXPECT_LE(disconnect_times_ms_[0] - started_ms, 300 + kSlackMs);
  EXPECT_EQ(connects_, 0);
  server.resume();
  ASSERT_TRUE(waitConnected());
  closeAll();
}

// Verifies that a link configured with the password of `--requirepass`
// authenticates and works.
TEST_F(RedisLinkTest, AuthenticatesWithRequirepass) {
  RedisServer server({"--requirepass", "s3cret"});
  RedisConfig config = configFor(server);
  config.password = "s3cret";
  startLink(config);
  ASSERT_TRUE(waitConnected());
  EXPECT_EQ(roundTrip({"SET", "k", "v"}).status, RedisStatus::kOk);
  closeAll();
}

// Verifies that a config whose password is kept in a password_file (chmod
// 600, one line) authenticates to a Redis started with --requirepass.
TEST_F(RedisLinkTest, AuthenticatesWithThePasswordOfAPasswordFile) {
  RedisServer server({"--requirepass", "s3cret"});
  test::TempDir dir;
  const std::string secret = dir.file("redis.password");
  test::writeFile(secret, "s3cret\n");
  ASSERT_EQ(chmod(secret.c_str(), 0600), 0);
  ConfigResult loaded = loadConfigString(
      "[redis]\nurl = \"" + server.url() + "\"\npassword_file = \"" + secret + "\"\n", "x.toml");
  ASSERT_TRUE(loaded.ok()) << loaded.error;
  startLink(*loaded.config->redis);
  ASSERT_TRUE(waitConnected());
  EXPECT_EQ(roundTrip({"SET", "k", "v"}).status, RedisStatus::kOk);
  closeAll();
}

// Verifies that a wrong password is reported as a failed handshake and the
// link never comes up.
TEST_F(RedisLinkTest, ReportsAWrongPasswordAndStaysDown) {
  RedisServer server({"--requirepass", "s3cret"});
  RedisConfig config = configFor(server);
  config.password = "wrong";
  startLink(config);
  ASSERT_TRUE(runUntil([&] { return disconnects_ >= 2; }));
  EXPECT_NE(last_reason_.find("AUTH"), std::string::npos) << last_reason_;
  EXPECT_NE(last_reason_.find("WRONGPASS"), std::string::npos) << last_reason_;
  EXPECT_EQ(connects_, 0);
  EXPECT_FALSE(link_->connected());
  closeAll();
}

// Verifies that a link without a password to a server that requires one is
// reported (the handshake's PING gets NOAUTH) instead of looking healthy.
TEST_F(RedisLinkTest, ReportsAMissingPassword) {
  RedisServer server({"--requirepass", "s3cret"});
  startLink(configFor(server));
  ASSERT_TRUE(runUntil([&] { return disconnects_ >= 1; }));
  EXPECT_NE(last_reason_.find("NOAUTH"), std::string::npos) << last_reason_;
  EXPECT_EQ(connects_, 0);
  closeAll();
}

// Verifies that an ACL user (username + password) authenticates as that user.
TEST_F(RedisLinkTest, AuthenticatesAsAnAclUser) {
  RedisServer server;
  ASSERT_EQ(server.cli({"ACL", "SETUSER", "lease", "on", ">pw", "~sluice:*", "+@all"}), "OK");
  RedisConfig config = configFor(server);
  config.username = "lease";
  config.password = "pw";
  startLink(config);
  ASSERT_TRUE(waitConnected());
  EXPECT_EQ(roundTrip({"ACL", "WHOAMI"}).text, "lease");
  EXPECT_EQ(roundTrip({"SET", "sluice:k", "v"}).status, RedisStatus::kOk);
  Seen denied = roundTrip({"SET", "other", "v"});
  EXPECT_EQ(denied.status, RedisStatus::kRedisError);
  EXPECT_NE(denied.text.find("NOPERM"), std::string::npos) << denied.text;
  closeAll();
}

// Verifies that the configured db is selected before any command runs.
TEST_F(RedisLinkTest, SelectsTheConfiguredDb) {
  RedisServer server;
  RedisConfig config = configFor(server);
  config.db = 3;
  startLink(config);
  ASSERT_TRUE(waitConnected());
  EXPECT_EQ(roundTrip({"SET", "where", "db3"}).status, RedisStatus::kOk);
  EXPECT_EQ(server.cli({"-n", "3", "GET", "where"}), "db3");
  EXPECT_EQ(server.cli({"-n", "0", "EXISTS", "where"}), "0");
  closeAll();
}

// Verifies that a registered script runs by SHA, and that after SCRIPT FLUSH
// the next call reloads it and succeeds.
TEST_F(RedisLinkTest, RunsScriptsBySha1AndReloadsThemAfterScriptFlush) {
  RedisServer server;
  RedisLink::ScriptId echo = 0;
  startLink(configFor(server), {}, [&](RedisLink& link) {
    echo = link.registerScript("echo", "return KEYS[1] .. '=' .. ARGV[1]");
  });
  ASSERT_TRUE(waitConnected());
  std::string sha = link_->scriptSha(echo);
  ASSERT_EQ(sha.size(), 40u);
  EXPECT_EQ(server.cli({"SCRIPT", "EXISTS", sha}), "1");

  std::string_view keys[] = {"k"};
  std::string_view args[] = {"v"};
  Seen first;
  ASSERT_TRUE(link_->evalsha(echo, keys, args, record(first), 2000));
  ASSERT_TRUE(runUntil([&] { return first.calls > 0; }));
  EXPECT_EQ(first.status, RedisStatus::kOk);
  EXPECT_EQ(first.text, "k=v");

  ASSERT_EQ(server.cli({"SCRIPT", "FLUSH"}), "OK");
  Seen second;
  ASSERT_TRUE(link_->evalsha(echo, keys, args, record(second), 2000));
  ASSERT_TRUE(runUntil([&] { return second.calls > 0; }));
  EXPECT_EQ(second.status, RedisStatus::kOk) << second.text;
  EXPECT_EQ(second.text, "k=v");
  EXPECT_EQ(second.calls, 1);
  EXPECT_EQ(server.cli({"SCRIPT", "EXISTS", sha}), "1");
  // One NOSCRIPT, one reload, one retry: loaded at connect and once more.
  std::string stats = server.cli({"INFO", "commandstats"});
  EXPECT_NE(stats.find("cmdstat_evalsha:calls=3,"), std::string::npos) << stats;
  EXPECT_NE(stats.find("cmdstat_script|load:calls=2,"), std::string::npos) << stats;
  closeAll();
}

// Verifies that a script that fails returns its error reply once, without
// being retried, and that a script that does not compile reports Redis's
// compile error through evalsha.
TEST_F(RedisLinkTest, ReturnsAScriptsErrorReplyWithoutRetrying) {
  RedisServer server;
  RedisLink::ScriptId failing = 0;
  RedisLink::ScriptId broken = 0;
  startLink(configFor(server), {}, [&](RedisLink& link) {
    failing = link.registerScript("failing", "return redis.error_reply('LIMIT exceeded')");
    broken = link.registerScript("broken", "return (");
  });
  ASSERT_TRUE(waitConnected());
  EXPECT_EQ(link_->scriptSha(failing).size(), 40u);
  EXPECT_EQ(link_->scriptSha(broken), "");

  Seen seen;
  ASSERT_TRUE(link_->evalsha(failing, {}, {}, record(seen), 2000));
  ASSERT_TRUE(runUntil([&] { return seen.calls > 0; }));
  EXPECT_EQ(seen.status, RedisStatus::kRedisError);
  EXPECT_EQ(seen.text, "LIMIT exceeded");

  Seen compile;
  ASSERT_TRUE(link_->evalsha(broken, {}, {}, record(compile), 2000));
  ASSERT_TRUE(runUntil([&] { return compile.calls > 0; }));
  EXPECT_EQ(compile.status, RedisStatus::kRedisError);
  EXPECT_NE(compile.text.find("compiling"), std::string::npos) << compile.text;

  // Let any stray retry arrive before counting.
  EXPECT_EQ(roundTrip({"PING"}).text, "PONG");
  EXPECT_EQ(seen.calls, 1);
  EXPECT_EQ(compile.calls, 1);
  std::string stats = server.cli({"INFO", "commandstats"});
  EXPECT_NE(stats.find("cmdstat_evalsha:calls=1,"), std::string::npos) << stats;
  closeAll();
}

// Verifies that after Redis restarts (losing its script cache) the link
// reconnects on its own, loads the scripts again, and evalsha works.
TEST_F(RedisLinkTest, ReconnectsAndReloadsScriptsAfterARestart) {
  RedisServer server;
  RedisLink::ScriptId incr = 0;
  startLink(configFor(server), {}, [&](RedisLink& link) {
    incr = link.registerScript("incr", "return redis.call('INCR', KEYS[1])");
  });
  ASSERT_TRUE(waitConnected());
  std::string sha = link_->scriptSha(incr);

  server.restart();
  ASSERT_TRUE(runUntil([&] { return connects_ == 2; }, 5000));
  EXPECT_GE(disconnects_, 1);
  EXPECT_EQ(link_->scriptSha(incr), sha);
  EXPECT_EQ(server.cli({"SCRIPT", "EXISTS", sha}), "1");

  std::string_view keys[] = {"sluice:n"};
  Seen seen;
  ASSERT_TRUE(link_->evalsha(incr, keys, {}, record(seen), 2000));
  ASSERT_TRUE(runUntil([&] { return seen.calls > 0; }));
  EXPECT_EQ(seen.status, RedisStatus::kOk) << seen.text;
  EXPECT_EQ(seen.integer, 1);
  closeAll();
}

// Verifies that the link also connects over a Unix socket.
TEST_F(RedisLinkTest, ConnectsOverAUnixSocket) {
  test::TempDir dir;
  std::string path = dir.file("redis.sock");
  RedisServer server({"--unixsocket", path});
  RedisConfig config;
  config.unix_path = path;
  startLink(config);
  ASSERT_TRUE(waitConnected());
  EXPECT_EQ(roundTrip({"PING"}).text, "PONG");
  closeAll();
}

// Verifies that close() with commands pending calls each callback exactly
// once with `disconnected`, refuses later commands, and leaves no handle open.
TEST_F(RedisLinkTest, CloseFailsEveryPendingCommandOnceAndLeavesNoHandleOpen) {
  RedisServer server;
  startLink(configFor(server));
  ASSERT_TRUE(waitConnected());

  std::vector<Seen> seen(3);
  for (Seen& one : seen) {
    ASSERT_TRUE(link_->command({"BLPOP", "nothing", "10"}, record(one), 10'000));
  }
  bool closed = false;
  link_->close([&] { closed = true; });
  for (const Seen& one : seen) {
    EXPECT_EQ(one.calls, 1);
    EXPECT_EQ(one.status, RedisStatus::kDisconnected);
  }
  EXPECT_FALSE(closed);  // never from inside close()
  Seen late;
  EXPECT_FALSE(link_->command({"PING"}, record(late), 100));
  ASSERT_TRUE(runUntil([&] { return closed; }));
  for (const Seen& one : seen) EXPECT_EQ(one.calls, 1);
  EXPECT_EQ(late.calls, 0);
  EXPECT_EQ(disconnects_, 0);  // closing is not a failure
  link_.reset();
  closeAll();
}

// Verifies that a link closed from inside a command's callback closes cleanly.
TEST_F(RedisLinkTest, ClosesFromInsideACallback) {
  RedisServer server;
  startLink(configFor(server));
  ASSERT_TRUE(waitConnected());
  Seen other;
  bool closed = false;
  ASSERT_TRUE(link_->command(
      {"PING"}, [&](const RedisResult&) { link_->close([&] { closed = true; }); }, 2000));
  ASSERT_TRUE(link_->command({"PING"}, record(other), 2000));
  ASSERT_TRUE(runUntil([&] { return closed; }));
  EXPECT_EQ(other.calls, 1);
  EXPECT_EQ(other.status, RedisStatus::kDisconnected);
  link_.reset();
  closeAll();
}

// --- where to connect, and pub/sub (Sentinel mode's pieces) ------------------

RedisAddress addressOf(const RedisServer& server) {
  return RedisAddress{server.host(), static_cast<uint16_t>(server.port())};
}

// Verifies that with require_master a replica is refused by ROLE in the
// handshake and the next attempt asks the resolver again, until it answers
// a master.
TEST_F(RedisLinkTest, RefusesAReplicaByRoleAndAsksTheResolverAgain) {
  RedisServer master;
  RedisServer replica({"--replicaof", master.host(), std::to_string(master.port())});
  int asked = 0;
  RedisLinkOptions options;
  options.require_master = true;
  startLink({}, options, [&](RedisLink& link) {
    link.resolveWith([&](const RedisLink::AddressCallback& done) {
      done(++asked <= 2 ? addressOf(replica) : addressOf(master), "");
    });
  });
  ASSERT_TRUE(waitConnected());
  EXPECT_EQ(asked, 3);
  EXPECT_EQ(disconnects_, 2);
  EXPECT_NE(last_reason_.find("ROLE answered slave, not master"), std::string::npos)
      << last_reason_;
  EXPECT_EQ(link_->address(), addressOf(master).text());
  closeAll();
}

// Verifies that a resolver without an address counts as a failed attempt,
// retried with backoff, with its reason reported.
TEST_F(RedisLinkTest, AResolverWithoutAnAddressIsAFailedAttempt) {
  RedisServer server;
  int asked = 0;
  startLink({}, {}, [&](RedisLink& link) {
    link.resolveWith([&](const RedisLink::AddressCallback& done) {
      if (++asked < 3) {
        done(std::nullopt, "nobody knows");
      } else {
        done(addressOf(server), "");
      }
    });
  });
  EXPECT_EQ(link_->address(), "");
  ASSERT_TRUE(waitConnected());
  EXPECT_EQ(asked, 3);
  EXPECT_EQ(disconnects_, 2);
  EXPECT_EQ(last_reason_, "nobody knows");
  closeAll();
}

// Verifies that a READONLY reply (the master was demoted under the link)
// reaches the caller, drops the connection, and the next attempt resolves
// again, to the new master.
TEST_F(RedisLinkTest, DropsTheConnectionOnReadonlyAndResolvesAgain) {
  RedisServer first;
  RedisServer second;
  RedisAddress current = addressOf(first);
  RedisLinkOptions options;
  options.require_master = true;
  startLink({}, options, [&](RedisLink& link) {
    link.resolveWith([&](const RedisLink::AddressCallback& done) { done(current, ""); });
  });
  ASSERT_TRUE(waitConnected());
  ASSERT_EQ(first.cli({"REPLICAOF", second.host(), std::to_string(second.port())}), "OK");
  current = addressOf(second);

  Seen seen = roundTrip({"SET", "k", "v"});
  EXPECT_EQ(seen.status, RedisStatus::kRedisError);
  EXPECT_EQ(seen.text.rfind("READONLY", 0), 0u) << seen.text;
  ASSERT_TRUE(runUntil([&] { return connects_ == 2 && link_->connected(); }));
  EXPECT_NE(last_reason_.find("READONLY"), std::string::npos) << last_reason_;
  EXPECT_EQ(link_->address(), addressOf(second).text());
  EXPECT_EQ(roundTrip({"SET", "k", "v"}).status, RedisStatus::kOk);
  closeAll();
}

// Verifies that reconnect() fails what is pending and connects again at
// once, without waiting for a backoff, to where the resolver now points.
TEST_F(RedisLinkTest, ReconnectMovesToTheResolvedAddressAtOnce) {
  RedisServer first;
  RedisServer second;
  RedisAddress current = addressOf(first);
  startLink({}, {}, [&](RedisLink& link) {
    link.resolveWith([&](const RedisLink::AddressCallback& done) { done(current, ""); });
  });
  ASSERT_TRUE(waitConnected());
  first.stop();  // the pending command stays unanswered
  Seen pending;
  ASSERT_TRUE(link_->command({"PING"}, record(pending), 5000));
  current = addressOf(second);
  uint64_t asked_at_ms = nowMs();
  link_->reconnect("moved");
  EXPECT_EQ(pending.calls, 1);
  EXPECT_EQ(pending.status, RedisStatus::kDisconnected);
  ASSERT_TRUE(runUntil([&] { return link_->connected(); }, 1000));
  EXPECT_LT(nowMs() - asked_at_ms, 50 + kSlackMs);  // the backoff's first step is 50 ms
  EXPECT_EQ(link_->address(), addressOf(second).text());
  EXPECT_EQ(connects_, 2);
  first.resume();
  closeAll();
}

// Verifies that a subscribed link is up once the subscription is confirmed,
// delivers each message, refuses commands, and subscribes again after a
// reconnect.
TEST_F(RedisLinkTest, SubscribesOnEveryConnectionAndDeliversMessages) {
  RedisServer server;
  std::vector<std::string> messages;
  startLink(configFor(server), {}, [&](RedisLink& link) {
    link.subscribe("news", [&](std::string_view payload) { messages.emplace_back(payload); });
  });
  ASSERT_TRUE(waitConnected());
  Seen unused;
  EXPECT_FALSE(link_->command({"PING"}, record(unused), 1000));
  EXPECT_EQ(server.cli({"PUBLISH", "news", "first"}), "1");
  ASSERT_TRUE(runUntil([&] { return messages.size() == 1; }));
  EXPECT_EQ(messages[0], "first");

  server.restart();
  ASSERT_TRUE(runUntil([&] { return connects_ == 2; }));
  EXPECT_EQ(server.cli({"PUBLISH", "news", "second"}), "1");
  ASSERT_TRUE(runUntil([&] { return messages.size() == 2; }));
  EXPECT_EQ(messages[1], "second");
  EXPECT_EQ(unused.calls, 0);
  closeAll();
}

// Verifies that a subscribed link with probes PINGs every interval and stays
// up while the server answers.
TEST_F(RedisLinkTest, ProbesASubscribedConnectionAndStaysUpWhileTheServerAnswers) {
  RedisServer server;
  RedisLinkOptions options;
  options.probe_interval_ms = 50;
  options.probe_timeout_ms = 200;
  startLink(configFor(server), options,
            [&](RedisLink& link) { link.subscribe("news", [](std::string_view) {}); });
  ASSERT_TRUE(waitConnected());
  uint64_t until_ms = nowMs() + 600;
  runUntil([&] { return nowMs() >= until_ms; }, 2000);
  EXPECT_EQ(disconnects_, 0) << last_reason_;
  EXPECT_TRUE(link_->connected());
  std::string stats = server.cli({"INFO", "commandstats"});
  size_t at = stats.find("cmdstat_ping:calls=");  // the handshake sends none here
  ASSERT_NE(at, std::string::npos) << stats;
  EXPECT_GE(std::stoll(stats.substr(at + 19)), 8);  // one per 50 ms, and a loaded machine
  closeAll();
}

// Verifies that a subscribed link drops a connection whose server stopped
// answering (SIGSTOP: the connection stays open) once a probe is late, and
// subscribes again when the server is back.
TEST_F(RedisLinkTest, DropsASubscribedConnectionWhoseServerStopsAnsweringProbes) {
  RedisServer server;
  RedisLinkOptions options;
  options.probe_interval_ms = 100;
  options.probe_timeout_ms = 200;
  std::vector<std::string> messages;
  startLink(configFor(server), options, [&](RedisLink& link) {
    link.subscribe("news", [&](std::string_view payload) { messages.emplace_back(payload); });
  });
  ASSERT_TRUE(waitConnected());
  server.stop();
  uint64_t stopped_ms = nowMs();
  ASSERT_TRUE(runUntil([&] { return disconnects_ == 1; }, 3000));
  EXPECT_LT(nowMs() - stopped_ms, 100 + 200 + kSlackMs);
  EXPECT_NE(last_reason_.find("a PING got no answer within 200 ms"), std::string::npos)
      << last_reason_;

  server.resume();
  ASSERT_TRUE(runUntil([&] { return connects_ == 2; }));
  EXPECT_EQ(server.cli({"PUBLISH", "news", "after"}), "1");
  ASSERT_TRUE(runUntil([&] { return messages.size() == 1; }));
  EXPECT_EQ(messages[0], "after");
  closeAll();
}

// --- RetiredLinks -----------------------------------------------------------------

// Verifies that a link retired from inside its own callback is closed, not
// destroyed: it counts as closing, freeClosed() leaves it alone (destroying
// it there would abort), and once its close completes on_drained runs.
TEST_F(RedisLinkTest, RetiredLinksCloseALinkInsideItsOwnCallbackAndKeepItUntilClosed) {
  RedisServer server;
  int drained = 0;
  RetiredLinks retired([&] { drained++; });
  retired.retire(nullptr);
  EXPECT_EQ(retired.closing(), 0u);
  startLink(configFor(server));
  ASSERT_TRUE(waitConnected());
  Seen other;
  size_t closing_after_retire = 0;
  ASSERT_TRUE(link_->command(
      {"PING"},
      [&](const RedisResult&) {
        retired.retire(std::move(link_));
        retired.freeClosed();
        closing_after_retire = retired.closing();
      },
      2000));
  ASSERT_TRUE(link_->command({"PING"}, record(other), 2000));
  ASSERT_TRUE(runUntil([&] { return drained == 1; }));
  EXPECT_EQ(closing_after_retire, 1u);
  EXPECT_EQ(retired.closing(), 0u);
  EXPECT_EQ(other.status, RedisStatus::kDisconnected);  // closed like any link
  retired.freeClosed();
  closeAll();
}

// Verifies that on_drained runs once, when the last of the links retired
// together has closed, not once per link.
TEST_F(RedisLinkTest, RetiredLinksReportDrainedWhenTheLastClosingLinkHasClosed) {
  RedisServer server;
  int drained = 0;
  RetiredLinks retired([&] { drained++; });
  for (int i = 0; i < 3; i++) {
    auto link = std::make_unique<RedisLink>(&loop_, configFor(server));
    link->start();
    retired.retire(std::move(link));
  }
  EXPECT_EQ(retired.closing(), 3u);
  ASSERT_TRUE(runUntil([&] { return retired.closing() == 0; }));
  EXPECT_EQ(drained, 1);
  retired.freeClosed();
  closeAll();
}

}  // namespace
}  // namespace sluice

// Tests for Control, the control thread, against a real redis-server per test
// (RedisServer fixture). Control runs its own thread, so the tests watch its
// published snapshot (polling every millisecond, bounded) and end by stopping
// it and checking that its loop closed with no handle open.
#include "control.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "redis_server.h"
#include "scripts.h"
#include "test_support.h"

namespace sluice {
namespace {

using test::RedisServer;
using test::waitFor;

// docs/design.md, "Fallback": fall back within 500 ms of Redis dying or stalling. Sanitizers
// slow everything, so they get room; a detection that takes seconds still fails.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int64_t kSlackMs = 300;
#else
constexpr int64_t kSlackMs = 0;
#endif
constexpr int64_t kDetectMs = 500;

int64_t nowMs() { return monotonicNowNs() / 1'000'000; }

RedisConfig configFor(const RedisServer& server, const std::string& node_id) {
  RedisConfig config;
  config.host = server.host();
  config.port = static_cast<uint16_t>(server.port());
  config.node_id = node_id;
  return config;
}

// Starts `control`, waits for Redis up and a first heartbeat.
bool startAndJoin(Control& control) {
  control.start();
  return waitFor(5000, [&] {
    ControlSnapshot s = control.snapshot();
    return s.redis_up && s.clock_offset_us.has_value();
  });
}

// Stops `control`; its thread must end and its loop close with nothing open.
void stopCleanly(Control& control) {
  control.stop();
  EXPECT_TRUE(control.join()) << "the control loop closed with handles open";
}

// Milliseconds until `control` reports Redis down, or -1 after 5 s.
int64_t msUntilDown(Control& control, int64_t since_ms) {
  if (!waitFor(5000, [&] { return !control.snapshot().redis_up; })) return -1;
  return nowMs() - since_ms;
}

// Verifies that Control reports Redis up, counts itself in the members set
// and leaves it on a graceful stop.
TEST(ControlTest, ReportsRedisUpCountsItselfAndLeavesOnStop) {
  RedisServer server;
  Control control(configFor(server, "node-a"));
  EXPECT_FALSE(control.snapshot().redis_up);  // nothing runs before start()
  ASSERT_TRUE(startAndJoin(control));
  EXPECT_EQ(control.snapshot().nodes, 1u);
  EXPECT_EQ(control.membersKey(), "sluice:members");
  EXPECT_NE(server.cli({"ZSCORE", "sluice:members", "node-a"}), "");
  stopCleanly(control);
  EXPECT_EQ(server.cli({"ZCARD", "sluice:members"}), "0");
}

// Verifies that a killed Redis is reported down within 500 ms and up again
// once it is back.
TEST(ControlTest, ReportsAKilledRedisDownWithin500MsAndUpAfterARestart) {
  RedisServer server;
  Control control(configFor(server, "node-a"));
  ASSERT_TRUE(startAndJoin(control));

  int64_t killed_ms = nowMs();
  server.kill();
  int64_t down_ms = msUntilDown(control, killed_ms);
  std::cout << "measured: kill detected after " << down_ms << " ms\n";
  EXPECT_GE(down_ms, 0);
  EXPECT_LT(down_ms, kDetectMs + kSlackMs);

  server.restart();
  int64_t restarted_ms = nowMs();
  // Reconnects back off up to 1.2 s (RedisLinkOptions: its cap and jitter),
  // so allow for that.
  ASSERT_TRUE(waitFor(5000, [&] { return control.snapshot().redis_up; }));
  std::cout << "measured: up again " << nowMs() - restarted_ms << " ms after the restart\n";
  // The restarted Redis lost the members set; the beat on reconnect refills it.
  EXPECT_TRUE(waitFor(2000, [&] { return server.cli({"ZCARD", "sluice:members"}) == "1"; }));
  stopCleanly(control);
}

// Verifies that a stalled Redis (SIGSTOP: the connection stays open, nothing
// answers) is reported down within 500 ms and up again after SIGCONT.
TEST(ControlTest, ReportsAStalledRedisDownWithin500MsAndUpAfterItResumes) {
  RedisServer server;
  Control control(configFor(server, "node-a"));
  ASSERT_TRUE(startAndJoin(control));

  int64_t stopped_ms = nowMs();
  server.stop();
  int64_t down_ms = msUntilDown(control, stopped_ms);
  std::cout << "measured: stall detected after " << down_ms << " ms\n";
  EXPECT_GE(down_ms, 0);
  EXPECT_LT(down_ms, kDetectMs + kSlackMs);

  server.resume();
  int64_t resumed_ms = nowMs();
  ASSERT_TRUE(waitFor(5000, [&] { return control.snapshot().redis_up; }));
  std::cout << "measured: up again " << nowMs() - resumed_ms << " ms after SIGCONT\n";
  stopCleanly(control);
}

// Verifies that two nodes on one Redis both count 2, that each change of N
// reaches the callback, and that a node that stops is gone for the other at
// its next heartbeat.
TEST(ControlTest, CountsTwoNodesAndDropsOneThatStops) {
  RedisServer server;
  RedisConfig a_config = configFor(server, "node-a");
  a_config.heartbeat_interval_ms = 100;
  RedisConfig b_config = configFor(server, "node-b");
  b_config.heartbeat_interval_ms = 100;
  Control a(a_config);
  Control b(b_config);
  std::atomic<uint32_t> a_reported{0};
  std::atomic<int> a_changes{0};
  a.onNodesChanged([&](uint32_t nodes) {
    a_reported.store(nodes);
    a_changes.fetch_add(1);
  });
  ASSERT_TRUE(startAndJoin(a));
  ASSERT_TRUE(startAndJoin(b));
  // The snapshot changes just before the callback runs: wait for both.
  EXPECT_TRUE(waitFor(2000, [&] {
    return a.snapshot().nodes == 2 && b.snapshot().nodes == 2 && a_reported.load() == 2;
  }));
  EXPECT_EQ(a_changes.load(), 1);  // 1 (expected_nodes) -> 2

  stopCleanly(b);
  EXPECT_EQ(server.cli({"ZSCORE", "sluice:members", "node-b"}), "");
  EXPECT_TRUE(waitFor(1000, [&] { return a.snapshot().nodes == 1 && a_reported.load() == 1; }));
  EXPECT_EQ(a_changes.load(), 2);
  stopCleanly(a);
}

// Verifies that a node that stops beating without leaving (a crash: its last
// beat is the last thing Redis hears) stops counting after its TTL.
TEST(ControlTest, DropsANodeThatCrashedAfterItsTtl) {
  RedisServer server;
  RedisConfig config = configFor(server, "node-a");
  config.heartbeat_interval_ms = 100;
  const int64_t ttl_ms = kHeartbeatTtlIntervals * config.heartbeat_interval_ms;
  Control control(config);
  ASSERT_TRUE(startAndJoin(control));

  // The crashed node's last beat, exactly as its Control sends it.
  std::string ttl = std::to_string(ttl_ms);
  std::string reply = server.cli({"EVAL", std::string(scripts::get(scripts::Script::kHeartbeat).source),
                                  "1", "sluice:members", "beat", "crashed", ttl, "0"});
  int64_t last_beat_ms = nowMs();
  ASSERT_EQ(reply.substr(0, reply.find('\n')), "2") << reply;  // {live, now_ms}
  ASSERT_TRUE(waitFor(1000, [&] { return control.snapshot().nodes == 2; }));
  ASSERT_TRUE(waitFor(2000, [&] { return control.snapshot().nodes == 1; }));
  int64_t dropped_after_ms = nowMs() - last_beat_ms;
  std::cout << "measured: crashed node dropped " << dropped_after_ms << " ms after its last beat"
            << " (TTL " << ttl_ms << " ms)\n";
  EXPECT_GE(dropped_after_ms, ttl_ms - 20);  // not before its TTL (less the cli's own time)
  EXPECT_LE(dropped_after_ms, ttl_ms + 2 * config.heartbeat_interval_ms + 100 + kSlackMs);
  stopCleanly(control);
}

// Verifies that N is expected_nodes until a heartbeat answers, and that the
// last known N stays while Redis is down.
TEST(ControlTest, KeepsExpectedNodesUntilAHeartbeatAndTheLastKnownNWhileDown) {
  RedisServer server;
  server.stop();  // connections hang until SIGCONT
  RedisConfig config = configFor(server, "node-a");
  config.expected_nodes = 5;
  Control control(config);
  control.start();
  ASSERT_FALSE(waitFor(300, [&] { return control.snapshot().redis_up; }));
  EXPECT_EQ(control.snapshot().nodes, 5u);
  EXPECT_FALSE(control.snapshot().clock_offset_us.has_value());

  server.resume();
  ASSERT_TRUE(waitFor(5000, [&] { return control.snapshot().nodes == 1; }));
  server.kill();
  ASSERT_TRUE(waitFor(2000, [&] { return !control.snapshot().redis_up; }));
  EXPECT_FALSE(waitFor(300, [&] { return control.snapshot().nodes != 1; }));
  stopCleanly(control);
}

// Verifies that on one machine Redis's clock and ours agree: the estimated
// offset, taken back to wall time, is about 0.
TEST(ControlTest, EstimatesAClockOffsetOfAboutZeroOnOneMachine) {
  RedisServer server;
  RedisConfig config = configFor(server, "node-a");
  config.heartbeat_interval_ms = 100;
  Control control(config);
  ASSERT_TRUE(startAndJoin(control));
  // A few beats, so the estimate picks the shortest of several round trips.
  ASSERT_FALSE(waitFor(500, [] { return false; }));
  std::optional<int64_t> offset_us = control.snapshot().clock_offset_us;
  ASSERT_TRUE(offset_us.has_value());
  int64_t wall_offset_us = *offset_us - realtimeMinusMonotonicUs();
  std::cout << "measured: Redis minus wall clock " << wall_offset_us << " µs\n";
  EXPECT_LT(std::llabs(wall_offset_us), 2'000 + kSlackMs * 1000);
  stopCleanly(control);
}

// Verifies that Control reads time through the clock it is given: on a
// clock an hour behind the monotonic one, the offset to Redis's clock is an
// hour larger.
TEST(ControlTest, StampsHeartbeatsWithTheInjectedClock) {
  constexpr int64_t kHourUs = 3'600'000'000;
  RedisServer server;
  RedisConfig config = configFor(server, "node-a");
  config.heartbeat_interval_ms = 100;
  Control control(config, RedisLinkOptions{}, [] { return monotonicNowNs() - kHourUs * 1000; });
  ASSERT_TRUE(startAndJoin(control));
  std::optional<int64_t> offset_us = control.snapshot().clock_offset_us;
  ASSERT_TRUE(offset_us.has_value());
  int64_t wall_offset_us = *offset_us - realtimeMinusMonotonicUs();
  EXPECT_LT(std::llabs(wall_offset_us - kHourUs), 50'000 + kSlackMs * 1000);
  stopCleanly(control);
}

// Verifies that stopping never waits long on a dead or stalled Redis.
TEST(ControlTest, StopsAtOnceWithADeadRedisAndWithinTheLeaveTimeoutWithAStalledOne) {
  RedisServer server;
  Control dead(configFor(server, "node-a"));
  Control stalled(configFor(server, "node-b"));
  ASSERT_TRUE(startAndJoin(dead));
  ASSERT_TRUE(startAndJoin(stalled));

  server.stop();
  int64_t start_ms = nowMs();
  stopCleanly(stalled);
  int64_t stalled_stop_ms = nowMs() - start_ms;
  std::cout << "measured: stop with a stalled Redis took " << stalled_stop_ms << " ms\n";
  EXPECT_LT(stalled_stop_ms, kLeaveTimeoutMs + 100 + kSlackMs);

  server.kill();
  ASSERT_TRUE(waitFor(2000, [&] { return !dead.snapshot().redis_up; }));
  start_ms = nowMs();
  stopCleanly(dead);
  int64_t dead_stop_ms = nowMs() - start_ms;
  std::cout << "measured: stop with a dead Redis took " << dead_stop_ms << " ms\n";
  EXPECT_LT(dead_stop_ms, 50 + kSlackMs);
}

// Verifies that a Control that never started is destroyed without a thread.
TEST(ControlTest, NeverStartedControlStopsAndJoinsAtOnce) {
  RedisConfig config;
  config.host = "127.0.0.1";
  config.port = 1;
  Control control(config);
  control.stop();
  EXPECT_TRUE(control.join());
  EXPECT_FALSE(control.nodeId().empty());
}

// Verifies the default node id: this host's name and this process's id.
TEST(ControlTest, DefaultNodeIdIsHostnameAndPid) {
  std::string id = defaultNodeId();
  EXPECT_EQ(id.substr(id.rfind(':') + 1), std::to_string(getpid()));
  RedisConfig config;
  EXPECT_EQ(Control(config).nodeId(), id);
}

}  // namespace
}  // namespace sluice

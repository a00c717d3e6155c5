// Tests for RedisCluster's routing against a real Redis Cluster per test:
// three redis-server masters (--cluster-enabled yes, each with its own bus
// port), no replicas, joined here as redis-cli --cluster create would join
// them (a config epoch each, CLUSTER ADDSLOTSRANGE, CLUSTER MEET). A slot
// migration is made by hand with CLUSTER SETSLOT and MIGRATE. Each test
// drives the cluster on its own loop, waits on conditions with a guard timer
// (never a sleep), and ends by closing the cluster and checking that the
// loop closes with no handle left open.
#include "cluster.h"

#include <gtest/gtest.h>
#include <uv.h>

#include <array>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "redis_keys.h"
#include "redis_server.h"
#include "test_support.h"
#include "uv_loop.h"

namespace sluice {
namespace {

using test::RedisServer;

// The one script the tests route: INCR of its key, so that an answer says
// how often the key was counted on the node that holds it.
constexpr std::string_view kIncrScript = "return redis.call('INCR', KEYS[1])";

// The masters' slot ranges, as redis-cli --cluster create splits 16384 by 3.
constexpr std::array<std::pair<int, int>, 3> kRanges = {{{0, 5460}, {5461, 10922}, {10923, 16383}}};

// What a call's callback saw, copied out of the (callback-scoped) reply.
struct Seen {
  RedisStatus status = RedisStatus::kOk;
  std::string text;  // the error or reason; "" for a reply
  int64_t integer = 0;
  int calls = 0;
};

class RedisClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(uv_loop_init(&loop_), 0);
    for (size_t i = 0; i < kRanges.size(); i++) {
      int bus_port = test::freeLoopbackPort();
      nodes_.push_back(std::make_unique<RedisServer>(std::vector<std::string>{
          "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
          "--cluster-port", std::to_string(bus_port), "--cluster-node-timeout", "5000"}));
      bus_ports_.push_back(bus_port);
    }
    for (size_t i = 0; i < nodes_.size(); i++) {
      ASSERT_EQ(node(i).cli({"CLUSTER", "SET-CONFIG-EPOCH", std::to_string(i + 1)}), "OK");
      ASSERT_EQ(node(i).cli({"CLUSTER", "ADDSLOTSRANGE", std::to_string(kRanges[i].first),
                             std::to_string(kRanges[i].second)}),
                "OK");
    }
    for (size_t i = 1; i < nodes_.size(); i++) {
      ASSERT_EQ(node(0).cli({"CLUSTER", "MEET", node(i).host(), std::to_string(node(i).port()),
                             std::to_string(bus_ports_[i])}),
                "OK");
    }
    bool formed = test::waitFor(30'000, [&] {
      for (size_t i = 0; i < nodes_.size(); i++) {
        std::string info = node(i).cli({"CLUSTER", "INFO"});
        if (info.find("cluster_state:ok") == std::string::npos ||
            info.find("cluster_known_nodes:3") == std::string::npos) {
          return false;
        }
      }
      return true;
    });
    ASSERT_TRUE(formed) << node(0).cli({"CLUSTER", "NODES"});
  }

  void TearDown() override {
    if (cluster_) {
      bool closed = false;
      cluster_->close([&] { closed = true; });
      ASSERT_TRUE(runUntil([&] { return closed; })) << "close() callback never ran";
      cluster_.reset();
    }
    uv_run(&loop_, UV_RUN_NOWAIT);
    EXPECT_EQ(uv_loop_close(&loop_), 0);
  }

  bool runUntil(const std::function<bool()>& done, int timeout_ms = 10'000) {
    return test::runLoopUntil(&loop_, done, timeout_ms);
  }

  RedisServer& node(size_t i) { return *nodes_.at(i); }
  RedisAddress addressOf(size_t i) {
    return RedisAddress{node(i).host(), static_cast<uint16_t>(node(i).port())};
  }
  std::string nodeId(size_t i) { return node(i).cli({"CLUSTER", "MYID"}); }

  // The cluster client on `seeds`, started; its script is registered first.
  void startCluster(std::vector<RedisAddress> seeds) {
    RedisConfig config;
    config.cluster_addresses = std::move(seeds);
    cluster_ = std::make_unique<RedisCluster>(&loop_, config, RedisLinkOptions{}, 2'000,
                                              "home-key");
    incr_ = cluster_->registerScript("incr", std::string(kIncrScript));
    cluster_->start();
  }

  // Until the slot map names the three masters and each one's link is up
  // (a call for a key on each is accepted and answered).
  void waitAllMastersUp() {
    std::string all = addressOf(0).text() + "," + addressOf(1).text() + "," + addressOf(2).text();
    ASSERT_TRUE(runUntil([&] { return cluster_->address() == all; })) << cluster_->address();
    for (size_t i = 0; i < nodes_.size(); i++) {
      std::string key = keyOn(i, "warm-up-");
      bool sent = false;
      Seen seen;
      ASSERT_TRUE(runUntil([&] {
        if (!sent) sent = send(key, seen);
        return seen.calls > 0;
      })) << "master " << i << " never took a call";
      ASSERT_EQ(seen.status, RedisStatus::kOk) << seen.text;
    }
  }

  // Sends the script for `key`; false when the cluster refused it.
  bool send(const std::string& key, Seen& seen) {
    std::array<std::string_view, 1> keys = {key};
    return cluster_->evalsha(
        incr_, keys, {},
        [&seen](const RedisResult& result) {
          seen.calls++;
          seen.status = result.status;
          if (result.reply != nullptr) {
            seen.integer = result.reply->integer();
          } else {
            seen.text = std::string(result.error);
          }
        },
        2'000);
  }

  // Sends the script on `first` and `second` (one slot: a call of two keys,
  // as a penalty rule's state and block); false when the cluster refused it.
  bool sendPair(const std::string& first, const std::string& second, Seen& seen) {
    std::array<std::string_view, 2> keys = {first, second};
    return cluster_->evalsha(
        incr_, keys, {},
        [&seen](const RedisResult& result) {
          seen.calls++;
          seen.status = result.status;
          if (result.status == RedisStatus::kOk) {
            seen.integer = result.reply->integer();
          } else {
            seen.text = std::string(result.error);
          }
        },
        2'000);
  }

  // MIGRATEs `key` from master `from` to master `to`.
  void migrate(size_t from, size_t to, const std::string& key) {
    ASSERT_EQ(node(from).cli({"MIGRATE", node(to).host(), std::to_string(node(to).port()), key, "0",
                              "5000"}),
              "OK");
  }

  // Sends the script for `key` (the call must be accepted) and waits for its answer.
  Seen incr(const std::string& key) {
    Seen seen;
    EXPECT_TRUE(send(key, seen)) << "refused: " << key;
    EXPECT_TRUE(runUntil([&] { return seen.calls > 0; }));
    EXPECT_EQ(seen.calls, 1);
    return seen;
  }

  // The first name `prefix`<n> whose slot is `slot`.
  static std::string keyInSlot(uint16_t slot, const std::string& prefix) {
    for (int n = 0;; n++) {
      std::string key = prefix + std::to_string(n);
      if (clusterSlot(key) == slot) return key;
    }
  }

  // The first name `prefix`<n> whose slot master `i` serves (kRanges).
  static std::string keyOn(size_t i, const std::string& prefix) {
    for (int n = 0;; n++) {
      std::string key = prefix + std::to_string(n);
      int slot = clusterSlot(key);
      if (slot >= kRanges[i].first && slot <= kRanges[i].second) return key;
    }
  }

  // A number after `field` in an INFO `section` line starting with `line`
  // ("errorstat_MOVED:" "count=", "cmdstat_asking:" "calls="); 0 when absent.
  int64_t infoCount(size_t i, const std::string& section, const std::string& line,
                    const std::string& field) {
    std::string info = node(i).cli({"INFO", section});
    size_t at = info.find(line);
    if (at == std::string::npos) return 0;
    at = info.find(field, at);
    return at == std::string::npos ? 0 : std::strtoll(info.c_str() + at + field.size(), nullptr, 10);
  }
  int64_t redirects(size_t i, const std::string& kind) {
    return infoCount(i, "errorstats", "errorstat_" + kind + ":", "count=");
  }

  uv_loop_t loop_;
  std::vector<std::unique_ptr<RedisServer>> nodes_;
  std::vector<int> bus_ports_;
  std::unique_ptr<RedisCluster> cluster_;
  RedisCluster::ScriptId incr_ = 0;
};

// Verifies that the slot map is loaded from the seeds (past one where
// nothing listens), names the three masters, and that each call goes
// straight to the master of its key's slot: every key lands on its master
// and no node answers MOVED or ASK. A command without keys goes to the
// master of the home key's slot.
TEST_F(RedisClusterTest, LoadsTheSlotMapAndSendsEachCallToItsSlotsMaster) {
  RedisAddress nobody{"127.0.0.1", static_cast<uint16_t>(test::freeLoopbackPort())};
  startCluster({nobody, addressOf(2)});
  waitAllMastersUp();
  for (size_t i = 0; i < nodes_.size(); i++) {
    for (int k = 0; k < 5; k++) {
      std::string key = keyOn(i, "key-" + std::to_string(k) + "-");
      Seen seen = incr(key);
      EXPECT_EQ(seen.status, RedisStatus::kOk) << seen.text;
      EXPECT_EQ(seen.integer, 1);
      EXPECT_EQ(node(i).cli({"GET", key}), "1") << key << " is not on master " << i;
    }
  }
  for (size_t i = 0; i < nodes_.size(); i++) {
    EXPECT_EQ(redirects(i, "MOVED"), 0) << "master " << i;
    EXPECT_EQ(redirects(i, "ASK"), 0) << "master " << i;
  }

  size_t home = 0;
  while (clusterSlot("home-key") > kRanges[home].second) home++;
  int64_t pings = infoCount(home, "commandstats", "cmdstat_ping:", "calls=");
  Seen pong;
  ASSERT_TRUE(cluster_->command(
      {"PING"},
      [&](const RedisResult& result) {
        pong.calls++;
        pong.status = result.status;
      },
      2'000));
  ASSERT_TRUE(runUntil([&] { return pong.calls > 0; }));
  EXPECT_EQ(pong.status, RedisStatus::kOk);
  EXPECT_EQ(infoCount(home, "commandstats", "cmdstat_ping:", "calls="), pings + 1);
}

// Verifies MOVED: once a slot and its key have migrated (MIGRATE, then
// CLUSTER SETSLOT NODE on every master) the client's map is stale; the call
// gets MOVED from the old owner, follows it to the new one, where the key
// kept its value, and the next call of that slot goes to the new owner
// directly (the old one answers no second MOVED).
TEST_F(RedisClusterTest, FollowsMovedToTheSlotsNewOwnerAndGoesThereDirectlyAfterwards) {
  startCluster({addressOf(0), addressOf(1), addressOf(2)});
  waitAllMastersUp();
  std::string key = keyOn(0, "moving-");
  uint16_t slot = clusterSlot(key);
  ASSERT_EQ(incr(key).integer, 1);

  std::string from = nodeId(0), to = nodeId(1);
  ASSERT_EQ(node(1).cli({"CLUSTER", "SETSLOT", std::to_string(slot), "IMPORTING", from}), "OK");
  ASSERT_EQ(node(0).cli({"CLUSTER", "SETSLOT", std::to_string(slot), "MIGRATING", to}), "OK");
  ASSERT_EQ(node(0).cli({"MIGRATE", node(1).host(), std::to_string(node(1).port()), key, "0",
                         "5000"}),
            "OK");
  for (size_t i = 0; i < nodes_.size(); i++) {
    ASSERT_EQ(node(i).cli({"CLUSTER", "SETSLOT", std::to_string(slot), "NODE", to}), "OK");
  }

  Seen moved = incr(key);
  EXPECT_EQ(moved.status, RedisStatus::kOk) << moved.text;
  EXPECT_EQ(moved.integer, 2);  // the key's value moved with it
  EXPECT_EQ(redirects(0, "MOVED"), 1);

  Seen direct = incr(key);
  EXPECT_EQ(direct.status, RedisStatus::kOk) << direct.text;
  EXPECT_EQ(direct.integer, 3);
  EXPECT_EQ(redirects(0, "MOVED"), 1) << "the slot map still named the old owner";
  EXPECT_EQ(node(1).cli({"GET", key}), "3");
  // The rest of the old owner's slots stay with it.
  EXPECT_EQ(incr(keyOn(0, "staying-")).integer, 1);
  EXPECT_EQ(redirects(0, "MOVED"), 1);
}

// Verifies ASK: while a slot is MIGRATING from its owner and IMPORTING on
// another master, a key the owner does not hold is created on the importing
// node through ASKING, and the map does not change: every call of that slot
// still goes to the owner first, and gets ASK again.
TEST_F(RedisClusterTest, FollowsAskToTheImportingNodeWithoutChangingTheMap) {
  startCluster({addressOf(0), addressOf(1), addressOf(2)});
  waitAllMastersUp();
  uint16_t slot = clusterSlot(keyOn(0, "migrating-"));
  std::string first = keyInSlot(slot, "fresh-a-");
  std::string second = keyInSlot(slot, "fresh-b-");
  ASSERT_EQ(node(1).cli({"CLUSTER", "SETSLOT", std::to_string(slot), "IMPORTING", nodeId(0)}),
            "OK");
  ASSERT_EQ(node(0).cli({"CLUSTER", "SETSLOT", std::to_string(slot), "MIGRATING", nodeId(1)}),
            "OK");

  Seen asked = incr(first);
  EXPECT_EQ(asked.status, RedisStatus::kOk) << asked.text;
  EXPECT_EQ(asked.integer, 1);
  EXPECT_EQ(redirects(0, "ASK"), 1);
  EXPECT_EQ(infoCount(1, "commandstats", "cmdstat_asking:", "calls="), 1);
  EXPECT_EQ(node(1).cli({"CLUSTER", "COUNTKEYSINSLOT", std::to_string(slot)}), "1");
  EXPECT_EQ(node(0).cli({"CLUSTER", "COUNTKEYSINSLOT", std::to_string(slot)}), "0");

  EXPECT_EQ(incr(second).integer, 1);
  EXPECT_EQ(incr(first).integer, 2);  // the same key again, found on the importing node
  EXPECT_EQ(redirects(0, "ASK"), 3) << "a call of the slot skipped its owner";
  EXPECT_EQ(redirects(0, "MOVED"), 0);
  EXPECT_EQ(redirects(1, "MOVED"), 0);
  EXPECT_EQ(infoCount(1, "commandstats", "cmdstat_asking:", "calls="), 3);
  EXPECT_EQ(node(1).cli({"CLUSTER", "COUNTKEYSINSLOT", std::to_string(slot)}), "2");
}

// Verifies TRYAGAIN: while a slot migrates key by key, a call of two keys
// whose keys are split between the two masters (one moved, one not yet) is
// sent again after kTryAgainDelayMs, counted, and is answered once both
// keys are on the importing master (through ASK and ASKING), never failed.
TEST_F(RedisClusterTest, SendsACallAgainAfterTryAgainUntilItsKeysAreOnOneNode) {
  startCluster({addressOf(0), addressOf(1), addressOf(2)});
  waitAllMastersUp();
  const uint16_t slot = clusterSlot(keyOn(0, "split-"));
  const std::string tag = "{" + keyInSlot(slot, "tag-") + "}";
  const std::string first = tag + "state", second = tag + "block";
  ASSERT_EQ(node(0).cli({"SET", first, "1"}), "OK");
  ASSERT_EQ(node(0).cli({"SET", second, "1"}), "OK");
  ASSERT_EQ(node(1).cli({"CLUSTER", "SETSLOT", std::to_string(slot), "IMPORTING", nodeId(0)}), "OK");
  ASSERT_EQ(node(0).cli({"CLUSTER", "SETSLOT", std::to_string(slot), "MIGRATING", nodeId(1)}), "OK");
  migrate(0, 1, first);

  Seen seen;
  ASSERT_TRUE(sendPair(first, second, seen));
  // The first TRYAGAIN came back: the second key moves before the retry.
  ASSERT_TRUE(runUntil([&] { return cluster_->tryAgains() > 0 || seen.calls > 0; }));
  EXPECT_EQ(seen.calls, 0) << seen.text;
  migrate(0, 1, second);
  ASSERT_TRUE(runUntil([&] { return seen.calls > 0; }));
  EXPECT_EQ(seen.status, RedisStatus::kOk) << seen.text;
  EXPECT_EQ(seen.integer, 2);
  EXPECT_EQ(cluster_->tryAgains(), 1u);
  EXPECT_EQ(redirects(0, "TRYAGAIN"), 1);
  EXPECT_EQ(redirects(0, "ASK"), 1);
}

// Verifies the bound: a call whose keys stay split gets TRYAGAIN back
// after kMaxTryAgains sends again, each kTryAgainDelayMs apart.
TEST_F(RedisClusterTest, GivesUpAfterTryAgainAFewTimes) {
  startCluster({addressOf(0), addressOf(1), addressOf(2)});
  waitAllMastersUp();
  const uint16_t slot = clusterSlot(keyOn(0, "stuck-"));
  const std::string tag = "{" + keyInSlot(slot, "tag-") + "}";
  const std::string first = tag + "state", second = tag + "block";
  ASSERT_EQ(node(0).cli({"SET", first, "1"}), "OK");
  ASSERT_EQ(node(0).cli({"SET", second, "1"}), "OK");
  ASSERT_EQ(node(1).cli({"CLUSTER", "SETSLOT", std::to_string(slot), "IMPORTING", nodeId(0)}), "OK");
  ASSERT_EQ(node(0).cli({"CLUSTER", "SETSLOT", std::to_string(slot), "MIGRATING", nodeId(1)}), "OK");
  migrate(0, 1, first);

  Seen seen;
  const uint64_t sent_ms = uv_now(&loop_);
  ASSERT_TRUE(sendPair(first, second, seen));
  ASSERT_TRUE(runUntil([&] { return seen.calls > 0; }));
  EXPECT_EQ(seen.status, RedisStatus::kRedisError);
  EXPECT_EQ(seen.text.rfind("TRYAGAIN", 0), 0u) << seen.text;
  EXPECT_EQ(cluster_->tryAgains(), static_cast<uint64_t>(kMaxTryAgains));
  EXPECT_EQ(redirects(0, "TRYAGAIN"), kMaxTryAgains + 1);
  EXPECT_GE(uv_now(&loop_) - sent_ms, static_cast<uint64_t>(kMaxTryAgains * kTryAgainDelayMs));
}

}  // namespace
}  // namespace sluice

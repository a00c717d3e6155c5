// Tests for redis_keys.h: Redis Cluster's slot function, and the names of
// one (rule, key)'s Redis keys sharing a slot whatever the key holds.
#include "redis_keys.h"

#include <gtest/gtest.h>

#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace sluice {
namespace {

using namespace std::string_literals;

TEST(ClusterSlotTest, MatchesRedisForPlainNames) {
  // CLUSTER KEYSLOT of a Redis 7 cluster; 12739 is the spec's CRC16
  // ("123456789" -> 0x31C3 = 12739) mod 16384.
  EXPECT_EQ(clusterSlot("123456789"), 0x31C3 % kClusterSlots);
  EXPECT_EQ(clusterSlot("foo"), 12182);
  EXPECT_EQ(clusterSlot("bar"), 5061);
  EXPECT_EQ(clusterSlot(""), 0);
}

TEST(ClusterSlotTest, HashesTheFirstNonEmptyTagOnly) {
  EXPECT_EQ(clusterSlot("{foo}bar"), clusterSlot("foo"));
  EXPECT_EQ(clusterSlot("{user1000}.following"), clusterSlot("{user1000}.followers"));
  EXPECT_EQ(clusterSlot("foo{bar}{zap}"), clusterSlot("bar"));
  // The tag is what lies between the first '{' and the first '}' after it.
  EXPECT_EQ(clusterSlot("foo{{bar}}zap"), clusterSlot("{bar"));
  // "{}" is no tag: the whole name is hashed, later braces included.
  EXPECT_EQ(clusterSlot("foo{}{bar}"), clusterSlot("foo{}{bar}"s));
  EXPECT_NE(clusterSlot("foo{}{bar}"), clusterSlot("bar"));
  // An unclosed '{' is no tag either.
  EXPECT_EQ(clusterSlot("{foo"), clusterSlot("{foo"s));
  EXPECT_NE(clusterSlot("{foo"), clusterSlot("foo"));
}

const std::vector<std::string>& adversarialKeys() {
  static const std::vector<std::string> keys = {
      "", "{", "}", "{}", "}{", "{{}}", "a{b}c", "{b}", "{}b}", "\0"s, "\0{x}\0"s, "x\0}"s,
      std::string(1024, '{'), std::string(1024, '}'), std::string(1024, 'k'),
      std::string(512, '{') + std::string(512, '}'), "{" + std::string(1022, '\0') + "}",
      "sluice:q:{0000000000000000}:1:a:", "\xff\xfe{\x80}"};
  return keys;
}

// Verifies the adversarial keys: the state and block keys of each
// (rule, key), rule names with braces included, fall in the slot of the
// pair's own tag, so EVALSHA's KEYS[1] and KEYS[2] never cross slots.
TEST(RedisKeysTest, StateAndBlockOfAnyPairShareTheTagsSlot) {
  for (const std::string& rule : {"api"s, "{"s, "}{"s, "r\0le"s}) {
    for (const std::string& key : adversarialKeys()) {
      std::string state = redisStateKey("sluice:", rule, key);
      std::string block = redisBlockKey("sluice:", rule, key);
      std::string tag = redisHashTag(rule, key);
      const std::string v = "sluice:v" + std::to_string(kRedisStateVersion);
      ASSERT_EQ(tag.size(), 18u);
      EXPECT_EQ(clusterSlot(state), clusterSlot(tag.substr(1, 16)));
      EXPECT_EQ(clusterSlot(block), clusterSlot(state));
      EXPECT_EQ(state.rfind(v + ":q:" + tag + ":", 0), 0u);
      EXPECT_EQ(block.rfind(v + ":b:" + tag + ":", 0), 0u);
    }
  }
}

TEST(RedisKeysTest, NamesKeepEveryPairApart) {
  std::set<std::string> names;
  for (const std::string& rule : {"a"s, "a:"s, "a:b"s}) {
    for (const std::string& key : {""s, "b"s, ":b"s, "b:"s}) {
      EXPECT_TRUE(names.insert(redisStateKey("p:", rule, key)).second) << rule << "/" << key;
    }
  }
  EXPECT_NE(redisStateKey("p:", "r", "k"), redisBlockKey("p:", "r", "k"));
}

// Different pairs spread over the slots: 16,384 keys of one rule, and one
// key under 2,048 rules, each cover most slots and no slot holds many.
TEST(RedisKeysTest, PairsSpreadOverTheSlots) {
  std::vector<int> per_slot(kClusterSlots, 0);
  for (int i = 0; i < kClusterSlots; ++i) {
    ++per_slot[clusterSlot(redisStateKey("sluice:", "api", "user-" + std::to_string(i)))];
  }
  int used = 0, most = 0;
  for (int count : per_slot) {
    used += count > 0;
    most = std::max(most, count);
  }
  // A uniform spread uses 1 - 1/e (63%) of the slots, at most a handful each.
  EXPECT_GT(used, kClusterSlots / 2);
  EXPECT_LE(most, 12);

  std::set<uint16_t> slots;
  for (int i = 0; i < 2048; ++i) {
    slots.insert(clusterSlot(redisStateKey("sluice:", "rule" + std::to_string(i), "same")));
  }
  EXPECT_GT(slots.size(), 1800u);
}

// Verifies that the state version is a part of every pair's names, so
// daemons of two versions never read each other's state, while the pair
// keeps its tag (and slot) in every version.
TEST(RedisKeysTest, EachStateVersionNamesItsOwnKeysInTheSameSlot) {
  EXPECT_EQ(kRedisStateVersion, 3);
  EXPECT_EQ(redisStateKey("sluice:", "api", "k"), redisStateKey("sluice:", "api", "k", kRedisStateVersion));
  for (int64_t version : {1, 2, 10}) {
    std::string mine = redisStateKey("sluice:", "api", "k");
    std::string theirs = redisStateKey("sluice:", "api", "k", version);
    EXPECT_NE(theirs, mine) << version;
    EXPECT_NE(redisBlockKey("sluice:", "api", "k", version), redisBlockKey("sluice:", "api", "k"));
    EXPECT_EQ(theirs.rfind("sluice:v" + std::to_string(version) + ":q:{", 0), 0u) << theirs;
    EXPECT_EQ(clusterSlot(theirs), clusterSlot(mine));
  }
  // "v1" and "v10" cannot collide: the version ends at its ':'.
  EXPECT_NE(redisStateKey("p:", "r", "k", 1).substr(0, 6), redisStateKey("p:", "r", "k", 10).substr(0, 6));
}

// Verifies that the members set and the fleet marker carry no version:
// daemons of every version read the same two keys.
TEST(RedisKeysTest, TheFleetMarkerIsOnePlainNameOfThePrefix) {
  EXPECT_EQ(redisVersionKey("sluice:"), "sluice:version");
  EXPECT_EQ(redisVersionKey("blue:"), "blue:version");
}

// Verifies that the `renew` channel's messages (a state key's name) give
// back the (rule, key) they name, whatever bytes the key holds, and that
// another prefix's or version's key, or a mangled one, gives nothing.
TEST(RedisKeysTest, ARenewMessageNamesItsRuleAndKey) {
  EXPECT_EQ(redisRenewChannel("sluice:"), "sluice:v3:renew");
  const std::string odd_key("a:}{\0b", 7);
  for (const auto& [rule, key] : {std::pair<std::string, std::string>{"api", "k"}, {"r:1", odd_key}, {"x", ""}}) {
    std::optional<StateKeyPair> pair = parseRedisStateKey(redisStateKey("sluice:", rule, key), "sluice:");
    ASSERT_TRUE(pair) << rule;
    EXPECT_EQ(pair->rule_name, rule);
    EXPECT_EQ(pair->key, key);
  }
  EXPECT_FALSE(parseRedisStateKey(redisStateKey("blue:", "api", "k"), "sluice:"));
  EXPECT_FALSE(parseRedisStateKey(redisStateKey("sluice:", "api", "k", 2), "sluice:"));
  EXPECT_FALSE(parseRedisStateKey(redisBlockKey("sluice:", "api", "k"), "sluice:"));
  std::string mangled = redisStateKey("sluice:", "api", "k");
  mangled[mangled.size() - 1] = 'j';  // the tag no longer matches
  EXPECT_FALSE(parseRedisStateKey(mangled, "sluice:"));
  EXPECT_FALSE(parseRedisStateKey("sluice:v3:q:{", "sluice:"));
}

TEST(RedisKeysTest, MembersKeyIsOnePlainName) {
  EXPECT_EQ(redisMembersKey("sluice:"), "sluice:members");
}

}  // namespace
}  // namespace sluice

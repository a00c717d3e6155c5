// Redis keys: the names of the keys sluice writes, and the Redis Cluster
// hash slot a name falls in.
//
// One (rule, key) owns two Redis keys, which the lease scripts and
// lua/penalty.lua take together (KEYS[1], KEYS[2]), so in a cluster they
// must share a slot whatever bytes the key holds:
//
//   <key_prefix>v<V>:q:{<tag>}:<rule name length>:<rule name>:<key>   global state
//   <key_prefix>v<V>:b:{<tag>}:<rule name length>:<rule name>:<key>   penalty block
//
// <V> is the state version (kRedisStateVersion): what these keys hold and
// what the scripts that write them reply. Daemons of different state
// versions never touch each other's keys; the fleet marker (below) keeps
// them from sharing a key_prefix by accident.
//
// <tag> is 16 lowercase hex digits of a 64-bit FNV-1a hash of
// "<rule name length>:<rule name>:<key>". Redis hashes only what lies between
// the first '{' and the first '}' after it; the config refuses braces in
// key_prefix, so that first '{' is the tag's own and the first '}' closes it,
// before any byte of the rule name or key: braces, NUL bytes or a 1 KiB key
// cannot move the pair apart, and different pairs spread over the slots as
// their hashes do. The length prefix keeps any two (rule, key) pairs' names
// apart whatever bytes they contain.
//
// Membership (control.h) is one key, <key_prefix>members, so one slot. It
// and the fleet marker, <key_prefix>version (lua/fleet_version.lua: the
// state version the daemons leasing on this prefix write), carry no
// version: every version reads them, so the whole fleet is counted and a
// daemon of another version sees the marker.
//
// Pure functions; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace sluice {

// The state version this build writes. Raise it with any change to what a
// state or block key holds or to what a script that writes one replies
// (docs/operations.md, "Upgrading the Redis state"). Version 1 is the key
// names without a version, which no daemon writes any more.
constexpr int64_t kRedisStateVersion = 3;

// Redis Cluster's slot count (CLUSTER KEYSLOT answers 0 .. kClusterSlots - 1).
constexpr uint16_t kClusterSlots = 16384;

// The slot Redis Cluster puts `name` in: CRC16 (XMODEM) of its hash tag when
// it has one (the bytes between the first '{' and the first '}' after it,
// when there are any), else of the whole name, mod kClusterSlots.
uint16_t clusterSlot(std::string_view name);

// The hash tag of (rule, key), braces included: "{" + 16 hex digits + "}".
std::string redisHashTag(std::string_view rule_name, std::string_view key);

// The Redis keys of (rule, key) at `state_version`: its global state and
// its penalty block.
std::string redisStateKey(std::string_view prefix, std::string_view rule_name,
                          std::string_view key, int64_t state_version = kRedisStateVersion);
std::string redisBlockKey(std::string_view prefix, std::string_view rule_name,
                          std::string_view key, int64_t state_version = kRedisStateVersion);

// The members sorted set (lua/heartbeat.lua).
std::string redisMembersKey(std::string_view prefix);

// The channel the rate scripts PUBLISH a state key's name on when the
// key's rates are to be divided again (lua/rate_lease.lua: a rate op freed
// rate while some holder is short of its ask, or got less than 3/4 of its
// share because the others hold more than theirs): <key_prefix>v<V>:renew,
// the state keys' names up to their kind. Every daemon subscribes
// (Control) and renews its rate on that key.
std::string redisRenewChannel(std::string_view prefix, int64_t state_version = kRedisStateVersion);

// The (rule name, key) a state key of `prefix` and `state_version` names
// (redisStateKey's inverse); nullopt for any other name.
struct StateKeyPair {
  std::string rule_name;
  std::string key;
};
std::optional<StateKeyPair> parseRedisStateKey(std::string_view name, std::string_view prefix,
                                               int64_t state_version = kRedisStateVersion);

// The fleet marker (lua/fleet_version.lua).
std::string redisVersionKey(std::string_view prefix);

}  // namespace sluice

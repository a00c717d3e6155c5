// Redis keys: the names of the keys sluice writes, and the Redis Cluster
// hash slot a name falls in.
//
// One (rule, key) owns two Redis keys, which the lease scripts and
// lua/penalty.lua take together (KEYS[1], KEYS[2]), so in a cluster they
// must share a slot whatever bytes the key holds:
//
//   <key_prefix>q:{<tag>}:<rule name length>:<rule name>:<key>   global state
//   <key_prefix>b:{<tag>}:<rule name length>:<rule name>:<key>   penalty block
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
// Membership (control.h) is one key, <key_prefix>members, so one slot.
//
// Pure functions; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace sluice {

// Redis Cluster's slot count (CLUSTER KEYSLOT answers 0 .. kClusterSlots - 1).
constexpr uint16_t kClusterSlots = 16384;

// The slot Redis Cluster puts `name` in: CRC16 (XMODEM) of its hash tag when
// it has one (the bytes between the first '{' and the first '}' after it,
// when there are any), else of the whole name, mod kClusterSlots.
uint16_t clusterSlot(std::string_view name);

// The hash tag of (rule, key), braces included: "{" + 16 hex digits + "}".
std::string redisHashTag(std::string_view rule_name, std::string_view key);

// The Redis keys of (rule, key): its global state and its penalty block.
std::string redisStateKey(std::string_view prefix, std::string_view rule_name,
                          std::string_view key);
std::string redisBlockKey(std::string_view prefix, std::string_view rule_name,
                          std::string_view key);
// The rate leases held on (rule, key) (lua/token_bucket.lua's KEYS[3]).
std::string redisRatesKey(std::string_view prefix, std::string_view rule_name,
                          std::string_view key);

// The members sorted set (lua/heartbeat.lua).
std::string redisMembersKey(std::string_view prefix);

}  // namespace sluice

// Redis keys: names and cluster slots; see redis_keys.h.
#include "redis_keys.h"

#include <array>

namespace sluice {

namespace {

// CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, no reflection,
// as in Redis's crc16.c.
constexpr std::array<uint16_t, 256> makeCrc16Table() {
  std::array<uint16_t, 256> table{};
  for (uint32_t byte = 0; byte < 256; ++byte) {
    uint16_t crc = static_cast<uint16_t>(byte << 8);
    for (int bit = 0; bit < 8; ++bit) {
      crc = static_cast<uint16_t>((crc & 0x8000) != 0 ? (crc << 1) ^ 0x1021 : crc << 1);
    }
    table[byte] = crc;
  }
  return table;
}

constexpr std::array<uint16_t, 256> kCrc16Table = makeCrc16Table();

uint16_t crc16(std::string_view bytes) {
  uint16_t crc = 0;
  for (char c : bytes) {
    crc = static_cast<uint16_t>((crc << 8) ^ kCrc16Table[((crc >> 8) ^ static_cast<uint8_t>(c)) & 0xff]);
  }
  return crc;
}

// "<rule name length>:<rule name>:<key>": what names a (rule, key) apart
// from every other pair.
std::string pairName(std::string_view rule_name, std::string_view key) {
  std::string name = std::to_string(rule_name.size());
  name += ':';
  name += rule_name;
  name += ':';
  name += key;
  return name;
}

uint64_t fnv1a64(std::string_view bytes) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (char c : bytes) {
    hash ^= static_cast<uint8_t>(c);
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

std::string tagOf(std::string_view pair) {
  static constexpr char kHex[] = "0123456789abcdef";
  uint64_t hash = fnv1a64(pair);
  std::string tag(18, '}');
  tag[0] = '{';
  for (int i = 16; i >= 1; --i, hash >>= 4) tag[static_cast<size_t>(i)] = kHex[hash & 0xf];
  return tag;
}

// <prefix>v<version>:<kind>:{<tag>}:<pair>
std::string pairKey(std::string_view prefix, int64_t state_version, char kind,
                    std::string_view rule_name, std::string_view key) {
  std::string pair = pairName(rule_name, key);
  std::string name(prefix);
  name += 'v';
  name += std::to_string(state_version);
  name += ':';
  name += kind;
  name += ':';
  name += tagOf(pair);
  name += ':';
  name += pair;
  return name;
}

}  // namespace

uint16_t clusterSlot(std::string_view name) {
  size_t open = name.find('{');
  if (open != std::string_view::npos) {
    size_t close = name.find('}', open + 1);
    // "{}" (nothing between) is no tag: the whole name is hashed.
    if (close != std::string_view::npos && close != open + 1) {
      name = name.substr(open + 1, close - open - 1);
    }
  }
  return crc16(name) % kClusterSlots;
}

std::string redisHashTag(std::string_view rule_name, std::string_view key) {
  return tagOf(pairName(rule_name, key));
}

std::string redisStateKey(std::string_view prefix, std::string_view rule_name,
                          std::string_view key, int64_t state_version) {
  return pairKey(prefix, state_version, 'q', rule_name, key);
}

std::string redisBlockKey(std::string_view prefix, std::string_view rule_name,
                          std::string_view key, int64_t state_version) {
  return pairKey(prefix, state_version, 'b', rule_name, key);
}

std::string redisMembersKey(std::string_view prefix) { return std::string(prefix) + "members"; }

std::string redisVersionKey(std::string_view prefix) { return std::string(prefix) + "version"; }

std::string redisRenewChannel(std::string_view prefix, int64_t state_version) {
  return std::string(prefix) + 'v' + std::to_string(state_version) + ":renew";
}

std::optional<StateKeyPair> parseRedisStateKey(std::string_view name, std::string_view prefix,
                                               int64_t state_version) {
  const std::string head = std::string(prefix) + 'v' + std::to_string(state_version) + ":q:{";
  constexpr size_t kTagDigits = 16;
  if (name.size() < head.size() + kTagDigits + 2 || name.substr(0, head.size()) != head ||
      name.substr(head.size() + kTagDigits, 2) != "}:") {
    return std::nullopt;
  }
  std::string_view pair = name.substr(head.size() + kTagDigits + 2);
  size_t colon = pair.find(':');
  if (colon == std::string_view::npos || colon == 0 || colon > 10) return std::nullopt;
  size_t length = 0;
  for (char c : pair.substr(0, colon)) {
    if (c < '0' || c > '9') return std::nullopt;
    length = length * 10 + static_cast<size_t>(c - '0');
  }
  pair.remove_prefix(colon + 1);
  if (pair.size() < length + 1 || pair[length] != ':') return std::nullopt;
  StateKeyPair parsed{std::string(pair.substr(0, length)), std::string(pair.substr(length + 1))};
  if (redisStateKey(prefix, parsed.rule_name, parsed.key, state_version) != name) return std::nullopt;
  return parsed;
}

}  // namespace sluice
